package inject

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// SidecarName is the injected container's name.
const SidecarName = "ms2m-sidecar"

// SecretKey points at one key of a Secret in the pod's namespace.
type SecretKey struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

// Config is the webhook's configuration of what it injects.
type Config struct {
	// SidecarImage is the sidecar's image.
	SidecarImage    string            `json:"sidecarImage"`
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// StreamURI is the Secret key holding the broker's stream URI with
	// credentials (rabbitmq-stream://user:password@host:5552/vhost): the
	// sidecar's MS2M_STREAM_URI. The same credentials in every namespace
	// reach every namespace's logs: set BrokerUsers instead.
	StreamURI SecretKey `json:"streamURI,omitempty"`
	// BrokerUsers: each namespace has a broker user of its own, confined to
	// its logs (internal/brokeruser), and the sidecar's MS2M_STREAM_URI
	// comes from that user's Secret in the pod's namespace
	// (contract.BrokerUserSecret). StreamURI must then be empty.
	BrokerUsers bool `json:"brokerUsers,omitempty"`
	// NATSURL is the Secret key holding the NATS URL with credentials
	// (nats://user:password@host:4222) of the server that keeps the replay
	// logs of NATS apps as JetStream streams: the sidecar's MS2M_NATS_URL.
	// Without it, pods whose app speaks NATS are left alone.
	NATSURL SecretKey `json:"natsURL,omitempty"`
	// NATSListenPort is where a NATS app's sidecar listens, on 127.0.0.1.
	// Default 4222.
	NATSListenPort int32 `json:"natsListenPort,omitempty"`
	// ControlToken is the Secret key holding the sidecar's control token.
	ControlToken SecretKey `json:"controlToken"`
	// ListenPort is where the sidecar listens for the app, on 127.0.0.1.
	// Default 5672.
	ListenPort int32 `json:"listenPort,omitempty"`
	// ControlPort is the sidecar's control API port. Default 8089.
	ControlPort int32 `json:"controlPort,omitempty"`
	// LogMaxAge and LogMaxBytes are the default retention of replay logs.
	LogMaxAge   string `json:"logMaxAge,omitempty"`
	LogMaxBytes int64  `json:"logMaxBytes,omitempty"`
	// Resources are the sidecar's requests and limits.
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// RunAsUser is the sidecar's non-root user. Default 65532.
	RunAsUser int64 `json:"runAsUser,omitempty"`
	// CheckpointRepository is where ms2m's checkpoint images go (the
	// migrator's MS2M_IMAGE_REPO): no pod may name an image in it or below
	// it, except the restore the controller ordered (CheckImages). Empty:
	// images are not checked.
	CheckpointRepository string `json:"checkpointRepository,omitempty"`
	// RestoreKey checks the controller's signature on every restore
	// instruction (SignRestore); without it no pod is made a restore.
	RestoreKey []byte `json:"-"`
	// Now is the clock that signatures expire by. Default time.Now.
	Now func() time.Time `json:"-"`
}

// Migration is a pending migration of a pod's identity, as the migrator
// records it in the API server, for pods the webhook must turn into a
// restore without the migrator creating them (the StatefulSet strategies).
type Migration struct {
	Name         string `json:"name"`
	Image        string `json:"image"`        // checkpoint image
	Node         string `json:"node"`         // target node
	LogName      string `json:"logName"`      // the source's replay log
	ReplayStart  string `json:"replayStart"`  // checkpoint ID
	ReplayCutoff string `json:"replayCutoff"` // "marker", "end" (the log's end when the sidecar starts) or an ID
	// ReplayEpoch is the log's epoch at the checkpoint: a "marker" cutoff
	// is only taken from a marker of a later epoch. Empty means 0.
	ReplayEpoch string `json:"replayEpoch,omitempty"`
	// ReplaySkip are delivery IDs in the range not to replay, ascending
	// and comma-separated (MS2M_REPLAY_SKIP). Empty: none.
	ReplaySkip string `json:"replaySkip,omitempty"`
	// Images are the checkpoint images of the app containers after the
	// first (AppContainers), by container name, for a pod with several;
	// Image is the first's. Empty: one app container.
	Images map[string]string `json:"images,omitempty"`
	// Signature is the controller's (SignRestore) for the pod of the
	// pending record's name, in its namespace.
	Signature string `json:"signature,omitempty"`
}

// Input is what Inject decides on.
type Input struct {
	Pod             *corev1.Pod
	NamespaceLabels map[string]string
	// Pending is a pending migration for this pod's identity, if the
	// webhook found one.
	Pending *Migration
}

// Result is what Inject decided.
type Result struct {
	// Pod is the mutated copy, or nil when the pod is left alone.
	Pod *corev1.Pod
	// Skipped says why the pod was left alone (or partly: an env var that
	// could not be rewritten).
	Skipped []string
	// Rewritten says, one line each, what was changed in the app.
	Rewritten []string
	// Warnings go back in the admission response (unknown annotations
	// under our prefix, for example).
	Warnings []string
	// Restore is set when the pod was turned into a restore.
	Restore *Migration
}

// Status is the JSON in contract.AnnotationStatus.
type Status struct {
	Version   string   `json:"version"`
	Sidecar   string   `json:"sidecar"`
	Rewritten []string `json:"rewritten,omitempty"`
	Restore   string   `json:"restore,omitempty"` // migration name, if restored
}

// DenyError is a bad input: the admission request is denied with its
// message, which names the annotation, the value and what is allowed.
type DenyError struct{ Msg string }

func (e *DenyError) Error() string { return e.Msg }
