package inject

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// StatusVersion is Status.Version as this package writes it.
const StatusVersion = "v1"

// Skip reasons that callers may match. Every other reason is prose for
// people (an admission warning, an Event).
const (
	// ReasonAlreadyInjected is the whole of Result.Skipped when the pod
	// already has the sidecar and the status annotation.
	ReasonAlreadyInjected = "already injected"
	// ReasonNotOptedIn starts the one skip reason of a pod that did not
	// opt in; the rest says why.
	ReasonNotOptedIn = "not opted in: "
)

// Inject decides what to do with a pod at its creation, and does it on a
// copy: in.Pod is never modified.
//
// It returns one of:
//   - Result.Pod set: the pod, mutated. Result.Skipped may still list env
//     vars that could not be rewritten; Result.Rewritten says what changed;
//     Result.Restore is set when the pod was turned into a restore.
//   - Result.Pod nil and a nil error: the pod is left alone, for the
//     reasons in Result.Skipped (ReasonAlreadyInjected, ReasonNotOptedIn…,
//     or why the sidecar cannot proxy its broker). Admit it unchanged.
//   - a *DenyError: the pod asks for something wrong (a bad ms2m.io/
//     annotation value, a container of the sidecar's name, a restore that
//     lacks its annotations or cannot be carried out). Deny the request
//     with its message. Result.Warnings may still be set.
//   - another error: the Config is invalid (see Config.Validate) or in.Pod
//     is nil. Nothing about the pod is known.
//
// Result.Warnings (unknown annotations under ms2m.io/, ignored settings)
// go back in the admission response in every case.
//
// Injection is idempotent: Inject on its own output returns
// ReasonAlreadyInjected, and so does it on any pod with the sidecar init
// container and the status annotation, except one that asks to be the
// restore target of a migration its status does not record (the migrator
// copied an injected pod): then only the restore is applied, to the
// sidecar that is there.
//
// Last, no image of the pod may lie in the checkpoint repository
// (CheckImages): only the app container of a restore the controller
// ordered for this pod runs a checkpoint image.
func Inject(in Input, cfg Config) (Result, error) {
	var carried *Migration
	res, err := decide(in, cfg, &carried)
	if err != nil {
		return res, err
	}
	final, instruction := res.Pod, res.Restore
	if final == nil {
		final = in.Pod
	}
	if instruction == nil {
		instruction = carried
	}
	if err := CheckImages(final, nil, cfg, instruction); err != nil {
		return Result{Warnings: res.Warnings}, err
	}
	return res, nil
}

// decide is Inject before the image check. carried is set to the verified
// restore instruction of a pod that is left alone because it was restored
// by it already (the webhook called again after another webhook's change).
func decide(in Input, cfg Config, carried **Migration) (Result, error) {
	if in.Pod == nil {
		return Result{}, errors.New("inject: Input.Pod is nil")
	}
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	cfg = cfg.withDefaults()
	pod := in.Pod

	if err := checkInjectAnnotation(pod); err != nil {
		return Result{}, err
	}

	asked, askedName := restoreAsked(pod, in.Pending)
	status, injected := injectedStatus(pod)
	if injected && (!asked || (askedName != "" && askedName == status.Restore)) {
		// A pod can carry the sidecar and the status from its author, not
		// from ms2m: its log must still be its namespace's.
		if msg := checkInjectedLogName(pod); msg != "" {
			return Result{}, denyf("%s", msg)
		}
		if asked {
			if m, _, err := restoreRequest(pod, in.Pending, cfg); err == nil {
				*carried = m
			}
		}
		return Result{Skipped: []string{ReasonAlreadyInjected}}, nil
	}

	var warnings []string
	if reason, ok := optedIn(pod, in.NamespaceLabels); !ok {
		if !asked {
			return Result{Skipped: []string{ReasonNotOptedIn + reason}}, nil
		}
		if pod.Annotations[contract.AnnotationInject] == "false" || pod.Labels[contract.LabelInject] == "false" {
			warnings = append(warnings, fmt.Sprintf("%s is \"false\", but the pod is a restore target: injected all the same", contract.AnnotationInject))
		}
	}

	if !injected {
		if name, ok := foreignSidecar(pod); ok {
			return Result{Warnings: warnings}, denyf("%s named %s exists but was not injected by ms2m (the pod has no %s annotation); rename it",
				name, SidecarName, contract.AnnotationStatus)
		}
	}

	w, err := checkAnnotations(pod)
	warnings = append(warnings, w...)
	if err != nil {
		return Result{Warnings: warnings}, err
	}
	restore, w, err := restoreRequest(pod, in.Pending, cfg)
	warnings = append(warnings, w...)
	if err != nil {
		return Result{Warnings: warnings}, err
	}

	// leaveAlone skips the pod, or denies it when it is a restore target:
	// a restore must not start without its sidecar and replay.
	leaveAlone := func(reasons []string) (Result, error) {
		if restore != nil {
			return Result{Warnings: warnings}, denyf("the pod is the restore target of migration %s, but ms2m cannot inject it: %s",
				restore.Name, strings.Join(reasons, "; "))
		}
		return Result{Skipped: reasons, Warnings: warnings}, nil
	}

	if reasons := podProblems(pod, cfg); len(reasons) > 0 {
		return leaveAlone(reasons)
	}
	out := pod.DeepCopy()
	app := appContainer(out)
	if app == nil {
		return leaveAlone([]string{"the pod has no containers"})
	}

	if injected {
		// A copy of an injected pod: the app's settings point at the
		// sidecar already; make that sidecar replay.
		sidecar := &out.Spec.InitContainers[sidecarIndex(out.Spec.InitContainers)]
		if restore != nil && isNATSSidecar(sidecar) {
			return Result{Warnings: warnings}, denyf("%s", errNATSRestore)
		}
		lines := applyRestore(out, app, sidecar, restore)
		var kept []string
		for _, l := range status.Rewritten {
			if !isRestoreLine(l) {
				kept = append(kept, l)
			}
		}
		st := Status{Version: StatusVersion, Sidecar: sidecar.Image, Rewritten: append(kept, lines...), Restore: restore.Name}
		if err := setStatus(out, st); err != nil {
			return Result{Warnings: warnings}, err
		}
		return Result{Pod: out, Rewritten: lines, Warnings: warnings, Restore: restore}, nil
	}

	br := rewriteBroker(app, pod.Annotations[contract.AnnotationBrokerEnv], cfg.ListenPort)
	nats := false
	if br.fatal != "" && br.considered == 0 {
		// No AMQP setting at all: a NATS app, perhaps.
		nb, considered := rewriteNATS(app, cfg.NATSListenPort)
		switch {
		case considered == 0:
		case nb.fatal != "":
			return leaveAlone(append(nb.skipped, nb.fatal))
		case cfg.NATSURL.Name == "":
			return leaveAlone(append(nb.skipped, fmt.Sprintf("container %q speaks NATS (%s), but the webhook has no natsURL configured for the replay log",
				app.Name, strings.Join(wellKnownNATSEnv, ", "))))
		default:
			br, nats = nb, true
		}
	}
	if !nats && br.fatal != "" && br.noneSet && pod.Annotations[contract.AnnotationBrokerEnv] == "" {
		if fa, ok := fromAppSettings(out, app, cfg.ListenPort); ok {
			br = fa
		}
	}
	if !nats {
		if fatal, warning := springAbove(app); fatal != "" && br.fatal == "" {
			br.fatal = fatal
		} else if warning != "" {
			br.skipped = append(br.skipped, warning)
		}
	}
	if br.fatal != "" {
		return leaveAlone(append(br.skipped, br.fatal))
	}
	app.Env = br.env
	rewritten := br.rewritten
	skipped := br.skipped
	if line, reason := checkpointable(app); line != "" {
		rewritten = append(rewritten, line)
	} else if reason != "" {
		skipped = append(skipped, reason)
	}

	spec := sidecarSpec{upstream: br.upstream, logName: defaultLogNameValue, nats: nats}
	if v, ok := pod.Annotations[contract.AnnotationLogName]; ok {
		spec.logName = v
	} else if msg := checkDefaultLogName(pod); msg != "" && restore == nil {
		return Result{Warnings: warnings}, denyf("%s", msg)
	}
	spec.logMaxAge = cfg.LogMaxAge
	if v, ok := pod.Annotations[contract.AnnotationLogMaxAge]; ok {
		spec.logMaxAge = v
	}
	if cfg.LogMaxBytes > 0 {
		spec.logMaxBytes = fmt.Sprint(cfg.LogMaxBytes)
	}
	if v, ok := pod.Annotations[contract.AnnotationLogMaxBytes]; ok {
		spec.logMaxBytes = v
	}
	if nats && restore != nil {
		return Result{Warnings: warnings}, denyf("%s", errNATSRestore)
	}
	sc := sidecarContainer(cfg, spec)
	sc.EnvFrom, sc.VolumeMounts = br.envFrom, br.mounts
	out.Spec.InitContainers = append(out.Spec.InitContainers, sc)
	tlsLines, err := applyUpstreamTLS(out, &out.Spec.InitContainers[len(out.Spec.InitContainers)-1])
	if err != nil {
		return Result{Warnings: warnings}, err
	}
	rewritten = append(rewritten, tlsLines...)

	st := Status{Version: StatusVersion, Sidecar: cfg.SidecarImage}
	if restore != nil {
		sidecar := &out.Spec.InitContainers[len(out.Spec.InitContainers)-1]
		rewritten = append(rewritten, applyRestore(out, app, sidecar, restore)...)
		st.Restore = restore.Name
	}
	st.Rewritten = rewritten
	if err := setStatus(out, st); err != nil {
		return Result{Warnings: warnings}, err
	}
	return Result{Pod: out, Skipped: skipped, Rewritten: rewritten, Warnings: warnings, Restore: restore}, nil
}

// optedIn says whether the pod opted in, and if not, why not.
// contract.AnnotationInject and contract.LabelInject have been checked to be "true", "false"
// or absent. A "false" in either opts out; else a "true" in either opts
// in; else the namespace's label decides.
func optedIn(pod *corev1.Pod, nsLabels map[string]string) (string, bool) {
	label, hasLabel := nsLabels[contract.LabelNamespaceInject]
	ann, hasAnn := pod.Annotations[contract.AnnotationInject]
	podLabel, hasPodLabel := pod.Labels[contract.LabelInject]
	var out string
	switch {
	case hasAnn && ann == "false":
		out = fmt.Sprintf("annotation %s is \"false\"", contract.AnnotationInject)
	case hasPodLabel && podLabel == "false":
		out = fmt.Sprintf("label %s is \"false\"", contract.LabelInject)
	case ann == "true" || podLabel == "true":
		return "", true
	case label == "enabled":
		return "", true
	case hasLabel:
		return fmt.Sprintf("the pod has neither the annotation nor the label %s: \"true\", and its namespace's label %s is %s, not \"enabled\"",
			contract.AnnotationInject, contract.LabelNamespaceInject, quote(label)), false
	default:
		return fmt.Sprintf("the pod has neither the annotation nor the label %s: \"true\", nor its namespace the label %s=enabled", contract.AnnotationInject, contract.LabelNamespaceInject), false
	}
	if label == "enabled" {
		out += fmt.Sprintf(" (it overrides the namespace's label %s=enabled)", contract.LabelNamespaceInject)
	}
	return out, false
}

// injectedStatus reads the status of an earlier injection. The pod counts
// as injected when it has both the sidecar init container and the status
// annotation; a status that does not parse reads as empty.
func injectedStatus(pod *corev1.Pod) (Status, bool) {
	raw, ok := pod.Annotations[contract.AnnotationStatus]
	if !ok || sidecarIndex(pod.Spec.InitContainers) < 0 {
		return Status{}, false
	}
	var st Status
	_ = json.Unmarshal([]byte(raw), &st)
	return st, true
}

// foreignSidecar finds a container of the sidecar's name in a pod that
// ms2m did not inject, and says which kind it is.
func foreignSidecar(pod *corev1.Pod) (string, bool) {
	if sidecarIndex(pod.Spec.InitContainers) >= 0 {
		return "an init container", true
	}
	if sidecarIndex(pod.Spec.Containers) >= 0 {
		return "a container", true
	}
	for _, c := range pod.Spec.EphemeralContainers {
		if c.Name == SidecarName {
			return "an ephemeral container", true
		}
	}
	return "", false
}

func sidecarIndex(cs []corev1.Container) int {
	for i, c := range cs {
		if c.Name == SidecarName {
			return i
		}
	}
	return -1
}

// appContainer is the container whose broker settings are rewritten and
// whose image a restore replaces: the one contract.AnnotationContainer names
// (checked to exist), else the first.
func appContainer(pod *corev1.Pod) *corev1.Container {
	if len(pod.Spec.Containers) == 0 {
		return nil
	}
	if name, ok := pod.Annotations[contract.AnnotationContainer]; ok {
		for i := range pod.Spec.Containers {
			if pod.Spec.Containers[i].Name == name {
				return &pod.Spec.Containers[i]
			}
		}
	}
	return &pod.Spec.Containers[0]
}

// podProblems are the reasons the sidecar cannot run in this pod at all.
func podProblems(pod *corev1.Pod, cfg Config) []string {
	var reasons []string
	if pod.Spec.HostNetwork {
		reasons = append(reasons, "the pod uses hostNetwork: the sidecar's ports would be the node's")
	}
	if pod.Spec.OS != nil && pod.Spec.OS.Name != corev1.Linux {
		reasons = append(reasons, fmt.Sprintf("the pod runs on %s: the sidecar runs on Linux only", pod.Spec.OS.Name))
	}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if c.Name == SidecarName {
				continue // ms2m's own, in an injected pod
			}
			for _, p := range c.Ports {
				switch p.ContainerPort {
				case cfg.ListenPort:
					reasons = append(reasons, fmt.Sprintf("container %q declares port %d, where the sidecar listens for the app", c.Name, p.ContainerPort))
				case cfg.ControlPort:
					reasons = append(reasons, fmt.Sprintf("container %q declares port %d, the sidecar's control port", c.Name, p.ContainerPort))
				}
			}
		}
	}
	return reasons
}

// setStatus writes st as the pod's contract.AnnotationStatus.
func setStatus(pod *corev1.Pod, st Status) error {
	raw, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("inject: encode the %s annotation: %w", contract.AnnotationStatus, err)
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[contract.AnnotationStatus] = string(raw)
	return nil
}
