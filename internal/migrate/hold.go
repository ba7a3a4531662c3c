package migrate

import (
	"context"
	"fmt"
	"time"
)

// FreezeWatcher is an optional NodeAgent method: it watches a container on
// node until its tasks are frozen (state "frozen": CRIU froze or seized
// them) or free again ("thawed": the dump ended). It returns once the watch
// is in place; wait blocks until the state is seen (nil), or not within
// timeout, or ctx ends.
type FreezeWatcher interface {
	WatchFreeze(ctx context.Context, node, podUID, containerID, state string, timeout time.Duration) (wait func() error, err error)
}

// HoldTimings breaks down a live checkpoint's hold: how long the source's
// sidecar held deliveries, and where that time went. The freeze and the
// thaw are as the node's agent saw them, timed when the migrator heard.
type HoldTimings struct {
	// Quiesce: POST /quiesce until the app had settled what it held.
	Quiesce time.Duration `json:"quiesce"`
	// Call is the kubelet's checkpoint call, whole; ToFreeze, Dump and
	// AfterDump split it (when the agent could watch the container): up
	// to the freeze (kubelet, containerd, runc, CRIU's setup), the freeze
	// until the tasks were free again (CRIU's dump), and the rest (the
	// archive).
	Call      time.Duration `json:"call"`
	ToFreeze  time.Duration `json:"toFreeze,omitempty"`
	Dump      time.Duration `json:"dump,omitempty"`
	AfterDump time.Duration `json:"afterDump,omitempty"`
	// Held: POST /quiesce until the resume was answered.
	Held time.Duration `json:"held"`
	// AtFreeze: the source resumed as soon as the freeze was seen, not
	// after the call. Fallback says why not, when it was asked for.
	AtFreeze bool   `json:"resumedAtFreeze"`
	Fallback string `json:"fallback,omitempty"`
}

// holdEvents is when each step of a live checkpoint happened. Zero: it did
// not.
type holdEvents struct {
	Quiesce, CallStart, Frozen, Resumed, Thawed, Returned time.Time
}

// releaseErr checks the hold invariant on a timeline: deliveries are
// released (the resume) only once the app is frozen, or once the
// checkpoint call has returned; never before.
func (e holdEvents) releaseErr() error {
	switch {
	case e.Resumed.IsZero():
		return nil
	case !e.Returned.IsZero() && !e.Resumed.Before(e.Returned):
		return nil
	case e.Frozen.IsZero():
		return fmt.Errorf("the hold was released at %s, before the checkpoint call returned and with no freeze seen", e.Resumed.Format(time.StampMicro))
	case e.Resumed.Before(e.Frozen):
		return fmt.Errorf("the hold was released at %s, before the freeze was seen at %s", e.Resumed.Format(time.StampMicro), e.Frozen.Format(time.StampMicro))
	}
	return nil
}

// timings is the breakdown of e.
func (e holdEvents) timings() HoldTimings {
	since := func(a, b time.Time) time.Duration {
		if a.IsZero() || b.IsZero() {
			return 0
		}
		return b.Sub(a)
	}
	t := HoldTimings{
		Quiesce: since(e.Quiesce, e.CallStart),
		Call:    since(e.CallStart, e.Returned),
		Held:    since(e.Quiesce, e.Resumed),
	}
	if !e.Frozen.IsZero() && !e.Thawed.IsZero() {
		t.ToFreeze, t.Dump, t.AfterDump = since(e.CallStart, e.Frozen), since(e.Frozen, e.Thawed), since(e.Thawed, e.Returned)
	}
	return t
}

// holdSteps are the steps of a live checkpoint once the source is
// quiesced.
type holdSteps struct {
	// checkpoint makes the checkpoint (the kubelet's call).
	checkpoint func(ctx context.Context) (string, error)
	// frozen waits for the freeze, on a watch started before the quiesce
	// (nil: none; frozenErr says why, if one was tried).
	frozen    func() error
	frozenErr error
	// watch starts a freeze watch (nil: no agent can).
	watch func(ctx context.Context, state string) (func() error, error)
	// resume releases the hold.
	resume func(ctx context.Context) error
	// atFreeze: resume as soon as the freeze is seen.
	atFreeze bool
	// now tells the time of the events (nil: the system's clock).
	now func() time.Time
}

// holdResult is what checkpointUnderHold did.
type holdResult struct {
	archive   string
	err       error // the checkpoint's
	resumed   bool  // resume was called during the call
	resumeErr error // and what it answered
	fallback  string
	events    holdEvents
}

// checkpointUnderHold runs the checkpoint while the source is held. With a
// freeze watch, it learns when the app was frozen and when it was free
// again; with atFreeze, it releases the hold once the freeze is seen, while
// the call goes on: what the app is handed from then on does not reach its
// memory before the dump has ended, so it is not in the image, and the
// target replays it (it comes after the checkpoint ID). It never releases
// earlier. If the watch cannot start, fails or sees no freeze before the
// call returns, nothing is released here: the caller resumes after the
// call, as without a watch.
func checkpointUnderHold(ctx context.Context, s holdSteps, quiesced time.Time) holdResult {
	res := holdResult{events: holdEvents{Quiesce: quiesced}}
	now := s.now
	if now == nil {
		now = time.Now
	}
	var frozen <-chan error
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	switch {
	case s.frozen != nil:
		ch := make(chan error, 1)
		go func() { ch <- s.frozen() }()
		frozen = ch
	case s.frozenErr != nil:
		res.fallback = "the freeze watch did not start: " + s.frozenErr.Error()
	default:
		res.fallback = "the node agent cannot watch a container's freeze"
	}

	type called struct {
		archive string
		err     error
	}
	done := make(chan called, 1)
	res.events.CallStart = now()
	go func() {
		a, err := s.checkpoint(ctx)
		done <- called{a, err}
	}()

	var thawed <-chan error
	for {
		select {
		case err := <-frozen:
			frozen = nil
			if err != nil {
				res.fallback = "no freeze seen: " + err.Error()
				continue
			}
			res.events.Frozen = now()
			if s.watch == nil {
				// no thaw to watch
			} else if wait, err := s.watch(wctx, "thawed"); err == nil {
				ch := make(chan error, 1)
				go func() { ch <- wait() }()
				thawed = ch
			}
			if s.atFreeze {
				res.resumed = true
				res.resumeErr = s.resume(ctx)
				res.events.Resumed = now()
			}
		case c := <-done:
			res.events.Returned = now()
			res.archive, res.err = c.archive, c.err
			if thawed != nil {
				// The dump is over: the watch sees it within a poll.
				select {
				case err := <-thawed:
					if err == nil {
						// Heard after the call returned: the dump ended
						// before it did.
						res.events.Thawed = now()
						if res.events.Thawed.After(res.events.Returned) {
							res.events.Thawed = res.events.Returned
						}
					}
				case <-time.After(time.Second):
				}
			}
			if frozen != nil && res.fallback == "" {
				res.fallback = "the call returned before the freeze was seen"
			}
			if !s.atFreeze {
				res.fallback = ""
			}
			return res
		}
	}
}
