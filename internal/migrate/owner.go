package migrate

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// A pod of a ReplicaSet (a Deployment's, say) must end up owned by it
// again, and its controller must never start a fresh replica, with empty
// state, beside it. The target is a copy of the source with the same
// labels, so the ReplicaSet would adopt it at once and, one replica too
// many, delete one of the two, maybe the target in the middle of its
// restore. So the target is created held: the source pod is its
// controller, which no ReplicaSet overrides. Once the target serves, the
// source is made the cheapest pod to delete
// (controller.kubernetes.io/pod-deletion-cost), the target is let go, the
// ReplicaSet adopts it, and only then is the source deleted: the
// ReplicaSet's count never drops below its replicas.

// DeletionCostAnnotation is the ReplicaSet controller's hint: of the pods
// it scales down, those of lower cost go first.
const DeletionCostAnnotation = "controller.kubernetes.io/pod-deletion-cost"

// controllerOf returns pod's controller reference, or nil.
func controllerOf(pod *corev1.Pod) *metav1.OwnerReference {
	for i := range pod.OwnerReferences {
		if o := pod.OwnerReferences[i]; o.Controller != nil && *o.Controller {
			return &pod.OwnerReferences[i]
		}
	}
	return nil
}

// ownedByStatefulSet reports whether a StatefulSet controls pod.
func ownedByStatefulSet(pod *corev1.Pod) bool {
	c := controllerOf(pod)
	return c != nil && c.Kind == "StatefulSet"
}

// holdBy makes source the controller of target, so that the controller
// of source does not adopt target before it serves.
func holdBy(target, source *corev1.Pod) {
	yes := true
	target.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "Pod", Name: source.Name, UID: source.UID, Controller: &yes,
	}}
}

// handBack gives target to the controller of source (if source has one)
// and returns once that controller owns it. The source is marked as the
// pod to scale down first, in case the controller sees both at once.
// Its deadline is by clk.
func handBack(ctx context.Context, clk Clock, cs kubernetes.Interface, source *corev1.Pod, target string, timeout time.Duration) error {
	owner := controllerOf(source)
	if owner == nil {
		return nil
	}
	pods := cs.CoreV1().Pods(source.Namespace)
	cost := fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}}}`, DeletionCostAnnotation, int32(-1<<31))
	if _, err := pods.Patch(ctx, source.Name, types.MergePatchType, []byte(cost), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("mark the source %s as the first to scale down: %w", source.Name, err)
	}
	if err := release(ctx, cs, source.Namespace, target, source.UID); err != nil {
		return fmt.Errorf("hand the target %s to %s %s: %w", target, owner.Kind, owner.Name, err)
	}
	deadline := clk.Now().Add(timeout)
	for {
		got, err := pods.Get(ctx, target, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("hand the target %s to %s %s: %w", target, owner.Kind, owner.Name, err)
		}
		switch c := controllerOf(got); {
		case c != nil && c.UID == owner.UID:
			return nil
		case c != nil && c.UID != source.UID:
			return fmt.Errorf("the target %s was adopted by %s %s, not by the source's %s %s", target, c.Kind, c.Name, owner.Kind, owner.Name)
		}
		if clk.Now().After(deadline) {
			return fmt.Errorf("%s %s did not adopt the target %s within %s (do its selector's labels match the pod's?); the target serves and the source is kept", owner.Kind, owner.Name, target, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// release drops the hold of the pod with UID holder on pod ns/name,
// guarded by its resourceVersion (retried on a conflict).
func release(ctx context.Context, cs kubernetes.Interface, ns, name string, holder types.UID) error {
	pods := cs.CoreV1().Pods(ns)
	for {
		got, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := controllerOf(got); c == nil || c.UID != holder {
			return nil
		}
		patch := fmt.Sprintf(`{"metadata":{"ownerReferences":null,"resourceVersion":%q}}`, got.ResourceVersion)
		_, err = pods.Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

// Finish ends a migration whose target serves: the target goes to the
// source's controller (if any), then the source is deleted. A restarted
// migrator uses it to complete a migration that its predecessor left after
// the target had taken over. Its waits end by clk.
func Finish(ctx context.Context, clk Clock, cs kubernetes.Interface, source *corev1.Pod, target string, timeout time.Duration) error {
	if err := handBack(ctx, clk, cs, source, target, timeout); err != nil {
		return err
	}
	if err := deleteNow(ctx, cs, source); err != nil {
		return err
	}
	// Left, the restore annotations only mislead: not worth a retry.
	_ = Served(ctx, cs, source.Namespace, target)
	return nil
}
