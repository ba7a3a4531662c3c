package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
)

// EvictionRetry is the Retry-After the refusal of an eviction suggests:
// kubectl drain retries every 5 s whatever it says.
const EvictionRetry = 5

// evictionStatus is the part of the controller's migration status
// (contract.AnnotationMigrationStatus) the webhook reads, for its message
// only: whether an eviction is let through never depends on it, except
// for the one case in evict that needs a node to be cordoned as well.
type evictionStatus struct {
	Name       string         `json:"name"`
	Phase      contract.Phase `json:"phase"`
	Target     string         `json:"target"`
	Source     string         `json:"source"`
	Evacuation string         `json:"evacuation"`
	Started    time.Time      `json:"started"`
	Message    string         `json:"message"`
	History    []struct {
		Name string `json:"name"`
	} `json:"history"`
}

// knows says whether st records migration name, now or in its history.
func (st evictionStatus) knows(name string) bool {
	if st.Name == name {
		return true
	}
	for _, e := range st.History {
		if e.Name == name {
			return true
		}
	}
	return false
}

// evict answers an eviction (CREATE of pods/eviction) of a pod. A pod that
// opted in (contract.AnnotationOnEvict, or its namespace's
// contract.LabelNamespaceOnEvict) and runs with the sidecar is not
// evicted: the answer is 429, which kubectl drain and the cluster
// autoscaler take as a PodDisruptionBudget's refusal and retry, and the
// pod is marked (contract.AnnotationEvacuate) for the controller to
// migrate it. Every other eviction is allowed.
func (h *Handler) evict(ctx context.Context, req admission.Request) (admission.Response, string) {
	pod := &corev1.Pod{}
	if err := h.api.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: req.Name}, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return admission.Allowed("no such pod"), outcomeAllowed
		}
		// The eviction webhook's failure policy is Ignore: an answer the
		// API server cannot use lets the eviction through, so this one
		// refuses with the retryable code instead.
		return refuse(fmt.Sprintf("ms2m could not read pod %s/%s to decide on its eviction: %v; retry", req.Namespace, req.Name, err)), outcomeError
	}
	if pod.DeletionTimestamp != nil || pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return admission.Allowed("the pod does not run"), outcomeAllowed
	}
	nsLabels, err := h.namespaceLabels(ctx, pod.Namespace)
	if err != nil {
		return refuse(fmt.Sprintf("ms2m: %v; retry", err)), outcomeError
	}
	if !onEvictMigrate(pod, nsLabels) {
		return admission.Allowed("not opted in to migrate on eviction"), outcomeAllowed
	}
	if pod.Annotations[contract.AnnotationOnEvictOverride] == "true" {
		return admission.Allowed(contract.AnnotationOnEvictOverride + " is true: evicted without a migration"), outcomeAllowed
	}
	if _, injected := pod.Annotations[contract.AnnotationStatus]; !injected {
		return admission.Allowed("").WithWarnings(fmt.Sprintf("pod %s/%s asks to migrate on eviction (%s) but has no ms2m sidecar: evicted without a migration", pod.Namespace, pod.Name, contract.AnnotationOnEvict)), outcomeAllowed
	}
	st, hasStatus := readEvictionStatus(pod)
	node := pod.Spec.NodeName

	// A StatefulSet's pod comes back under its name on the target: kubectl
	// drain, which evicts by name again after each refusal, then asks to
	// evict the moved pod. It left the node being drained (cordoned), so
	// it is answered as gone from there.
	// The status is not checked for the controller's signature here (the
	// webhook has no need of the key otherwise), so a forged one could
	// only ever answer this for a pod on a node that is not cordoned,
	// which is not the one being drained.
	if hasStatus && st.Phase == contract.PhaseSucceeded && st.Evacuation != "" && st.Evacuation != node && h.cordoned(ctx, st.Evacuation) && !h.cordoned(ctx, node) {
		msg := fmt.Sprintf("pod %s/%s left node %s by migration %s and runs on %s now; it is not evicted", pod.Namespace, pod.Name, st.Evacuation, st.Name, node)
		return answer(http.StatusNotFound, metav1.StatusReasonNotFound, msg), outcomeAllowed
	}

	// A pod restored by a migration whose outcome is not recorded on it
	// yet (a StatefulSet's pod, back under its name), or is recorded as
	// still running: wait for the outcome, which says whether it just
	// left the node being drained. Marked now, it would be moved on again,
	// off a node nobody drains.
	if mig := restoredBy(pod); mig != "" && !(hasStatus && st.knows(mig) && !(st.Name == mig && st.Phase == contract.PhaseRunning)) {
		return refuse(fmt.Sprintf("pod %s/%s was just restored by migration %s, which has not ended yet; retry", pod.Namespace, pod.Name, mig)), outcomeDenied
	}

	evacuate := pod.Annotations[contract.AnnotationEvacuate]
	dryRun := req.DryRun != nil && *req.DryRun || evictionDryRun(req.Object.Raw)
	if evacuate != node && !dryRun {
		if err := h.markEvacuate(ctx, pod, node); err != nil {
			return refuse(fmt.Sprintf("ms2m: pod %s/%s is to migrate instead of being evicted, but it could not be marked: %v; retry", pod.Namespace, pod.Name, err)), outcomeError
		}
		evacuate = node
		logf.FromContext(ctx).Info("eviction refused: marked to migrate", "pod", pod.Namespace+"/"+pod.Name, "node", node,
			"restoredBy", restoredBy(pod), "status", st.Name, "phase", st.Phase, "evacuation", st.Evacuation)
		h.podEvent(pod, corev1.EventTypeNormal, contract.ReasonEvictionRefused, "Evict",
			fmt.Sprintf("eviction refused: the pod migrates off node %s instead (%s: %s)", node, contract.AnnotationOnEvict, contract.OnEvictMigrate))
	}
	return refuse(evictionMessage(pod, node, st, hasStatus && st.Evacuation == evacuate && evacuate != "")), outcomeDenied
}

// evictionDryRun says whether the Eviction asks for a dry run in its own
// delete options (kubectl drain --dry-run=server), which the admission
// request's dryRun does not carry.
func evictionDryRun(raw []byte) bool {
	var ev struct {
		DeleteOptions *struct {
			DryRun []string `json:"dryRun"`
		} `json:"deleteOptions"`
	}
	if err := json.Unmarshal(raw, &ev); err != nil || ev.DeleteOptions == nil {
		return false
	}
	return len(ev.DeleteOptions.DryRun) > 0
}

// restoredBy is the migration pod was restored by, from its restore
// annotations, its contract.AnnotationRestoredFrom record or its
// injection status, or "".
func restoredBy(pod *corev1.Pod) string {
	if m := pod.Annotations[contract.AnnotationMigrationName]; m != "" {
		return m
	}
	var from struct {
		Migration string `json:"migration"`
	}
	if raw := pod.Annotations[contract.AnnotationRestoredFrom]; raw != "" && json.Unmarshal([]byte(raw), &from) == nil {
		return from.Migration
	}
	// The restore annotations go at injection: what remains is the
	// injection's status (seen on real nodes: a StatefulSet's pod back
	// on its target, evicted by name by kubectl drain, carried only this).
	if r, ok := inject.RestoredFromPod(pod); ok {
		return r.Migration
	}
	return ""
}

// onEvictMigrate says whether pod opted in to migrate on eviction: its
// annotation, or else its namespace's label.
func onEvictMigrate(pod *corev1.Pod, nsLabels map[string]string) bool {
	if v, ok := pod.Annotations[contract.AnnotationOnEvict]; ok {
		return v == contract.OnEvictMigrate
	}
	return nsLabels[contract.LabelNamespaceOnEvict] == contract.OnEvictMigrate
}

// evictionMessage is the refusal's text: which migration moves the pod
// and how far it is, or why it failed and what the operator can do.
func evictionMessage(pod *corev1.Pod, node string, st evictionStatus, ours bool) string {
	who := fmt.Sprintf("pod %s/%s migrates off node %s instead of being evicted (%s: %s)", pod.Namespace, pod.Name, node, contract.AnnotationOnEvict, contract.OnEvictMigrate)
	override := fmt.Sprintf("set %s=true on the pod to evict it without a migration (its state is lost)", contract.AnnotationOnEvictOverride)
	switch {
	case ours && st.Phase == contract.PhaseRunning:
		return fmt.Sprintf("%s: migration %s to node %s, phase %s since %s; retry", who, st.Name, st.Target, st.Phase, st.Started.UTC().Format(time.RFC3339))
	case ours && (st.Phase == contract.PhaseFailed || st.Phase == contract.PhaseRolledBack):
		return fmt.Sprintf("%s: migration %s to node %s %s: %s; the pod serves on %s. Remove %s from the pod to try again, or %s",
			who, st.Name, st.Target, st.Phase, st.Message, node, contract.AnnotationEvacuate, override)
	case pod.Annotations[contract.AnnotationMigrateTo] != "":
		return fmt.Sprintf("%s: migration to node %s requested, not started yet; retry", who, pod.Annotations[contract.AnnotationMigrateTo])
	}
	return fmt.Sprintf("%s: waiting for the scheduler to choose the target and for a free migration slot; retry", who)
}

func readEvictionStatus(pod *corev1.Pod) (evictionStatus, bool) {
	raw, ok := pod.Annotations[contract.AnnotationMigrationStatus]
	if !ok {
		return evictionStatus{}, false
	}
	var st evictionStatus
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return evictionStatus{}, false
	}
	return st, true
}

// markEvacuate writes contract.AnnotationEvacuate = node on pod, guarded
// by its resourceVersion: a pod changed meanwhile (another eviction
// marked it) gives a conflict, and the next retry reads it again.
func (h *Handler) markEvacuate(ctx context.Context, pod *corev1.Pod, node string) error {
	if h.writer == nil {
		return fmt.Errorf("the webhook has no client to write pods")
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": pod.ResourceVersion,
		"annotations":     map[string]string{contract.AnnotationEvacuate: node},
	}})
	if err != nil {
		return err
	}
	if err := h.writer.Patch(ctx, pod, client.RawPatch(types.MergePatchType, body)); err != nil {
		return fmt.Errorf("annotate %s: %w (the webhook needs patch on pods)", contract.AnnotationEvacuate, err)
	}
	return nil
}

// cordoned says whether node is marked unschedulable; an unreadable or
// missing node is not.
func (h *Handler) cordoned(ctx context.Context, node string) bool {
	full := &corev1.Node{}
	if err := h.api.Get(ctx, types.NamespacedName{Name: node}, full); err != nil {
		logf.FromContext(ctx).V(1).Info("read node", "node", node, "error", err.Error())
		return false
	}
	return full.Spec.Unschedulable
}

// refuse is the answer that makes an evicting client retry: 429, as for a
// PodDisruptionBudget.
func refuse(msg string) admission.Response {
	return answer(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, msg)
}

func answer(code int32, reason metav1.StatusReason, msg string) admission.Response {
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{
		Allowed: false,
		Result:  &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg},
	}}
}

// podEvent emits an Event on the pod itself (an eviction's pod exists).
func (h *Handler) podEvent(pod *corev1.Pod, typ, reason, action, note string) {
	if h.events == nil {
		return
	}
	ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	h.events.Eventf(ref, nil, typ, reason, action, "%s", note)
}
