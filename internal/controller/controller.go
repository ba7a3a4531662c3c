package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/sign"
)

// EventSource names the controller in Events.
const EventSource = "ms2m-migrator"

// Recorder emits Events (the events.k8s.io recorder of controller-runtime).
type Recorder interface {
	Eventf(regarding runtime.Object, related runtime.Object, eventtype, reason, action, note string, args ...any)
}

// Config is what the controller needs.
type Config struct {
	// Client reads from and writes to the API server.
	Client kubernetes.Interface
	// Reader reads pods and pending-migration ConfigMaps from the
	// manager's cache where a read that lags is safe (read.go).
	// SetupWithManager sets it to the manager's client; without it, every
	// read goes to the API server.
	Reader    client.Reader
	Events    Recorder
	Agent     migrate.NodeAgent
	ImageRepo string
	// CheckpointThroughAPIServer is migrate.Env's: checkpoints through the
	// API server's node proxy rather than the node agents.
	CheckpointThroughAPIServer bool
	// Admit is for clusters without the webhook (tests); nil in a cluster.
	Admit func(*corev1.Pod) (*corev1.Pod, error)
	// Timeout bounds each wait of a migration. Default 5 minutes.
	Timeout time.Duration
	// ThawAfterDump is every migration's migrate.Plan.ThawAfterDump.
	ThawAfterDump migrate.ThawPolicy
	// Concurrent is how many migrations run at once. Default 4.
	Concurrent int
	// Metrics counts and times migrations. Default: DefaultMetrics, in
	// controller-runtime's registry.
	Metrics *Metrics
	// StatusKey signs the migration statuses this controller writes (it
	// trusts no other) and the restore instructions it gives (the webhook
	// restores no other). Replicas, restarts and the webhook must share it
	// (the migrator keeps it in a Secret). Default: a random key for this
	// process alone, with which a restarted controller cannot roll back
	// what it left, and the webhook refuses every restore.
	StatusKey []byte
	// Clock names and times the migrations, ends the controller's own
	// retries, and is handed to each migration (migrate.Env.Clock).
	// Default: migrate.SystemClock.
	Clock migrate.Clock
	// KeepImages keeps checkpoint images once a migration's target serves
	// (for debugging); by default they are deleted then.
	KeepImages bool
	// EvacuatePerNode and EvacuateMax bound the evacuations (evictions
	// turned into migrations, contract.AnnotationOnEvict) under way off
	// one node and in the whole cluster. Defaults 2 and Concurrent.
	EvacuatePerNode int
	EvacuateMax     int
	// PlaceholderImage is the image of the placeholder pods that ask
	// kube-scheduler for an evacuation's target. Default
	// DefaultPlaceholderImage.
	PlaceholderImage string
}

// requeueAfter is how soon a pod that has to wait (its target's migration
// runs, or one runs elsewhere) is looked at again.
const requeueAfter = 10 * time.Second

// Reconciler runs requested migrations.
type Reconciler struct {
	cfg     Config
	running sync.Map // migration name → true, for the ones this process drives; podKey → "migration" or "rebuild", for the pods they have
	refused sync.Map // pod UID, migration and node → true, for the Events of refused requests
	asked   sync.Map // pod UID → its request (requestOf), for the requests that wait for a rebuild of the pod
	http    *http.Client
}

// New returns a Reconciler.
func New(cfg Config) *Reconciler {
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Minute
	}
	if cfg.Concurrent == 0 {
		cfg.Concurrent = 4
	}
	if cfg.Metrics == nil {
		cfg.Metrics = DefaultMetrics()
	}
	if cfg.EvacuatePerNode == 0 {
		cfg.EvacuatePerNode = 2
	}
	if cfg.EvacuateMax == 0 {
		cfg.EvacuateMax = cfg.Concurrent
	}
	if cfg.Clock == nil {
		cfg.Clock = migrate.SystemClock
	}
	if len(cfg.StatusKey) == 0 {
		key, err := sign.NewKey()
		if err != nil {
			panic("no randomness for the status key: " + err.Error())
		}
		cfg.StatusKey = key
	}
	return &Reconciler{cfg: cfg, http: &http.Client{Timeout: migrate.DefaultTimeouts.Sidecar}}
}

// SetupWithManager registers the controller: it sees only pods that carry
// a migration request.
// A second controller sees the pending-migration records of StatefulSet
// migrations, to complete one whose migrator stopped after it deleted the
// source.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.cfg.Reader == nil {
		r.cfg.Reader = mgr.GetClient()
	}
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("migration").
		For(&corev1.Pod{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			_, ok := o.GetAnnotations()[contract.AnnotationMigrateTo]
			return ok
		}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.cfg.Concurrent}).
		Complete(r); err != nil {
		return err
	}
	if err := r.setupEvacuation(mgr); err != nil {
		return err
	}
	if err := r.setupRebuild(mgr); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("pending-migration").
		For(&corev1.ConfigMap{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			_, ok := o.GetLabels()[contract.LabelMigration]
			return ok && strings.HasPrefix(o.GetName(), contract.PendingConfigMapPrefix)
		}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.cfg.Concurrent}).
		Complete(reconcile.Func(r.reconcilePending))
}

// PendingSelector selects the pending-migration ConfigMaps, the only ones
// the controller watches: a manager's cache can be narrowed to them.
func PendingSelector() labels.Selector {
	sel, _ := labels.Parse(contract.LabelMigration)
	return sel
}

// Reconcile acts on one pod that asks to migrate.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	// Fresh: the answer rests on the migration status this controller
	// wrote; a cache that has not seen a migration's end yet would have it
	// roll back what ended.
	pod, err := r.freshPod(ctx, req.Namespace, req.Name)
	if apierrors.IsNotFound(err) {
		return reconcile.Result{}, nil
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	prev, has, stErr := statusOf(pod)
	if has && stErr == nil && !signedByUs(r.cfg.StatusKey, pod) {
		// Not a record this controller wrote: nothing is rolled back or
		// deleted by it, and its history is dropped.
		r.forged(pod)
		prev, has = Status{}, false
	}
	migrateTo, asked := pod.Annotations[contract.AnnotationMigrateTo]
	act := decide(situation{
		node: pod.Spec.NodeName, asked: asked, migrateTo: migrateTo,
		hasStatus: has, statusBad: stErr != nil, status: prev,
		ours: has && r.isRunning(prev.Name), targetOfOurs: r.isRunning(pod.Annotations[contract.AnnotationMigrationName]),
	})
	// One operation per pod: a rebuild of its state goes first, and the
	// request then runs against the pod that serves after it.
	if act == ActMigrate || act == ActBusy && !(has && prev.Phase == contract.PhaseRunning) {
		if rebuild := r.rebuildFirst(pod); rebuild != "" {
			r.waitForRebuild(pod, rebuild, migrateTo)
			return reconcile.Result{RequeueAfter: requeueAfter}, nil
		}
	}
	if act == ActMigrate {
		key := podKey(pod.Namespace, pod.Name)
		if _, busy := r.running.LoadOrStore(key, "migration"); busy {
			return reconcile.Result{RequeueAfter: requeueAfter}, nil
		}
		defer r.running.Delete(key)
	}
	switch act {
	case ActNone:
		return reconcile.Result{}, nil
	case ActBadStatus:
		r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, contract.ReasonMigrationRejected, "Migrate", "%v; remove it (kubectl annotate pod %s %s-) to ask again", stErr, pod.Name, contract.AnnotationMigrationStatus)
		return reconcile.Result{}, nil
	case ActWait:
		return reconcile.Result{RequeueAfter: requeueAfter}, nil
	case ActRollBack:
		return reconcile.Result{}, r.rollBack(ctx, pod, prev)
	case ActBusy:
		r.refuseBusy(pod, prev, migrateTo)
		return reconcile.Result{RequeueAfter: requeueAfter}, nil
	case ActSameNode:
		err := fmt.Errorf("annotation %s: the pod already runs on %s", contract.AnnotationMigrateTo, migrateTo)
		return reconcile.Result{}, r.reject(ctx, pod, Status{Target: migrateTo, Source: pod.Spec.NodeName, Started: r.cfg.Clock.Now(), History: prev.History}, err)
	}

	rq, err := parseRequest(pod)
	if err == nil {
		err = r.checkTarget(ctx, pod, rq)
	}
	if err != nil {
		return reconcile.Result{}, r.reject(ctx, pod, Status{Target: rq.node, Source: pod.Spec.NodeName, Strategy: string(rq.strategy), Started: r.cfg.Clock.Now(), History: prev.History}, err)
	}

	return reconcile.Result{}, r.start(ctx, pod, rq, prev)
}

// start records a migration of pod by rq as Running (guarded by the pod's
// resourceVersion: a conflict means another reconcile or controller got
// there first) and drives it to its end, which it records.
func (r *Reconciler) start(ctx context.Context, pod *corev1.Pod, rq request, prev Status) error {
	now := r.cfg.Clock.Now()
	name, targetPod := migrate.MigrationName(pod.Name, now), migrate.NextPodName(pod)
	st := Status{Name: name, Phase: contract.PhaseRunning, Strategy: string(rq.strategy), Source: pod.Spec.NodeName, Target: rq.node, TargetPod: targetPod, Started: now, History: prev.History}
	st.Evacuation = evacuationOf(pod)
	if err := r.setStatus(ctx, pod, st); err != nil {
		return err // a conflict: try again with the new pod
	}
	r.running.Store(name, true)
	defer r.running.Delete(name)
	defer r.forgetRefused(name)
	// The target is the migration's until it ends: a rebuild of it (its
	// app restarted right after it took over) waits for the migration's
	// last steps, which hand it to its workload and record the outcome
	// on it.
	if key := podKey(pod.Namespace, targetPod); targetPod != pod.Name {
		if _, busy := r.running.LoadOrStore(key, "migration"); !busy {
			defer r.running.Delete(key)
		}
	}
	// A request made on the pod while this one runs is refused: its
	// reconcile would wait until this one returns.
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go r.watchRequests(watchCtx, pod, st)
	r.cfg.Metrics.started()
	defer r.cfg.Metrics.stopped()
	r.cfg.Events.Eventf(pod, nil, corev1.EventTypeNormal, contract.ReasonMigrationStarted, "Migrate", "migration %s to node %s by %s", name, rq.node, rq.strategy)
	log.FromContext(ctx).Info("migration started", "migration", name, "targetNode", rq.node, "strategy", rq.strategy)

	port, token, err := migrate.SidecarControl(pod, r.cfg.StatusKey)
	if err != nil {
		return r.fail(ctx, pod, st, err)
	}
	rep, err := migrate.Run(ctx, r.env(ctx, pod, name, port, token), migrate.Plan{
		Name: name, Namespace: pod.Namespace, Pod: pod.Name, Container: inject.AppContainer(pod),
		TargetNode: rq.node, TargetPod: targetPod, Strategy: rq.strategy, ReplayMax: rq.replayMax, Cutoff: rq.cutoff, Timeout: r.cfg.Timeout,
		ThawAfterDump: r.cfg.ThawAfterDump,
	})
	st.Report = &rep
	var refused *migrate.Refused
	if errors.As(err, &refused) {
		st.Report = nil
		return r.reject(ctx, pod, st, err)
	}
	var after *migrate.AfterTakeover
	if errors.As(err, &after) {
		st.TargetPod = targetPod
		return r.servesAfterAll(ctx, pod, st, after)
	}
	var back *migrate.RolledBack
	if errors.As(err, &back) {
		return r.restoredOnSource(ctx, pod, st, back)
	}
	if err != nil {
		return r.fail(ctx, pod, st, err)
	}
	st.Phase = contract.PhaseSucceeded
	st.Message = fmt.Sprintf("total %s, downtime %s", rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond))
	st.TargetPod = rep.TargetPod
	r.cfg.Metrics.record(ResultSucceeded, st)
	log.FromContext(ctx).Info("migration succeeded", "migration", name, "target", st.TargetPod, "total", rep.Total, "downtime", rep.Downtime)
	return r.recordOnTarget(ctx, pod, st)
}

// restoredOnSource records migration st of pod, a StatefulSet's, as
// rolled back: its restore on the target failed, and the StatefulSet's
// pod of the same name was restored on the source's node instead and
// serves (back says how). The status and the Event go on that pod.
func (r *Reconciler) restoredOnSource(ctx context.Context, pod *corev1.Pod, st Status, back *migrate.RolledBack) error {
	st.Phase, st.Message, st.TargetPod = contract.PhaseRolledBack, back.Error(), pod.Name
	log.FromContext(ctx).Info("rolled back: restored on the source's node", "migration", st.Name, "err", back.Err.Error())
	r.cfg.Metrics.record(ResultRolledBack, st)
	// Fresh: the StatefulSet made this pod again moments ago, under the
	// same name; a cache may still hold the one deleted.
	now, err := r.freshPod(ctx, pod.Namespace, pod.Name)
	if err != nil {
		now = pod
	}
	r.cfg.Events.Eventf(now, nil, corev1.EventTypeWarning, contract.ReasonMigrationRolledBack, "Migrate", "migration %s: %s", st.Name, st.Message)
	return r.setStatus(ctx, now, st)
}

// recordOnTarget writes st, the outcome of a migration of pod whose target
// serves, on the target, with its Event, trying again for up to the
// migration timeout: a failed write is not retried by a requeue, since
// the pod that asked is gone (or, a StatefulSet's, is the target, which
// carries no request), and the migration would be recorded nowhere.
func (r *Reconciler) recordOnTarget(ctx context.Context, pod *corev1.Pod, st Status) error {
	deadline := r.cfg.Clock.Now().Add(r.cfg.Timeout)
	wait := 200 * time.Millisecond
	for {
		// Fresh: a StatefulSet's target has the source's name; a cache
		// may still hold the source, and the Event would go to it.
		target, err := r.freshPod(ctx, pod.Namespace, st.TargetPod)
		if err == nil {
			if err = r.setStatus(ctx, target, st); err == nil {
				r.cfg.Events.Eventf(target, nil, corev1.EventTypeNormal, contract.ReasonMigrationSucceeded, "Migrate", "migration %s from %s: %s", st.Name, pod.Spec.NodeName, st.Message)
				return nil
			}
		}
		if r.cfg.Clock.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("migration %s succeeded, but its outcome could not be recorded on the target %s: %w", st.Name, st.TargetPod, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// servesAfterAll ends migration st of pod, the source, whose target took
// over but whose last steps failed (after): it is recorded on the target,
// which serves, as Succeeded with what failed among its warnings. The
// failed steps (Finish: the target to the workload's controller, the
// source deleted) are tried again meanwhile, for up to the migration
// timeout, and so is the record: a source its ReplicaSet deletes first
// (it is marked to go first) takes no request annotation with it that a
// later reconcile could act on, so this is the one chance to write the
// outcome.
func (r *Reconciler) servesAfterAll(ctx context.Context, pod *corev1.Pod, st Status, after *migrate.AfterTakeover) error {
	st.Phase = contract.PhaseSucceeded
	st.Report.Warnings = append(st.Report.Warnings, after.Error())
	r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, contract.ReasonMigrationRollForwardFailed, "Migrate", "migration %s: %v; trying again", st.Name, after)
	log.FromContext(ctx).Info("migration's target serves, its last steps failed; trying them again", "migration", st.Name, "target", st.TargetPod, "error", after.Error())
	deadline := r.cfg.Clock.Now().Add(r.cfg.Timeout)
	wait := 200 * time.Millisecond
	finished := false
	for !finished {
		err := migrate.Finish(ctx, r.cfg.Clock, r.cfg.Client, pod, st.TargetPod, r.cfg.Timeout)
		if err == nil {
			finished = true
			break
		}
		if r.cfg.Clock.Now().After(deadline) || ctx.Err() != nil {
			rerr := fmt.Errorf("migration %s: finish after the takeover: %w", st.Name, err)
			st.Report.Warnings = append(st.Report.Warnings, rerr.Error())
			r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, contract.ReasonMigrationRollForwardFailed, "Migrate", "%v; the target serves: delete the source %s by hand", rerr, pod.Name)
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
	st.Message = fmt.Sprintf("total %s, downtime %s; after the takeover: %v", st.Report.Total.Round(time.Millisecond), st.Report.Downtime.Round(time.Millisecond), after)
	if finished {
		st.Message += " (done again: the source is gone)"
	}
	r.cfg.Metrics.record(ResultSucceeded, st)
	return r.recordOnTarget(ctx, pod, st)
}

// env is what migration name of pod needs; its phases become Events on pod
// and log lines on ctx's logger.
func (r *Reconciler) env(ctx context.Context, pod *corev1.Pod, name string, port int, token string) migrate.Env {
	return migrate.Env{
		Client: r.cfg.Client, Agent: r.cfg.Agent, ImageRepo: r.cfg.ImageRepo, Admit: r.cfg.Admit,
		ControlToken: token, ControlPort: port, HTTP: r.http, Log: log.FromContext(ctx), Clock: r.cfg.Clock,
		SigningKey: r.cfg.StatusKey, KeepImages: r.cfg.KeepImages, CheckpointThroughAPIServer: r.cfg.CheckpointThroughAPIServer,
		Progress: func(phase string, took time.Duration) {
			// The action names the phase: the Events recorder folds Events
			// of the same type, reason, action and object into one series
			// that keeps the first note, so with one action for every phase
			// only the first phase's note would ever be shown.
			r.cfg.Events.Eventf(pod, nil, corev1.EventTypeNormal, contract.ReasonMigrationPhase, "Migrate "+phase, "migration %s: %s took %s", name, phase, took.Round(time.Millisecond))
		},
	}
}

func (r *Reconciler) isRunning(name string) bool {
	_, ok := r.running.Load(name)
	return ok
}

// checkTarget checks the request against the cluster before anything is
// touched.
func (r *Reconciler) checkTarget(ctx context.Context, pod *corev1.Pod, rq request) error {
	if _, ok := pod.Annotations[contract.AnnotationStatus]; !ok {
		return fmt.Errorf("the pod has no ms2m sidecar: opt it in with %s: \"true\" and recreate it", contract.AnnotationInject)
	}
	if pod.Spec.NodeName == rq.node {
		return fmt.Errorf("annotation %s: the pod already runs on %s", contract.AnnotationMigrateTo, rq.node)
	}
	node, err := r.cfg.Client.CoreV1().Nodes().Get(ctx, rq.node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("annotation %s: node %s: %w", contract.AnnotationMigrateTo, rq.node, err)
	}
	if node.Spec.Unschedulable && pod.Annotations[contract.AnnotationEvacuate] != "" {
		return fmt.Errorf("annotation %s: node %s is cordoned; an evacuated pod is never restored onto a cordoned node", contract.AnnotationMigrateTo, rq.node)
	}
	if pod.Status.Phase != corev1.PodRunning {
		return fmt.Errorf("the pod is %s, not Running", pod.Status.Phase)
	}
	return nil
}

// reject answers a request that was refused before anything was touched:
// a Warning Event, and st, Failed, as the pod's status.
func (r *Reconciler) reject(ctx context.Context, pod *corev1.Pod, st Status, err error) error {
	st.Evacuation = evacuationOf(pod)
	st.Phase, st.Message = contract.PhaseFailed, err.Error()+"; nothing was touched"
	reason := contract.ReasonMigrationRejected
	var np *migrate.NotPlaceable
	if errors.As(err, &np) {
		reason = contract.ReasonMigrationTargetNotAllowed
	}
	var nc *migrate.NotCapable
	if errors.As(err, &nc) {
		reason = nc.Reason
	}
	r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, reason, "Migrate", "%v", err)
	r.cfg.Metrics.record(ResultRejected, st)
	return r.setStatus(ctx, pod, st)
}

// refuseBusy answers a request for node made while migration st of pod
// (or the migration pod is the target of) runs, with one Event per
// request: the running migration goes on, and its end answers the pod's
// request annotation.
func (r *Reconciler) refuseBusy(pod *corev1.Pod, st Status, node string) {
	running := st.Name
	if running == "" || st.Phase != contract.PhaseRunning {
		running = pod.Annotations[contract.AnnotationMigrationName]
	}
	key := string(pod.UID) + "\x00" + running + "\x00" + node
	if _, seen := r.refused.LoadOrStore(key, true); seen {
		return
	}
	r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, contract.ReasonMigrationInProgress, "Migrate",
		"migration %s of this pod is under way; the request %s=%s is refused: ask again once it has ended (migrator status %s/%s)",
		running, contract.AnnotationMigrateTo, node, pod.Namespace, pod.Name)
}

// forged answers a pod whose migration status this controller did not
// sign, with one Warning Event per status value.
func (r *Reconciler) forged(pod *corev1.Pod) {
	raw := pod.Annotations[contract.AnnotationMigrationStatus]
	key := "forged\x00" + string(pod.UID) + "\x00" + raw
	if _, seen := r.refused.LoadOrStore(key, true); seen {
		return
	}
	r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, contract.ReasonForgedMigrationStatus, "Migrate",
		"annotation %s is not signed by this migrator (%s missing or wrong): it was not written by ms2m's controller, or before statuses were signed; it is ignored: nothing is rolled back or deleted by it, and the request is handled as the pod's first",
		contract.AnnotationMigrationStatus, contract.AnnotationMigrationStatusSignature)
}

// watchRequests refuses, with an Event each, the requests made on pod
// while migration st runs, until ctx ends.
func (r *Reconciler) watchRequests(ctx context.Context, pod *corev1.Pod, st Status) {
	w, err := r.cfg.Client.CoreV1().Pods(pod.Namespace).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", pod.Name).String(), ResourceVersion: pod.ResourceVersion,
	})
	if err != nil {
		return // no Events for the requests made meanwhile; they are answered when it ends
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok || p.UID != pod.UID {
			continue
		}
		if node, asked := p.Annotations[contract.AnnotationMigrateTo]; asked && node != st.Target {
			r.refuseBusy(p, st, node)
		}
	}
}

// forgetRefused drops the record of the requests refused while migration
// name ran: its end answers them.
func (r *Reconciler) forgetRefused(name string) {
	r.refused.Range(func(k, _ any) bool {
		if strings.Contains(k.(string), "\x00"+name+"\x00") {
			r.refused.Delete(k)
		}
		return true
	})
}

// fail records a failed migration on the source.
func (r *Reconciler) fail(ctx context.Context, pod *corev1.Pod, st Status, err error) error {
	st.Evacuation = evacuationOf(pod)
	st.Phase, st.Message = contract.PhaseFailed, err.Error()
	r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, contract.ReasonMigrationFailed, "Migrate", "migration %s: %v", st.Name, err)
	log.FromContext(ctx).Error(err, "migration failed", "migration", st.Name)
	r.cfg.Metrics.record(ResultFailed, st)
	return r.setStatus(ctx, pod, st)
}

// rollBack ends a migration that a killed controller left running. A
// target that has taken over (its replay reached the cutoff and it consumes
// the primary queue) has processed deliveries the source never saw, so the
// migration is completed instead: the target stays and the source goes.
// Otherwise the source serves again and the half-made target goes: a
// target that has not switched has taken nothing from the primary queue.
func (r *Reconciler) rollBack(ctx context.Context, pod *corev1.Pod, st Status) error {
	if s := contract.Strategy(st.Strategy); s == contract.StrategyStatefulSet || s == contract.StrategyStatefulSetShadow {
		return r.rollBackStatefulSet(ctx, pod, st)
	}
	port, token, ctlErr := migrate.SidecarControl(pod, r.cfg.StatusKey)
	// Fresh: whether the target is gone decides between deleting it and
	// resuming the source, and completing the migration.
	target, err := r.freshPod(ctx, pod.Namespace, st.TargetPod)
	switch {
	case apierrors.IsNotFound(err):
		target = nil
	case err != nil:
		return fmt.Errorf("migration %s: the target %s: %w", st.Name, st.TargetPod, err)
	}
	if target != nil && ctlErr == nil {
		switch v, err := migrate.TargetTakeover(ctx, r.cfg.Clock, target, control.ClientAt(target.Status.PodIP, port, token, r.http), 0); v {
		case migrate.TakeoverUnknown:
			// Deleting a target that serves would lose what it processed,
			// resuming the source beside it would count twice.
			return fmt.Errorf("migration %s: %w", st.Name, err)
		case migrate.TookOver:
			return r.rollForward(ctx, pod, target, st)
		}
	}
	// The same undo steps as a migration that fails (migrate.RollBack).
	err = migrate.RollBack(ctx, r.env(ctx, pod, st.Name, port, token), rollbackPlan(pod, st), pod)
	return r.rolledBack(ctx, pod, st, errors.Join(ctlErr, err), "the target and its checkpoint image were deleted")
}

// rollbackPlan is what migrate.RollBack needs to know of migration st of
// pod.
func rollbackPlan(pod *corev1.Pod, st Status) migrate.Plan {
	return migrate.Plan{Name: st.Name, Namespace: pod.Namespace, Pod: pod.Name, TargetNode: st.Target, TargetPod: st.TargetPod, Strategy: contract.Strategy(st.Strategy)}
}

// rolledBack ends a rollback of st on pod, the source, once err (of its
// steps) is nil: the status says the source serves and what else was
// undone. Otherwise the rollback is retried.
func (r *Reconciler) rolledBack(ctx context.Context, pod *corev1.Pod, st Status, err error, undone string) error {
	if err != nil {
		r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, contract.ReasonMigrationRollbackFailed, "Migrate", "migration %s: %v", st.Name, err)
		log.FromContext(ctx).Error(err, "rollback failed; retried", "migration", st.Name)
		return err // retried
	}
	st.Phase = contract.PhaseRolledBack
	st.Message = "the migrator stopped in the middle of this migration; the source was resumed and serves, " + undone + "; set " + contract.AnnotationMigrateTo + " again to ask again"
	r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, contract.ReasonMigrationRolledBack, "Migrate", "migration %s: %s", st.Name, st.Message)
	log.FromContext(ctx).Info("rolled back", "migration", st.Name)
	r.cfg.Metrics.record(ResultRolledBack, st)
	return r.setStatus(ctx, pod, st)
}

// dropImages deletes the checkpoint images migration st may have pushed
// (tagged with its name, and its shadow's), through the agent on pod's
// node; images that were never pushed are no error.
func (r *Reconciler) dropImages(ctx context.Context, pod *corev1.Pod, st Status) error {
	del, ok := r.cfg.Agent.(migrate.ImageDeleter)
	if !ok || r.cfg.ImageRepo == "" {
		return nil
	}
	var errs []error
	for _, tag := range []string{st.Name, migrate.ShadowName(st.Name)} {
		ref := migrate.CheckpointRef(r.cfg.ImageRepo, pod.Namespace, tag, r.cfg.StatusKey)
		if err := del.DeleteCheckpointImage(ctx, pod.Spec.NodeName, ref); err != nil {
			errs = append(errs, fmt.Errorf("delete the checkpoint image %s: %w", ref, err))
		}
	}
	return errors.Join(errs...)
}

// dropServedImages deletes the checkpoint images of migration st, which a
// restarted controller completed, as Run does once a target serves; what
// it could not delete is said in the returned text, for the status.
func (r *Reconciler) dropServedImages(ctx context.Context, pod *corev1.Pod, st Status) string {
	if r.cfg.KeepImages {
		return ""
	}
	if err := r.dropImages(ctx, pod, st); err != nil {
		return "; its checkpoint images could not all be deleted (" + err.Error() + "): delete them by hand, each holds the process's memory"
	}
	return ""
}

// rollForward completes a migration whose target had taken over when the
// controller that drove it stopped.
func (r *Reconciler) rollForward(ctx context.Context, pod, target *corev1.Pod, st Status) error {
	if err := migrate.Finish(ctx, r.cfg.Clock, r.cfg.Client, pod, target.Name, r.cfg.Timeout); err != nil {
		r.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, contract.ReasonMigrationRollForwardFailed, "Migrate", "migration %s: the target %s serves, but: %v", st.Name, target.Name, err)
		return err // retried
	}
	st.Phase = contract.PhaseSucceeded
	st.Message = fmt.Sprintf("the migrator stopped after the target %s had taken over; a restarted migrator completed the migration (the source was deleted); the timings of the handover were lost with it", target.Name)
	st.Message += r.dropServedImages(ctx, pod, st)
	r.cfg.Events.Eventf(target, nil, corev1.EventTypeNormal, contract.ReasonMigrationSucceeded, "Migrate", "migration %s from %s: %s", st.Name, pod.Spec.NodeName, st.Message)
	r.cfg.Metrics.record(ResultSucceeded, st)
	return r.setStatus(ctx, target, st)
}

// setStatus writes st to pod's status annotation; once st has ended, it
// goes into st's History, and the pod's request annotation is removed: it
// is answered, and the next one is new. Starting a migration
// (contract.PhaseRunning) is guarded by the pod's resourceVersion: a pod changed
// meanwhile gives a conflict, and the caller starts over with the new one,
// so that two controllers never both start it. Later writes are not.
func (r *Reconciler) setStatus(ctx context.Context, pod *corev1.Pod, st Status) error {
	body, err := statusPatch(pod, st, r.cfg.StatusKey)
	if err != nil {
		return fmt.Errorf("record the migration's status on %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	got, err := r.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, body, metav1.PatchOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("record the migration's status on %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	pod.ResourceVersion = got.ResourceVersion
	pod.Annotations = got.Annotations
	return nil
}

// statusPatch is the merge patch that writes st, signed with key, to pod
// (see setStatus).
func statusPatch(pod *corev1.Pod, st Status, key []byte) ([]byte, error) {
	raw := st.ended().encode()
	sig := statusSignature(key, pod.Namespace, raw)
	patch := mergePatch{Metadata: patchMeta{Annotations: map[string]*string{
		contract.AnnotationMigrationStatus:          &raw,
		contract.AnnotationMigrationStatusSignature: &sig,
	}}}
	if st.Phase == contract.PhaseRunning {
		patch.Metadata.ResourceVersion = pod.ResourceVersion
	} else {
		// The request is answered: it goes with the same write, and so
		// does its override, which holds for one request only.
		patch.Metadata.Annotations[contract.AnnotationMigrateTo] = nil
		patch.Metadata.Annotations[contract.AnnotationMigrateForce] = nil
	}
	return json.Marshal(patch)
}

// mergePatch is a JSON merge patch (RFC 7386) of a pod's metadata: an
// annotation set to nil is removed, and a resourceVersion makes the patch
// fail with a conflict if the pod changed since it was read.
type mergePatch struct {
	Metadata patchMeta `json:"metadata"`
}

type patchMeta struct {
	ResourceVersion string             `json:"resourceVersion,omitempty"`
	Annotations     map[string]*string `json:"annotations,omitempty"`
}

// evacuationOf is the node pod is evacuated from, if its eviction became
// its migration request (contract.AnnotationEvacuate), else "".
func evacuationOf(pod *corev1.Pod) string {
	if ev := pod.Annotations[contract.AnnotationEvacuate]; ev != "" && ev == pod.Spec.NodeName {
		return ev
	}
	return ""
}
