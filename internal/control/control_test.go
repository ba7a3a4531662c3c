package control

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ms2m/ms2m/internal/proxy"
	"github.com/ms2m/ms2m/internal/replay"
	"github.com/ms2m/ms2m/internal/tracking"
)

const testToken = "t0ken"

// fake is a Sidecar: a source (target false) or a target that switches
// once its source's stop wrote a cutoff (*cutoff != 0).
type fake struct {
	mu      sync.Mutex
	mode    string
	last    uint64
	start   uint64 // a target's replay range start (the checkpoint ID)
	target  bool
	cutoff  *atomic.Uint64
	resumes int
}

func (f *fake) State() State {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := State{LogName: "l", Ready: true, State: proxy.State{Mode: f.mode, Queues: []tracking.QueueStats{{Queue: "q", LastAckedID: f.last}}}}
	st.Log.LastID = f.last
	if f.target {
		lag := uint64(0)
		st.ReplayLag = &lag
		st.Source = &replay.Status{Range: replay.Range{Start: f.start}.String(), Start: f.start}
		st.Replay = &proxy.ReplayState{Replaying: 1}
		if c := f.cutoff.Load(); c != 0 {
			now := time.Now()
			st.Source.Cutoff, st.Source.Complete = c, true
			st.Replay = &proxy.ReplayState{Replaying: 0, SwitchedAt: &now, LastReplayedID: c}
			st.Mode = ModeServing
		}
	}
	return st
}

func (f *fake) Quiesce(context.Context) (Cut, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mode == ModeStopped {
		return Cut{}, ErrConflict
	}
	f.mode = ModeQuiesced
	return Cut{ID: f.last, Epoch: 1}, nil
}

func (f *fake) Resume(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mode, f.resumes = ModeServing, f.resumes+1
	return nil
}

func (f *fake) Stop(context.Context) (StopResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mode = ModeStopped
	if f.cutoff != nil {
		f.cutoff.Store(f.last)
	}
	return StopResult{StartedAt: time.Now(), CutoffID: f.last, Epoch: 2, StoppedAt: time.Now()}, nil
}

func (f *fake) Ready() error { return nil }

// serve serves s's control API until the test ends; wrap, if set, wraps
// the handler (to fail calls).
func serve(t *testing.T, s Sidecar, wrap func(http.Handler) http.Handler) Client {
	t.Helper()
	h := Handler(s, testToken, prometheus.NewRegistry())
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return Client{URL: srv.URL, Token: testToken, HTTP: &http.Client{Timeout: 5 * time.Second}}
}

func TestCheckHold(t *testing.T) {
	for _, tc := range []struct {
		name, want, current, mode string
		err                       string // "" for none
	}{
		{"quiesced under it", "h1", "h1", ModeQuiesced, ""},
		{"restarted: no hold", "h1", "", ModeServing, "holds no quiesce, not hold h1: it was restarted, resumed or stopped"},
		{"quiesced again", "h1", "h2", ModeQuiesced, "quiesced under hold h2, not h1"},
		{"same hold but not quiesced", "h1", "h1", ModeStopped, "the sidecar is stopped, not quiesced under hold h1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkHold(tc.want, tc.current, tc.mode)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "discard it") {
				t.Errorf("checkHold = %v, want an ErrConflict that says %q and to discard the checkpoint", err, tc.err)
			}
		})
	}
}

func TestNextBackoff(t *testing.T) {
	var got []time.Duration
	for d := 10 * time.Millisecond; len(got) < 9; d = nextBackoff(d) {
		got = append(got, d)
	}
	ms := time.Millisecond
	want := []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, time.Second, time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("back-off (-want +got):\n%s", diff)
	}
}

func TestTransient(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{errors.New("connection refused"), true},
		{&StatusError{Code: http.StatusServiceUnavailable}, true},
		{&StatusError{Code: http.StatusGatewayTimeout}, true},
		{&StatusError{Code: http.StatusUnauthorized}, false},
		{&StatusError{Code: http.StatusConflict}, false},
		{context.Canceled, false},
	} {
		if got := transient(tc.err); got != tc.want {
			t.Errorf("transient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestResumeHold: a resume with the hold of the quiesce in force resumes;
// one with a hold that did not last (the sidecar was resumed, quiesced
// again or restarted) is 409 and changes nothing; one without a hold
// behaves as before holds.
func TestResumeHold(t *testing.T) {
	ctx := t.Context()
	f := &fake{mode: ModeServing, last: 7}
	c := serve(t, f, nil)

	cut, err := c.Quiesce(ctx, time.Second)
	if err != nil || cut.Hold == "" || cut.ID != 7 {
		t.Fatalf("quiesce = %+v, %v; want checkpoint 7 and a hold", cut, err)
	}
	if st, err := c.State(ctx); err != nil || st.Hold != cut.Hold {
		t.Fatalf("state's hold = %q (%v), want %q", st.Hold, err, cut.Hold)
	}
	if err := c.ResumeHold(ctx, cut.Hold); err != nil {
		t.Fatalf("resume under the hold in force: %v", err)
	}
	if st, _ := c.State(ctx); st.Mode != ModeServing || st.Hold != "" {
		t.Fatalf("after the resume: mode %s hold %q, want serving and none", st.Mode, st.Hold)
	}

	// A resume with the same hold again: the sidecar serves, 409.
	resumes := f.resumes
	err = c.ResumeHold(ctx, cut.Hold)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "409") {
		t.Fatalf("resume with a spent hold on a serving sidecar = %v, want 409", err)
	}
	if f.resumes != resumes {
		t.Error("a refused resume reached the sidecar")
	}
	// Without a hold, as before: OK on a serving sidecar.
	if err := c.Resume(ctx); err != nil {
		t.Fatalf("resume without a hold on a serving sidecar: %v", err)
	}

	// Quiesced again: the first quiesce's hold is void.
	first, _ := c.Quiesce(ctx, time.Second)
	second, _ := c.Quiesce(ctx, time.Second)
	if err := c.ResumeHold(ctx, first.Hold); !errors.Is(err, ErrConflict) {
		t.Fatalf("resume with the hold of an earlier quiesce = %v, want 409", err)
	}
	if st, _ := c.State(ctx); st.Mode != ModeQuiesced {
		t.Fatalf("a refused resume changed the mode to %s", st.Mode)
	}

	// Restarted: a new server over the same sidecar holds nothing.
	restarted := serve(t, f, nil)
	err = restarted.ResumeHold(ctx, second.Hold)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "holds no quiesce") {
		t.Fatalf("resume after a restart = %v, want 409 that says the sidecar holds no quiesce", err)
	}
	// A stop ends the hold too.
	third, _ := c.Quiesce(ctx, time.Second)
	if _, err := c.Stop(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.ResumeHold(ctx, third.Hold); !errors.Is(err, ErrConflict) {
		t.Fatalf("resume with a hold after a stop = %v, want 409", err)
	}
	// Old callers resume a quiesced or stopped sidecar without a hold.
	if err := c.Resume(ctx); err != nil {
		t.Fatalf("resume without a hold of a stopped sidecar: %v", err)
	}
}

// failing wraps a handler: while fail() is true, GET /state gets no
// answer (the connection is dropped), as from a restarting sidecar.
func failing(fail func() bool, failed *atomic.Int64) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/state" && fail() {
				failed.Add(1)
				panic(http.ErrAbortHandler) // drops the connection, unlogged
			}
			h.ServeHTTP(w, r)
		})
	}
}

// TestHandoverRetriesReadsAfterTheStop: once the source is stopped, reads
// of the target that fail for a while are retried, and the handover ends
// when the target has switched. Before, the first failed read ended it, and
// a caller rolled back a target that had taken over.
func TestHandoverRetriesReadsAfterTheStop(t *testing.T) {
	var cutoff atomic.Uint64
	src := serve(t, &fake{mode: ModeServing, last: 40, cutoff: &cutoff}, nil)
	var failed atomic.Int64
	// The first 5 reads after the switch fail.
	dst := serve(t, &fake{mode: ModeReplaying, last: 40, target: true, cutoff: &cutoff},
		failing(func() bool { return cutoff.Load() != 0 && failed.Load() < 5 }, &failed))
	tm, err := Handover(t.Context(), src, dst, HandoverOptions{ReadRetry: 10 * time.Second})
	if err != nil {
		t.Fatalf("handover: %v", err)
	}
	if failed.Load() != 5 || tm.CutoffID != 40 || tm.Switched.IsZero() {
		t.Errorf("failed reads %d, timings %+v; want 5 failed reads, then the switch at cutoff 40", failed.Load(), tm)
	}
}

// TestHandoverGivesUpAfterReadRetry: a target that stays unreachable after
// the stop fails the handover once ReadRetry has passed, with an error
// that is not ErrBeforeStop (the target may have taken over) and says how
// often it tried.
func TestHandoverGivesUpAfterReadRetry(t *testing.T) {
	var cutoff atomic.Uint64
	src := serve(t, &fake{mode: ModeServing, last: 3, cutoff: &cutoff}, nil)
	var failed atomic.Int64
	dst := serve(t, &fake{mode: ModeReplaying, last: 3, target: true, cutoff: &cutoff},
		failing(func() bool { return cutoff.Load() != 0 }, &failed))
	began := time.Now()
	_, err := Handover(t.Context(), src, dst, HandoverOptions{ReadRetry: 500 * time.Millisecond})
	if err == nil {
		t.Fatal("the handover succeeded with an unreachable target")
	}
	if errors.Is(err, ErrBeforeStop) || !strings.Contains(err.Error(), "the source is stopped at cutoff 3, but reading the target failed") || !strings.Contains(err.Error(), "reads over") {
		t.Errorf("err = %v", err)
	}
	if took := time.Since(began); took > 5*time.Second || failed.Load() < 3 {
		t.Errorf("gave up after %s and %d reads, want about 0.5 s and several", took, failed.Load())
	}
}

// TestHandoverIdleTarget: a target with nothing to replay (its consumer was
// idle since the checkpoint, so its app acks nothing) is caught up: its lag
// counts from the checkpoint ID. Counted from 0, it stayed at the
// checkpoint ID and the handover waited for ever (TestDrain's first run).
func TestHandoverIdleTarget(t *testing.T) {
	var cutoff atomic.Uint64
	src := serve(t, &fake{mode: ModeServing, last: 40, cutoff: &cutoff}, nil)
	dst := serve(t, &fake{mode: ModeReplaying, start: 40, target: true, cutoff: &cutoff}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	tm, err := Handover(ctx, src, dst, HandoverOptions{})
	if err != nil || tm.CutoffID != 40 || tm.LagAtStop != 0 {
		t.Fatalf("Handover = %+v, %v; want the switch at cutoff 40 with lag 0", tm, err)
	}
}

// TestHandoverCatchUpTimeout: a target that does not catch up fails the
// handover before the stop once CatchUpTimeout has passed, and the source
// keeps serving.
func TestHandoverCatchUpTimeout(t *testing.T) {
	var cutoff atomic.Uint64
	sf := &fake{mode: ModeServing, last: 40, cutoff: &cutoff}
	src := serve(t, sf, nil)
	dst := serve(t, &fake{mode: ModeReplaying, start: 10, target: true, cutoff: &cutoff}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := Handover(ctx, src, dst, HandoverOptions{CatchUpTimeout: 300 * time.Millisecond})
	if !errors.Is(err, ErrBeforeStop) || !strings.Contains(err.Error(), "lag 30 deliveries") {
		t.Fatalf("err = %v; want ErrBeforeStop naming lag 30", err)
	}
	if sf.mode != ModeServing || cutoff.Load() != 0 {
		t.Errorf("source mode %s, cutoff %d; want serving and no cutoff", sf.mode, cutoff.Load())
	}
}

// TestHandoverBeforeStop: a failure before the stop matches ErrBeforeStop
// and leaves the source serving.
func TestHandoverBeforeStop(t *testing.T) {
	var cutoff atomic.Uint64
	sf := &fake{mode: ModeServing, last: 3, cutoff: &cutoff}
	src := serve(t, sf, nil)
	var failed atomic.Int64
	dst := serve(t, &fake{mode: ModeReplaying, target: true, cutoff: &cutoff}, failing(func() bool { return true }, &failed))
	_, err := Handover(t.Context(), src, dst, HandoverOptions{})
	if !errors.Is(err, ErrBeforeStop) {
		t.Fatalf("err = %v, want ErrBeforeStop", err)
	}
	if sf.State().Mode != ModeServing {
		t.Error("the source was stopped")
	}
}

// TestLongWaitOutlivesTheClientTimeout: a quiesce or stop may take up to
// its own timeout, longer than the client's (10 s by default against the
// migrator's 30 s quiesce and 60 s stop); the client waits for it.
// Before, it gave up at its own timeout and the migration failed.
func TestLongWaitOutlivesTheClientTimeout(t *testing.T) {
	slow := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/quiesce" || r.URL.Path == "/stop" {
				time.Sleep(300 * time.Millisecond) // the app acking what it holds
			}
			h.ServeHTTP(w, r)
		})
	}
	c := serve(t, &fake{mode: ModeServing, last: 3}, slow)
	c.HTTP = &http.Client{Timeout: 100 * time.Millisecond}
	if _, err := c.Quiesce(t.Context(), time.Second); err != nil {
		t.Fatalf("quiesce taking 300 ms of its 1 s with a 100 ms client: %v", err)
	}
	if _, err := c.Stop(t.Context(), time.Second); err != nil {
		t.Fatalf("stop taking 300 ms of its 1 s with a 100 ms client: %v", err)
	}
	if _, err := c.State(t.Context()); err != nil {
		t.Fatalf("state: %v", err)
	}
	if c.HTTP.Timeout != 100*time.Millisecond {
		t.Errorf("the caller's client was changed: timeout %v", c.HTTP.Timeout)
	}
}
