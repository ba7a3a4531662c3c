package migrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/inject"
)

// A migrator can stop in the middle of a StatefulSet migration at two
// points a rollback cannot undo: once the shadow has taken over from the
// source (statefulset-shadow), and once the source is deleted (both
// StatefulSet strategies). ContinueShadow and FinishPending let a
// restarted migrator complete those, from what the API server holds: the
// shadow pod, the pending-migration record, and the sidecars' own state.

// ContinueShadow completes statefulset-shadow migration p, whose shadow
// has taken over from the source (p.Pod, which still exists, stopped for
// good): the shadow is checkpointed, the StatefulSet's pod recreated from
// it, and it takes over from the shadow.
func ContinueShadow(ctx context.Context, env Env, p Plan) (Report, error) {
	r := newRun(env, p)
	// The source's checkpoint image was pushed by the migrator that
	// stopped: it goes too, once the StatefulSet's pod serves.
	r.pushedBefore = true
	err := r.continueShadow(ctx)
	if err == nil {
		r.dropServedImages(ctx)
	}
	r.rep.Total = time.Since(r.began)
	return r.rep, err
}

func (r *run) continueShadow(ctx context.Context) error {
	p, cs := r.p, r.env.Client
	src, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Pod, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("migration %s: the source pod: %w", p.Name, err)
	}
	shadow, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, ShadowName(p.Name), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("migration %s: the shadow pod: %w", p.Name, err)
	}
	switched, err := r.endpoint(shadow).Switched(ctx)
	if err != nil {
		return fmt.Errorf("migration %s: %w", p.Name, err)
	}
	if !switched {
		return fmt.Errorf("migration %s: the shadow %s has not taken over: roll back instead", p.Name, shadow.Name)
	}
	r.source = src
	r.rep.TargetPod, r.rep.ShadowPod = src.Name, shadow.Name
	r.phase("shadow found")
	return r.fromShadow(ctx, shadow)
}

// PendingOutcome is what FinishPending found or did.
type PendingOutcome struct {
	Migration string
	Strategy  contract.Strategy
	Node      string
	// Ours is false when the pod is not the record's restore (the source
	// still runs, or nothing was recorded): FinishPending leaves it alone.
	Ours bool
	// Done: the restored pod took over and the record is deleted.
	Done bool
	// Waiting says what FinishPending waits for, when not done.
	Waiting string
}

// FinishPending completes the StatefulSet migration recorded for pod ns/name
// once the source is gone: the pod the StatefulSet made again is the
// restore (the webhook made it so). A shadow that still serves hands over
// to it; once it serves, the shadow and the record go. A restore that
// fails is an error, and the record stays, so that the pod is never
// started with empty state.
func FinishPending(ctx context.Context, env Env, ns, name string, timeout time.Duration) (PendingOutcome, error) {
	var out PendingOutcome
	cs := env.Client
	cmName := contract.PendingConfigMapName(name)
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, cmName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("the pending-migration ConfigMap %s/%s: %w", ns, cmName, err)
	}
	var m inject.Migration
	if err := json.Unmarshal([]byte(cm.Data[contract.PendingConfigMapKey]), &m); err != nil {
		return out, fmt.Errorf("ConfigMap %s/%s, key %s: %w", ns, cmName, contract.PendingConfigMapKey, err)
	}
	out.Migration, out.Strategy, out.Node = cm.Labels[contract.LabelMigration], contract.Strategy(cm.Annotations[contract.AnnotationStrategy]), m.Node
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		out.Ours, out.Waiting = true, "the StatefulSet to make pod "+name+" again"
		return out, nil
	}
	if err != nil {
		return out, err
	}
	var st inject.Status
	if json.Unmarshal([]byte(pod.Annotations[contract.AnnotationStatus]), &st) != nil || st.Restore != out.Migration || out.Migration == "" {
		return out, nil // the source, still there: its migration's own rollback handles the record
	}
	out.Ours = true
	if !podReady(pod) {
		if problem := podProblem(pod); problem != "" {
			return out, fmt.Errorf("the restored pod %s/%s of migration %s does not run: %s; ConfigMap %s/%s stays, so that the pod is not started with empty state: fix the cause and delete the pod to try again, or delete the ConfigMap to let it start from its template without its state", ns, name, out.Migration, problem, ns, cmName)
		}
		out.Waiting = "the restored pod " + name + " to run"
		return out, nil
	}
	r := newRun(env, Plan{Name: out.Migration, Namespace: ns, Pod: name, Timeout: timeout})
	r.source = pod
	ep := r.endpoint(pod)
	switched, err := ep.Switched(ctx)
	if err != nil {
		return out, err
	}
	shadow, err := cs.CoreV1().Pods(ns).Get(ctx, ShadowName(out.Migration), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		shadow = nil
	case err != nil:
		return out, fmt.Errorf("the shadow of migration %s: %w", out.Migration, err)
	}
	if !switched {
		if err := r.takeOver(ctx, shadow, ep, timeout); err != nil {
			return out, fmt.Errorf("migration %s: %w", out.Migration, err)
		}
	}
	var errs []error
	if shadow != nil {
		if err := deleteNow(ctx, cs, shadow); err != nil {
			errs = append(errs, fmt.Errorf("delete the shadow %s: %w", shadow.Name, err))
		}
	}
	if err := r.deletePending(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("migration %s: the restored pod %s serves, but: %w", out.Migration, name, err)
	}
	r.served(ctx, name)
	out.Done = true
	return out, nil
}

// takeOver lets the restored pod at ep take over: from a shadow that still
// serves by a handoff, else by replaying to the cutoff it was given (or
// the one the stopped shadow wrote).
func (r *run) takeOver(ctx context.Context, shadow *corev1.Pod, ep control.Client, timeout time.Duration) error {
	if shadow != nil && podReady(shadow) {
		shadowEP := r.endpoint(shadow)
		st, err := shadowEP.Inspect(ctx)
		if err != nil {
			return err
		}
		if st.Mode != "stopped" {
			_, err := control.Handover(ctx, shadowEP, ep, control.HandoverOptions{SwitchTimeout: timeout, ReadRetry: r.env.ReadRetry})
			return err
		}
	}
	_, err := ep.WaitSwitched(ctx, timeout)
	return err
}
