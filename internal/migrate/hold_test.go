package migrate

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeNode plays a checkpoint: the call freezes the app after a while,
// thaws it once the dump is done, and returns; a watch sees the app's
// state as the agent would. Every step is written to a log.
type fakeNode struct {
	mu     sync.Mutex
	frozen bool
	log    []string

	freezeAfter time.Duration // 0: the call never freezes the app
	dumpFor     time.Duration
	callErr     error
	watchErr    error // the watch does not start
	blind       bool  // the watch never sees anything
}

func (n *fakeNode) note(s string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.log = append(n.log, s)
}

func (n *fakeNode) state() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.frozen
}

func (n *fakeNode) setFrozen(f bool) {
	n.mu.Lock()
	n.frozen = f
	n.mu.Unlock()
}

func (n *fakeNode) checkpoint(ctx context.Context) (string, error) {
	n.note("call")
	if n.freezeAfter > 0 {
		time.Sleep(n.freezeAfter) // the kubelet, containerd and runc at work
		n.setFrozen(true)
		time.Sleep(n.dumpFor) // CRIU dumps
		n.setFrozen(false)
	}
	n.note("return")
	return "/ckpt/a.tar", n.callErr
}

func (n *fakeNode) watch(ctx context.Context, state string) (func() error, error) {
	if n.watchErr != nil {
		return nil, n.watchErr
	}
	n.note("watch " + state)
	return func() error {
		for {
			if !n.blind && n.state() == (state == "frozen") {
				n.note("seen " + state)
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Millisecond):
			}
		}
	}, nil
}

// resume fails the test if deliveries are released while the app is not
// frozen and the call has not returned: that is the hold invariant.
func (n *fakeNode) resume(t *testing.T) func(context.Context) error {
	return func(context.Context) error {
		if !n.state() {
			t.Errorf("the hold was released while the app was not frozen, during the checkpoint call")
		}
		n.note("resume")
		return nil
	}
}

// TestCheckpointUnderHold: the hold is released during the checkpoint
// call only once the app is seen frozen, and never without a freeze seen;
// a watch that cannot start, ends with an error or sees nothing leaves
// the release to the caller, after the call.
func TestCheckpointUnderHold(t *testing.T) {
	for _, tc := range []struct {
		name     string
		node     *fakeNode
		noWatch  bool
		atFreeze bool
		wantLog  []string
		resumed  bool
		fallback string
	}{
		{
			name: "resumed at the freeze", atFreeze: true,
			node:    &fakeNode{freezeAfter: 30 * time.Millisecond, dumpFor: 60 * time.Millisecond},
			wantLog: []string{"watch frozen", "call", "seen frozen", "watch thawed", "resume", "seen thawed", "return"},
			resumed: true,
		},
		{
			name: "held for the whole call when asked", atFreeze: false,
			node:    &fakeNode{freezeAfter: 30 * time.Millisecond, dumpFor: 60 * time.Millisecond},
			wantLog: []string{"watch frozen", "call", "seen frozen", "watch thawed", "seen thawed", "return"},
		},
		{
			name: "the watch does not start", atFreeze: true,
			node:     &fakeNode{freezeAfter: 10 * time.Millisecond, dumpFor: 10 * time.Millisecond, watchErr: errors.New("404 no cgroup")},
			wantLog:  []string{"call", "return"},
			fallback: "the freeze watch did not start: 404 no cgroup",
		},
		{
			name: "the watch sees no freeze", atFreeze: true,
			node:     &fakeNode{freezeAfter: 10 * time.Millisecond, dumpFor: 10 * time.Millisecond, blind: true},
			wantLog:  []string{"watch frozen", "call", "return"},
			fallback: "the call returned before the freeze was seen",
		},
		{
			name: "no agent can watch", atFreeze: true, noWatch: true,
			node:     &fakeNode{freezeAfter: 10 * time.Millisecond, dumpFor: 10 * time.Millisecond},
			wantLog:  []string{"call", "return"},
			fallback: "the node agent cannot watch a container's freeze",
		},
		{
			name: "a failed call after the release", atFreeze: true,
			node:    &fakeNode{freezeAfter: 10 * time.Millisecond, dumpFor: 60 * time.Millisecond, callErr: errors.New("runc: criu failed")},
			wantLog: []string{"watch frozen", "call", "seen frozen", "watch thawed", "resume", "seen thawed", "return"},
			resumed: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.node
			steps := holdSteps{checkpoint: n.checkpoint, watch: n.watch, resume: n.resume(t), atFreeze: tc.atFreeze}
			if tc.noWatch {
				steps.watch = nil
			} else {
				steps.frozen, steps.frozenErr = n.watch(t.Context(), "frozen")
			}
			res := checkpointUnderHold(t.Context(), steps, time.Now())
			// The thaw is seen within a poll of it, before or after the
			// call's "return": the order of those two is the watch's.
			log := n.log
			if i, j := index(log, "return"), index(log, "seen thawed"); i >= 0 && j > i {
				log[i], log[j] = log[j], log[i]
			}
			if diff := cmp.Diff(tc.wantLog, log); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
			if res.resumed != tc.resumed || res.fallback != tc.fallback {
				t.Errorf("resumed %v, fallback %q; want %v, %q", res.resumed, res.fallback, tc.resumed, tc.fallback)
			}
			if (res.err != nil) != (n.callErr != nil) || res.archive != "/ckpt/a.tar" {
				t.Errorf("archive %q, err %v; want the call's", res.archive, res.err)
			}
			if err := res.events.releaseErr(); err != nil {
				t.Error(err)
			}
			if tm := res.events.timings(); tc.resumed && (tm.ToFreeze < n.freezeAfter || tm.Dump < n.dumpFor/2 || tm.ToFreeze+tm.Dump+tm.AfterDump != tm.Call) {
				t.Errorf("timings %+v do not split the call (freeze after %s, dump %s)", tm, n.freezeAfter, n.dumpFor)
			}
		})
	}
}

func index(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// TestReleaseErr: the invariant's check on a timeline.
func TestReleaseErr(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 18, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		name string
		ev   holdEvents
		want string // "" no error, else a part of it
	}{
		{"not resumed", holdEvents{CallStart: at(0), Returned: at(400)}, ""},
		{"resumed after the call", holdEvents{CallStart: at(0), Returned: at(400), Resumed: at(410)}, ""},
		{"resumed after the freeze", holdEvents{CallStart: at(0), Frozen: at(250), Resumed: at(252), Returned: at(400)}, ""},
		{"resumed before the freeze", holdEvents{CallStart: at(0), Frozen: at(250), Resumed: at(240), Returned: at(400)}, "before the freeze was seen"},
		{"resumed during the call, no freeze", holdEvents{CallStart: at(0), Resumed: at(240), Returned: at(400)}, "no freeze seen"},
		{"resumed while the call runs, no freeze", holdEvents{CallStart: at(0), Resumed: at(240)}, "no freeze seen"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.ev.releaseErr()
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("releaseErr = %v, want %q", err, tc.want)
			}
		})
	}
}
