package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
)

// rebuildRetry is how soon a rebuild that failed, but may succeed later,
// is tried again.
const rebuildRetry = 30 * time.Second

// setupRebuild registers the controller that watches restored pods that
// serve (contract.AnnotationRestoredFrom) for an app container that
// restarted, and rebuilds their state (migrate.Rebuild).
func (r *Reconciler) setupRebuild(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("rebuild").
		For(&corev1.Pod{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			_, ok := o.GetAnnotations()[contract.AnnotationRestoredFrom]
			return ok
		}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.cfg.Concurrent}).
		Complete(reconcile.Func(r.reconcileRebuild))
}

// reconcileRebuild rebuilds the state of a restored pod whose app
// container restarted since it took over. It records the outcome as Events
// and, when the state cannot be rebuilt, as the pod condition
// contract.ConditionStateNotRebuilt; the pod's sidecar then stays stopped.
func (r *Reconciler) reconcileRebuild(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	// Cached first: every status change of every restored pod comes here,
	// and few need a rebuild.
	pod, res, err := r.toRebuild(ctx, req, r.cachedPod)
	if pod == nil {
		return res, err
	}
	// Fresh before acting: a cache that has not yet seen the end of a
	// rebuild that just ran (the pod replaced or marked) would start
	// another.
	if pod, res, err = r.toRebuild(ctx, req, r.freshPod); pod == nil {
		return res, err
	}
	key := "rebuild/" + string(pod.UID)
	if _, busy := r.running.LoadOrStore(key, true); busy {
		return reconcile.Result{RequeueAfter: requeueAfter}, nil
	}
	defer r.running.Delete(key)
	port, token, err := migrate.SidecarControl(pod, r.cfg.StatusKey)
	if err != nil {
		return reconcile.Result{}, nil // no sidecar: not ours
	}
	name := migrate.MigrationName(pod.Name, r.cfg.Clock.Now())
	// The pending-migration controller leaves a StatefulSet pod's record
	// to the rebuild that wrote it.
	r.running.Store(migrate.MigrationLabel(name), true)
	defer r.running.Delete(migrate.MigrationLabel(name))
	logger := log.FromContext(ctx).WithValues("rebuild", name)
	rep, err := migrate.Rebuild(ctx, r.rebuildEnv(ctx, pod, name, port, token, logger),
		migrate.RebuildPlan{Name: name, Namespace: pod.Namespace, Pod: pod.Name, Timeout: r.cfg.Timeout})
	if errors.Is(err, migrate.ErrRebuildNotYet) {
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	var after *migrate.AfterTakeover
	if err == nil || errors.As(err, &after) {
		return r.rebuilt(ctx, pod, name, rep, after, logger), nil
	}
	return r.notRebuilt(ctx, pod, name, err, logger), nil
}

// toRebuild reads the pod of req with get and returns it if its state is
// to be rebuilt now: it runs, its app restarted since it took over, and
// neither a migration of it nor an earlier verdict stands in the way.
// Otherwise it returns nil and what the reconcile answers.
func (r *Reconciler) toRebuild(ctx context.Context, req reconcile.Request, get func(ctx context.Context, ns, name string) (*corev1.Pod, error)) (*corev1.Pod, reconcile.Result, error) {
	pod, err := get(ctx, req.Namespace, req.Name)
	if apierrors.IsNotFound(err) {
		return nil, reconcile.Result{}, nil
	}
	if err != nil {
		return nil, reconcile.Result{}, err
	}
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return nil, reconcile.Result{}, nil
	}
	if restarted, _, _ := migrate.AppRestartedSince(pod); !restarted {
		return nil, reconcile.Result{}, nil
	}
	if c := stateNotRebuilt(pod); c != nil && c.Reason == contract.ConditionReasonRetention {
		return nil, reconcile.Result{}, nil // said once; nothing can mend it
	}
	if _, asked := pod.Annotations[contract.AnnotationMigrateTo]; asked {
		return nil, reconcile.Result{RequeueAfter: requeueAfter}, nil // the migration's reconcile goes first
	}
	if st, has, err := statusOf(pod); err == nil && has && st.Phase == contract.PhaseRunning {
		return nil, reconcile.Result{RequeueAfter: requeueAfter}, nil // a migration of it runs, or is to be rolled back
	}
	return pod, reconcile.Result{}, nil
}

// rebuildEnv is the migrate.Env of rebuild name of pod: its phases become
// Events, the first of them (the stop) said why.
func (r *Reconciler) rebuildEnv(ctx context.Context, pod *corev1.Pod, name string, port int, token string, logger logr.Logger) migrate.Env {
	_, was, now := migrate.AppRestartedSince(pod)
	env := r.env(ctx, pod, name, port, token)
	phaseEvent := env.Progress
	env.Progress = func(phase string, took time.Duration) {
		if phase == "stop" { // the rebuild has begun: say why first
			r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, contract.ReasonAppRestarted, "Rebuild",
				"the app container restarted (restartCount %d, %d when the pod took over) and came back from the checkpoint without what it processed since; its sidecar is stopped and the state rebuilt from the replay log (%s)", now, was, name)
			logger.Info("app restarted: rebuilding its state", "restarts", now, "was", was)
		}
		phaseEvent(phase, took)
	}
	return env
}

// rebuilt records the rebuild of pod's state (name, rep) with an Event on
// pod and on the pod that serves it now; after, if set, says what failed
// once it served (tried again later).
func (r *Reconciler) rebuilt(ctx context.Context, pod *corev1.Pod, name string, rep migrate.Report, after *migrate.AfterTakeover, logger logr.Logger) reconcile.Result {
	msg := fmt.Sprintf("%s: the state was rebuilt: %s replayed the log after checkpoint %d to the stop's cutoff %d, leaving out %d deliveries the broker had requeued when the app left without acking them, and serves (downtime %s)",
		name, rep.TargetPod, rep.Start, rep.CutoffID, rep.Skipped, rep.Downtime.Round(time.Millisecond))
	if after != nil {
		msg += "; but " + after.Error()
	}
	r.cfg.Events.Eventf(pod, nil, corev1.EventTypeNormal, contract.ReasonStateRebuilt, "Rebuild", "%s", msg)
	// Fresh: the pod was made moments ago (a StatefulSet's under pod's
	// own name).
	if target, gerr := r.freshPod(ctx, pod.Namespace, rep.TargetPod); gerr == nil && target.UID != pod.UID {
		r.cfg.Events.Eventf(target, nil, corev1.EventTypeNormal, contract.ReasonStateRebuilt, "Rebuild", "%s", msg)
	}
	logger.Info("state rebuilt", "pod", rep.TargetPod, "downtime", rep.Downtime)
	if after != nil {
		return reconcile.Result{RequeueAfter: rebuildRetry}
	}
	return reconcile.Result{}
}

// notRebuilt records that rebuild name of pod's state failed with err: a
// Warning Event and the condition contract.ConditionStateNotRebuilt. A
// log that lost the records (migrate.ErrStateLost) is final; anything
// else is tried again.
func (r *Reconciler) notRebuilt(ctx context.Context, pod *corev1.Pod, name string, err error, logger logr.Logger) reconcile.Result {
	reason := contract.ConditionReasonFailed
	next := "; tried again in " + rebuildRetry.String()
	if errors.Is(err, migrate.ErrStateLost) {
		reason = contract.ConditionReasonRetention
		next = "; the pod consumes nothing until it is deleted (its ReplicaSet then starts it from its template, without the state)"
		if migrate.ByOwner(pod) == contract.StrategyStatefulSetShadow {
			next = fmt.Sprintf("; the pod consumes nothing until ConfigMap %s and the pod are deleted (its StatefulSet then starts it from its template, without the state)", contract.PendingConfigMapName(pod.Name))
		}
	}
	logger.Info("state not rebuilt", "err", err.Error())
	r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, contract.ReasonStateNotRebuilt, "Rebuild", "%s: %v%s", name, err, next)
	if cerr := r.setStateNotRebuilt(ctx, pod, reason, fmt.Sprintf("%v%s", err, next)); cerr != nil {
		logger.Error(cerr, "record the condition", "condition", contract.ConditionStateNotRebuilt)
	}
	if reason == contract.ConditionReasonRetention {
		return reconcile.Result{}
	}
	return reconcile.Result{RequeueAfter: rebuildRetry}
}

// stateNotRebuilt returns pod's contract.ConditionStateNotRebuilt, if set.
func stateNotRebuilt(pod *corev1.Pod) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if c := &pod.Status.Conditions[i]; c.Type == contract.ConditionStateNotRebuilt && c.Status == corev1.ConditionTrue {
			return c
		}
	}
	return nil
}

// setStateNotRebuilt sets pod's contract.ConditionStateNotRebuilt (a
// strategic merge patch of its status: the kubelet keeps conditions it
// does not own).
func (r *Reconciler) setStateNotRebuilt(ctx context.Context, pod *corev1.Pod, reason, msg string) error {
	cond := corev1.PodCondition{Type: contract.ConditionStateNotRebuilt, Status: corev1.ConditionTrue, Reason: reason, Message: msg,
		LastTransitionTime: metav1.NewTime(r.cfg.Clock.Now())}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{cond}}})
	if err != nil {
		return err
	}
	_, err = r.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}
