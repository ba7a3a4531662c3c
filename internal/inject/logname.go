package inject

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// Replay log names. Every replay log of a pod in namespace N is named
// "N.<something>": the default is "N.<pod name>", ms2m.io/log-name and a
// pending migration must keep the prefix, and the webhook denies a pod that
// names a log outside its namespace. The prefix lets the broker confine a
// namespace's sidecars to their own logs (a user whose permissions match
// ^N\.), and it keeps a tenant from pointing its pod at another
// namespace's log by annotation. Everything that computes a log name calls
// DefaultLogName, OwnLogName or LogName here.

// maxLogNameLen is the longest replay log (stream) name: RabbitMQ queue and
// stream names are AMQP short strings.
const maxLogNameLen = 255

// LogNamePrefix is what every replay log name of namespace starts with.
func LogNamePrefix(namespace string) string { return namespace + "." }

// DefaultLogName is the replay log of the pod named pod in namespace when
// ms2m.io/log-name does not name one: "<namespace>.<pod>", the pod's
// stable identity. The injected sidecar gets it as
// DefaultLogName("$(POD_NAMESPACE)", "$(POD_NAME)"), which the kubelet
// expands.
// ownLogSep starts the suffix of a criu-alone target's own log.
const ownLogSep = ".criu-alone."

func DefaultLogName(namespace, pod string) string { return LogNamePrefix(namespace) + pod }

// OwnLogName is the log of its own that the target of migration gets when
// it does not replay (the criu-alone strategy), so that it does not write
// into log, the source's: "<log>.criu-alone.<migration>". An earlier
// migration's suffix on log is replaced, not appended to, so the name does
// not grow however often a pod moves. It keeps log's namespace prefix. A
// name over 255 bytes is cut, at a character boundary, and ends in a hash
// of the whole, so that names stay unique.
func OwnLogName(log, migration string) string {
	base, _, _ := strings.Cut(log, ownLogSep)
	name := base + ownLogSep + migration
	if len(name) <= maxLogNameLen {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	suffix := "-" + hex.EncodeToString(sum[:8])
	cut := maxLogNameLen - len(suffix)
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut] + suffix
}

// checkLogNameIn checks v as the replay log name of a pod in namespace:
// a stream name (checkLogName) that starts with the namespace's prefix. It
// returns "" or what to do instead.
func checkLogNameIn(namespace, v string) string {
	if allowed := checkLogName(v); allowed != "" {
		return allowed
	}
	prefix := LogNamePrefix(namespace)
	if strings.HasPrefix(v, prefix) && len(v) > len(prefix) {
		return ""
	}
	suggest := v
	if i := strings.IndexByte(v, '.'); i >= 0 {
		suggest = v[i+1:]
	}
	if suggest == "" {
		suggest = "<pod name>"
	}
	return fmt.Sprintf("it must start with %q, the pod's namespace and a dot (each namespace has its own replay logs, and no pod may read or write another namespace's); use %s",
		prefix, quote(prefix+suggest))
}

// checkLogNameAnnotation checks the value of contract.AnnotationLogName on pod.
func checkLogNameAnnotation(pod *corev1.Pod, v string) string {
	allowed := checkLogNameIn(pod.Namespace, v)
	if allowed != "" && checkLogName(v) == "" {
		allowed += ", or remove the annotation for the default " + quote(DefaultLogName(pod.Namespace, "<pod name>"))
	}
	return allowed
}

// checkInjectedLogName checks the log name of a pod that carries the
// sidecar already: one that the webhook injected before (a copy of an
// injected pod), or one whose author wrote the sidecar and the status
// annotation in, which must not reach another namespace's log either. It
// returns "" or a message for the deny.
func checkInjectedLogName(pod *corev1.Pod) string {
	name, known := sidecarLogName(pod)
	if !known {
		return fmt.Sprintf("the pod carries the %s container and the %s annotation, but its %s cannot be read here (it comes from a Secret, a ConfigMap or envFrom, or is missing): set it as a literal or $(%s).$(%s), or create the pod without the sidecar and let the webhook inject it",
			SidecarName, contract.AnnotationStatus, envLogName, envPodNamespace, envPodName)
	}
	if allowed := checkLogNameIn(pod.Namespace, name); allowed != "" {
		return fmt.Sprintf("the pod carries the %s container and the %s annotation, and its %s is %s: %s; or create the pod without the sidecar and let the webhook inject it",
			SidecarName, contract.AnnotationStatus, envLogName, quote(name), allowed)
	}
	return ""
}

// checkDefaultLogName checks the default log name of a pod that
// ms2m.io/log-name does not name, as far as the pod's name is known at
// admission: a pod made from generateName gets at most 63 characters. It
// returns "" or a message for the deny.
func checkDefaultLogName(pod *corev1.Pod) string {
	name := pod.Name
	if name == "" {
		// The API server appends 5 characters to generateName, cut to 58.
		name = pod.GenerateName[:min(len(pod.GenerateName), 58)] + "xxxxx"
	}
	n := DefaultLogName(pod.Namespace, name)
	if len(n) <= maxLogNameLen {
		return ""
	}
	return fmt.Sprintf("the pod's default replay log name %s is %d bytes, over RabbitMQ's %d for a stream name: set annotation %s to a shorter name that starts with %q",
		quote(n), len(n), maxLogNameLen, contract.AnnotationLogName, LogNamePrefix(pod.Namespace))
}
