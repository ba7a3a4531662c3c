package migrate

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/internal/control"
)

// liveCheckpoint checkpoints pod while it keeps serving: quiesce its
// sidecar, checkpoint the app under the hold (hold.go), release the hold,
// and build the checkpoint image (tagged tag). Its phases are named with
// prefix. On an error after the quiesce, pod serves again.
func (r *run) liveCheckpoint(ctx context.Context, pod *corev1.Pod, tag, prefix string) (control.Cut, error) {
	ep := r.endpoint(pod)
	// The watches start before the quiesce, so that setting them up adds
	// nothing to the hold; nothing freezes the app before the checkpoint
	// call.
	wctx, stopWatches := context.WithCancel(ctx)
	defer stopWatches()
	steps := r.holdSteps(wctx, pod)
	quiesced := r.now()
	cut, err := ep.Quiesce(ctx, r.env.Timeouts.Quiesce)
	if err != nil {
		return cut, err
	}
	r.phase(prefix + "quiesce")
	steps.resume = func(ctx context.Context) error { return ep.ResumeHold(ctx, cut.Hold) }
	held := checkpointUnderHold(ctx, steps, quiesced)
	if len(r.others) > 0 {
		held.fallback = steps.thawNo // the hold lasts for every call, not until a freeze
	}
	if held.err != nil {
		r.reportHold(held, prefix)
		return cut, r.checkpointFailed(ctx, ep, held)
	}
	r.phase(prefix + "checkpoint")
	if err := r.releaseHold(ctx, ep, cut, &held, prefix); err != nil {
		return cut, err
	}
	r.phase(prefix + "resume")
	image, others, err := r.images(ctx, pod, held.archive, tag)
	if err != nil {
		return cut, err
	}
	r.phase(prefix + "image")
	if prefix == "" {
		r.rep.Archive, r.rep.Image, r.rep.Images = held.archive, image, others
	} else {
		r.rep.ShadowImage, r.rep.ShadowImages = image, others
	}
	return cut, nil
}

// holdSteps are the steps of pod's live checkpoint, with its watches
// started on wctx: the freeze watch, at which the hold ends (unless
// Plan.HoldWholeCall), and, when Plan.ThawAfterDump allows, the dump
// watch at which the node's agent thaws the app. A whole pod's app
// containers are checkpointed one after the other under one hold, which
// lasts until the last call returned: a freeze of the first would let the
// others take deliveries after the cut.
func (r *run) holdSteps(wctx context.Context, pod *corev1.Pod) holdSteps {
	steps := holdSteps{
		checkpoint: func(ctx context.Context) (string, error) { return r.checkpoint(ctx, pod) },
		atFreeze:   !r.p.HoldWholeCall,
		now:        r.now,
	}
	if len(r.others) > 0 {
		steps.atFreeze = false
		steps.thawNo = fmt.Sprintf("the pod's %d app containers are checkpointed one after the other under one hold", len(r.others)+1)
		return steps
	}
	id := containerID(pod, r.p.Container)
	if fw, ok := r.env.Agent.(FreezeWatcher); ok && id != "" {
		steps.watch = func(ctx context.Context, state string) (func() error, error) {
			return fw.WatchFreeze(ctx, pod.Spec.NodeName, string(pod.UID), id, state, r.env.Timeouts.FreezeWatch)
		}
		steps.frozen, steps.frozenErr = steps.watch(wctx, "frozen")
	}
	if steps.thaw, steps.thawNo = r.p.ThawAfterDump.thaws(pod, r.p.Container); steps.thaw {
		steps.dumped, steps.thawNo = r.watchDump(wctx, pod, id)
	}
	return steps
}

// watchDump starts the watch on pod's node for CRIU's dump of the app
// container id, after which the agent thaws it; if it cannot, it says
// why.
func (r *run) watchDump(wctx context.Context, pod *corev1.Pod, id string) (func() (bool, string, time.Duration, error), string) {
	dw, ok := r.env.Agent.(DumpWatcher)
	switch {
	case !ok:
		return nil, "the node agent cannot watch for the dump"
	case id == "":
		return nil, "the app container has no ID in the pod's status"
	}
	wait, err := dw.WatchDump(wctx, pod.Spec.NodeName, string(pod.UID), id, true, r.env.Timeouts.FreezeWatch)
	if err != nil {
		return nil, "the dump watch did not start: " + err.Error()
	}
	return wait, ""
}

// checkpointFailed ends a live checkpoint whose call failed (held.err):
// the source serves again, resumed at its freeze already or now.
func (r *run) checkpointFailed(ctx context.Context, ep control.Client, held holdResult) error {
	if held.resumed && held.resumeErr == nil {
		return fmt.Errorf("%w (the source was resumed at its freeze and keeps serving)", held.err)
	}
	cctx, cancel := r.cleanupContext(ctx)
	defer cancel()
	return r.resume(cctx, held.err, ep)
}

// releaseHold releases the hold of a live checkpoint whose call
// succeeded, unless the freeze did already, and reports the hold. The
// checkpoint is used only if the hold invariant held and the sidecar
// stayed quiesced until the release; otherwise no image is built from it.
func (r *run) releaseHold(ctx context.Context, ep control.Client, cut control.Cut, held *holdResult, prefix string) error {
	if !held.resumed {
		held.resumeErr = ep.ResumeHold(ctx, cut.Hold)
		held.events.Resumed = r.now()
	}
	r.reportHold(*held, prefix)
	if err := held.events.releaseErr(); err != nil {
		return fmt.Errorf("the hold invariant was broken (%w): the checkpoint %s may hold deliveries after the checkpoint ID, so it is discarded (no image is built from it): migrate again", err, filepath.Base(held.archive))
	}
	if err := held.resumeErr; err != nil {
		if errors.Is(err, control.ErrConflict) {
			// The sidecar did not stay quiesced (it restarted, say): the
			// checkpoint may hold deliveries after cut.ID, which a target
			// would get again. No image is built from it; the sidecar is
			// left as it is (a restarted one serves).
			return fmt.Errorf("%w; the checkpoint %s is discarded (no image is built from it) and nothing was deleted: migrate again", err, filepath.Base(held.archive))
		}
		return err
	}
	return nil
}

// reportHold puts the breakdown of held into the report: Report.Hold, or
// the shadow's (a prefix) Report.ShadowHold.
func (r *run) reportHold(held holdResult, prefix string) {
	ht := held.events.timings()
	ht.AtFreeze, ht.Fallback = held.resumed, held.fallback
	ht.ThawedAtDump, ht.ThawFallback, ht.CRIU = held.thawed, held.thawNo, held.criu
	if prefix == "" {
		r.rep.Hold = &ht
	} else {
		r.rep.ShadowHold = &ht
	}
}
