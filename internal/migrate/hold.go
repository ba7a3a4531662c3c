package migrate

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// FreezeWatcher is an optional NodeAgent method: it watches a container on
// node until its tasks are frozen (state "frozen": CRIU froze or seized
// them) or free again ("thawed": the dump ended). It returns once the watch
// is in place; wait blocks until the state is seen (nil), or not within
// timeout, or ctx ends.
type FreezeWatcher interface {
	WatchFreeze(ctx context.Context, node, podUID, containerID, state string, timeout time.Duration) (wait func() error, err error)
}

// DumpWatcher is an optional NodeAgent method: it watches a container on
// node until CRIU has dumped it (its tasks were seen traced by CRIU and
// then let go); with thaw, the agent then thaws the container's freezer
// cgroup if the runtime still holds it frozen. It returns once the watch
// is in place; wait blocks until the dump is seen and says whether the
// agent thawed the container (if not, noThaw says why) and how long CRIU
// held its tasks (seized until let go, as the agent's polls saw it), or
// fails when no dump is seen within timeout or ctx ends.
type DumpWatcher interface {
	WatchDump(ctx context.Context, node, podUID, containerID string, thaw bool, timeout time.Duration) (wait func() (thawed bool, noThaw string, criu time.Duration, err error), err error)
}

// ThawPolicy says when a live checkpoint has the node's agent thaw the
// app as soon as CRIU's dump is done, instead of when the runtime
// resumes it after archiving the root filesystem's changes (see
// ARCHITECTURE.md, "Thaw after the dump").
type ThawPolicy string

const (
	// ThawAuto (the default, also ""): only an app container whose root
	// filesystem is read-only (securityContext.readOnlyRootFilesystem),
	// so that nothing it does after the dump can reach the archive.
	ThawAuto ThawPolicy = "auto"
	// ThawAlways: every app container; the user vouches that the app
	// does not write to its root filesystem during a checkpoint.
	ThawAlways ThawPolicy = "always"
	// ThawNever: the app stays frozen until the runtime resumes it.
	ThawNever ThawPolicy = "never"
)

// ParseThawPolicy reads a ThawPolicy ("" is auto).
func ParseThawPolicy(s string) (ThawPolicy, error) {
	switch p := ThawPolicy(s); p {
	case "":
		return ThawAuto, nil
	case ThawAuto, ThawAlways, ThawNever:
		return p, nil
	}
	return "", fmt.Errorf("thaw-after-dump policy %q: want auto, always or never", s)
}

// thaws says whether a live checkpoint of container in pod thaws it
// after the dump under p; if not, why not.
func (p ThawPolicy) thaws(pod *corev1.Pod, container string) (bool, string) {
	switch p {
	case ThawAlways:
		return true, ""
	case ThawNever:
		return false, "thawing after the dump is off (policy never)"
	case "", ThawAuto:
		for _, c := range pod.Spec.Containers {
			if c.Name != container {
				continue
			}
			if sc := c.SecurityContext; sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
				return true, ""
			}
			return false, "the app's root filesystem is writable (no readOnlyRootFilesystem): what the app writes after the dump could reach the checkpoint's archive of it"
		}
		return false, fmt.Sprintf("pod %s has no container %s", pod.Name, container)
	}
	return false, fmt.Sprintf("unknown thaw-after-dump policy %q", p)
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
	// ThawedAtDump: the node's agent thawed the app as soon as CRIU's
	// dump was done, while the runtime went on archiving (Dump then ends
	// at the thaw). ThawFallback says why not.
	ThawedAtDump bool   `json:"thawedAtDump,omitempty"`
	ThawFallback string `json:"thawFallback,omitempty"`
	// CRIU: how long CRIU itself held the app's tasks (from the agent's
	// first sight of CRIU tracing them until it let them go), the part of
	// Dump that is CRIU's seize and dump rather than runc's and CRIU's
	// setup; measured with the dump watch.
	CRIU time.Duration `json:"criu,omitempty"`
}

// holdEvents is when each step of a live checkpoint happened. Zero: it did
// not.
type holdEvents struct {
	Quiesce, CallStart, Frozen, Resumed, Dumped, Thawed, Returned time.Time
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
	if !e.Dumped.IsZero() && (e.Thawed.IsZero() || e.Dumped.Before(e.Thawed)) {
		e.Thawed = e.Dumped // the agent's thaw, heard before its own watch saw it
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
	// thaw: the agent thaws the app after the dump, on a watch started
	// before the quiesce (dumped; nil: none, and thawNo says why).
	thaw   bool
	dumped func() (thawed bool, noThaw string, criu time.Duration, err error)
	thawNo string
}

// holdResult is what checkpointUnderHold did.
type holdResult struct {
	archive   string
	err       error // the checkpoint's
	resumed   bool  // resume was called during the call
	resumeErr error // and what it answered
	fallback  string
	thawed    bool   // the agent thawed the app at the dump
	thawNo    string // why not
	criu      time.Duration
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
// call, as without a watch. With thaw, a dump watch started before the
// quiesce has the agent thaw the app once CRIU let it go; the app then
// runs (and reads what the release handed it) while the call goes on.
func checkpointUnderHold(ctx context.Context, s holdSteps, quiesced time.Time) holdResult {
	h := &underHold{s: s, now: s.now, res: holdResult{events: holdEvents{Quiesce: quiesced}, thawNo: s.thawNo}}
	if h.now == nil {
		h.now = SystemClock.Now
	}
	h.awaitDump()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h.awaitFreeze()
	done := h.call(ctx)
	for {
		select {
		case err := <-h.frozen:
			h.sawFreeze(ctx, wctx, err)
		case d := <-h.dumped:
			h.sawDump(d)
		case c := <-done:
			h.callReturned(c)
			return h.res
		}
	}
}

// underHold is a checkpoint under the hold as it goes: what it found out
// so far, and the waits still open (nil once heard, or never started).
type underHold struct {
	s   holdSteps
	now func() time.Time
	res holdResult
	// frozen hears the freeze watch, dumped the dump watch, and thawed
	// the watch for the app's tasks to be free again (started at the
	// freeze).
	frozen <-chan error
	dumped <-chan dumpSeen
	thawed <-chan error
}

// dumpSeen is what the dump watch saw.
type dumpSeen struct {
	thawed bool
	noThaw string
	criu   time.Duration
	err    error
}

// called is what the checkpoint call returned.
type called struct {
	archive string
	err     error
}

// awaitDump waits for the dump watch, if the app is to be thawed at the
// dump and the watch started.
func (h *underHold) awaitDump() {
	if !h.s.thaw || h.s.dumped == nil {
		return
	}
	ch := make(chan dumpSeen, 1)
	go func() {
		t, no, c, err := h.s.dumped()
		ch <- dumpSeen{t, no, c, err}
	}()
	h.dumped = ch
}

// awaitFreeze waits for the freeze watch; without one, the fallback says
// why the hold cannot end at the freeze.
func (h *underHold) awaitFreeze() {
	switch {
	case h.s.frozen != nil:
		ch := make(chan error, 1)
		go func() { ch <- h.s.frozen() }()
		h.frozen = ch
	case h.s.frozenErr != nil:
		h.res.fallback = "the freeze watch did not start: " + h.s.frozenErr.Error()
	default:
		h.res.fallback = "the node agent cannot watch a container's freeze"
	}
}

// call starts the checkpoint call.
func (h *underHold) call(ctx context.Context) <-chan called {
	done := make(chan called, 1)
	h.res.events.CallStart = h.now()
	go func() {
		a, err := h.s.checkpoint(ctx)
		done <- called{a, err}
	}()
	return done
}

// sawFreeze hears the freeze watch (err: it saw none): it watches for the
// tasks to be free again (on wctx) and, with atFreeze, releases the hold.
func (h *underHold) sawFreeze(ctx, wctx context.Context, err error) {
	h.frozen = nil
	if err != nil {
		h.res.fallback = "no freeze seen: " + err.Error()
		return
	}
	h.res.events.Frozen = h.now()
	if h.s.watch != nil {
		if wait, err := h.s.watch(wctx, "thawed"); err == nil {
			ch := make(chan error, 1)
			go func() { ch <- wait() }()
			h.thawed = ch
		}
	}
	if h.s.atFreeze {
		h.res.resumed = true
		h.res.resumeErr = h.s.resume(ctx)
		h.res.events.Resumed = h.now()
	}
}

// sawDump hears the dump watch: whether the agent thawed the app, and how
// long CRIU held it.
func (h *underHold) sawDump(d dumpSeen) {
	h.dumped = nil
	h.res.criu = d.criu
	switch {
	case d.err != nil:
		h.res.thawNo = "no dump seen: " + d.err.Error()
	case !d.thawed:
		h.res.thawNo = "the agent did not thaw the app: " + d.noThaw
	default:
		h.res.thawed, h.res.thawNo = true, ""
		h.res.events.Dumped = h.now()
	}
}

// callReturned ends the checkpoint under the hold with what the call
// returned: the end of the dump, if the thaw watch is still open, is
// heard within a poll, and the fallbacks say what was not seen.
func (h *underHold) callReturned(c called) {
	h.res.events.Returned = h.now()
	if h.dumped != nil {
		h.res.thawNo = "the call returned before the dump was seen"
	}
	h.res.archive, h.res.err = c.archive, c.err
	if h.thawed != nil {
		// The dump is over: the watch sees it within a poll.
		select {
		case err := <-h.thawed:
			if err == nil {
				// Heard after the call returned: the dump ended
				// before it did.
				h.res.events.Thawed = h.now()
				if h.res.events.Thawed.After(h.res.events.Returned) {
					h.res.events.Thawed = h.res.events.Returned
				}
			}
		case <-time.After(time.Second):
		}
	}
	if h.frozen != nil && h.res.fallback == "" {
		h.res.fallback = "the call returned before the freeze was seen"
	}
	if !h.s.atFreeze {
		h.res.fallback = ""
	}
}
