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
	// The request carried over to the rebuilt pod is written once the
	// rebuild has let go of the pods (the defers below run first), so
	// that the new pod's reconcile finds them free.
	var carry func()
	defer func() {
		if carry != nil {
			carry()
		}
	}()
	// One operation per pod: the pod, and the copy that rebuilds it, are
	// the rebuild's until it ends; a migration request waits meanwhile
	// (Reconcile), and one that runs makes the rebuild wait.
	key, copyKey := podKey(pod.Namespace, pod.Name), podKey(pod.Namespace, migrate.RebuildPodName(pod))
	if _, busy := r.running.LoadOrStore(key, "rebuild"); busy {
		return reconcile.Result{RequeueAfter: requeueAfter}, nil
	}
	defer r.running.Delete(key)
	if _, busy := r.running.LoadOrStore(copyKey, "rebuild"); busy {
		return reconcile.Result{RequeueAfter: requeueAfter}, nil
	}
	defer r.running.Delete(copyKey)
	// Fresh before acting, and once the pod is the rebuild's: a cache
	// that has not yet seen the end of a rebuild or migration that just
	// ran (the pod replaced or marked) would start another.
	if pod, res, err = r.toRebuild(ctx, req, r.freshPod); pod == nil {
		return res, err
	}
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
	env := r.rebuildEnv(ctx, pod, name, port, token, logger)
	// A migration request made on the pod meanwhile is read before each
	// step that may replace the pod (the StatefulSet's pod deleted after
	// the stop, the copy handed over after its replay), to be carried
	// over to the pod that serves after it.
	var asked map[string]string
	progress := env.Progress
	env.Progress = func(phase string, took time.Duration) {
		progress(phase, took)
		if p, gerr := r.freshPod(ctx, pod.Namespace, pod.Name); gerr == nil && p.UID == pod.UID {
			if req := requestOf(p); req != nil {
				asked = req
			}
		}
	}
	rep, err := migrate.Rebuild(ctx, env, migrate.RebuildPlan{Name: name, Namespace: pod.Namespace, Pod: pod.Name, Timeout: r.cfg.Timeout})
	if errors.Is(err, migrate.ErrRebuildNotYet) {
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	var after *migrate.AfterTakeover
	if err == nil || errors.As(err, &after) {
		carry = func() { r.carryRequest(ctx, pod, rep.TargetPod, asked, logger) }
		return r.rebuilt(ctx, pod, name, rep, after, logger), nil
	}
	return r.notRebuilt(ctx, pod, name, err, logger), nil
}

// toRebuild reads the pod of req with get and returns it if its state is
// to be rebuilt now: it runs, its app restarted since it took over, and
// neither a migration of it nor an earlier verdict stands in the way. A
// migration request does not: it waits for the rebuild (rebuildFirst),
// since a migration would move the restarted app's wrong state.
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

// podKey is the key in Reconciler.running of the pod ns/name while a
// migration ("migration") or a rebuild ("rebuild") has it: one operation
// per pod at a time.
func podKey(ns, name string) string { return "pod/" + ns + "/" + name }

// requestKeys are the annotations of a migration request, carried over
// with it to the pod a rebuild makes.
var requestKeys = []string{
	contract.AnnotationMigrateTo, contract.AnnotationMigrateForce, contract.AnnotationStrategy,
	contract.AnnotationReplayMax, contract.AnnotationCutoff, contract.AnnotationEvacuate,
}

// requestOf is pod's migration request (its requestKeys), or nil if it
// has none.
func requestOf(pod *corev1.Pod) map[string]string {
	if _, ok := pod.Annotations[contract.AnnotationMigrateTo]; !ok {
		return nil
	}
	out := map[string]string{}
	for _, k := range requestKeys {
		if v, ok := pod.Annotations[k]; ok {
			out[k] = v
		}
	}
	return out
}

// rebuildFirst says why a migration request on pod waits for a rebuild
// of its state, or "": this process rebuilds it (or pod is the copy that
// does), or its app restarted since it took over and no rebuild has dealt
// with that yet (this process's rebuild reconciler, or a restarted
// controller's, which goes on from what its predecessor left). A
// migration would move the restarted app's wrong state, or checkpoint a
// pod the rebuild is about to replace. A pod whose state cannot be
// rebuilt (the log lost its records) waits for nothing.
func (r *Reconciler) rebuildFirst(pod *corev1.Pod) string {
	if v, ok := r.running.Load(podKey(pod.Namespace, pod.Name)); ok && v == "rebuild" {
		return "its state is being rebuilt"
	}
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return ""
	}
	if restarted, _, _ := migrate.AppRestartedSince(pod); !restarted {
		return ""
	}
	if c := stateNotRebuilt(pod); c != nil && c.Reason == contract.ConditionReasonRetention {
		return ""
	}
	return "its app container restarted, and its state is rebuilt first"
}

// waitForRebuild answers a request for node on pod that waits for the
// rebuild of its state (why), with one Event per pod, request and
// reason, and remembers the request, to carry it over should the rebuild
// replace the pod.
func (r *Reconciler) waitForRebuild(pod *corev1.Pod, why, node string) {
	if req := requestOf(pod); req != nil {
		r.asked.Store(pod.UID, req)
	}
	key := "rebuild\x00" + string(pod.UID) + "\x00" + node + "\x00" + why
	if _, seen := r.refused.LoadOrStore(key, true); seen {
		return
	}
	r.cfg.Events.Eventf(pod, nil, corev1.EventTypeNormal, contract.ReasonMigrationWaiting, "Migrate",
		"the request %s=%s is waiting for the rebuild of pod %s to end (%s); it then runs against the pod that serves with the rebuilt state (carried over to it if the rebuild replaces this one)",
		contract.AnnotationMigrateTo, node, pod.Name, why)
}

// carryRequest carries the migration request made on pod while its state
// was rebuilt over to target, the pod that serves after the rebuild, if
// that is another pod (a copy, or a StatefulSet's pod made again): the
// request on the pod it replaced would go with that pod. asked is the
// request the rebuild read on pod before it could replace it; the
// request Reconcile saw waiting, and the pod itself if still there, are
// read too. The request then leaves pod, so that it is answered once.
func (r *Reconciler) carryRequest(ctx context.Context, pod *corev1.Pod, target string, asked map[string]string, logger logr.Logger) {
	if v, ok := r.asked.LoadAndDelete(pod.UID); ok && asked == nil {
		asked = v.(map[string]string)
	}
	old, err := r.freshPod(ctx, pod.Namespace, pod.Name)
	if err == nil && old.UID == pod.UID {
		asked = requestOf(old) // still there: what it says now (none: withdrawn)
	} else {
		old = nil
	}
	if asked == nil || target == "" {
		return
	}
	now, err := r.freshPod(ctx, pod.Namespace, target)
	if err != nil || now.UID == pod.UID {
		return // the pod itself serves on, with its request
	}
	if _, has := now.Annotations[contract.AnnotationMigrateTo]; !has {
		ann := map[string]*string{}
		for k, v := range asked {
			ann[k] = &v
		}
		if err := r.patchAnnotations(ctx, now, ann, now.ResourceVersion); err != nil {
			logger.Error(err, "carry the migration request over to the rebuilt pod", "pod", target)
			r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, contract.ReasonMigrationWaiting, "Migrate",
				"the request %s=%s could not be carried over to %s, which serves with the rebuilt state (%v): ask again there", contract.AnnotationMigrateTo, asked[contract.AnnotationMigrateTo], target, err)
			return
		}
		r.cfg.Events.Eventf(now, nil, corev1.EventTypeNormal, contract.ReasonMigrationWaiting, "Migrate",
			"the request %s=%s made on pod %s while its state was rebuilt is carried over to this pod, which serves with the rebuilt state",
			contract.AnnotationMigrateTo, asked[contract.AnnotationMigrateTo], pod.Name)
	}
	if old != nil {
		drop := map[string]*string{}
		for k := range asked {
			drop[k] = nil
		}
		if err := r.patchAnnotations(ctx, old, drop, ""); err != nil {
			logger.Error(err, "remove the request carried over from the rebuilt pod", "pod", pod.Name)
		}
	}
}
