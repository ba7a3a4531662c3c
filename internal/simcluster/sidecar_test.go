package simcluster

import (
	"strings"
	"testing"
	"time"
)

// step runs the simulation's ticks by hand, 10 ms apart.
func step(s *Sidecar, from time.Time, n int) time.Time {
	for i := 0; i < n; i++ {
		from = from.Add(10 * time.Millisecond)
		s.tick(from)
	}
	return from
}

func newManual(log *Log, app *App, rp *Replay) *Sidecar {
	s := &Sidecar{log: log, app: app, apps: []*App{app}, mode: ModeServing, replay: rp, stopped: make(chan struct{})}
	if rp != nil {
		s.mode, s.replayed, s.cutoff = ModeReplaying, rp.Start, rp.Cutoff
	}
	return s
}

func TestSimulatedHandoverIsExactlyOnce(t *testing.T) {
	ctx := t.Context()
	log := &Log{name: "l"}
	src := newManual(log, &App{}, nil)
	now := step(src, time.Unix(0, 0), 100) // 1 s at λ = 10
	q, err := src.Quiesce(ctx)
	id, epoch := q.ID, q.Epoch
	if err != nil || id != log.LastID() || id < 9 {
		t.Fatalf("quiesce: %d, %v (log %d)", id, err, log.LastID())
	}
	// The checkpoint carries the app as it is; the source serves on.
	restored := &App{state: src.app.State()}
	if err := src.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	now = step(src, now, 50)
	dst := newManual(log, restored, &Replay{Start: id, Epoch: epoch})
	now = step(dst, now, 5)
	if dst.Mode() != ModeReplaying {
		t.Fatalf("the target switched without a cutoff: %s", dst.Mode())
	}
	res, err := src.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cut := res.CutoffID
	step(src, now, 50) // a stopped source takes nothing
	if log.LastID() != cut {
		t.Fatalf("the log went on to %d after the stop at %d", log.LastID(), cut)
	}
	now = step(dst, now, 5)
	if dst.Mode() != ModeServing {
		t.Fatalf("the target did not switch at cutoff %d: %s, replayed %d", cut, dst.Mode(), dst.replayed)
	}
	step(dst, now, 50)
	st := dst.app.State()
	if len(st.Violations) > 0 || st.Count != st.Last || st.Last != log.LastID() || st.Last <= cut {
		t.Fatalf("target app %+v, log %d, cutoff %d", st, log.LastID(), cut)
	}
}

func TestSimulatedTargetIgnoresAnEarlierMarker(t *testing.T) {
	log := &Log{name: "l", lastID: 20, epoch: 1, markers: []Marker{{ID: 20, Epoch: 1}}}
	dst := newManual(log, &App{state: AppState{Last: 20, Count: 20}}, &Replay{Start: 20, Epoch: 1})
	step(dst, time.Unix(0, 0), 5)
	if dst.Mode() != ModeReplaying {
		t.Fatal("a marker of the checkpoint's epoch ended the replay")
	}
}

func TestSimulatedAppSeesGapsAndDuplicates(t *testing.T) {
	a := &App{}
	for _, id := range []uint64{1, 2, 2, 5} {
		a.process(id, "test")
	}
	v := a.State().Violations
	if len(v) != 2 || !strings.HasPrefix(v[0], "duplicate") || !strings.HasPrefix(v[1], "gap") || !strings.Contains(v[1], "(2 lost)") {
		t.Fatalf("violations %q", v)
	}
}

// TestSimulatedWholePod: the two apps of a whole pod each take their
// queue's deliveries (odd and even IDs) through one sidecar, and each
// sees a gap or a duplicate of its own queue.
func TestSimulatedWholePod(t *testing.T) {
	a, b := &App{part: 0, parts: 2}, &App{part: 1, parts: 2}
	s := newManual(&Log{name: "l"}, a, nil)
	s.apps = []*App{a, b}
	step(s, time.Unix(0, 0), 100)
	sa, sb := a.State(), b.State()
	if len(sa.Violations)+len(sb.Violations) > 0 || sa.Count+sb.Count != s.log.LastID() || sa.Last%2 != 1 || sb.Last%2 != 0 || sb.Count != sb.Last/2 {
		t.Fatalf("apps %+v and %+v, log %d", sa, sb, s.log.LastID())
	}
	c := &App{part: 1, parts: 2}
	for _, id := range []uint64{2, 4, 4, 10} {
		c.process(id, "test")
	}
	v := c.State().Violations
	if len(v) != 2 || !strings.HasPrefix(v[0], "duplicate") || !strings.Contains(v[1], "(2 lost)") {
		t.Fatalf("violations %q", v)
	}
}

func TestSimulatedSidecarRefusesWhileReplaying(t *testing.T) {
	s := newManual(&Log{}, &App{}, &Replay{Start: 0})
	if _, err := s.Quiesce(t.Context()); err == nil {
		t.Fatal("a replaying sidecar was quiesced")
	}
	if _, err := s.Stop(t.Context()); err == nil {
		t.Fatal("a replaying sidecar was stopped")
	}
}

func TestReplayOfEnv(t *testing.T) {
	rp, err := replayOf(map[string]string{"MS2M_REPLAY_START": "7", "MS2M_REPLAY_CUTOFF": "marker", "MS2M_REPLAY_EPOCH": "2"})
	if err != nil || *rp != (Replay{Start: 7, Epoch: 2}) {
		t.Fatalf("%+v, %v", rp, err)
	}
	if rp, err := replayOf(map[string]string{}); rp != nil || err != nil {
		t.Fatalf("a serving sidecar: %+v, %v", rp, err)
	}
	if _, err := replayOf(map[string]string{"MS2M_REPLAY_START": "x"}); err == nil {
		t.Fatal("a bad start was taken")
	}
}
