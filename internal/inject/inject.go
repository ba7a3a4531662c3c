package inject

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
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
//
// It checks, in order: the config, the inject annotation, an earlier
// injection, the opt-in, a foreign container of the sidecar's name, the
// ms2m.io/ annotations and the restore request; then it injects (inject),
// or makes an earlier injection's sidecar replay (restoreInjected).
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
		return alreadyInjected(in, cfg, asked, carried)
	}

	skip, warnings := optInCheck(pod, in.NamespaceLabels, asked)
	if skip != "" {
		return Result{Skipped: []string{skip}}, nil
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

	d := &decision{pod: pod, cfg: cfg, restore: restore, warnings: warnings}
	if reasons := podProblems(pod, cfg); len(reasons) > 0 {
		return d.leaveAlone(reasons)
	}
	out := pod.DeepCopy()
	app := appContainer(out)
	if app == nil {
		return d.leaveAlone([]string{"the pod has no containers"})
	}
	if injected {
		return d.restoreInjected(out, app, status)
	}
	return d.inject(out, app)
}

// alreadyInjected is decide for a pod that has the sidecar and the status
// annotation, and asks for no restore its status does not record: it is
// left alone. Its log name is checked all the same, since a pod can carry
// the sidecar and the status from its author, not from ms2m; and the
// restore it was made by is carried for the image check.
func alreadyInjected(in Input, cfg Config, asked bool, carried **Migration) (Result, error) {
	if msg := checkInjectedLogName(in.Pod); msg != "" {
		return Result{}, denyf("%s", msg)
	}
	if asked {
		if m, _, err := restoreRequest(in.Pod, in.Pending, cfg); err == nil {
			*carried = m
		}
	}
	return Result{Skipped: []string{ReasonAlreadyInjected}}, nil
}

// optInCheck says whether a pod that did not opt in is skipped, and why
// (skip), and warns when a restore target opted out: it is injected all the
// same, since a restore must not start without its sidecar.
func optInCheck(pod *corev1.Pod, nsLabels map[string]string, asked bool) (skip string, warnings []string) {
	reason, ok := optedIn(pod, nsLabels)
	if ok {
		return "", nil
	}
	if !asked {
		return ReasonNotOptedIn + reason, nil
	}
	if pod.Annotations[contract.AnnotationInject] == "false" || pod.Labels[contract.LabelInject] == "false" {
		warnings = append(warnings, fmt.Sprintf("%s is \"false\", but the pod is a restore target: injected all the same", contract.AnnotationInject))
	}
	return "", warnings
}

// decision is what decide has settled about a pod once its annotations and
// restore request are checked: the steps that mutate the pod share it.
type decision struct {
	pod      *corev1.Pod // the pod as created; never modified
	cfg      Config      // with defaults
	restore  *Migration  // the restore to apply, or nil
	warnings []string
}

// leaveAlone skips the pod, or denies it when it is a restore target:
// a restore must not start without its sidecar and replay.
func (d *decision) leaveAlone(reasons []string) (Result, error) {
	if d.restore != nil {
		return Result{Warnings: d.warnings}, denyf("the pod is the restore target of migration %s, but ms2m cannot inject it: %s",
			d.restore.Name, strings.Join(reasons, "; "))
	}
	return Result{Skipped: reasons, Warnings: d.warnings}, nil
}

// restoreInjected is decide for a copy of an injected pod that is a restore
// target: the app's settings point at the sidecar already; it makes that
// sidecar replay, and replaces the earlier restore's lines in the status.
func (d *decision) restoreInjected(out *corev1.Pod, app *corev1.Container, status Status) (Result, error) {
	sidecar := &out.Spec.InitContainers[sidecarIndex(out.Spec.InitContainers)]
	lines := applyRestore(out, app, sidecar, d.restore)
	var kept []string
	for _, l := range status.Rewritten {
		if !isRestoreLine(l) {
			kept = append(kept, l)
		}
	}
	st := Status{Version: StatusVersion, Sidecar: sidecar.Image, Rewritten: append(kept, lines...), Restore: d.restore.Name}
	if err := setStatus(out, st); err != nil {
		return Result{Warnings: d.warnings}, err
	}
	return Result{Pod: out, Rewritten: lines, Warnings: d.warnings, Restore: d.restore}, nil
}

// inject is decide for a pod without the sidecar: it points the app at the
// sidecar, adds the sidecar with its TLS settings, applies the restore if
// any, and records the status. out is the pod's copy, app its app container.
func (d *decision) inject(out *corev1.Pod, app *corev1.Container) (Result, error) {
	br, nats, reasons := chooseBroker(d.pod, out, app, d.cfg)
	if reasons != nil {
		return d.leaveAlone(reasons)
	}
	app.Env = br.env
	rewritten := br.rewritten
	skipped := br.skipped
	if line, reason := checkpointable(app); line != "" {
		rewritten = append(rewritten, line)
	} else if reason != "" {
		skipped = append(skipped, reason)
	}
	more, moreSkipped, reasons := d.rewriteOthers(out, br, nats)
	if reasons != nil {
		return d.leaveAlone(reasons)
	}
	rewritten, skipped = append(rewritten, more...), append(skipped, moreSkipped...)

	spec, err := d.sidecarSettings(br.upstream, nats)
	if err != nil {
		return Result{Warnings: d.warnings}, err
	}
	sc := sidecarContainer(d.cfg, spec)
	sc.EnvFrom, sc.VolumeMounts = br.envFrom, br.mounts
	out.Spec.InitContainers = append(out.Spec.InitContainers, sc)
	sidecar := &out.Spec.InitContainers[len(out.Spec.InitContainers)-1]
	tlsLines, err := applyUpstreamTLS(out, sidecar)
	if err != nil {
		return Result{Warnings: d.warnings}, err
	}
	rewritten = append(rewritten, tlsLines...)
	if err := applyStateDir(out, sidecar); err != nil {
		return Result{Warnings: d.warnings}, err
	}

	st := Status{Version: StatusVersion, Sidecar: d.cfg.SidecarImage}
	if d.restore != nil {
		rewritten = append(rewritten, applyRestore(out, app, sidecar, d.restore)...)
		st.Restore = d.restore.Name
	}
	st.Rewritten = rewritten
	if err := setStatus(out, st); err != nil {
		return Result{Warnings: d.warnings}, err
	}
	return Result{Pod: out, Skipped: skipped, Rewritten: rewritten, Warnings: d.warnings, Restore: d.restore}, nil
}

// rewriteOthers points the app containers after the first (appContainers)
// at the sidecar as well, whose one upstream connection per app connection
// serves them all: each must name the same broker as the first (br), by
// the same protocol (nats), or the pod is left alone (reasons). Their
// lines name the container.
func (d *decision) rewriteOthers(out *corev1.Pod, br brokerRewrite, nats bool) (rewritten, skipped, reasons []string) {
	apps := appContainers(out)
	for _, c := range otherApps(out) {
		if !setsBroker(c, d.pod.Annotations[contract.AnnotationBrokerEnv], d.cfg) {
			skipped = append(skipped, fmt.Sprintf("container %q: sets no broker variable, left as it is (it is checkpointed and restored with the others)", c.Name))
			continue
		}
		xb, xnats, why := chooseBroker(d.pod, out, c, d.cfg)
		if why != nil {
			return nil, nil, append(why, fmt.Sprintf("app container %q: ms2m checkpoints every app container, and each must reach the broker through the sidecar; name the one that holds the state in %s if the others keep none", c.Name, contract.AnnotationContainer))
		}
		if xnats != nats || !reflect.DeepEqual(xb.upstream, br.upstream) || !reflect.DeepEqual(xb.envFrom, br.envFrom) || !reflect.DeepEqual(xb.mounts, br.mounts) {
			return nil, nil, []string{fmt.Sprintf("app containers %q and %q reach different brokers (or the same one differently): the sidecar has one upstream for all of a pod's app containers", apps[0].Name, c.Name)}
		}
		c.Env = xb.env
		for _, l := range xb.rewritten {
			rewritten = append(rewritten, fmt.Sprintf("container %q: %s", c.Name, l))
		}
		for _, l := range xb.skipped {
			skipped = append(skipped, fmt.Sprintf("container %q: %s", c.Name, l))
		}
		if line, reason := checkpointable(c); line != "" {
			rewritten = append(rewritten, fmt.Sprintf("container %q: %s", c.Name, line))
		} else if reason != "" {
			skipped = append(skipped, fmt.Sprintf("container %q: %s", c.Name, reason))
		}
	}
	return rewritten, skipped, nil
}

// setsBroker says whether container c sets any AMQP or NATS variable ms2m
// knows (an extra app container may be a helper without a broker).
func setsBroker(c *corev1.Container, brokerEnv string, cfg Config) bool {
	if rewriteBroker(c.DeepCopy(), brokerEnv, cfg.ListenPort).considered > 0 {
		return true
	}
	_, considered := rewriteNATS(c.DeepCopy(), cfg.NATSListenPort)
	return considered > 0
}

// chooseBroker rewrites the app container's broker settings: AMQP ones,
// else NATS ones when it has no AMQP setting at all, else, for an app that
// sets no broker var and names none in ms2m.io/broker-env, the sources it
// reads its settings from (fromAppSettings). pod is the pod as created,
// out its copy. reasons is set when the pod must be left alone.
func chooseBroker(pod, out *corev1.Pod, app *corev1.Container, cfg Config) (br brokerRewrite, nats bool, reasons []string) {
	br = rewriteBroker(app, pod.Annotations[contract.AnnotationBrokerEnv], cfg.ListenPort)
	if br.fatal != "" && br.considered == 0 {
		// No AMQP setting at all: a NATS app, perhaps.
		nb, considered := rewriteNATS(app, cfg.NATSListenPort)
		switch {
		case considered == 0:
		case nb.fatal != "":
			return brokerRewrite{}, false, append(nb.skipped, nb.fatal)
		case cfg.NATSURL.Name == "":
			return brokerRewrite{}, false, append(nb.skipped, fmt.Sprintf("container %q speaks NATS (%s), but the webhook has no natsURL configured for the replay log",
				app.Name, strings.Join(wellKnownNATSEnv, ", ")))
		default:
			return nb, true, nil
		}
	}
	if br.fatal != "" && br.noneSet && pod.Annotations[contract.AnnotationBrokerEnv] == "" {
		if fa, ok := fromAppSettings(out, app, cfg.ListenPort); ok {
			br = fa
		}
	}
	if fatal, warning := springAbove(app); fatal != "" && br.fatal == "" {
		br.fatal = fatal
	} else if warning != "" {
		br.skipped = append(br.skipped, warning)
	}
	if br.fatal != "" {
		return brokerRewrite{}, false, append(br.skipped, br.fatal)
	}
	return br, false, nil
}

// sidecarSettings is the sidecar's spec for the broker upstream: the
// replay log's name and limits, from the pod's annotations over the
// config's. It denies a pod that takes the default log name where that
// name would not be its own, unless it is a restore target.
func (d *decision) sidecarSettings(upstream []corev1.EnvVar, nats bool) (sidecarSpec, error) {
	spec := sidecarSpec{upstream: upstream, logName: defaultLogNameValue, nats: nats}
	if v, ok := d.pod.Annotations[contract.AnnotationLogName]; ok {
		spec.logName = v
	} else if msg := checkDefaultLogName(d.pod); msg != "" && d.restore == nil {
		return sidecarSpec{}, denyf("%s", msg)
	}
	spec.logMaxAge = d.cfg.LogMaxAge
	if v, ok := d.pod.Annotations[contract.AnnotationLogMaxAge]; ok {
		spec.logMaxAge = v
	}
	if d.cfg.LogMaxBytes > 0 {
		spec.logMaxBytes = fmt.Sprint(d.cfg.LogMaxBytes)
	}
	if v, ok := d.pod.Annotations[contract.AnnotationLogMaxBytes]; ok {
		spec.logMaxBytes = v
	}
	return spec, nil
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

// appContainers are the containers of the pod's app, in the pod's order:
// every container but ms2m's own (the sidecar; injected init containers
// are not among pod.Spec.Containers), or only the one
// contract.AnnotationContainer names, which says the others keep no state.
// The first is appContainer's. Their broker settings are rewritten, and
// each is checkpointed and restored from a checkpoint image of its own.
func appContainers(pod *corev1.Pod) []*corev1.Container {
	first := appContainer(pod)
	if first == nil {
		return nil
	}
	out := []*corev1.Container{first}
	if _, named := pod.Annotations[contract.AnnotationContainer]; named {
		return out
	}
	for i := range pod.Spec.Containers {
		if c := &pod.Spec.Containers[i]; c != first && c.Name != SidecarName {
			out = append(out, c)
		}
	}
	return out
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
