package inject

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// restoreAnnotations are set together by the migrator on a target pod.
var restoreAnnotations = []string{
	contract.AnnotationRestoreImage,
	contract.AnnotationRestoreNode,
	contract.AnnotationReplayStart,
	contract.AnnotationReplayCutoff,
	contract.AnnotationLogName,
	contract.AnnotationMigrationName,
}

// restoreOnly are the restore annotations that mean nothing without
// contract.AnnotationRestoreImage (contract.AnnotationLogName does: it names the log).
var restoreOnly = []string{contract.AnnotationRestoreImages, contract.AnnotationRestoreNode, contract.AnnotationReplayStart, contract.AnnotationReplayCutoff, contract.AnnotationReplayEpoch, contract.AnnotationReplaySkip, contract.AnnotationMigrationName, contract.AnnotationRestoreSignature}

// restoreAsked says whether the pod asks to be a restore, and the
// migration's name as far as it is known ("" when it is not).
func restoreAsked(pod *corev1.Pod, pending *Migration) (bool, string) {
	if _, ok := pod.Annotations[contract.AnnotationRestoreImage]; ok {
		return true, pod.Annotations[contract.AnnotationMigrationName]
	}
	if pending != nil {
		return true, pending.Name
	}
	return false, ""
}

// restoreRequest is the restore the pod is the target of: from its
// annotations (the migrator created it), else from the pending migration
// (a StatefulSet controller created it). The annotations' values have been
// checked already; here their presence is, and the controller's signature
// (checkRestoreSignature).
func restoreRequest(pod *corev1.Pod, pending *Migration, cfg Config) (*Migration, []string, error) {
	ann := pod.Annotations
	var warnings []string
	if _, ok := ann[contract.AnnotationRestoreImage]; ok {
		var missing []string
		for _, k := range restoreAnnotations {
			if _, ok := ann[k]; !ok {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 {
			verb := "are"
			if len(missing) == 1 {
				verb = "is"
			}
			return nil, nil, denyf("annotation %s makes the pod a restore target, but %s %s missing: the migrator sets %s together",
				contract.AnnotationRestoreImage, strings.Join(missing, ", "), verb, strings.Join(restoreAnnotations, ", "))
		}
		m := &Migration{
			Name:         ann[contract.AnnotationMigrationName],
			Image:        ann[contract.AnnotationRestoreImage],
			Node:         ann[contract.AnnotationRestoreNode],
			LogName:      ann[contract.AnnotationLogName],
			ReplayStart:  ann[contract.AnnotationReplayStart],
			ReplayCutoff: ann[contract.AnnotationReplayCutoff],
			ReplayEpoch:  ann[contract.AnnotationReplayEpoch],
			ReplaySkip:   ann[contract.AnnotationReplaySkip],
			Signature:    ann[contract.AnnotationRestoreSignature],
		}
		if v, ok := ann[contract.AnnotationRestoreImages]; ok {
			images, msg := ParseImages(v)
			if msg != "" {
				return nil, nil, denyf("annotation %s is %s: %s", contract.AnnotationRestoreImages, quote(v), msg)
			}
			m.Images = images
		}
		if msg := checkRestoreSignature(cfg, pod.Namespace, pod.Name, "annotation "+contract.AnnotationRestoreImage,
			"remove the restore annotations, which ms2m did not write (the controller signs them in "+contract.AnnotationRestoreSignature+")", m); msg != "" {
			return nil, nil, denyf("%s", msg)
		}
		if pending != nil {
			warnings = append(warnings, fmt.Sprintf("pending migration %q ignored: the pod's restore annotations (migration %q) win", pending.Name, m.Name))
		}
		if err := checkRestoreImages(pod, m); err != nil {
			return nil, nil, err
		}
		return m, warnings, nil
	}
	for _, k := range restoreOnly {
		if _, ok := ann[k]; ok {
			warnings = append(warnings, fmt.Sprintf("annotation %s ignored without %s", k, contract.AnnotationRestoreImage))
		}
	}
	if pending == nil {
		return nil, warnings, nil
	}
	if err := checkPending(pod.Namespace, pending); err != nil {
		return nil, warnings, err
	}
	where := fmt.Sprintf("pending migration %q (ConfigMap %s)", pending.Name, contract.PendingConfigMapName(pod.Name))
	if msg := checkRestoreSignature(cfg, pod.Namespace, pod.Name, where,
		"delete the ConfigMap, which ms2m did not write (the controller signs its key \"signature\")", pending); msg != "" {
		return nil, warnings, denyf("%s", msg)
	}
	m := *pending
	if err := checkRestoreImages(pod, &m); err != nil {
		return nil, warnings, err
	}
	return &m, warnings, nil
}

// checkPending checks a pending migration that the migrator recorded for a
// pod in namespace.
func checkPending(namespace string, p *Migration) error {
	var bad []string
	add := func(field, v, allowed string) {
		if allowed != "" {
			bad = append(bad, fmt.Sprintf("%s is %s: %s", field, quote(v), allowed))
		}
	}
	add("name", p.Name, checkMigrationName(p.Name))
	if p.Image == "" || strings.ContainsAny(p.Image, " \t\r\n") {
		add("image", p.Image, "use the checkpoint image's reference")
	}
	add("node", p.Node, checkNodeName(p.Node))
	add("logName", p.LogName, checkLogNameIn(namespace, p.LogName))
	add("replayStart", p.ReplayStart, checkReplayStart(p.ReplayStart))
	add("replayCutoff", p.ReplayCutoff, checkReplayCutoff(p.ReplayCutoff))
	if p.ReplayEpoch != "" {
		add("replayEpoch", p.ReplayEpoch, checkReplayEpoch(p.ReplayEpoch))
	}
	if msg := checkReplayRange(p.ReplayStart, p.ReplayCutoff); msg != "" {
		bad = append(bad, msg)
	}
	if p.ReplaySkip != "" {
		add("replaySkip", p.ReplaySkip, checkReplaySkip(p.ReplaySkip))
	}
	if len(p.Images) > 0 {
		if _, msg := ParseImages(EncodeImages(p.Images)); msg != "" {
			bad = append(bad, "images: "+msg)
		}
	}
	if len(bad) > 0 {
		return denyf("pending migration %q for this pod is invalid (%s): the migrator must fix or delete it", p.Name, strings.Join(bad, "; "))
	}
	return nil
}

// Prefixes of the Rewritten lines that a restore writes; a later restore
// of a copy of the pod replaces them.
const (
	restoreLineImage   = "image of container "
	restoreLineNode    = "spec.nodeName: "
	restoreLineSidecar = SidecarName + ": "
)

func isRestoreLine(s string) bool {
	return strings.HasPrefix(s, restoreLineImage) || strings.HasPrefix(s, restoreLineNode) || strings.HasPrefix(s, restoreLineSidecar)
}

// applyRestore turns an injected pod into the restore m: the app's image
// becomes the checkpoint image, the pod is pinned to the target node, and
// the sidecar replays the source's log over m's range.
func applyRestore(pod *corev1.Pod, app, sidecar *corev1.Container, m *Migration) []string {
	var lines []string
	if app.Image != m.Image {
		lines = append(lines, fmt.Sprintf("%s%q: %s → %s (the checkpoint of migration %s)", restoreLineImage, app.Name, orUnset(app.Image), m.Image, m.Name))
		app.Image = m.Image
	}
	for _, c := range otherApps(pod) {
		if img, ok := m.Images[c.Name]; ok && c.Image != img {
			lines = append(lines, fmt.Sprintf("%s%q: %s → %s (the checkpoint of migration %s)", restoreLineImage, c.Name, orUnset(c.Image), img, m.Name))
			c.Image = img
		}
	}
	if pod.Spec.NodeName != m.Node {
		lines = append(lines, fmt.Sprintf("%s%s → %s (pinned to the restore's target node)", restoreLineNode, orUnset(pod.Spec.NodeName), m.Node))
		pod.Spec.NodeName = m.Node
	}
	setEnv(sidecar, envLogName, m.LogName)
	setEnv(sidecar, envReplayStart, m.ReplayStart)
	setEnv(sidecar, envReplayCutoff, m.ReplayCutoff)
	epoch := m.ReplayEpoch
	if epoch == "" {
		epoch = "0"
	}
	setEnv(sidecar, envReplayEpoch, epoch)
	if m.ReplaySkip != "" {
		setEnv(sidecar, envReplaySkip, m.ReplaySkip)
	} else {
		unsetEnv(sidecar, envReplaySkip) // a copy of a rebuilt pod's spec carries its own
	}
	cutoff := "the cutoff marker"
	if epoch != "0" {
		cutoff += " of an epoch after " + epoch
	}
	switch m.ReplayCutoff {
	case "marker":
	case "end":
		cutoff = "the log's end when it starts"
	default:
		cutoff = "ID " + m.ReplayCutoff
	}
	lines = append(lines, fmt.Sprintf("%sreplays log %s after ID %s up to %s (migration %s)", restoreLineSidecar, m.LogName, m.ReplayStart, cutoff, m.Name))
	return lines
}

func orUnset(s string) string {
	if s == "" {
		return "(unset)"
	}
	return s
}

// RestoreRequestAnnotations are the annotations that ask for a restore. A
// restored pod that has taken over needs none of them: the migrator
// removes them, and records what they said in contract.AnnotationRestoredFrom.
var RestoreRequestAnnotations = []string{
	contract.AnnotationRestoreImage,
	contract.AnnotationRestoreNode,
	contract.AnnotationReplayStart,
	contract.AnnotationReplayCutoff,
	contract.AnnotationReplayEpoch,
	contract.AnnotationReplaySkip,
	contract.AnnotationRestoreImages,
	contract.AnnotationMigrationName,
	contract.AnnotationRestoreSignature,
}

// RestoredFrom is the JSON in contract.AnnotationRestoredFrom: the restore a pod
// was made as, from its sidecar's settings (what it replayed).
type RestoredFrom struct {
	Migration string `json:"migration"`
	// Image is the checkpoint image the app container runs from; a
	// restarted app starts from it again.
	Image string `json:"image"`
	// LogName, ReplayStart (the checkpoint ID), ReplayCutoff ("marker" or
	// an ID) and ReplayEpoch are the replay the sidecar was given.
	LogName      string `json:"logName"`
	ReplayStart  string `json:"replayStart"`
	ReplayCutoff string `json:"replayCutoff"`
	ReplayEpoch  string `json:"replayEpoch,omitempty"`
	// ReplaySkip are the IDs the replay left out (MS2M_REPLAY_SKIP).
	ReplaySkip string `json:"replaySkip,omitempty"`
	// AppRestarts is the app container's restartCount when the pod took
	// over (the migrator sets it): a higher count means the app restarted
	// since, from the checkpoint, and its state must be rebuilt.
	AppRestarts int32 `json:"appRestarts"`
}

// RestoredFromPod reads the restore pod was made as from its status and
// its sidecar's environment; false if it is not a restore.
func RestoredFromPod(pod *corev1.Pod) (RestoredFrom, bool) {
	st, injected := injectedStatus(pod)
	if !injected || st.Restore == "" {
		return RestoredFrom{}, false
	}
	out := RestoredFrom{Migration: st.Restore}
	if app := appContainer(pod); app != nil {
		out.Image = app.Image
	}
	for _, e := range pod.Spec.InitContainers[sidecarIndex(pod.Spec.InitContainers)].Env {
		switch e.Name {
		case envReplayStart:
			out.ReplayStart = e.Value
		case envReplayCutoff:
			out.ReplayCutoff = e.Value
		case envReplayEpoch:
			out.ReplayEpoch = e.Value
		case envReplaySkip:
			out.ReplaySkip = e.Value
		}
	}
	out.LogName = LogName(pod)
	return out, true
}

// Encode is r as contract.AnnotationRestoredFrom's value.
func (r RestoredFrom) Encode() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// EncodeImages is images (container → checkpoint image) as
// contract.AnnotationRestoreImages's value: "container=image",
// comma-separated, sorted by container.
func EncodeImages(images map[string]string) string {
	names := make([]string, 0, len(images))
	for n := range images {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + "=" + images[n]
	}
	return strings.Join(parts, ",")
}

// ParseImages reads contract.AnnotationRestoreImages's value; msg says
// what is wrong with it, if anything.
func ParseImages(v string) (map[string]string, string) {
	out := map[string]string{}
	prev := ""
	for _, part := range strings.Split(v, ",") {
		name, img, ok := strings.Cut(part, "=")
		switch {
		case !ok || name == "" || img == "" || strings.ContainsAny(part, " \t\r\n"):
			return nil, "want container=image, comma-separated"
		case name <= prev:
			return nil, "want each container once, sorted by name"
		}
		out[name], prev = img, name
	}
	return out, ""
}

// checkRestoreImages denies a restore m whose Images name a container that
// is not one of pod's app containers after the first.
func checkRestoreImages(pod *corev1.Pod, m *Migration) error {
	others := map[string]bool{}
	for _, c := range otherApps(pod) {
		others[c.Name] = true
	}
	for name := range m.Images {
		if !others[name] {
			return denyf("the restore of migration %s names a checkpoint image for container %q, which is not one of the pod's app containers after the first", m.Name, name)
		}
	}
	return nil
}

// otherApps are pod's app containers after the first.
func otherApps(pod *corev1.Pod) []*corev1.Container {
	if apps := appContainers(pod); len(apps) > 1 {
		return apps[1:]
	}
	return nil
}
