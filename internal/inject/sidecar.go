package inject

import (
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The sidecar's environment (docs/sidecar.md lists what each one means).
const (
	envPodName       = "POD_NAME"
	envPodNamespace  = "POD_NAMESPACE"
	envListen        = "MS2M_LISTEN"
	envUpstream      = "MS2M_UPSTREAM"
	envStreamURI     = "MS2M_STREAM_URI"
	envLogName       = "MS2M_LOG_NAME"
	envLogMaxAge     = "MS2M_LOG_MAX_AGE"
	envLogMaxBytes   = "MS2M_LOG_MAX_BYTES"
	envControlListen = "MS2M_CONTROL_LISTEN"
	envControlToken  = "MS2M_CONTROL_TOKEN"
	envReplayStart   = "MS2M_REPLAY_START"
	envReplayCutoff  = "MS2M_REPLAY_CUTOFF"
	envReplayEpoch   = "MS2M_REPLAY_EPOCH"
)

// defaultLogNameValue is the injected MS2M_LOG_NAME when ms2m.io/log-name
// names no log: the kubelet expands it to DefaultLogName of the pod.
var defaultLogNameValue = DefaultLogName("$("+envPodNamespace+")", "$("+envPodName+")")

// sidecarSpec is what varies between injections.
type sidecarSpec struct {
	upstream    string // the broker's host:port
	logName     string
	logMaxAge   string // "" leaves the sidecar's default
	logMaxBytes string // "" leaves the sidecar's default
}

// sidecarContainer is the ms2m sidecar as a native sidecar: an init
// container with restartPolicy Always. Its startup probe holds back the
// app's containers until it listens and its replay log is open.
//
// The env is ordered so that MS2M_LOG_NAME's default,
// $(POD_NAMESPACE).$(POD_NAME), comes after the vars it refers to: the
// kubelet expands a reference only to a var defined earlier in the list.
// The name comes from the downward API, because a pod that a controller
// creates has no name yet at admission.
func sidecarContainer(cfg Config, s sidecarSpec) corev1.Container {
	env := []corev1.EnvVar{
		{Name: envPodName, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
		{Name: envPodNamespace, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}},
		{Name: envListen, Value: localhost + ":" + strconv.Itoa(int(cfg.ListenPort))},
		{Name: envUpstream, Value: s.upstream},
		{Name: envStreamURI, ValueFrom: secretRef(cfg.StreamURI)},
		{Name: envLogName, Value: s.logName},
	}
	if s.logMaxAge != "" {
		env = append(env, corev1.EnvVar{Name: envLogMaxAge, Value: s.logMaxAge})
	}
	if s.logMaxBytes != "" {
		env = append(env, corev1.EnvVar{Name: envLogMaxBytes, Value: s.logMaxBytes})
	}
	env = append(env,
		corev1.EnvVar{Name: envControlListen, Value: ":" + strconv.Itoa(int(cfg.ControlPort))},
		corev1.EnvVar{Name: envControlToken, ValueFrom: secretRef(cfg.ControlToken)},
	)

	always := corev1.ContainerRestartPolicyAlways
	return corev1.Container{
		Name:            SidecarName,
		Image:           cfg.SidecarImage,
		ImagePullPolicy: cfg.ImagePullPolicy,
		RestartPolicy:   &always,
		Ports: []corev1.ContainerPort{{
			Name:          ControlPortName,
			ContainerPort: cfg.ControlPort,
			Protocol:      corev1.ProtocolTCP,
		}},
		Env:       env,
		Resources: *cfg.Resources.DeepCopy(),
		// Two minutes for the replay log to open before the kubelet
		// restarts the sidecar; the app waits meanwhile.
		StartupProbe:   controlProbe("/readyz", 1, 120),
		ReadinessProbe: controlProbe("/readyz", 5, 3),
		LivenessProbe:  controlProbe("/healthz", 10, 3),
		// The sidecar says why it refused to start on stderr.
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr(true),
			RunAsUser:                ptr(cfg.RunAsUser),
			ReadOnlyRootFilesystem:   ptr(true),
			AllowPrivilegeEscalation: ptr(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}

func controlProbe(path string, period, failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: path,
			Port: intstr.FromString(ControlPortName),
		}},
		TimeoutSeconds:   1,
		PeriodSeconds:    period,
		FailureThreshold: failures,
	}
}

func secretRef(k SecretKey) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: k.Name},
		Key:                  k.Key,
	}}
}

// setEnv sets name to a literal value in c, replacing every var of that
// name (ms2m's own vars on its own sidecar) or appending it.
func setEnv(c *corev1.Container, name, value string) {
	found := false
	for i := range c.Env {
		if c.Env[i].Name == name {
			c.Env[i] = corev1.EnvVar{Name: name, Value: value}
			found = true
		}
	}
	if !found {
		c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
	}
}

func ptr[T any](v T) *T { return &v }

// LogName returns the replay log the injected sidecar of pod writes to:
// its MS2M_LOG_NAME with the pod's name and namespace filled in, as the
// kubelet expands them. It is "" for a pod without the sidecar.
func LogName(pod *corev1.Pod) string {
	i := sidecarIndex(pod.Spec.InitContainers)
	if i < 0 {
		return ""
	}
	for _, e := range pod.Spec.InitContainers[i].Env {
		if e.Name == envLogName {
			return strings.NewReplacer(
				"$("+envPodNamespace+")", pod.Namespace,
				"$("+envPodName+")", pod.Name,
			).Replace(e.Value)
		}
	}
	return ""
}

// AppContainer returns the name of the container ms2m treats as pod's app
// (the one checkpointed and restored): the one ms2m.io/container names,
// else the first; "" for a pod without containers.
func AppContainer(pod *corev1.Pod) string {
	if c := appContainer(pod); c != nil {
		return c.Name
	}
	return ""
}
