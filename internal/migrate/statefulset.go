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

// A StatefulSet's pod is its identity: only the StatefulSet controller
// makes a pod of that name, from its template. So the migrator cannot
// create the target; it records the restore in a pending-migration
// ConfigMap (contract.PendingConfigMapName), deletes the source, and the
// webhook turns the pod that the StatefulSet controller makes next into
// that restore. The record stays until the restored pod runs; a restore
// that fails leaves it, so that the pod is never started with empty state
// while its messages are elsewhere.

// statefulSet is the paper's strategy: checkpoint while serving, stop at a
// cutoff once the image is pushed, delete the source, and let the
// recreated pod replay to the cutoff. The stop is its point of no return:
// until then a failure deletes the image and resumes the source; after it,
// the pending-migration ConfigMap keeps the pod from starting without its
// state (recreate).
func (r *run) statefulSet(ctx context.Context) error {
	srcEP := r.endpoint(r.source)
	r.rep.TargetPod = r.source.Name
	var m recreated
	err := r.runPhases(ctx,
		phase{name: "live checkpoint", do: func(ctx context.Context) error {
			cut, err := r.liveCheckpoint(ctx, r.source, r.p.Name, "")
			if err != nil {
				return err
			}
			r.rep.Start = cut.ID
			return nil
		}, undo: []undoStep{r.undoResume(srcEP), r.undoImages()}},
		phase{name: "stop", do: func(ctx context.Context) error { return r.stopAtCutoff(ctx, srcEP, &m) }},
		phase{name: "restore", do: func(ctx context.Context) error { return r.restoreRecreated(ctx, &m) }},
		phase{name: "switch", do: func(ctx context.Context) error { return r.switchRecreated(ctx, &m) }},
		phase{name: "finalise", do: func(ctx context.Context) error { return r.finaliseRecreated(ctx, &m) }},
	)
	if err != nil || m.onSource == nil {
		return err
	}
	r.dropServedImages(ctx)
	return &RolledBack{Err: fmt.Errorf("migration %s: %w", r.p.Name, m.onSource),
		How: fmt.Sprintf("the StatefulSet's pod %s was restored on the source's node %s from the same checkpoint instead, replayed to the cutoff and serves with the exact state; the pending-migration record and the checkpoint image were deleted", r.source.Name, r.source.Spec.NodeName)}
}

// recreated is what the statefulset strategy's phases learn and later
// ones use.
type recreated struct {
	stopped control.StopResult
	running *corev1.Pod
	// finished: FinishPending completed the migration.
	finished bool
	// onSource: the restore on the target failed, and the pod was
	// restored on the source's node instead (restoreOnSource).
	onSource error
}

// stopAtCutoff stops the source at a cutoff: the point of no return, from
// which the source never consumes again.
func (r *run) stopAtCutoff(ctx context.Context, srcEP control.Client, m *recreated) (err error) {
	if m.stopped, err = srcEP.Stop(ctx, r.env.Timeouts.Stop); err != nil {
		return err
	}
	r.rep.CutoffID, r.rep.Epoch = m.stopped.CutoffID, m.stopped.Epoch
	r.phase("stop")
	r.commit()
	return nil
}

// restoreRecreated has the StatefulSet make its pod again as the restore
// on the target node (recreate); if that fails, as the same restore on
// the source's node (restoreOnSource).
func (r *run) restoreRecreated(ctx context.Context, m *recreated) error {
	p, src := r.p, r.source
	restore := Restore{Migration: p.Name, Image: r.rep.Image, Images: r.rep.Images, Node: p.TargetNode, LogName: inject.LogName(src),
		Start: r.rep.Start}.atStop(m.stopped.CutoffID, m.stopped.Epoch)
	// Until the source is deleted, a failed write changes nothing and is
	// tried again (the API server may be back soon).
	err := r.tryAgain(ctx, r.now().Add(p.Timeout), "recreate the StatefulSet's pod", func() (err error) {
		m.running, err = r.recreate(ctx, restore)
		return err
	}, isSourceKept, nil)
	if err != nil {
		cause := err
		if m.running, err = r.restoreOnSource(ctx, restore, m.running, cause); err != nil {
			return err
		}
		if m.running.Spec.NodeName != p.TargetNode {
			m.onSource = fmt.Errorf("the restore on %s failed: %w", p.TargetNode, cause)
		}
	}
	r.phase("restore")
	return nil
}

// switchRecreated waits for the restored pod to replay to the cutoff and
// take over. One that died or whose replay was interrupted is made again
// from the record by the recovery a restarted controller runs
// (FinishPending), which also finalises.
func (r *run) switchRecreated(ctx context.Context, m *recreated) error {
	switched, err := r.waitSwitched(ctx, m.running)
	if err != nil {
		if ferr := r.finishPending(ctx); ferr != nil {
			return fmt.Errorf("the restored pod %s did not take over the queue: %w; %w", r.source.Name, err, ferr)
		}
		r.rep.Note = fmt.Sprintf("the restored pod did not take over as made (%v): it was made again from the pending-migration record, which took over", err)
		m.finished = true
		r.phase("switch")
		return nil
	}
	r.rep.Downtime = switched.Sub(m.stopped.StartedAt)
	r.phase("switch")
	return nil
}

// finaliseRecreated marks the restored pod as serving and deletes the
// pending-migration record, unless FinishPending did.
func (r *run) finaliseRecreated(ctx context.Context, m *recreated) error {
	if m.finished {
		return nil
	}
	r.served(ctx, r.source.Name)
	if err := r.deletePending(ctx); err != nil {
		return fmt.Errorf("the restored pod serves, but: %w", err)
	}
	r.phase("finalise")
	return nil
}

// RolledBack is the error of a migration that failed but whose pod serves
// again on the source's node with the exact state, restored there (a
// StatefulSet's, whose source was deleted): the migration is rolled back,
// not merely failed.
type RolledBack struct {
	Err error
	How string // what serves now, and what was cleaned up
}

func (e *RolledBack) Error() string { return e.Err.Error() + "; rolled back: " + e.How }
func (e *RolledBack) Unwrap() error { return e.Err }

// restoreOnSource rolls back a statefulset migration whose restore on the
// target failed (cause; failed is the pod that did not run, nil if none
// came): the source was deleted at its cutoff, so "back" is the same
// restore (the checkpoint, replayed to the same cutoff) on the source's
// node, where the checkpoint was taken and is known to run. The pending
// record is pointed at that node, the failed pod is deleted (confirmed
// by its node: nothing of it runs on), and the StatefulSet makes it again
// there. It returns the pod that runs; if that fails too, an error that
// says both, with the record left as the restore to make.
//
// A real kubelet retries a failed restore under CrashLoopBackOff; the
// failed pod is deleted only after its sidecar says that it has not
// taken over (a retried restore that took over is the migration, done),
// and within the back-off's pause (10 s and more) that follows the
// failure WaitRunning saw. A sidecar that cannot be read leaves the pod
// as it is: whether it consumes is not known.
func (r *run) restoreOnSource(ctx context.Context, restore Restore, failed *corev1.Pod, cause error) (*corev1.Pod, error) {
	src := r.source
	back := restore
	back.Node = src.Spec.NodeName
	cmName := contract.PendingConfigMapName(src.Name)
	if failed == nil || failed.UID == src.UID || back.Node == "" || back.Node == restore.Node || !isRestoreOf(failed, restore.Migration) {
		return failed, cause
	}
	notBack := func(err error) error {
		return fmt.Errorf("%w; the rollback, the same restore on the source's node %s, failed too: %w; ConfigMap %s/%s stays, so that the pod is not started with empty state: fix the cause (the pod's Events say it) and delete the pod to try again, or delete the ConfigMap to let it start from its template without its state",
			cause, back.Node, err, src.Namespace, cmName)
	}
	if failed.Status.PodIP != "" {
		switched, err := r.endpoint(failed).Switched(ctx)
		switch {
		case err == nil && switched:
			return failed, nil // a retried restore took over: it serves
		case err != nil && containerRunning(failed, inject.SidecarName):
			return failed, fmt.Errorf("%w; its sidecar cannot be read (%w), so whether it took over is not known: it is left as it is", cause, err)
		}
	}
	r.log.Info("the restore on the target failed; restoring on the source's node", "node", back.Node, "err", cause.Error())
	if err := r.writePending(ctx, back); err != nil {
		return failed, notBack(err)
	}
	if err := deleteConfirmed(ctx, r.env.Clock, r.env.Client, failed, r.p.Timeout); err != nil {
		return failed, notBack(err)
	}
	pod, err := waitRecreated(ctx, r, failed, restore.Migration)
	if err != nil {
		return pod, notBack(err)
	}
	r.phase("restore on the source's node")
	return pod, nil
}

// isRestoreOf tells whether the webhook made pod migration's restore.
func isRestoreOf(pod *corev1.Pod, migration string) bool {
	var st inject.Status
	return json.Unmarshal([]byte(pod.Annotations[contract.AnnotationStatus]), &st) == nil && st.Restore == migration && migration != ""
}

// containerRunning tells whether pod's container name runs.
func containerRunning(pod *corev1.Pod, name string) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == name {
			return cs.State.Running != nil
		}
	}
	return false
}

// waitSwitched waits until pod's sidecar has taken over, for up to the
// plan's Timeout, and gives up when the pod is deleted or made again
// meanwhile (FinishPending takes it from there). The pod is looked at
// from 5 s on, once a second: a replay that ends sooner makes no API call.
func (r *run) waitSwitched(ctx context.Context, pod *corev1.Pod) (time.Time, error) {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		wait := 5 * time.Second
		for wctx.Err() == nil {
			select {
			case <-wctx.Done():
				return
			case <-time.After(wait):
			}
			wait = time.Second
			p, err := r.env.Client.CoreV1().Pods(pod.Namespace).Get(wctx, pod.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && (p.UID != pod.UID || p.DeletionTimestamp != nil)) {
				cancel(fmt.Errorf("the pod %s/%s was deleted", pod.Namespace, pod.Name))
				return
			}
		}
	}()
	at, err := r.endpoint(pod).WaitSwitched(wctx, r.p.Timeout)
	if cause := context.Cause(wctx); err != nil && cause != nil && ctx.Err() == nil {
		err = cause
	}
	return at, err
}

// finishPending drives FinishPending for the source's StatefulSet pod
// until the restore it records has taken over (and the record, and a
// shadow, are gone), for up to the plan's Timeout.
func (r *run) finishPending(ctx context.Context) error {
	deadline := r.now().Add(r.p.Timeout)
	for {
		out, err := FinishPending(ctx, r.env, r.source.Namespace, r.source.Name, r.p.Timeout)
		switch {
		case out.Done:
			return nil
		case err == nil && !out.Ours:
			return fmt.Errorf("pod %s/%s is not the restore its pending-migration record asks for", r.source.Namespace, r.source.Name)
		case r.now().After(deadline):
			if err == nil {
				err = fmt.Errorf("still waiting for %s after %s", out.Waiting, r.p.Timeout)
			}
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// statefulSetShadow moves a StatefulSet's pod with two ms2m handoffs: to a
// shadow pod on the target node, and from the shadow to the StatefulSet's
// recreated pod, restored on the same node from a checkpoint of the shadow.
// Until the shadow has taken over, a failure deletes the shadow and the
// image and resumes the source.
func (r *run) statefulSetShadow(ctx context.Context) error {
	p, src := r.p, r.source
	srcEP := r.endpoint(src)
	shadowName := ShadowName(p.Name)
	r.rep.TargetPod, r.rep.ShadowPod = src.Name, shadowName
	var shadowPod *corev1.Pod
	err := r.runPhases(ctx,
		phase{name: "live checkpoint", do: func(ctx context.Context) error {
			cut, err := r.liveCheckpoint(ctx, src, p.Name, "")
			if err != nil {
				return err
			}
			r.rep.Start, r.rep.Epoch = cut.ID, cut.Epoch
			return nil
		}, undo: []undoStep{r.undoResume(srcEP), r.undoImages()}},
		phase{name: "shadow restore", do: func(ctx context.Context) error {
			shadow, err := r.targetPod(src, shadowName, Restore{Migration: p.Name, Image: r.rep.Image, Images: r.rep.Images, Node: p.TargetNode, LogName: inject.LogName(src), Start: r.rep.Start, Epoch: r.rep.Epoch})
			if err != nil {
				return err
			}
			shadow.Labels[contract.LabelShadowOf] = ShadowOfLabel(src.Name)
			// A create that failed may still have made the pod.
			r.push(r.undoShadow(shadowName))
			if _, err := r.env.Client.CoreV1().Pods(p.Namespace).Create(ctx, shadow, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create the shadow pod %s: %w", shadowName, err)
			}
			if shadowPod, err = waitRunning(ctx, r.env.Clock, r.env.Client, p.Namespace, shadowName, p.Timeout); err != nil {
				return fmt.Errorf("the shadow's restore failed: %w", err)
			}
			r.phase("shadow restore")
			return nil
		}},
		phase{name: "shadow handover", do: func(ctx context.Context) error {
			tm, err := r.handover(ctx, srcEP, r.endpoint(shadowPod))
			if err != nil && !errors.Is(err, control.ErrBeforeStop) {
				// The source was asked to stop: the shadow may have taken over.
				switch _, v, terr := r.checkTakeover(ctx, shadowName); v {
				case TookOver:
					r.rep.Note = fmt.Sprintf("the first handover reported %q, but the shadow %s had taken over: the migration went on from it; that handover's timings are unknown", err, shadowName)
					return nil
				case TakeoverUnknown:
					r.commit() // neither deleted nor resumed
					return fmt.Errorf("%w; %w, so the shadow is kept and the source %s stays stopped, never both consuming: read the shadow's GET /state, and if replay.switchedAt is set let a restarted migrator controller continue from it, else delete the shadow and POST /resume the source's sidecar", err, terr, src.Name)
				}
			}
			if err != nil {
				return err
			}
			r.rep.Handover, r.rep.Downtime = &tm, tm.Downtime
			return nil
		}},
		phase{name: "shadow took over", do: func(context.Context) error {
			r.commit()
			r.phase("shadow handover")
			return nil
		}},
	)
	if err != nil {
		return err
	}
	return r.fromShadow(ctx, shadowPod)
}

// undoShadow deletes the shadow pod named name.
func (r *run) undoShadow(name string) undoStep {
	return undoStep{name: "delete the shadow", fn: func(ctx context.Context) error {
		return r.deletePod(ctx, name, "the failed shadow")
	}}
}

// undoPending deletes the source's pending-migration ConfigMap if this
// migration wrote it: while the source exists it is unused, and left, it
// would turn the pod's next recreation into a stale restore.
func (r *run) undoPending() undoStep {
	return undoStep{name: "delete the pending-migration ConfigMap", fn: func(ctx context.Context) error {
		cms := r.env.Client.CoreV1().ConfigMaps(r.source.Namespace)
		name := contract.PendingConfigMapName(r.source.Name)
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return fmt.Errorf("the pending-migration ConfigMap %s: %w", name, err)
		case cm.Labels[contract.LabelMigration] != MigrationLabel(r.p.Name):
			return nil // another migration's
		}
		if err := cms.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cm.UID}}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete the pending-migration ConfigMap %s: %w", name, err)
		}
		return nil
	}}
}

// fromShadow is statefulset-shadow's second half: the shadow serves with
// the exact state and the source is stopped for good. The shadow is
// checkpointed on the target node, the StatefulSet's pod is recreated from
// that checkpoint, takes over from the shadow, and the shadow goes.
func (r *run) fromShadow(ctx context.Context, shadowPod *corev1.Pod) error {
	p, cs, src := r.p, r.env.Client, r.source
	shadowEP := r.endpoint(shadowPod)
	// From here the source must never consume again.
	serving := func(err error) error {
		return fmt.Errorf("migration %s: %w; the shadow pod %s serves on %s with the exact state and the StatefulSet's pod %s is stopped: delete the shadow only after %s runs again and took over", p.Name, err, shadowPod.Name, p.TargetNode, src.Name, src.Name)
	}

	// Until the source is deleted, a failed step changes nothing: the
	// shadow serves, the source is stopped. The network to the shadow's
	// node or to the API server may be back soon, so the steps are tried
	// again for up to the plan's Timeout; a quiesce whose answer was lost
	// may have quiesced the shadow, so it is resumed (on a serving
	// sidecar, no change) before the next checkpoint.
	deadline := r.now().Add(p.Timeout)
	var cut2 control.Cut
	err := r.tryAgain(ctx, deadline, "checkpoint the shadow", func() (err error) {
		cut2, err = r.liveCheckpoint(ctx, shadowPod, ShadowName(p.Name), "shadow ")
		return err
	}, func(error) bool { return true }, func() error { return shadowEP.Resume(ctx) })
	if err != nil {
		return serving(err)
	}
	r.rep.ShadowCheckpoint = cut2.ID
	restore := Restore{Migration: p.Name, Image: r.rep.ShadowImage, Images: r.rep.ShadowImages, Node: p.TargetNode, LogName: inject.LogName(src), Start: cut2.ID, Epoch: cut2.Epoch}
	var running *corev1.Pod
	err = r.tryAgain(ctx, deadline, "recreate the StatefulSet's pod", func() (err error) {
		running, err = r.recreate(ctx, restore)
		return err
	}, isSourceKept, nil)
	if err != nil {
		return serving(err)
	}
	r.phase("restore")
	tm2, err := control.Handover(ctx, shadowEP, r.endpoint(running), control.HandoverOptions{MaxLag: p.MaxLag, SwitchTimeout: p.Timeout, ReadRetry: r.env.ReadRetry})
	if err != nil {
		// The restored pod died, its replay was interrupted, or the shadow
		// died: the recovery a restarted controller runs (FinishPending)
		// hands over again, or makes the pod again from the record.
		if ferr := r.finishPending(ctx); ferr != nil {
			return serving(errors.Join(err, ferr))
		}
		r.rep.Note = fmt.Sprintf("the handover from the shadow failed (%v); the restore was finished from the pending-migration record; its timings are unknown", err)
		r.phase("handover")
		return nil
	}
	r.rep.ShadowHandover, r.rep.CutoffID = &tm2, tm2.CutoffID
	r.rep.Downtime += tm2.Downtime
	r.phase("handover")
	r.served(ctx, src.Name)

	var errs []error
	if err := deleteNow(ctx, cs, shadowPod); err != nil {
		errs = append(errs, fmt.Errorf("delete the shadow %s: %w", shadowPod.Name, err))
	}
	if err := r.deletePending(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("migration %s: the restored pod serves, but: %w", p.Name, err)
	}
	r.phase("finalise")
	return nil
}

// tryAgain runs step until it succeeds, fails with an error that retry
// says is not worth another try, or deadline has passed; between tries
// it waits, 0.2 s doubling up to 5 s, and runs before, if set, which must
// succeed for the next try. It returns step's last error.
func (r *run) tryAgain(ctx context.Context, deadline time.Time, what string, step func() error, retry func(error) bool, before func() error) error {
	wait := 200 * time.Millisecond
	err := step()
	for err != nil && retry(err) {
		if r.now().Add(wait).After(deadline) {
			return err
		}
		r.log.Info("a step failed; trying again", "step", what, "in", wait, "err", err.Error())
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
		if before != nil {
			if berr := before(); berr != nil {
				err = fmt.Errorf("%w; before trying again: %w", err, berr)
				continue
			}
		}
		err = step()
	}
	return err
}

// sourceKept is recreate's error before the source was deleted: the
// source is as it was, stopped, and the pending record is gone (or, if
// that failed too, unused while the source exists); trying again is safe.
type sourceKept struct{ error }

func (e sourceKept) Unwrap() error { return e.error }

func isSourceKept(err error) bool {
	var k sourceKept
	return errors.As(err, &k)
}

// recreate records restore as the source's pending migration, deletes the
// source, and waits until the StatefulSet's new pod of the same name runs
// as that restore. If the source cannot be deleted, the record goes again.
func (r *run) recreate(ctx context.Context, restore Restore) (*corev1.Pod, error) {
	src, cs := r.source, r.env.Client
	if err := r.writePending(ctx, restore); err != nil {
		return nil, sourceKept{err}
	}
	cmName := contract.PendingConfigMapName(src.Name)
	if err := deleteNow(ctx, cs, src); err != nil {
		cctx, cancel := r.cleanupContext(ctx)
		defer cancel()
		return nil, sourceKept{errors.Join(fmt.Errorf("delete the source %s for its StatefulSet to recreate it: %w", src.Name, err), r.deletePending(cctx))}
	}
	pod, err := waitRecreated(ctx, r, src, restore.Migration)
	if err != nil {
		return pod, fmt.Errorf("the StatefulSet's pod %s was not restored: %w; ConfigMap %s/%s stays, so that the pod is not started with empty state: fix the cause (the pod's Events say it) and delete the pod to try again, or delete the ConfigMap to let it start from its template without its state",
			src.Name, err, src.Namespace, cmName)
	}
	return pod, nil
}

// writePending records restore, signed, as the source's pending migration.
func (r *run) writePending(ctx context.Context, restore Restore) error {
	src, cs := r.source, r.env.Client
	b, err := json.Marshal(restore.Pending(src.Namespace, src.Name, r.env.SigningKey, r.now().Add(r.env.RestoreValidity)))
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: contract.PendingConfigMapName(src.Name), Namespace: src.Namespace,
			Labels:      map[string]string{contract.LabelMigration: MigrationLabel(restore.Migration)},
			Annotations: map[string]string{contract.AnnotationStrategy: string(r.p.Strategy)}},
		Data: map[string]string{contract.PendingConfigMapKey: string(b)},
	}
	cms := cs.CoreV1().ConfigMaps(src.Namespace)
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("record the pending migration in ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("record the pending migration in ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return nil
}

// waitRecreated waits for the pod that replaces old (same name, another
// UID) to run, and checks that the webhook made it migration's restore.
// pollEvery is how often a wait reads a pod again.
const pollEvery = 100 * time.Millisecond

func waitRecreated(ctx context.Context, r *run, old *corev1.Pod, migration string) (*corev1.Pod, error) {
	cs := r.env.Client
	deadline := r.now().Add(r.p.Timeout)
	for {
		p, err := cs.CoreV1().Pods(old.Namespace).Get(ctx, old.Name, metav1.GetOptions{})
		if err == nil && p.UID != old.UID {
			var st inject.Status
			if err := json.Unmarshal([]byte(p.Annotations[contract.AnnotationStatus]), &st); err != nil || st.Restore != migration {
				return p, fmt.Errorf("the recreated pod was admitted without the restore (annotation %s does not name migration %s): is the ms2m webhook installed, with failurePolicy Fail?", contract.AnnotationStatus, migration)
			}
			return waitRunning(ctx, r.env.Clock, cs, old.Namespace, old.Name, deadline.Sub(r.now()))
		}
		if r.now().After(deadline) {
			return nil, fmt.Errorf("no new pod %s after %s: is the StatefulSet's controller running?", old.Name, r.p.Timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pollEvery):
		}
	}
}

// deletePending deletes the source's pending-migration record, if any.
func (r *run) deletePending(ctx context.Context) error {
	name := contract.PendingConfigMapName(r.source.Name)
	err := r.env.Client.CoreV1().ConfigMaps(r.source.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the pending-migration ConfigMap %s/%s: %w", r.source.Namespace, name, err)
	}
	return nil
}
