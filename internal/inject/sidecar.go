package inject

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ms2m/ms2m/internal/contract"
)

// The sidecar's environment (docs/sidecar.md lists what each one means).
const (
	envPodName          = "POD_NAME"
	envPodNamespace     = "POD_NAMESPACE"
	envListen           = "MS2M_LISTEN"
	envUpstream         = "MS2M_UPSTREAM"
	envUpstreamTLS      = "MS2M_UPSTREAM_TLS"
	envUpstreamCA       = "MS2M_UPSTREAM_TLS_CA_FILE"
	envUpstreamCert     = "MS2M_UPSTREAM_TLS_CERT_FILE"
	envUpstreamKey      = "MS2M_UPSTREAM_TLS_KEY_FILE"
	envUpstreamSNI      = "MS2M_UPSTREAM_TLS_SERVER_NAME"
	envUpstreamAuth     = "MS2M_UPSTREAM_AUTH"
	envUpstreamUsername = "MS2M_UPSTREAM_USERNAME"
	envUpstreamPassword = "MS2M_UPSTREAM_PASSWORD"
	envUpstreamVHost    = "MS2M_UPSTREAM_VHOST"
	envAppConfigFiles   = "MS2M_APP_CONFIG_FILES"
	envStreamURI        = "MS2M_STREAM_URI"
	envLogName          = "MS2M_LOG_NAME"
	envLogMaxAge        = "MS2M_LOG_MAX_AGE"
	envLogMaxBytes      = "MS2M_LOG_MAX_BYTES"
	envControlListen    = "MS2M_CONTROL_LISTEN"
	envControlToken     = "MS2M_CONTROL_TOKEN"
	envReplayStart      = "MS2M_REPLAY_START"
	envReplayCutoff     = "MS2M_REPLAY_CUTOFF"
	envReplayEpoch      = "MS2M_REPLAY_EPOCH"
	envReplaySkip       = "MS2M_REPLAY_SKIP"
	envBroker           = "MS2M_BROKER"
	envNATSLogURL       = "MS2M_NATS_URL"
	envStateDir         = "MS2M_STATE_DIR"
)

// defaultLogNameValue is the injected MS2M_LOG_NAME when ms2m.io/log-name
// names no log: the kubelet expands it to DefaultLogName of the pod.
var defaultLogNameValue = DefaultLogName("$("+envPodNamespace+")", "$("+envPodName+")")

// sidecarSpec is what varies between injections.
type sidecarSpec struct {
	upstream    []corev1.EnvVar // MS2M_UPSTREAM and what goes with it
	logName     string
	logMaxAge   string // "" leaves the sidecar's default
	logMaxBytes string // "" leaves the sidecar's default
	nats        bool   // the app speaks NATS: a NATS sidecar with its log on JetStream
}

// The Secret of contract.AnnotationUpstreamTLSSecret, as the sidecar mounts it.
const (
	upstreamTLSVolume = "ms2m-upstream-tls"
	upstreamTLSDir    = "/etc/ms2m/upstream-tls"
)

// applyUpstreamTLS mounts the Secret of contract.AnnotationUpstreamTLSSecret into
// the sidecar and points its TLS settings at it, and applies the server
// name and auth annotations. It returns what it did, for the status; an
// error when the pod already has a volume of the name it needs.
func applyUpstreamTLS(pod *corev1.Pod, sidecar *corev1.Container) ([]string, error) {
	ann := pod.Annotations
	var lines []string
	if secret := ann[contract.AnnotationUpstreamTLSSecret]; secret != "" {
		for _, v := range pod.Spec.Volumes {
			if v.Name == upstreamTLSVolume {
				return nil, denyf("the pod has a volume named %s, which ms2m needs for %s; rename it", upstreamTLSVolume, contract.AnnotationUpstreamTLSSecret)
			}
		}
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: upstreamTLSVolume,
			VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}}})
		sidecar.VolumeMounts = append(sidecar.VolumeMounts, corev1.VolumeMount{Name: upstreamTLSVolume, MountPath: upstreamTLSDir, ReadOnly: true})
		if !hasEnv(sidecar, envUpstreamTLS) {
			sidecar.Env = append(sidecar.Env, corev1.EnvVar{Name: envUpstreamTLS, Value: "true"})
		}
		sidecar.Env = append(sidecar.Env, corev1.EnvVar{Name: envUpstreamCA, Value: upstreamTLSDir + "/ca.crt"})
		line := fmt.Sprintf("TLS to the broker: the sidecar verifies it with ca.crt of Secret %s", secret)
		if ann[contract.AnnotationUpstreamAuth] == "EXTERNAL" {
			sidecar.Env = append(sidecar.Env,
				corev1.EnvVar{Name: envUpstreamCert, Value: upstreamTLSDir + "/tls.crt"},
				corev1.EnvVar{Name: envUpstreamKey, Value: upstreamTLSDir + "/tls.key"})
			line += " and logs in by EXTERNAL with its tls.crt and tls.key"
		}
		lines = append(lines, line)
	}
	if v := ann[contract.AnnotationUpstreamTLSServerName]; v != "" {
		sidecar.Env = append(sidecar.Env, corev1.EnvVar{Name: envUpstreamSNI, Value: v})
	}
	if v := ann[contract.AnnotationUpstreamAuth]; v != "" {
		sidecar.Env = append(sidecar.Env, corev1.EnvVar{Name: envUpstreamAuth, Value: v})
	}
	return lines, nil
}

// The sidecar's state folder, an emptyDir: it outlives the sidecar's
// container, so that a sidecar restarted while stopped starts stopped.
const (
	stateVolume = "ms2m-state"
	stateDir    = "/var/run/ms2m-state"
)

// applyStateDir gives the sidecar its state folder; an error when the pod
// already has a volume of that name.
func applyStateDir(pod *corev1.Pod, sidecar *corev1.Container) error {
	for _, v := range pod.Spec.Volumes {
		if v.Name == stateVolume {
			return denyf("the pod has a volume named %s, which ms2m needs for its sidecar's state; rename it", stateVolume)
		}
	}
	limit := resource.MustParse("1Mi")
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: stateVolume,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &limit}}})
	sidecar.VolumeMounts = append(sidecar.VolumeMounts, corev1.VolumeMount{Name: stateVolume, MountPath: stateDir})
	sidecar.Env = append(sidecar.Env, corev1.EnvVar{Name: envStateDir, Value: stateDir})
	return nil
}

func hasEnv(c *corev1.Container, name string) bool {
	for _, e := range c.Env {
		if e.Name == name {
			return true
		}
	}
	return false
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
	listen := cfg.ListenPort
	logURL := corev1.EnvVar{Name: envStreamURI, ValueFrom: secretRef(cfg.StreamURI)}
	env := []corev1.EnvVar{
		{Name: envPodName, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
		{Name: envPodNamespace, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}},
	}
	if s.nats {
		listen = cfg.NATSListenPort
		logURL = corev1.EnvVar{Name: envNATSLogURL, ValueFrom: secretRef(cfg.NATSURL)}
		env = append(env, corev1.EnvVar{Name: envBroker, Value: "nats"})
	}
	env = append(env, corev1.EnvVar{Name: envListen, Value: localhost + ":" + strconv.Itoa(int(listen))})
	env = append(env, s.upstream...)
	env = append(env,
		logURL,
		corev1.EnvVar{Name: envLogName, Value: s.logName},
	)
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

// unsetEnv removes every var named name from c.
func unsetEnv(c *corev1.Container, name string) {
	c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
}

func ptr[T any](v T) *T { return &v }

// LogName returns the replay log the injected sidecar of pod writes to:
// its MS2M_LOG_NAME with $(VAR) references expanded as the kubelet expands
// them (see sidecarLogName). It is "" for a pod without the sidecar.
func LogName(pod *corev1.Pod) string {
	name, _ := sidecarLogName(pod)
	return name
}

// sidecarLogName expands the sidecar's MS2M_LOG_NAME as the kubelet will:
// a $(VAR) takes the value of the env entry VAR defined before it, a
// literal (itself expanded) or the pod's metadata.name or
// metadata.namespace by field reference; "$$" is a "$"; a reference to a
// variable not defined stays as written. known is false when the name
// depends on what cannot be read here (a Secret, a ConfigMap, envFrom) or
// when the sidecar sets none. A pod without a name yet (generateName) reads
// as its generateName.
func sidecarLogName(pod *corev1.Pod) (name string, known bool) {
	i := sidecarIndex(pod.Spec.InitContainers)
	if i < 0 {
		return "", false
	}
	type value struct {
		v     string
		known bool
	}
	vars := map[string]value{}
	podName := pod.Name
	if podName == "" {
		podName = pod.GenerateName
	}
	for _, e := range pod.Spec.InitContainers[i].Env {
		var v value
		switch {
		case e.ValueFrom == nil:
			v.v, v.known = expandEnvRefs(e.Value, func(ref string) (string, bool, bool) {
				r, ok := vars[ref]
				return r.v, r.known, ok
			})
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			v = value{podName, true}
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			v = value{pod.Namespace, true}
		}
		vars[e.Name] = v
	}
	v, ok := vars[envLogName]
	return v.v, ok && v.known
}

// expandEnvRefs expands the $(VAR) references in s with lookup, which says
// the value, whether it is known, and whether VAR is defined at all.
func expandEnvRefs(s string, lookup func(string) (v string, known, defined bool)) (string, bool) {
	var b strings.Builder
	known := true
	for len(s) > 0 {
		i := strings.IndexByte(s, '$')
		if i < 0 || i == len(s)-1 {
			b.WriteString(s)
			break
		}
		b.WriteString(s[:i])
		s = s[i:]
		switch s[1] {
		case '$':
			b.WriteByte('$')
			s = s[2:]
		case '(':
			end := strings.IndexByte(s, ')')
			if end < 0 {
				b.WriteString(s)
				s = ""
				continue
			}
			v, k, defined := lookup(s[2:end])
			if defined {
				b.WriteString(v)
				known = known && k
			} else {
				b.WriteString(s[:end+1])
			}
			s = s[end+1:]
		default:
			b.WriteByte('$')
			s = s[1:]
		}
	}
	return b.String(), known
}

// AppContainers returns the names of pod's app containers (every
// container but ms2m's own, or the one ms2m.io/container names), the
// first being AppContainer's: each is checkpointed and restored; nil for a
// pod without containers.
func AppContainers(pod *corev1.Pod) []string {
	var out []string
	for _, c := range appContainers(pod) {
		out = append(out, c.Name)
	}
	return out
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
