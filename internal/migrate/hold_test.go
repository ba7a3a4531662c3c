package migrate

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	archiveFor  time.Duration // the runtime keeps the app frozen after the dump
	callErr     error
	watchErr    error  // the watch does not start
	blind       bool   // the watch never sees anything
	noThaw      string // the dump watch does not thaw, for this reason
	dumping     bool
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
		n.setDumping(true)
		time.Sleep(n.dumpFor) // CRIU dumps
		n.setDumping(false)
		time.Sleep(n.archiveFor) // the runtime archives, the app paused
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

func (n *fakeNode) setDumping(d bool) {
	n.mu.Lock()
	n.dumping = d
	n.mu.Unlock()
}

// dumpWatch is the agent's dump watch with thaw: once CRIU was seen at
// work and then done, it thaws the app if it is still frozen.
func (n *fakeNode) dumpWatch(ctx context.Context) func() (bool, string, time.Duration, error) {
	n.note("watch dumped")
	return func() (bool, string, time.Duration, error) {
		seen := false
		for {
			n.mu.Lock()
			dumping, frozen := n.dumping, n.frozen
			n.mu.Unlock()
			switch {
			case n.blind:
			case dumping:
				seen = true
			case seen && n.noThaw != "":
				n.note("seen dumped")
				return false, n.noThaw, n.dumpFor, nil
			case seen && frozen:
				n.note("seen dumped")
				n.note("thaw")
				n.setFrozen(false)
				return true, "", n.dumpFor, nil
			}
			select {
			case <-ctx.Done():
				return false, "", 0, ctx.Err()
			case <-time.After(time.Millisecond):
			}
		}
	}
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
		// thaw: the policy lets the agent thaw the app after the dump.
		thaw       bool
		thawNo     string // what the policy said, when it says no
		wantThawed bool
		wantThawNo string
	}{
		{
			name: "thawed at the dump", atFreeze: true, thaw: true,
			node:       &fakeNode{freezeAfter: 30 * time.Millisecond, dumpFor: 60 * time.Millisecond, archiveFor: 80 * time.Millisecond},
			wantLog:    []string{"watch frozen", "watch dumped", "call", "seen frozen", "watch thawed", "resume", "seen dumped", "thaw", "seen thawed", "return"},
			resumed:    true,
			wantThawed: true,
		},
		{
			name: "not thawed when the policy says no", atFreeze: true, thawNo: "policy never",
			node:       &fakeNode{freezeAfter: 30 * time.Millisecond, dumpFor: 60 * time.Millisecond, archiveFor: 20 * time.Millisecond},
			wantLog:    []string{"watch frozen", "call", "seen frozen", "watch thawed", "resume", "seen thawed", "return"},
			resumed:    true,
			wantThawNo: "policy never",
		},
		{
			name: "the agent does not thaw", atFreeze: true, thaw: true,
			node:       &fakeNode{freezeAfter: 30 * time.Millisecond, dumpFor: 60 * time.Millisecond, archiveFor: 20 * time.Millisecond, noThaw: "the cgroup was not frozen after the dump"},
			wantLog:    []string{"watch frozen", "watch dumped", "call", "seen frozen", "watch thawed", "resume", "seen dumped", "seen thawed", "return"},
			resumed:    true,
			wantThawNo: "the agent did not thaw the app: the cgroup was not frozen after the dump",
		},
		{
			name: "the dump watch sees nothing", atFreeze: true, thaw: true,
			node:       &fakeNode{freezeAfter: 10 * time.Millisecond, dumpFor: 10 * time.Millisecond, blind: true},
			wantLog:    []string{"watch frozen", "watch dumped", "call", "return"},
			fallback:   "the call returned before the freeze was seen",
			wantThawNo: "the call returned before the dump was seen",
		},
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
			steps.thaw, steps.thawNo = tc.thaw, tc.thawNo
			if tc.thaw {
				steps.dumped = n.dumpWatch(t.Context())
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
			if res.thawed != tc.wantThawed || res.thawNo != tc.wantThawNo {
				t.Errorf("thawed %v (%q); want %v (%q)", res.thawed, res.thawNo, tc.wantThawed, tc.wantThawNo)
			}
			if tm := res.events.timings(); tc.wantThawed && (tm.Dump > n.dumpFor+n.archiveFor/2 || tm.AfterDump < n.archiveFor/2) {
				t.Errorf("timings %+v: the dump should end at the thaw (dump %s, then %s archiving)", tm, n.dumpFor, n.archiveFor)
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

// TestThawPolicy: auto thaws only an app with a read-only root
// filesystem; always and never override; bad names are refused.
func TestThawPolicy(t *testing.T) {
	ro, rw := true, false
	pod := func(readOnly *bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "ms2m-sidecar"}, {Name: "app"}}}}
		if readOnly != nil {
			p.Spec.Containers[1].SecurityContext = &corev1.SecurityContext{ReadOnlyRootFilesystem: readOnly}
		}
		// The sidecar's own read-only root says nothing of the app's.
		p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{ReadOnlyRootFilesystem: &ro}
		return p
	}
	for _, tc := range []struct {
		policy string
		pod    *corev1.Pod
		want   bool
		why    string
	}{
		{"", pod(&ro), true, ""},
		{"auto", pod(&ro), true, ""},
		{"auto", pod(&rw), false, "root filesystem is writable"},
		{"auto", pod(nil), false, "root filesystem is writable"},
		{"always", pod(nil), true, ""},
		{"never", pod(&ro), false, "policy never"},
	} {
		p, err := ParseThawPolicy(tc.policy)
		if err != nil {
			t.Fatal(err)
		}
		got, why := p.thaws(tc.pod, "app")
		if got != tc.want || !strings.Contains(why, tc.why) || (tc.why == "") != (why == "") {
			t.Errorf("%q: thaws = %v (%q), want %v (%q)", tc.policy, got, why, tc.want, tc.why)
		}
	}
	if got, why := ThawAuto.thaws(pod(&ro), "other"); got || !strings.Contains(why, "no container other") {
		t.Errorf("auto on a missing container = %v (%q)", got, why)
	}
	if _, err := ParseThawPolicy("sometimes"); err == nil {
		t.Error("ParseThawPolicy took sometimes")
	}
}
