package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
)

// A StatefulSet migration that a stopped controller left has one of three
// shapes. The source still exists and no shadow has taken over: roll back
// (delete the shadow and the pending record, resume the source). The
// source still exists, stopped, and the shadow has taken over: continue
// from the shadow (migrate.ContinueShadow). The source is gone: its status
// went with it, and the pending-migration record drives the rest
// (reconcilePending, migrate.FinishPending).

// rollBackStatefulSet ends StatefulSet migration st of pod, the source,
// which still exists.
func (r *Reconciler) rollBackStatefulSet(ctx context.Context, pod *corev1.Pod, st Status) error {
	port, token, err := migrate.SidecarControl(pod, r.cfg.StatusKey)
	if err != nil {
		return fmt.Errorf("migration %s: %w", st.Name, err)
	}
	endpoint := func(p *corev1.Pod) control.Client {
		return control.ClientAt(p.Status.PodIP, port, token, r.http)
	}
	// Fresh: whether the shadow is gone decides between rolling back and
	// continuing from it.
	shadow, err := r.freshPod(ctx, pod.Namespace, migrate.ShadowName(st.Name))
	switch {
	case apierrors.IsNotFound(err):
		shadow = nil
	case err != nil:
		return fmt.Errorf("migration %s: the shadow: %w", st.Name, err)
	}
	if shadow != nil {
		switch v, err := migrate.TargetTakeover(ctx, r.cfg.Clock, shadow, endpoint(shadow), 0); v {
		case migrate.TakeoverUnknown:
			return fmt.Errorf("migration %s: the shadow: %w", st.Name, err)
		case migrate.TookOver:
			return r.continueShadow(ctx, pod, st, port, token)
		}
	}
	// The same undo steps as a migration that fails (migrate.RollBack).
	err = migrate.RollBack(ctx, r.env(ctx, pod, st.Name, port, token), rollbackPlan(pod, st), pod)
	return r.rolledBack(ctx, pod, st, err, "the shadow, the pending-migration record and the checkpoint images were deleted")
}

// continueShadow completes statefulset-shadow migration st, whose shadow
// took over from pod before the controller that drove it stopped.
func (r *Reconciler) continueShadow(ctx context.Context, pod *corev1.Pod, st Status, port int, token string) error {
	r.running.Store(st.Name, true)
	defer r.running.Delete(st.Name)
	r.cfg.Events.Eventf(pod, nil, corev1.EventTypeNormal, contract.ReasonMigrationContinued, "Migrate", "migration %s: the shadow %s had taken over when the migrator stopped; continuing from it", st.Name, migrate.ShadowName(st.Name))
	rep, err := migrate.ContinueShadow(ctx, r.env(ctx, pod, st.Name, port, token), migrate.Plan{
		Name: st.Name, Namespace: pod.Namespace, Pod: pod.Name, Container: inject.AppContainer(pod),
		TargetNode: st.Target, TargetPod: pod.Name, Strategy: contract.StrategyStatefulSetShadow, Timeout: r.cfg.Timeout,
		ThawAfterDump: r.cfg.ThawAfterDump,
	})
	if err != nil {
		r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, contract.ReasonMigrationRollForwardFailed, "Migrate", "migration %s: %v", st.Name, err)
		return err // retried; once the source is gone, reconcilePending goes on
	}
	st.Phase, st.Report, st.TargetPod = contract.PhaseSucceeded, &rep, pod.Name
	st.Message = "the migrator stopped after the shadow had taken over; a restarted migrator completed the migration from the shadow; the first handover's timings were lost with it"
	return r.succeeded(ctx, pod.Namespace, pod.Name, st)
}

// reconcilePending acts on one pending-migration record: once the
// migration that wrote it is not driven by this process and the source is
// gone, it completes it (migrate.FinishPending).
func (r *Reconciler) reconcilePending(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	podName := strings.TrimPrefix(req.Name, contract.PendingConfigMapPrefix)
	// Cached: FinishPending reads the record again before it acts.
	cm, err := r.cachedConfigMap(ctx, req.Namespace, req.Name)
	if apierrors.IsNotFound(err) {
		return reconcile.Result{}, nil
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	migration := cm.Labels[contract.LabelMigration]
	if r.isRunning(migration) {
		return reconcile.Result{RequeueAfter: time.Minute}, nil // ours, under way
	}
	// Fresh: the StatefulSet makes this pod again under the same name; a
	// cache may still hold the source, and the Events would go to it.
	pod, err := r.freshPod(ctx, req.Namespace, podName)
	if apierrors.IsNotFound(err) {
		return reconcile.Result{RequeueAfter: 2 * time.Second}, nil // the StatefulSet makes it again
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	port, token, err := migrate.SidecarControl(pod, r.cfg.StatusKey)
	if err != nil {
		// No sidecar: not the restore, which would have one. Look again
		// now and then, in case the record is for a pod yet to come.
		return reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	}
	r.running.Store(migration, true)
	defer r.running.Delete(migration)
	out, err := migrate.FinishPending(ctx, r.env(ctx, pod, migration, port, token), req.Namespace, podName, r.cfg.Timeout)
	switch {
	case err != nil && out.Ours:
		r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, contract.ReasonMigrationPending, "Migrate", "%v", err)
		return reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	case err != nil:
		return reconcile.Result{}, err
	case !out.Ours:
		return reconcile.Result{}, nil // the source still runs: its own status drives it
	case !out.Done:
		if out.Redone != "" {
			r.cfg.Events.Eventf(cm, nil, corev1.EventTypeWarning, contract.ReasonMigrationRestoreRedone, "Migrate", "migration %s: %s; the restored pod %s was deleted, for its StatefulSet to make it again as a restore", migration, out.Redone, podName)
		}
		return reconcile.Result{RequeueAfter: 2 * time.Second}, nil
	}
	st := Status{Name: migration, Phase: contract.PhaseSucceeded, Strategy: string(out.Strategy), Target: out.Node, TargetPod: podName, Started: cm.CreationTimestamp.Time,
		Message: "the migrator stopped after it had deleted the source; a restarted migrator completed the migration from its pending-migration record; its timings were lost with it"}
	st.Message += r.dropServedImages(ctx, pod, st)
	return reconcile.Result{}, r.succeeded(ctx, req.Namespace, podName, st)
}

// succeeded records st, a migration completed by a restarted controller,
// on the pod that serves now.
func (r *Reconciler) succeeded(ctx context.Context, ns, name string, st Status) error {
	// Fresh: the pod was made again under the same name.
	pod, err := r.freshPod(ctx, ns, name)
	if err != nil {
		return fmt.Errorf("migration %s succeeded, but its pod: %w", st.Name, err)
	}
	r.cfg.Events.Eventf(pod, nil, corev1.EventTypeNormal, contract.ReasonMigrationSucceeded, "Migrate", "migration %s: %s", st.Name, st.Message)
	r.cfg.Metrics.record(ResultSucceeded, st)
	return r.setStatus(ctx, pod, st)
}
