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
	"k8s.io/client-go/kubernetes"

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
	r.rep.Total = r.now().Sub(r.began)
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
	r.source, r.others = src, otherApps(src, p.Container)
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
	// Redone says why FinishPending deleted the restored pod, which had
	// not taken over, for the StatefulSet to make it again as a restore:
	// its replay was interrupted, or its shadow died before its cutoff.
	Redone string
}

// FinishPending completes the StatefulSet migration recorded for pod ns/name
// once the source is gone: the pod the StatefulSet made again is the
// restore (the webhook made it so). A shadow that still serves hands over
// to it; once it serves, the shadow and the record go. A restore that
// fails is an error, and the record stays, so that the pod is never
// started with empty state.
func FinishPending(ctx context.Context, env Env, ns, name string, timeout time.Duration) (PendingOutcome, error) {
	var out PendingOutcome
	rec, err := readPending(ctx, env.Client, ns, name, &out)
	if rec == nil || err != nil {
		return out, err
	}
	pod, err := rec.restoredPod(ctx, env.Client, &out)
	if pod == nil || err != nil {
		return out, err
	}
	r := newRun(env, Plan{Name: out.Migration, Namespace: ns, Pod: name, Timeout: timeout})
	r.source = pod
	ep := r.endpoint(pod)
	switched, err := ep.Switched(ctx)
	if err != nil {
		return out, err
	}
	shadow, err := r.shadowOf(ctx, out.Migration)
	if err != nil {
		return out, err
	}
	// A restore that cannot end its replay exactly is made again (redo):
	// one that did not take over has consumed nothing live; one that took
	// over after an interrupted replay has a wrong state, and the next
	// restore replays through what it took (replay.Range.LogEnd).
	why, err := r.redoReason(ctx, rec.cm, rec.m, pod, ep, shadow, switched, timeout)
	if err != nil {
		return out, fmt.Errorf("migration %s: %w", out.Migration, err)
	}
	if why != "" {
		if err := deleteConfirmed(ctx, r.env.Clock, env.Client, pod, timeout); err != nil {
			return out, fmt.Errorf("migration %s: %s, so the restored pod %s/%s is made again; %w", out.Migration, why, ns, name, err)
		}
		out.Redone, out.Waiting = why, "the StatefulSet to make pod "+name+" again"
		return out, nil
	}
	if !switched {
		if err := r.takeOver(ctx, shadow, ep, timeout); errors.Is(err, errNotYet) {
			out.Waiting = "the restored pod " + name + " to replay to its cutoff"
			return out, nil
		} else if err != nil {
			return out, fmt.Errorf("migration %s: %w", out.Migration, err)
		}
	}
	if err := r.dropShadowAndRecord(ctx, shadow); err != nil {
		return out, fmt.Errorf("migration %s: the restored pod %s serves, but: %w", out.Migration, name, err)
	}
	r.served(ctx, name)
	out.Done = true
	return out, nil
}

// pendingRecord is a StatefulSet pod's pending-migration record: the
// ConfigMap, and the restore it holds.
type pendingRecord struct {
	cm   *corev1.ConfigMap
	m    inject.Migration
	pod  string // the StatefulSet's pod it is for
	name string // the ConfigMap's
}

// readPending reads the pending-migration record of pod ns/pod into out
// (its migration, strategy and node); nil if there is none.
func readPending(ctx context.Context, cs kubernetes.Interface, ns, pod string, out *PendingOutcome) (*pendingRecord, error) {
	rec := &pendingRecord{pod: pod, name: contract.PendingConfigMapName(pod)}
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, rec.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the pending-migration ConfigMap %s/%s: %w", ns, rec.name, err)
	}
	rec.cm = cm
	if err := json.Unmarshal([]byte(cm.Data[contract.PendingConfigMapKey]), &rec.m); err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s, key %s: %w", ns, rec.name, contract.PendingConfigMapKey, err)
	}
	out.Migration, out.Strategy, out.Node = cm.Labels[contract.LabelMigration], contract.Strategy(cm.Annotations[contract.AnnotationStrategy]), rec.m.Node
	return rec, nil
}

// restoredPod returns the record's pod once it is the record's restore
// and runs ready; nil (and out says so) while it is not: not made again
// yet or not running yet (Ours, Waiting), or the source, still there (not
// Ours). A restore that cannot run is an error, and the record stays.
func (rec *pendingRecord) restoredPod(ctx context.Context, cs kubernetes.Interface, out *PendingOutcome) (*corev1.Pod, error) {
	ns, name := rec.cm.Namespace, rec.pod
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		out.Ours, out.Waiting = true, "the StatefulSet to make pod "+name+" again"
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st inject.Status
	if json.Unmarshal([]byte(pod.Annotations[contract.AnnotationStatus]), &st) != nil || st.Restore != out.Migration || out.Migration == "" {
		return nil, nil // the source, still there: its migration's own rollback handles the record
	}
	out.Ours = true
	if !podReady(pod) {
		if problem := podProblem(pod); problem != "" {
			return nil, fmt.Errorf("the restored pod %s/%s of migration %s does not run: %s; ConfigMap %s/%s stays, so that the pod is not started with empty state: fix the cause and delete the pod to try again, or delete the ConfigMap to let it start from its template without its state", ns, name, out.Migration, problem, ns, rec.name)
		}
		out.Waiting = "the restored pod " + name + " to run"
		return nil, nil
	}
	return pod, nil
}

// shadowOf returns the shadow pod of migration, nil if it is gone.
func (r *run) shadowOf(ctx context.Context, migration string) (*corev1.Pod, error) {
	shadow, err := r.env.Client.CoreV1().Pods(r.p.Namespace).Get(ctx, ShadowName(migration), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("the shadow of migration %s: %w", migration, err)
	}
	return shadow, nil
}

// dropShadowAndRecord deletes, once the restored pod serves, the shadow
// (if any) and the pending-migration record.
func (r *run) dropShadowAndRecord(ctx context.Context, shadow *corev1.Pod) error {
	var errs []error
	if shadow != nil {
		if err := deleteNow(ctx, r.env.Client, shadow); err != nil {
			errs = append(errs, fmt.Errorf("delete the shadow %s: %w", shadow.Name, err))
		}
	}
	if err := r.deletePending(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
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
	// A while, not the whole timeout: the pod may die meanwhile, and the
	// next call looks at it again.
	wctx, cancel := context.WithTimeout(ctx, min(timeout, 5*time.Second))
	defer cancel()
	_, err := ep.WaitSwitched(wctx, timeout)
	if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return errNotYet
	}
	return err
}

// errNotYet: the restored pod has not switched yet.
var errNotYet = errors.New("the restored pod has not taken over yet")

// redoReason says why the restored pod (its sidecar at ep; switched: it
// took over) must be made again, or "" if it can go on; cm and m are the
// pending record. Its state cannot be or become exact when:
//   - its app lost its connection after it had settled replayed
//     deliveries (replay.interrupted): a restarted app came back from the
//     checkpoint without them;
//   - (not switched) the record's cutoff is not the one the pod was made
//     with: a redo was asked for and the pod not yet made again;
//   - (not switched) its cutoff is the shadow's marker, which it has not
//     seen, and the shadow is dead: no marker will come. The dead shadow
//     is deleted, and once its node confirms that it stopped, nothing
//     writes the log any more; the record's cutoff becomes "end", the
//     log's end as the next restore's sidecar finds it at its start: the
//     shadow's last durable record.
func (r *run) redoReason(ctx context.Context, cm *corev1.ConfigMap, m inject.Migration, pod *corev1.Pod, ep control.Client, shadow *corev1.Pod, switched bool, timeout time.Duration) (string, error) {
	st, err := ep.State(ctx)
	if err != nil {
		return "", err
	}
	if st.Replay != nil && st.Replay.Interrupted > 0 {
		return fmt.Sprintf("its replay was interrupted (its app lost its connection %d times after it had processed replayed messages)", st.Replay.Interrupted), nil
	}
	if switched {
		return "", nil
	}
	if from, ok := inject.RestoredFromPod(pod); ok && from.ReplayCutoff != m.ReplayCutoff {
		return fmt.Sprintf("it replays to cutoff %q, but its pending-migration record now says %q", from.ReplayCutoff, m.ReplayCutoff), nil
	}
	if m.ReplayCutoff != "marker" || (st.Source != nil && st.Source.Cutoff != 0) {
		return "", nil // its cutoff is known: it ends by itself
	}
	dead, why := r.shadowDead(ctx, shadow)
	if !dead {
		return "", nil
	}
	if shadow != nil {
		if err := deleteConfirmed(ctx, r.env.Clock, r.env.Client, shadow, timeout); err != nil {
			return "", fmt.Errorf("the shadow %s %s, so it is deleted before the restored pod replays to the log's end; %w", shadow.Name, why, err)
		}
	}
	// The record is an instruction the webhook only follows signed.
	m.ReplayCutoff, m.Signature = "end", ""
	m.Signature = inject.SignRestore(r.env.SigningKey, pod.Namespace, pod.Name, m, r.now().Add(r.env.RestoreValidity))
	b, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	cm = cm.DeepCopy()
	cm.Data[contract.PendingConfigMapKey] = string(b)
	if _, err := r.env.Client.CoreV1().ConfigMaps(cm.Namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return "", fmt.Errorf("the shadow %s, so the pending-migration ConfigMap %s/%s is to replay to the log's end, but: %w", why, cm.Namespace, cm.Name, err)
	}
	return "the shadow " + why + " before it wrote its cutoff, so the restore replays to the log's end (the shadow's last durable record)", nil
}

// shadowDead tells whether shadow (nil: gone) can no longer hand over:
// gone, not running and ready, or its sidecar unreadable for
// Env.ReadRetry. It says how.
func (r *run) shadowDead(ctx context.Context, shadow *corev1.Pod) (bool, string) {
	if shadow == nil {
		return true, "is gone"
	}
	if !podReady(shadow) {
		return true, "does not run (" + describe(shadow) + ")"
	}
	deadline := r.now().Add(r.env.ReadRetry)
	wait := 100 * time.Millisecond
	for {
		_, err := r.endpoint(shadow).Inspect(ctx)
		if err == nil {
			return false, ""
		}
		if r.now().Add(wait).After(deadline) || ctx.Err() != nil {
			return true, fmt.Sprintf("does not answer (%v)", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// deleteConfirmed deletes pod gracefully and waits until it is gone: its
// node has confirmed that its containers stopped, so nothing of it runs
// on (a forced delete would not know). A pod that does not go within
// timeout by clk (its node is down) is an error, and is left to the next
// try.
func deleteConfirmed(ctx context.Context, clk Clock, cs kubernetes.Interface, pod *corev1.Pod, timeout time.Duration) error {
	grace := int64(1) // never 0: that deletes the object without the node
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil && *g > grace {
		grace = *g
	}
	pods := cs.CoreV1().Pods(pod.Namespace)
	err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	deadline := clk.Now().Add(timeout)
	for {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && p.UID != pod.UID) {
			return nil
		}
		if clk.Now().After(deadline) {
			return fmt.Errorf("pod %s/%s was deleted but is still there after %s (%v): is its node down? it goes once its kubelet confirms that its containers stopped", pod.Namespace, pod.Name, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
