package migrate

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/proxy"
	"github.com/ms2m/ms2m/internal/replay"
)

// A restored pod's app container that restarts comes back as the kubelet
// created it: from the checkpoint image, without what it processed since,
// while its sidecar serves on. The sidecar cannot tell a restarted app
// from one that reconnects; the controller can (the container's
// restartCount grows past the one recorded when the pod took over,
// AppRestartedSince). Rebuild then makes the state exact again:
//
//   - Stop. The pod's sidecar is stopped at once (POST /stop): the app,
//     whose state is wrong, consumes nothing more, and the stop is a
//     consistent cut (I4: nothing of this app is in flight at it). Its
//     cutoff marker ends the records of this identity; nothing writes the
//     log after it.
//   - Restore again. A new restore of the same checkpoint image on the
//     same node (its image is there: the kubelet restarted the app from
//     it), replaying (checkpoint ID, the stop's cutoff]: everything this
//     identity processed since the checkpoint, the source's part and the
//     pod's own. A Deployment's pod gets a copy held by it, handed to its
//     ReplicaSet once it serves (as a migration's target); a StatefulSet's
//     pod is made again from a pending-migration record.
//   - Refuse. If the log no longer holds the records after the checkpoint
//     ID (retention), the new restore's replay fails with
//     replay.ErrRetention before it consumes anything: it is deleted, and
//     the pod stays stopped, with ErrStateLost, which the controller turns
//     into a Warning Event and the pod condition
//     contract.ConditionStateNotRebuilt.
//
// The stop comes first, before the new restore replays, rather than a
// handover in which the pod serves until the copy has caught up: every
// message the restarted app handles is handled on a wrong state, so
// downtime is the lesser harm.

// ErrStateLost is the error of a rebuild whose replay log no longer holds
// the records after the checkpoint ID: the state cannot be rebuilt, and
// trying again cannot mend it.
var ErrStateLost = errors.New("the replay log no longer holds the records after the checkpoint, so the app's state cannot be rebuilt")

// ErrRebuildNotYet is the error of a rebuild that found the pod's
// migration not quite finished (a StatefulSet's pending-migration record
// still there): nothing was done; try again shortly.
var ErrRebuildNotYet = errors.New("the pod's migration has not finished yet")

// AppRestarts is the restartCount of pod's app container, summed over
// its app containers (a whole pod): any of them that restarts came back
// from its checkpoint.
func AppRestarts(pod *corev1.Pod) int32 {
	var n int32
	for _, app := range inject.AppContainers(pod) {
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.Name == app {
				n += cs.RestartCount
			}
		}
	}
	return n
}

// otherImages are the images of pod's app containers after the first (a
// whole pod's restore runs each from its own checkpoint image), by
// container; nil for a pod with one.
func otherImages(pod *corev1.Pod) map[string]string {
	var out map[string]string
	for _, c := range pod.Spec.Containers {
		if slices.Contains(otherApps(pod, ""), c.Name) {
			if out == nil {
				out = map[string]string{}
			}
			out[c.Name] = c.Image
		}
	}
	return out
}

// AppRestartedSince reports whether pod, a restored pod that took over
// (it carries contract.AnnotationRestoredFrom), had its app container
// restarted since: its restartCount is above the one recorded then. A
// record without one (an older migrator's) counts from 0.
func AppRestartedSince(pod *corev1.Pod) (restarted bool, was, now int32) {
	raw, ok := pod.Annotations[contract.AnnotationRestoredFrom]
	if !ok {
		return false, 0, 0
	}
	var from inject.RestoredFrom
	_ = json.Unmarshal([]byte(raw), &from) // a bad record counts from 0: a rebuild too many is exact too
	now = AppRestarts(pod)
	return now > from.AppRestarts, from.AppRestarts, now
}

// RebuildPlan is one rebuild of a restored pod whose app restarted.
type RebuildPlan struct {
	// Name names the rebuild as a migration is named (MigrationName): the
	// new restore is made under it.
	Name      string
	Namespace string
	Pod       string
	// Timeout bounds each wait. Default 3 minutes.
	Timeout time.Duration
}

// RebuildPodName is the name of the copy that rebuilds a ReplicaSet's or
// bare pod: one name per pod (from its UID), so that a restarted
// controller finds the copy its predecessor made instead of making a
// second one.
func RebuildPodName(pod *corev1.Pod) string {
	sum := sha256.Sum256([]byte(pod.UID))
	const alphabet = "bcdfghjklmnpqrstvwxz2456789" // a ReplicaSet's
	var b strings.Builder
	for _, c := range sum[:randomLen] {
		b.WriteByte(alphabet[int(c)%len(alphabet)])
	}
	if c := controllerOf(pod); c != nil && c.Kind == "ReplicaSet" {
		return ReplicaSetPodName(c.Name, b.String())
	}
	return BarePodName(pod.Name, b.String())
}

// Rebuild rebuilds the state of p.Pod, a restored pod whose app restarted
// (see above). Report.TargetPod is the pod that serves after it. On an
// error the pod's sidecar stays stopped, unless the rebuild found nothing
// to rebuild; an error wrapping ErrStateLost cannot be mended by trying
// again; an AfterTakeover error says the new restore serves, but its last
// steps failed.
func Rebuild(ctx context.Context, env Env, p RebuildPlan) (Report, error) {
	r := newRun(env, Plan{Name: p.Name, Namespace: p.Namespace, Pod: p.Pod, Timeout: p.Timeout})
	r.log.Info("rebuild started")
	err := r.rebuild(ctx)
	r.rep.Total = r.now().Sub(r.began)
	if err != nil {
		r.log.Info("rebuild failed", "took", r.rep.Total, "err", err.Error())
	} else {
		r.log.Info("rebuild succeeded", "took", r.rep.Total, "downtime", r.rep.Downtime)
	}
	return r.rep, err
}

func (r *run) rebuild(ctx context.Context) error {
	p, cs := r.p, r.env.Client
	pod, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Pod, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("rebuild %s/%s: %w", p.Namespace, p.Pod, err)
	}
	if pod.DeletionTimestamp != nil {
		return fmt.Errorf("rebuild %s/%s: the pod is being deleted", p.Namespace, p.Pod)
	}
	// What the pod restores comes from its spec, which the webhook admitted
	// as a signed restore, not from the annotation a tenant can edit.
	from, ok := inject.RestoredFromPod(pod)
	if !ok {
		return fmt.Errorf("rebuild %s/%s: the pod is not a restore (no restore in annotation %s)", p.Namespace, p.Pod, contract.AnnotationStatus)
	}
	start, err := strconv.ParseUint(from.ReplayStart, 10, 64)
	if err != nil {
		return fmt.Errorf("rebuild %s/%s: its sidecar's MS2M_REPLAY_START %q: %w", p.Namespace, p.Pod, from.ReplayStart, err)
	}
	r.source, r.p.Container, r.p.TargetNode = pod, inject.AppContainer(pod), pod.Spec.NodeName
	ep := r.endpoint(pod)
	if ownedByStatefulSet(pod) {
		// The migration that restored the pod deletes its record once the
		// pod serves; the rebuild's own record must not be taken for it.
		// A record beside a stopped sidecar is an earlier try's.
		cm := contract.PendingConfigMapName(pod.Name)
		if _, err := cs.CoreV1().ConfigMaps(p.Namespace).Get(ctx, cm, metav1.GetOptions{}); err == nil {
			if st, err := ep.State(ctx); err != nil || st.Mode != "stopped" {
				return fmt.Errorf("rebuild %s/%s: ConfigMap %s is still there: %w", p.Namespace, p.Pod, cm, ErrRebuildNotYet)
			}
		} else if !apierrors.IsNotFound(err) {
			return fmt.Errorf("rebuild %s/%s: ConfigMap %s: %w", p.Namespace, p.Pod, cm, err)
		}
	}
	cutoff, epoch, stoppedAt, requeued, err := r.stopForRebuild(ctx, ep)
	if err != nil {
		return fmt.Errorf("rebuild %s/%s: stop its sidecar: %w", p.Namespace, p.Pod, err)
	}
	r.rep.Start, r.rep.CutoffID, r.rep.Epoch = start, cutoff, epoch
	r.phase("stop")
	if cutoff <= start {
		// This identity took nothing since the checkpoint: the app that
		// came back from it has the exact state already.
		if err := ep.Resume(ctx); err != nil {
			return fmt.Errorf("rebuild %s/%s: nothing to replay after checkpoint %d, but resuming its sidecar failed: %w", p.Namespace, p.Pod, start, err)
		}
		r.rep.TargetPod = pod.Name
		// The restart is dealt with: its count becomes the one to watch.
		if err := Served(ctx, cs, p.Namespace, p.Pod); err != nil {
			return &AfterTakeover{err}
		}
		return nil
	}
	skip, err := skipIDs(from.ReplaySkip, requeued, start, cutoff)
	if err != nil {
		return fmt.Errorf("rebuild %s/%s: %w", p.Namespace, p.Pod, err)
	}
	restore := Restore{Migration: p.Name, Image: from.Image, Images: otherImages(pod), Node: pod.Spec.NodeName, LogName: inject.LogName(pod),
		Start: start, Cutoff: cutoff, Epoch: epoch, Skip: skip}
	r.rep.Skipped = len(skip)
	if ownedByStatefulSet(pod) {
		return r.rebuildStatefulSet(ctx, restore, stoppedAt)
	}
	return r.rebuildCopy(ctx, restore, stoppedAt)
}

// requeuedSince is what the sidecar's /state says the broker requeued
// (proxy.State.Requeued), and below which ID that list is not complete.
type requeuedSince struct {
	ids     []uint64
	evicted uint64
}

// stopForRebuild stops the sidecar at ep and returns its cutoff and epoch,
// and the deliveries the broker requeued when the app left; one that is
// stopped already (an earlier try) tells them by its state: nothing was
// written to the log after its stop.
func (r *run) stopForRebuild(ctx context.Context, ep control.Client) (cutoff, epoch uint64, at time.Time, rq requeuedSince, err error) {
	st, err := ep.State(ctx)
	if err != nil {
		return 0, 0, at, rq, err
	}
	switch st.Mode {
	case "stopped":
		cutoff, epoch, at = st.CutoffID, st.Epoch, r.now()
		if cutoff == 0 {
			cutoff, epoch = st.Log.LastID, st.Log.Epoch
		}
	case "replaying":
		return 0, 0, at, rq, errors.New("it is in replay mode again (it restarted after it took over): not rebuilt, see docs/faults.md")
	default:
		res, err := ep.Stop(ctx, r.env.Timeouts.Stop)
		if err != nil {
			return 0, 0, at, rq, err
		}
		cutoff, epoch, at = res.CutoffID, res.Epoch, res.StartedAt
		// The stop settled what the app had; what the broker took back
		// before it is in the state read after it.
		if st, err = ep.State(ctx); err != nil {
			return 0, 0, at, rq, fmt.Errorf("read its state after the stop: %w", err)
		}
	}
	return cutoff, epoch, at, requeuedSince{ids: st.Requeued, evicted: st.RequeuedEvictedThrough}, nil
}

// skipIDs are the IDs in (start, cutoff] that a rebuild leaves out of the
// replay: those the pod's own replay left out (had, its MS2M_REPLAY_SKIP)
// and those the broker requeued since (rq). If the sidecar's list lost
// IDs above start, which of them to leave out is not known: an error.
func skipIDs(had string, rq requeuedSince, start, cutoff uint64) ([]uint64, error) {
	if rq.evicted > start {
		return nil, fmt.Errorf("its sidecar no longer knows every delivery the broker requeued after the checkpoint %d (its list keeps the last %d; it lost those through %d), so a replay cannot leave them out exactly", start, proxy.MaxRequeued, rq.evicted)
	}
	set := map[uint64]bool{}
	if had != "" {
		for _, s := range strings.Split(had, ",") {
			id, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("its sidecar's MS2M_REPLAY_SKIP %q: %w", had, err)
			}
			set[id] = true
		}
	}
	for _, id := range rq.ids {
		set[id] = true
	}
	var out []uint64
	for id := range set {
		if id > start && id <= cutoff {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	if len(out) > replay.MaxSkip {
		return nil, fmt.Errorf("%d deliveries to leave out of the replay, more than %d", len(out), replay.MaxSkip)
	}
	return out, nil
}

// rebuildCopy rebuilds a ReplicaSet's or bare pod by a copy held by it,
// handed to its ReplicaSet once it serves.
func (r *run) rebuildCopy(ctx context.Context, restore Restore, stoppedAt time.Time) error {
	p, src, cs := r.p, r.source, r.env.Client
	name := RebuildPodName(src)
	r.p.TargetPod, r.rep.TargetPod = name, name
	got, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if err := r.createTarget(ctx, src, restore); err != nil {
			return err
		}
	case err != nil:
		return fmt.Errorf("rebuild %s/%s: the copy %s: %w", p.Namespace, p.Pod, name, err)
	default:
		if c := controllerOf(got); c == nil || c.UID != src.UID {
			return fmt.Errorf("rebuild %s/%s: a pod %s exists that is not its copy; delete it", p.Namespace, p.Pod, name)
		}
		// An earlier try's copy, held by the pod: it goes on.
	}
	r.phase("create the copy")
	running, err := waitRunning(ctx, r.env.Clock, cs, p.Namespace, name, p.Timeout)
	if err != nil {
		return r.dropCopy(ctx, name, fmt.Errorf("rebuild %s/%s: the copy %s did not start: %w", p.Namespace, p.Pod, name, err))
	}
	r.phase("restore")
	switched, err := r.endpoint(running).WaitSwitched(ctx, p.Timeout)
	if err != nil {
		if strings.Contains(err.Error(), replay.ErrRetention.Error()) {
			err = fmt.Errorf("%w: %w", ErrStateLost, err)
		}
		return r.dropCopy(ctx, name, fmt.Errorf("rebuild %s/%s: the copy %s: %w", p.Namespace, p.Pod, name, err))
	}
	r.rep.Downtime = switched.Sub(stoppedAt)
	r.phase("replay")
	// The copy serves with the exact state: from here on, nothing is undone.
	if err := handBack(ctx, r.env.Clock, cs, src, name, p.Timeout); err != nil {
		return &AfterTakeover{fmt.Errorf("the copy %s serves, but: %w", name, err)}
	}
	r.served(ctx, name)
	if err := deleteNow(ctx, cs, src); err != nil {
		return &AfterTakeover{fmt.Errorf("the copy %s serves, but deleting the restarted pod %s failed: %w", name, src.Name, err)}
	}
	r.phase("finalise")
	return nil
}

// dropCopy deletes the copy named name after err, unless it took over (it
// serves: then the rebuild is done but for its last steps) or cannot be
// read (then it is kept, and err says so).
func (r *run) dropCopy(ctx context.Context, name string, err error) error {
	cctx, cancel := r.cleanupContext(ctx)
	defer cancel()
	pod, gerr := r.env.Client.CoreV1().Pods(r.p.Namespace).Get(cctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(gerr) {
		return err
	}
	if gerr == nil && podReady(pod) {
		switched, serr := r.endpoint(pod).Switched(cctx)
		if serr != nil {
			return fmt.Errorf("%w; the copy %s is kept: whether it took over cannot be read (%v)", err, name, serr)
		}
		if switched {
			return &AfterTakeover{fmt.Errorf("%w; but the copy %s took over meanwhile: finish by hand", err, name)}
		}
	}
	if derr := r.deletePod(cctx, name, "the copy"); derr != nil {
		return errors.Join(err, derr)
	}
	return fmt.Errorf("%w (the copy was deleted; the pod's sidecar stays stopped)", err)
}

// rebuildStatefulSet rebuilds a StatefulSet's pod: the restore is recorded
// as its pending migration, the pod deleted, and the StatefulSet makes it
// again, which the webhook turns into the restore; it replays to the
// stop's cutoff and serves, and the record goes.
func (r *run) rebuildStatefulSet(ctx context.Context, restore Restore, stoppedAt time.Time) error {
	p, src := r.p, r.source
	r.p.Strategy, r.rep.TargetPod = contract.StrategyStatefulSet, src.Name
	running, err := r.recreate(ctx, restore)
	if err != nil {
		return fmt.Errorf("rebuild %s/%s: %w", p.Namespace, p.Pod, err)
	}
	r.source = running
	r.phase("restore")
	switched, err := r.endpoint(running).WaitSwitched(ctx, p.Timeout)
	if err != nil {
		if strings.Contains(err.Error(), replay.ErrRetention.Error()) {
			err = fmt.Errorf("%w: %w", ErrStateLost, err)
		}
		// The pod made again consumes nothing before its replay ends, and
		// the record stays, so that it never starts empty.
		return fmt.Errorf("rebuild %s/%s: the pod made again: %w; ConfigMap %s/%s stays", p.Namespace, p.Pod, err, p.Namespace, contract.PendingConfigMapName(src.Name))
	}
	r.rep.Downtime = switched.Sub(stoppedAt)
	r.phase("replay")
	if err := r.deletePending(ctx); err != nil {
		return &AfterTakeover{fmt.Errorf("the pod made again serves, but: %w", err)}
	}
	r.served(ctx, src.Name)
	r.phase("finalise")
	return nil
}
