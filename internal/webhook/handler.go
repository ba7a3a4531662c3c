package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
)

// Path is where the webhook server serves the pod handler; the
// MutatingWebhookConfiguration's clientConfig points here.
const Path = "/mutate-v1-pod"

// Event reasons (contract.WebhookReasons) go on the pod's controller for a
// CREATE and on the pod for an UPDATE; see eventTarget.

// EventRecorder is what the handler needs to emit Events: the
// events.k8s.io recorder of client-go, which a controller-runtime manager
// hands out.
type EventRecorder interface {
	Eventf(regarding runtime.Object, related runtime.Object, eventtype, reason, action, note string, args ...any)
}

// Handler admits pods: on CREATE it injects the sidecar or turns the pod
// into a restore; on UPDATE it validates changed ms2m annotations and never
// mutates. It implements admission.Handler.
type Handler struct {
	cfg     inject.Config
	decoder admission.Decoder
	// namespaces reads namespace metadata; a cache in production, since
	// every pod admission needs it.
	namespaces client.Reader
	// api reads straight from the API server: pending-migration ConfigMaps
	// (only StatefulSet pods need one, and a cache would watch every
	// ConfigMap in the cluster), and namespaces the cache has not seen yet.
	api     client.Reader
	events  EventRecorder // nil: no events
	metrics *Metrics
	// writer marks pods whose eviction became a migration
	// (contract.AnnotationEvacuate); nil: such evictions are refused
	// without the mark, and nothing migrates them.
	writer client.Writer
	// secrets writes each namespace's control token (ensureControlToken);
	// nil: none is written.
	secrets client.Writer
}

// SetWriter gives the handler the client that marks pods whose eviction
// it turned into a migration.
func (h *Handler) SetWriter(w client.Writer) { h.writer = w }

// NewHandler returns a handler that injects what cfg says. namespaces
// should be a cache; api reads from the API server. events may be nil.
func NewHandler(cfg inject.Config, scheme *runtime.Scheme, namespaces, api client.Reader, events EventRecorder, m *Metrics) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errors.New("webhook handler: no metrics")
	}
	return &Handler{
		cfg:        cfg,
		decoder:    admission.NewDecoder(scheme),
		namespaces: namespaces,
		api:        api,
		events:     events,
		metrics:    m,
	}, nil
}

// Outcomes, the label values of the requests counter.
const (
	outcomeInjected = "injected" // CREATE, sidecar added
	outcomeRestored = "restored" // CREATE, turned into a restore
	outcomeSkipped  = "skipped"  // CREATE, left alone
	outcomeAllowed  = "allowed"  // UPDATE (or anything else), allowed without a patch
	outcomeDenied   = "denied"   // bad ms2m annotations or a bad migration record
	outcomeError    = "error"    // the webhook could not decide (API error, bad request)
)

// Handle implements admission.Handler.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	resp, outcome := h.handle(ctx, req)
	h.metrics.observe(string(req.Operation), outcome, time.Since(start))
	return resp
}

func (h *Handler) handle(ctx context.Context, req admission.Request) (admission.Response, string) {
	if req.SubResource == "eviction" && req.Operation == admissionv1.Create {
		return h.evict(ctx, req)
	}
	if req.Kind.Kind != "Pod" {
		return admission.Allowed("not a pod"), outcomeAllowed
	}
	if req.SubResource == "ephemeralcontainers" && req.Operation == admissionv1.Update {
		return h.update(ctx, req)
	}
	if req.SubResource != "" {
		return admission.Allowed("not the pod itself"), outcomeAllowed
	}
	switch req.Operation {
	case admissionv1.Create:
		return h.create(ctx, req)
	case admissionv1.Update:
		return h.update(ctx, req)
	default:
		return admission.Allowed(""), outcomeAllowed
	}
}

// create admits a pod at its creation: it reads what Inject needs (the
// namespace's labels, a pending migration), runs Inject, and answers with
// a denial, the pod unchanged, or a patch to the mutated pod, with an Event
// saying which.
func (h *Handler) create(ctx context.Context, req admission.Request) (admission.Response, string) {
	pod := &corev1.Pod{}
	if err := h.decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode the pod: %w", err)), outcomeError
	}
	// A pod in a CREATE request may lack its namespace (the client left it
	// to the URL). Inject sees it; the patch must not add it.
	origNamespace := pod.Namespace
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	in := inject.Input{Pod: pod}
	var err error
	if in.NamespaceLabels, err = h.namespaceLabels(ctx, pod.Namespace); err != nil {
		return admission.Errored(http.StatusInternalServerError, err), outcomeError
	}
	if in.Pending, err = h.pendingMigration(ctx, pod); err != nil {
		var deny *inject.DenyError
		if errors.As(err, &deny) {
			return h.deny(ctx, req, pod, deny.Msg), outcomeDenied
		}
		// Fail closed: admitting a StatefulSet pod that should have been a
		// restore would start it from scratch and lose its state. The
		// StatefulSet controller retries.
		return admission.Errored(http.StatusInternalServerError, err), outcomeError
	}

	res, err := inject.Inject(in, h.cfg)
	if err != nil {
		var deny *inject.DenyError
		if errors.As(err, &deny) {
			return h.deny(ctx, req, pod, deny.Msg).WithWarnings(res.Warnings...), outcomeDenied
		}
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("inject pod %s: %w", podName(pod), err)), outcomeError
	}
	if res.Pod == nil {
		return h.skip(ctx, req, pod, in.NamespaceLabels, res), outcomeSkipped
	}

	if req.DryRun == nil || !*req.DryRun {
		if err := h.ensureControlToken(ctx, pod.Namespace); err != nil {
			return admission.Errored(http.StatusInternalServerError, err), outcomeError
		}
	}
	resp, err := mutationResponse(req, pod, origNamespace, res)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err), outcomeError
	}
	if !resp.Allowed {
		return resp, outcomeError
	}
	return resp, h.reportMutation(ctx, req, pod, res)
}

// deny logs a denial of pod and records it as a Warning Event.
func (h *Handler) deny(ctx context.Context, req admission.Request, pod *corev1.Pod, msg string) admission.Response {
	logf.FromContext(ctx).Info("denied", "pod", podName(pod), "reason", msg)
	h.event(ctx, req, pod, corev1.EventTypeWarning, contract.ReasonDenied, "Deny", msg)
	return admission.Denied(msg)
}

// skip admits pod unchanged, for the reasons in res.Skipped, which it logs
// and records as an Event when the pod or its namespace asked for ms2m.
func (h *Handler) skip(ctx context.Context, req admission.Request, pod *corev1.Pod, nsLabels map[string]string, res inject.Result) admission.Response {
	reason := strings.Join(res.Skipped, "; ")
	if asked(pod, nsLabels) {
		logf.FromContext(ctx).Info("skipped", "pod", podName(pod), "reasons", res.Skipped)
		h.event(ctx, req, pod, corev1.EventTypeNormal, contract.ReasonSkipped, "Skip", reason)
	}
	return admission.Allowed(reason).WithWarnings(res.Warnings...)
}

// mutationResponse is the patch from the request's pod to res.Pod, without
// the namespace when the request's pod had none, and without removals of
// fields that only the decoding lost (keepUnknownFields). pod is the
// decoded pod, its namespace filled in from the request.
func mutationResponse(req admission.Request, pod *corev1.Pod, origNamespace string, res inject.Result) (admission.Response, error) {
	mutated := res.Pod
	if origNamespace == "" {
		mutated.Namespace = ""
	}
	raw, err := json.Marshal(mutated)
	if err != nil {
		return admission.Response{}, fmt.Errorf("encode the mutated pod %s: %w", podName(pod), err)
	}
	resp := admission.PatchResponseFromRaw(req.Object.Raw, raw).WithWarnings(res.Warnings...)
	if !resp.Allowed {
		return resp, nil
	}
	decoded := *pod // Inject never changes in.Pod; only the namespace was filled in
	decoded.Namespace = origNamespace
	return keepUnknownFields(resp, req.Object.Raw, &decoded)
}

// reportMutation logs what was done to pod, a restore or an injection, and
// records it as an Event; it returns the outcome for the metrics.
func (h *Handler) reportMutation(ctx context.Context, req admission.Request, pod *corev1.Pod, res inject.Result) string {
	log := logf.FromContext(ctx)
	if r := res.Restore; r != nil {
		log.Info("restored", "pod", podName(pod), "migration", r.Name, "image", r.Image, "node", r.Node,
			"log", r.LogName, "replayStart", r.ReplayStart, "replayCutoff", r.ReplayCutoff, "skipped", res.Skipped)
		h.event(ctx, req, pod, corev1.EventTypeNormal, contract.ReasonRestored, "Restore",
			withSkips(fmt.Sprintf("restore of migration %s: image %s on node %s, replaying log %s after %s up to %s",
				r.Name, r.Image, r.Node, r.LogName, r.ReplayStart, r.ReplayCutoff), res.Skipped))
		return outcomeRestored
	}
	log.Info("injected", "pod", podName(pod), "rewritten", res.Rewritten, "skipped", res.Skipped)
	h.event(ctx, req, pod, corev1.EventTypeNormal, contract.ReasonInjected, "Inject",
		withSkips(injectedNote(res.Rewritten), res.Skipped))
	return outcomeInjected
}

// update validates the ms2m annotations of an updated pod when they changed
// (a migration request, typically). It never mutates, and it leaves alone
// updates that do not touch ms2m annotations, so that a pod admitted before
// the webhook ran, or before a rule tightened, can still be updated by its
// controllers.
func (h *Handler) update(ctx context.Context, req admission.Request) (admission.Response, string) {
	pod, old := &corev1.Pod{}, &corev1.Pod{}
	if err := h.decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode the pod: %w", err)), outcomeError
	}
	if err := h.decoder.DecodeRaw(req.OldObject, old); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode the old pod: %w", err)), outcomeError
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	// Images can change on an update (a container's image, an ephemeral
	// container added): none may become a checkpoint image.
	if err := inject.CheckImages(pod, old, h.cfg, nil); err != nil {
		var deny *inject.DenyError
		if errors.As(err, &deny) {
			logf.FromContext(ctx).Info("denied", "pod", podName(pod), "reason", deny.Msg)
			h.event(ctx, req, pod, corev1.EventTypeWarning, contract.ReasonDenied, "Deny", deny.Msg)
			return admission.Denied(deny.Msg), outcomeDenied
		}
		return admission.Errored(http.StatusInternalServerError, err), outcomeError
	}
	if req.SubResource != "" {
		return admission.Allowed("no checkpoint image"), outcomeAllowed
	}
	if maps.Equal(ms2mAnnotations(pod), ms2mAnnotations(old)) {
		return admission.Allowed("no ms2m annotation changed"), outcomeAllowed
	}
	res, err := inject.Inject(inject.Input{Pod: validationProbe(pod)}, h.cfg)
	if err != nil {
		var deny *inject.DenyError
		if errors.As(err, &deny) {
			logf.FromContext(ctx).Info("denied", "pod", podName(pod), "reason", deny.Msg)
			h.event(ctx, req, pod, corev1.EventTypeWarning, contract.ReasonDenied, "Deny", deny.Msg)
			return admission.Denied(deny.Msg).WithWarnings(res.Warnings...), outcomeDenied
		}
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("validate pod %s: %w", podName(pod), err)), outcomeError
	}
	return admission.Allowed("ms2m annotations are valid").WithWarnings(res.Warnings...), outcomeAllowed
}

// updateIgnored are the ms2m annotations an UPDATE does not validate: the
// status is ms2m's own, and the restore annotations are read only when a
// pod is created (their values were checked then).
var updateIgnored = map[string]bool{
	contract.AnnotationStatus:        true,
	contract.AnnotationRestoreImage:  true,
	contract.AnnotationRestoreNode:   true,
	contract.AnnotationReplayStart:   true,
	contract.AnnotationReplayCutoff:  true,
	contract.AnnotationMigrationName: true,
	contract.AnnotationReplayEpoch:   true,
	contract.AnnotationReplaySkip:    true,
	contract.AnnotationRestoreImages: true,
	// Checked at creation against the pod's name and namespace; an
	// update cannot make a pod a restore.
	contract.AnnotationRestoreSignature: true,
}

// validationProbe is the pod that Inject sees for an UPDATE. Inject
// decides about a pod at its creation and returns "already injected" or
// "not opted in" before it checks annotation values (internal/inject's doc
// has the order), so the updated pod itself would pass with any value.
// The probe is the pod as a new one that opted in: its containers and its
// ms2m annotations, without the sidecar, the status and the restore
// annotations. Inject then denies exactly a bad annotation value.
func validationProbe(pod *corev1.Pod) *corev1.Pod {
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, GenerateName: pod.GenerateName, Namespace: pod.Namespace,
			Labels: pod.Labels, OwnerReferences: pod.OwnerReferences,
			Annotations: map[string]string{},
		},
		Spec: corev1.PodSpec{Containers: make([]corev1.Container, len(pod.Spec.Containers))},
	}
	// Images were checked against the old pod (CheckImages); as a new
	// pod's, a restored pod's checkpoint image would be denied.
	for i, c := range pod.Spec.Containers {
		c.Image = "probe"
		probe.Spec.Containers[i] = c
	}
	for k, v := range pod.Annotations {
		if strings.HasPrefix(k, contract.Prefix) && !updateIgnored[k] {
			probe.Annotations[k] = v
		}
	}
	// A bad value stays, for Inject to deny; "false" or none would end
	// Inject at "not opted in".
	if v, ok := probe.Annotations[contract.AnnotationInject]; !ok || v == "false" {
		probe.Annotations[contract.AnnotationInject] = "true"
	}
	return probe
}

// keepUnknownFields drops the patch's removals of fields that the round
// trip through our Go types lost, not the mutation: fields that an API
// server newer than k8s.io/api sends and this build does not know. Without
// it, injecting a pod would delete them. decoded is the pod as decoded from
// raw. The common case, a patch without removals, costs nothing.
func keepUnknownFields(resp admission.Response, raw []byte, decoded *corev1.Pod) (admission.Response, error) {
	isRemove := func(op jsonpatch.JsonPatchOperation) bool { return op.Operation == "remove" }
	if !slices.ContainsFunc(resp.Patches, isRemove) {
		return resp, nil
	}
	roundTrip, err := json.Marshal(decoded)
	if err != nil {
		return resp, fmt.Errorf("encode the decoded pod: %w", err)
	}
	lost, err := jsonpatch.CreatePatch(raw, roundTrip)
	if err != nil {
		return resp, fmt.Errorf("compare the pod with its decoded form: %w", err)
	}
	lostPaths := map[string]bool{}
	for _, op := range lost {
		if isRemove(op) {
			lostPaths[op.Path] = true
		}
	}
	resp.Patches = slices.DeleteFunc(resp.Patches, func(op jsonpatch.JsonPatchOperation) bool {
		return isRemove(op) && lostPaths[op.Path]
	})
	if len(resp.Patches) == 0 {
		resp.PatchType = nil
	}
	return resp, nil
}

// namespaceLabels returns the labels of namespace ns.
func (h *Handler) namespaceLabels(ctx context.Context, ns string) (map[string]string, error) {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	err := h.namespaces.Get(ctx, types.NamespacedName{Name: ns}, m)
	if apierrors.IsNotFound(err) {
		// A namespace created a moment ago (one manifest with the namespace
		// and its pods) may not be in the cache yet.
		err = h.api.Get(ctx, types.NamespacedName{Name: ns}, m)
	}
	if err != nil {
		return nil, fmt.Errorf("read the labels of namespace %s: %w (the webhook needs get, list and watch on namespaces)", ns, err)
	}
	return m.Labels, nil
}

// pendingMigration returns the pending migration recorded for pod, if it is
// owned by a StatefulSet and the migrator left one. A record that does not
// parse is a *inject.DenyError: admitting the pod without it would start it
// from scratch.
func (h *Handler) pendingMigration(ctx context.Context, pod *corev1.Pod) (*inject.Migration, error) {
	if pod.Name == "" || !ownedByStatefulSet(pod) {
		return nil, nil
	}
	name := contract.PendingConfigMapName(pod.Name)
	cm := &corev1.ConfigMap{}
	if err := h.api.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: name}, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read the pending-migration ConfigMap %s/%s: %w (the webhook needs get on configmaps)", pod.Namespace, name, err)
	}
	data, ok := cm.Data[contract.PendingConfigMapKey]
	if !ok {
		return nil, &inject.DenyError{Msg: fmt.Sprintf("pending-migration ConfigMap %s/%s has no key %q: the migrator must write the migration's JSON there; fix or delete the ConfigMap", pod.Namespace, name, contract.PendingConfigMapKey)}
	}
	m := &inject.Migration{}
	dec := json.NewDecoder(strings.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(m); err != nil {
		return nil, &inject.DenyError{Msg: fmt.Sprintf("pending-migration ConfigMap %s/%s, key %q: %v; fix or delete the ConfigMap", pod.Namespace, name, contract.PendingConfigMapKey, err)}
	}
	return m, nil
}

func ownedByStatefulSet(pod *corev1.Pod) bool {
	for _, o := range pod.OwnerReferences {
		if o.Kind == "StatefulSet" && strings.HasPrefix(o.APIVersion, "apps/") {
			return true
		}
	}
	return false
}

// ms2mAnnotations are the pod's annotations under contract.Prefix, except the
// status, which only the webhook writes.
func ms2mAnnotations(pod *corev1.Pod) map[string]string {
	out := map[string]string{}
	for k, v := range pod.Annotations {
		if strings.HasPrefix(k, contract.Prefix) && k != contract.AnnotationStatus {
			out[k] = v
		}
	}
	return out
}

// asked says whether ms2m was asked for this pod, by an annotation under our
// prefix or its namespace's label: only then is a skip worth an Event.
func asked(pod *corev1.Pod, nsLabels map[string]string) bool {
	if _, ok := nsLabels[contract.LabelNamespaceInject]; ok {
		return true
	}
	for k := range pod.Annotations {
		if strings.HasPrefix(k, contract.Prefix) {
			return true
		}
	}
	return false
}

// event emits an Event about pod; see eventTarget for which object it is
// attached to. Dry-run requests emit none: they must have no side effects.
func (h *Handler) event(ctx context.Context, req admission.Request, pod *corev1.Pod, typ, reason, action, note string) {
	if h.events == nil || (req.DryRun != nil && *req.DryRun) {
		return
	}
	regarding, related := eventTarget(req, pod)
	if regarding == nil {
		logf.FromContext(ctx).V(1).Info("no object to attach the event to", "reason", reason, "note", note)
		return
	}
	const maxNote = 1024 // the API's limit
	if len(note) > maxNote {
		note = note[:maxNote-3] + "..."
	}
	h.events.Eventf(regarding, related, typ, reason, action, "%s", note)
}

// eventTarget decides what an Event is attached to. A pod in a CREATE
// request has no UID yet, and often no name (generateName), so an Event on
// it would not show in `kubectl describe pod`. Instead:
//
//   - CREATE of a pod with a controller (ReplicaSet, StatefulSet, Job, …):
//     the Event regards the controller, which has a UID, and names the pod,
//     when it has a name, as the related object. `kubectl describe` of the
//     controller shows it.
//   - CREATE of a bare pod with a name: the Event regards the pod by
//     namespace and name, without a UID (`kubectl events --for pod/NAME`
//     shows it).
//   - CREATE of a bare pod without a name: no Event; the log has it.
//   - UPDATE: the pod exists and the Event regards it.
func eventTarget(req admission.Request, pod *corev1.Pod) (regarding, related runtime.Object) {
	ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name}
	if req.Operation == admissionv1.Update {
		ref.UID = pod.UID
		return ref, nil
	}
	if ref.Name == "" {
		ref = nil
	}
	if owner := metav1.GetControllerOf(pod); owner != nil {
		regarding := &corev1.ObjectReference{APIVersion: owner.APIVersion, Kind: owner.Kind, Namespace: pod.Namespace, Name: owner.Name, UID: owner.UID}
		if ref == nil {
			return regarding, nil
		}
		return regarding, ref
	}
	if ref == nil {
		return nil, nil
	}
	return ref, nil
}

func podName(pod *corev1.Pod) string {
	name := pod.Name
	if name == "" {
		name = pod.GenerateName + "<generated>"
	}
	return pod.Namespace + "/" + name
}

func injectedNote(rewritten []string) string {
	if len(rewritten) == 0 {
		return "injected " + inject.SidecarName
	}
	return "injected " + inject.SidecarName + "; rewrote " + strings.Join(rewritten, "; ")
}

func withSkips(note string, skipped []string) string {
	if len(skipped) == 0 {
		return note
	}
	return note + "; left alone: " + strings.Join(skipped, "; ")
}
