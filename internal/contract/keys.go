package contract

// Every annotation and label key ms2m reads or writes, under one prefix.
// docs/webhook.md lists them with their values (TestDocsMatchContract keeps
// the two in step).
const (
	Prefix = "ms2m.io/"

	// AnnotationInject opts a pod in: "true" injects, "false" opts out even
	// where the namespace opted in.
	AnnotationInject = Prefix + "inject"
	// LabelNamespaceInject on a namespace opts in all its pods: "enabled".
	LabelNamespaceInject = Prefix + "inject"
	// LabelInject on a pod opts it in like AnnotationInject ("true" or
	// "false"), and also routes its creation to the webhook that fails
	// closed: a pod labelled "true" is not created while the webhook is
	// down, so it never starts without its sidecar. "false" opts out and
	// keeps the webhook away from the pod altogether.
	LabelInject = Prefix + "inject"

	// AnnotationStatus is written by the webhook: what it injected and
	// rewrote, as JSON (inject.Status). Its presence with the sidecar container
	// means "already injected".
	AnnotationStatus = Prefix + "status"

	// AnnotationContainer names the one app container that keeps state
	// when the pod has more than one: only it is migrated, the others
	// start afresh. Default: every container but ms2m's sidecar is an app
	// container, and all of them are migrated (a whole pod).
	AnnotationContainer = Prefix + "container"
	// AnnotationBrokerEnv names further env vars, comma separated, that hold
	// a broker URL (amqp://…) or host:port, beyond the well-known ones.
	AnnotationBrokerEnv = Prefix + "broker-env"
	// AnnotationLogName overrides the replay log's name, which is derived
	// from the workload's stable identity by default.
	AnnotationLogName = Prefix + "log-name"
	// AnnotationLogMaxAge and AnnotationLogMaxBytes override the log's
	// retention (a Go duration; a byte count).
	AnnotationLogMaxAge   = Prefix + "log-max-age"
	AnnotationLogMaxBytes = Prefix + "log-max-bytes"

	// AnnotationUpstreamTLSSecret names a Secret in the pod's namespace
	// that the sidecar mounts for TLS to the broker: ca.crt, the CA that
	// signs the broker's certificate, and, with EXTERNAL auth, tls.crt
	// and tls.key, the client certificate. It turns TLS on. The webhook
	// only writes the reference; it never reads the Secret.
	AnnotationUpstreamTLSSecret = Prefix + "upstream-tls-secret"
	// AnnotationUpstreamTLSServerName is the name the sidecar checks the
	// broker's certificate against (default: the host it dials).
	AnnotationUpstreamTLSServerName = Prefix + "upstream-tls-server-name"
	// AnnotationUpstreamAuth is PLAIN (default: the app's credentials) or
	// EXTERNAL (the client certificate of AnnotationUpstreamTLSSecret).
	AnnotationUpstreamAuth = Prefix + "upstream-auth"

	// Migration requests, read by the migrator's controller and validated by the webhook.
	AnnotationMigrateTo = Prefix + "migrate-to" // target node name (a DNS-1123 subdomain)
	AnnotationStrategy  = Prefix + "strategy"   // one of Strategies (default auto)
	AnnotationReplayMax = Prefix + "replay-max" // T_replay_max for ms2m-cutoff, a Go duration
	AnnotationCutoff    = Prefix + "cutoff"     // ms2m-cutoff's stop rule, one of CutoffRules (default formula)
	// AnnotationMigrateForce "true" lets a request for migrate-to's node
	// pass although the pod's nodeSelector, required node affinity or the
	// node's NoSchedule/NoExecute taints keep it off that node (the
	// migrator pins the target past the scheduler, so it checks these
	// itself). Whoever may annotate the pod may set it: RBAC on pods is
	// the gate.
	AnnotationMigrateForce = Prefix + "migrate-force"
	// AnnotationMigrationStatus is the migrator's record of a requested
	// migration on the pod that asked for it (and on the target it made):
	// JSON with its name, phase, target, error and timings.
	AnnotationMigrationStatus = Prefix + "migration-status"
	// AnnotationMigrationStatusSignature is the controller's HMAC-SHA256
	// of AnnotationMigrationStatus (with the pod's namespace), written in
	// the same patch. The controller acts only on a status it signed; one
	// without a valid signature is ignored as forged.
	AnnotationMigrationStatusSignature = Prefix + "migration-status-signature"

	// The restore hook. The migrator sets these on a target pod it creates
	// (or records them in a pending inject.Migration for a StatefulSet pod); the
	// webhook turns the pod into a restore.
	AnnotationRestoreImage  = Prefix + "restore-image" // checkpoint image for the app container
	AnnotationRestoreNode   = Prefix + "restore-node"  // node to pin the pod to
	AnnotationReplayStart   = Prefix + "replay-start"  // checkpoint ID (replay after it)
	AnnotationReplayCutoff  = Prefix + "replay-cutoff" // "marker", "end" or the last ID to replay
	AnnotationReplayEpoch   = Prefix + "replay-epoch"  // the log's epoch at the checkpoint (optional; default 0)
	AnnotationMigrationName = Prefix + "migration"     // the migration this pod belongs to
	// AnnotationReplaySkip (optional) lists delivery IDs in the range not
	// to replay, ascending and comma-separated: deliveries the broker
	// requeued when a restarted app had left without acking them. The
	// controller sets it when it rebuilds such an app's state.
	AnnotationReplaySkip = Prefix + "replay-skip"
	// AnnotationRestoreImages (optional) is the checkpoint image of each
	// app container after the first, of a pod with several:
	// "container=image", comma-separated, sorted by container. The
	// restore signature covers it.
	AnnotationRestoreImages = Prefix + "restore-images"
	// AnnotationRestoreSignature is the controller's signature of the
	// restore annotations above, for this pod's namespace and name, with
	// its expiry (inject.SignRestore). The webhook restores nothing unsigned.
	AnnotationRestoreSignature = Prefix + "restore-signature"
	// AnnotationRestoredFrom replaces the restore annotations once the
	// restored pod has taken over and serves: JSON (inject.RestoredFrom) saying
	// which migration's checkpoint its app runs from and what its sidecar
	// replayed, which an app restarted from that checkpoint needs again.
	// The migrator writes it; nothing acts on it at admission.
	AnnotationRestoredFrom = Prefix + "restored-from"

	// ConditionStateNotRebuilt is the pod condition the controller sets
	// (status True) on a restored pod whose app restarted and whose state
	// it could not rebuild: its sidecar is stopped and consumes nothing.
	// Reason ConditionReasonRetention says the replay log no longer holds
	// the records after the checkpoint (not retried); ConditionReasonFailed
	// that a rebuild failed otherwise (retried).
	ConditionStateNotRebuilt = Prefix + "StateNotRebuilt"
	ConditionReasonRetention = "ReplayLogRetention"
	ConditionReasonFailed    = "RebuildFailed"

	// AnnotationOnEvict "migrate" on a pod turns an eviction of it (kubectl
	// drain, the cluster autoscaler) into a migration: the eviction is
	// refused with 429, as a PodDisruptionBudget refuses one, while the
	// controller moves the pod to a node the scheduler chooses; the
	// evicting client retries and is done once the pod has left. "evict"
	// opts the pod out where its namespace opted in.
	AnnotationOnEvict = Prefix + "on-evict"
	// LabelNamespaceOnEvict "migrate" on a namespace is AnnotationOnEvict's
	// default for its pods.
	LabelNamespaceOnEvict = Prefix + "on-evict"
	// AnnotationOnEvictOverride "true" on a pod lets a plain eviction of it
	// through although it opted in: the operator's fallback when its
	// migration cannot be made (the pod then restarts empty elsewhere).
	AnnotationOnEvictOverride = Prefix + "on-evict-override"
	// AnnotationEvacuate is written by the webhook on a pod whose eviction
	// it refused: the node the pod is to leave. The controller then
	// migrates it (through AnnotationMigrateTo, once the scheduler chose
	// the target) and records the outcome in AnnotationMigrationStatus.
	AnnotationEvacuate = Prefix + "evacuate"
	// LabelPlaceholderFor is on the controller's placeholder pods (pause
	// containers with the source's scheduling constraints, bound by
	// kube-scheduler to choose an evacuation's target): the UID of the
	// pod they stand in for.
	LabelPlaceholderFor = Prefix + "placeholder-for"

	// LabelShadowOf is on a statefulset-shadow migration's shadow pod: the
	// StatefulSet pod it stands in for.
	LabelShadowOf = Prefix + "shadow-of"
	// LabelMigration is on the migrator's pending-migration ConfigMaps:
	// the migration's name.
	LabelMigration = Prefix + "migration"
)

// KnownAnnotations are the keys under Prefix that ms2m reads or writes.
// An annotation under Prefix that is not here draws a warning (a typo is
// otherwise silent). A key added above is added here too.
var KnownAnnotations = map[string]bool{
	AnnotationInject:                   true,
	AnnotationStatus:                   true,
	AnnotationContainer:                true,
	AnnotationBrokerEnv:                true,
	AnnotationLogName:                  true,
	AnnotationLogMaxAge:                true,
	AnnotationLogMaxBytes:              true,
	AnnotationUpstreamTLSSecret:        true,
	AnnotationUpstreamTLSServerName:    true,
	AnnotationUpstreamAuth:             true,
	AnnotationMigrateTo:                true,
	AnnotationStrategy:                 true,
	AnnotationReplayMax:                true,
	AnnotationCutoff:                   true,
	AnnotationMigrateForce:             true,
	AnnotationMigrationStatus:          true,
	AnnotationMigrationStatusSignature: true,
	AnnotationRestoreImage:             true,
	AnnotationRestoreNode:              true,
	AnnotationReplayStart:              true,
	AnnotationReplayCutoff:             true,
	AnnotationReplayEpoch:              true,
	AnnotationReplaySkip:               true,
	AnnotationRestoreImages:            true,
	AnnotationMigrationName:            true,
	AnnotationRestoreSignature:         true,
	AnnotationRestoredFrom:             true,
	AnnotationOnEvict:                  true,
	AnnotationOnEvictOverride:          true,
	AnnotationEvacuate:                 true,
}

// The values of AnnotationOnEvict and LabelNamespaceOnEvict.
const (
	OnEvictMigrate = "migrate" // an eviction becomes a migration
	OnEvictEvict   = "evict"   // an eviction is an eviction (the default)
)
