package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ms2m/ms2m/internal/contract"
)

// DefaultPlaceholderImage is the placeholder pods' image: the pause image
// every node has for its pod sandboxes.
const DefaultPlaceholderImage = "registry.k8s.io/pause:3.10"

// evacuateRequeue is how soon a waiting evacuation is looked at again.
const evacuateRequeue = 3 * time.Second

// setupEvacuation registers the controller of evacuations: pods that the
// webhook marked (contract.AnnotationEvacuate) after refusing their
// eviction.
func (r *Reconciler) setupEvacuation(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("evacuation").
		For(&corev1.Pod{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			_, ok := o.GetAnnotations()[contract.AnnotationEvacuate]
			return ok
		}))).
		// One at a time: the slot check counts the evacuations under way
		// and claims one (a placeholder) before the next is looked at.
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(reconcile.Func(r.reconcileEvacuation))
}

// PlaceholderName is the name of the placeholder pod of the pod with uid.
func PlaceholderName(uid types.UID) string { return "ms2m-placeholder-" + string(uid) }

// reconcileEvacuation moves a pod off the node its eviction was refused
// on: it waits for a free slot (Config.EvacuatePerNode, EvacuateMax) and
// a StatefulSet pod for its PodDisruptionBudget, asks kube-scheduler
// where the pod would go (a placeholder pod with its constraints, kept
// off the node it leaves), and requests the migration there
// (contract.AnnotationMigrateTo), which Reconcile drives by the pod's
// strategy. A failed one is not tried again: the webhook refuses the
// pod's evictions with why, until the operator overrides or removes the
// mark.
func (r *Reconciler) reconcileEvacuation(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	// Cached: the request this ends in is written guarded by the
	// resourceVersion read, and a placeholder dropped on a stale read is
	// made again.
	pod, err := r.cachedPod(ctx, req.Namespace, req.Name)
	if apierrors.IsNotFound(err) {
		return reconcile.Result{}, nil // its placeholder goes with it (owner reference)
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	node, marked := pod.Annotations[contract.AnnotationEvacuate]
	if !marked || pod.DeletionTimestamp != nil {
		return reconcile.Result{}, r.dropPlaceholder(ctx, pod)
	}
	if node != pod.Spec.NodeName {
		// A mark for a node the pod no longer runs on (it moved): stale.
		return reconcile.Result{}, errors.Join(r.dropPlaceholder(ctx, pod), r.patchAnnotations(ctx, pod, map[string]*string{contract.AnnotationEvacuate: nil}, ""))
	}
	st, has, _ := statusOf(pod)
	if has && !signedByUs(r.cfg.StatusKey, pod) {
		has = false
	}
	if _, asked := pod.Annotations[contract.AnnotationMigrateTo]; asked || (has && st.Phase == contract.PhaseRunning) {
		return reconcile.Result{}, r.dropPlaceholder(ctx, pod) // the migration controller's now
	}
	if has && st.Evacuation == node {
		return reconcile.Result{}, r.dropPlaceholder(ctx, pod) // it ended (failed): the webhook says why
	}

	if why, err := r.evacuationSlot(ctx, pod); err != nil {
		return reconcile.Result{}, err
	} else if why != "" {
		r.waiting(pod, why)
		return reconcile.Result{RequeueAfter: evacuateRequeue}, nil
	}
	target, why, err := r.scheduledTarget(ctx, pod)
	if err != nil {
		return reconcile.Result{}, err
	}
	if target == "" {
		r.waiting(pod, why)
		return reconcile.Result{RequeueAfter: evacuateRequeue}, nil
	}
	if err := r.dropPlaceholder(ctx, pod); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.patchAnnotations(ctx, pod, map[string]*string{contract.AnnotationMigrateTo: &target}, pod.ResourceVersion); err != nil {
		return reconcile.Result{}, err // a conflict: read again
	}
	r.cfg.Events.Eventf(pod, nil, corev1.EventTypeNormal, contract.ReasonEvacuationTarget, "Evacuate", "the scheduler placed the placeholder on %s: migrating off %s there", target, node)
	log.FromContext(ctx).Info("evacuation: target chosen", "pod", pod.Namespace+"/"+pod.Name, "from", node, "to", target)
	return reconcile.Result{}, nil
}

// waiting emits an EvacuationWaiting Event once per pod and reason.
func (r *Reconciler) waiting(pod *corev1.Pod, why string) {
	key := "evacuate\x00" + string(pod.UID) + "\x00" + why
	if _, seen := r.refused.LoadOrStore(key, true); seen {
		return
	}
	r.cfg.Events.Eventf(pod, nil, corev1.EventTypeNormal, contract.ReasonEvacuationWaiting, "Evacuate", "%s", why)
}

// evacuationSlot says why pod's evacuation must wait, or "": the
// evacuations under way off its node and in the cluster are below their
// limits, and a StatefulSet pod's PodDisruptionBudgets allow a
// disruption.
func (r *Reconciler) evacuationSlot(ctx context.Context, pod *corev1.Pod) (string, error) {
	// Fresh: the count must include the placeholder the previous
	// evacuation made moments ago, which a cache may not hold yet.
	pods, err := r.cfg.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("count the evacuations under way: %w", err)
	}
	// A pod with a placeholder holds a slot: its target is being chosen.
	placed := map[types.UID]bool{}
	for i := range pods.Items {
		if uid := pods.Items[i].Labels[contract.LabelPlaceholderFor]; uid != "" {
			placed[types.UID(uid)] = true
		}
	}
	if placed[pod.UID] {
		return "", nil // it has its slot
	}
	onNode, all := 0, 0
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.UID == pod.UID || !(placed[p.UID] || r.evacuating(p)) {
			continue
		}
		all++
		if p.Spec.NodeName == pod.Spec.NodeName {
			onNode++
		}
	}
	if onNode >= r.cfg.EvacuatePerNode {
		return fmt.Sprintf("waiting: %d evacuations off node %s under way (the limit per node)", onNode, pod.Spec.NodeName), nil
	}
	if all >= r.cfg.EvacuateMax {
		return fmt.Sprintf("waiting: %d evacuations under way in the cluster (the limit)", all), nil
	}
	if !ownedByStatefulSet(pod) {
		// The copy strategies start the target before the source goes:
		// the workload never has a replica fewer, so no budget is asked.
		return "", nil
	}
	pdbs, err := r.cfg.Client.PolicyV1().PodDisruptionBudgets(pod.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("read the PodDisruptionBudgets of %s: %w", pod.Namespace, err)
	}
	for _, b := range pdbs.Items {
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		if b.Status.DisruptionsAllowed < 1 {
			return fmt.Sprintf("waiting: PodDisruptionBudget %s allows no disruption now (a StatefulSet's pod is away while it is restored)", b.Name), nil
		}
	}
	return "", nil
}

// evacuating says whether p is being evacuated: its target is chosen (a
// request) or its migration runs.
func (r *Reconciler) evacuating(p *corev1.Pod) bool {
	node, ok := p.Annotations[contract.AnnotationEvacuate]
	if !ok || node != p.Spec.NodeName || p.DeletionTimestamp != nil {
		return false
	}
	if _, asked := p.Annotations[contract.AnnotationMigrateTo]; asked {
		return true
	}
	st, has, err := statusOf(p)
	return has && err == nil && st.Phase == contract.PhaseRunning
}

func ownedByStatefulSet(pod *corev1.Pod) bool {
	o := metav1.GetControllerOf(pod)
	return o != nil && o.Kind == "StatefulSet" && strings.HasPrefix(o.APIVersion, "apps/")
}

// scheduledTarget returns the node kube-scheduler bound pod's placeholder
// to, making the placeholder if need be; "" and why while it is not
// bound.
func (r *Reconciler) scheduledTarget(ctx context.Context, pod *corev1.Pod) (string, string, error) {
	pods := r.cfg.Client.CoreV1().Pods(pod.Namespace)
	// Cached: a placeholder the cache does not hold yet is created again,
	// and found there (AlreadyExists).
	ph, err := r.cachedPod(ctx, pod.Namespace, PlaceholderName(pod.UID))
	if apierrors.IsNotFound(err) {
		_, err = pods.Create(ctx, Placeholder(pod, r.cfg.PlaceholderImage), metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return "", "", fmt.Errorf("create the placeholder pod for %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		return "", "waiting for kube-scheduler to place the placeholder " + PlaceholderName(pod.UID), nil
	}
	if err != nil {
		return "", "", err
	}
	if ph.Spec.NodeName == "" {
		why := "waiting for kube-scheduler to place the placeholder " + ph.Name
		for _, c := range ph.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message != "" {
				why += ": " + c.Message
			}
		}
		return "", why, nil
	}
	node, err := r.cfg.Client.CoreV1().Nodes().Get(ctx, ph.Spec.NodeName, metav1.GetOptions{})
	if err != nil || node.Spec.Unschedulable || ph.Spec.NodeName == pod.Spec.NodeName {
		// Cordoned after the scheduler chose it: ask again.
		return "", "the placeholder's node " + ph.Spec.NodeName + " is cordoned or gone; asking the scheduler again", r.dropPlaceholder(ctx, pod)
	}
	return ph.Spec.NodeName, "", nil
}

// dropPlaceholder deletes pod's placeholder, if there is one.
func (r *Reconciler) dropPlaceholder(ctx context.Context, pod *corev1.Pod) error {
	zero := int64(0)
	err := r.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, PlaceholderName(pod.UID), metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the placeholder of %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// Placeholder is the pod that asks kube-scheduler where pod would go: one
// pause container that requests what all of pod's containers request,
// with its node selector, affinity (plus: not its current node),
// tolerations, topology spread, priority and scheduler. It carries none
// of pod's labels (no Service sends it traffic, no controller counts it),
// is kept away from the ms2m webhook, and is owned by pod, so that it
// goes with it.
func Placeholder(pod *corev1.Pod, image string) *corev1.Pod {
	if image == "" {
		image = DefaultPlaceholderImage
	}
	req := corev1.ResourceList{}
	for _, c := range pod.Spec.Containers {
		for k, q := range c.Resources.Requests {
			sum := req[k]
			sum.Add(q)
			req[k] = sum
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			continue // a run-to-completion init container needs no room beside the rest
		}
		for k, q := range c.Resources.Requests {
			sum := req[k]
			sum.Add(q)
			req[k] = sum
		}
	}
	if len(req) == 0 {
		req = nil
	}
	notHere := corev1.NodeSelectorRequirement{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpNotIn, Values: []string{pod.Spec.NodeName}}
	aff := pod.Spec.Affinity.DeepCopy()
	if aff == nil {
		aff = &corev1.Affinity{}
	}
	if aff.NodeAffinity == nil {
		aff.NodeAffinity = &corev1.NodeAffinity{}
	}
	ns := aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if ns == nil || len(ns.NodeSelectorTerms) == 0 {
		ns = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}
	}
	for i := range ns.NodeSelectorTerms { // terms are ORed: each keeps off the node
		ns.NodeSelectorTerms[i].MatchExpressions = append(ns.NodeSelectorTerms[i].MatchExpressions, notHere)
	}
	aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = ns
	zero := int64(0)
	no := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: PlaceholderName(pod.UID), Namespace: pod.Namespace,
			Labels: map[string]string{contract.LabelPlaceholderFor: string(pod.UID), contract.LabelInject: "false"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
			}},
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "placeholder", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Resources: corev1.ResourceRequirements{Requests: req},
			}},
			NodeSelector:                  pod.Spec.NodeSelector,
			Affinity:                      aff,
			Tolerations:                   pod.Spec.Tolerations,
			TopologySpreadConstraints:     pod.Spec.TopologySpreadConstraints,
			PriorityClassName:             pod.Spec.PriorityClassName,
			SchedulerName:                 pod.Spec.SchedulerName,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &zero,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
		},
	}
}

// patchAnnotations merge-patches pod's annotations (nil removes one),
// guarded by rv if it is not "".
func (r *Reconciler) patchAnnotations(ctx context.Context, pod *corev1.Pod, ann map[string]*string, rv string) error {
	body, err := json.Marshal(mergePatch{Metadata: patchMeta{ResourceVersion: rv, Annotations: ann}})
	if err != nil {
		return err
	}
	_, err = r.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, body, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
