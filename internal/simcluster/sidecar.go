package simcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/proxy"
	"github.com/ms2m/ms2m/internal/replay"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/tracking"
)

// Modes of a simulated sidecar, as the real one names them in GET /state.
const (
	ModeServing   = "serving"
	ModeQuiesced  = "quiesced"
	ModeStopped   = "stopped"
	ModeReplaying = "replaying"
	// ModeDead is a sidecar whose pod is gone or was killed (Node.Kill);
	// the real one has no such mode: it does not answer.
	ModeDead = "dead"
)

// Queue is the one queue every simulated app consumes.
const Queue = "work"

// Rates are the simulated sidecars' λ and μ (the paper's 10 msg/s and
// 50 ms per message).
const (
	Lambda = 10.0
	Mu     = 20.0
)

// Log is a replay log (one per log name), shared by every sidecar that
// writes or replays it, as the stream is on the broker. IDs are delivery
// IDs: the primary queue's deliveries, numbered as the serving sidecar
// tees them.
type Log struct {
	mu      sync.Mutex
	name    string
	lastID  uint64
	epoch   uint64
	markers []Marker
	// dropped is the last delivery ID that retention removed: the log
	// holds the deliveries after it.
	dropped uint64
}

// DropThrough removes the deliveries up to id, as the stream's retention
// (MS2M_LOG_MAX_AGE, MS2M_LOG_MAX_BYTES) does: a replay that needs them
// fails with replay.ErrRetention.
func (l *Log) DropThrough(id uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropped = max(l.dropped, id)
}

// Marker is a cutoff marker: the stop of the sidecar that served before.
type Marker struct{ ID, Epoch uint64 }

// LastID is the last delivery ID the log holds.
func (l *Log) LastID() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastID
}

// App is a simulated stateful consumer. Its state is the last delivery ID
// it processed and how many it processed; a delivery that is not the next
// one is a gap (lost messages) or a duplicate, and is recorded as such.
//
// The app containers of a whole pod each consume a queue of their own
// through the pod's one sidecar: with parts apps, the app of part i (from
// 0) gets the deliveries whose IDs are i+1 modulo parts, as if the log
// held the deliveries of parts queues in turn.
type App struct {
	mu    sync.Mutex
	state AppState
	// part and parts: which of the pod's app containers this is, and how
	// many there are; 0 parts is 1.
	part, parts uint64
}

// takes says whether the app consumes the queue of delivery id.
func (a *App) takes(id uint64) bool { return a.parts <= 1 || (id-1)%a.parts == a.part }

// WantCount is how many deliveries the app, its last one last, has
// processed if it processed each of its queue's once: last for a pod's one
// app, the IDs of its part up to last for one of several.
func (a *App) WantCount(last uint64) uint64 {
	switch {
	case a.parts <= 1:
		return last
	case last <= a.part:
		return 0
	}
	return (last-a.part-1)/a.parts + 1
}

// next is the delivery ID the app expects next.
func (a *App) next() uint64 {
	switch {
	case a.parts <= 1:
		return a.state.Last + 1
	case a.state.Last == 0:
		return a.part + 1
	}
	return a.state.Last + a.parts
}

// AppState is what a checkpoint carries of the app, and what a restore
// starts it with.
type AppState struct {
	Last       uint64   `json:"last"`
	Count      uint64   `json:"count"`
	Violations []string `json:"violations,omitempty"`
}

func (a *App) process(id uint64, via string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch next := a.next(); {
	case id == next:
	case id <= a.state.Last:
		a.state.Violations = append(a.state.Violations, fmt.Sprintf("duplicate: %s delivered %d after %d", via, id, a.state.Last))
	default:
		a.state.Violations = append(a.state.Violations, fmt.Sprintf("gap: %s delivered %d after %d (%d lost)", via, id, a.state.Last, (id-next)/max(a.parts, 1)))
	}
	a.state.Last = max(a.state.Last, id)
	a.state.Count++
}

// State returns a copy of the app's state.
func (a *App) State() AppState {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.state
	s.Violations = append([]string(nil), s.Violations...)
	return s
}

// Replay is what a target sidecar replays: its MS2M_REPLAY_* settings.
type Replay struct {
	Start  uint64
	Cutoff uint64 // 0: the first cutoff marker of an epoch after Epoch
	Epoch  uint64
	// ToEnd: the cutoff is the log's end when the sidecar starts
	// (MS2M_REPLAY_CUTOFF=end).
	ToEnd bool
}

// Sidecar is a simulated sidecar in front of a simulated app. Serving, it
// takes one delivery per 1/Lambda from the primary queue and tees it into
// the log; a target replays the log from Replay.Start to its cutoff, then
// serves. It implements control.Sidecar, with the real sidecar's JSON.
type Sidecar struct {
	mu  sync.Mutex
	log *Log
	app *App
	// apps are the pod's app containers' apps (a whole pod), app the
	// first.
	apps     []*App
	mode     string
	replay   *Replay
	replayed uint64 // last ID replayed to the app
	// handed is the last delivery ID the sidecar handed to its app, which
	// a quiesce and a stop cut at as the real one's Tee does; the app's
	// own last may be older (it restarted from a checkpoint).
	handed uint64
	cutoff uint64 // a target's cutoff, once known
	held   bool   // a target's replay is held (Hold)
	// holdAfter, if not 0: the replay holds once it has replayed this
	// many records (HoldAfter).
	holdAfter uint64
	// logEnd is the log's last ID when the sidecar started: deliveries
	// beyond the cutoff that were in the log then are replayed too, as the
	// real sidecar does (replay.Range.LogEnd).
	logEnd uint64
	// logEndEpoch is the log's epoch then: only deliveries of the stop's
	// epoch or later are a predecessor's.
	logEndEpoch uint64
	// replayErr is why a target cannot replay (the log no longer holds
	// the records after its start), as the real one reports it in
	// /state's source.error; it then replays and consumes nothing.
	replayErr string
	// interrupted counts app restarts in the middle of the replay, after
	// replayed records (the real proxy's ReplayState.Interrupted).
	interrupted int
	switched    *time.Time
	lastRep     *time.Time
	next        time.Time // a serving sidecar's next delivery
	stopped     chan struct{}
	// unreplayable are queues the app consumes that a migration cannot
	// carry over, as the real sidecar reports them (SetUnreplayable).
	unreplayable []proxy.UnreplayableQueue
	// broker is the cluster's broker, which an outage takes away
	// (Cluster.CutBroker); nil: always there.
	broker *broker
	// pendingMarker: a stop whose cutoff marker could not be written (the
	// broker was away until the stop's context ended); the marker goes to
	// the log once the broker is back, as the real tee's queued marker
	// does.
	pendingMarker *Marker
	// recorded is the stop the sidecar recorded in its state folder (the
	// real one's MS2M_STATE_DIR, an emptyDir of the pod): a restart
	// starts stopped while it is set; a resume clears it.
	recorded *control.StopResult
}

// SetUnreplayable makes the sidecar report qs in /state, as the real one
// does for an app that consumes a server-named, exclusive or auto-delete
// queue.
func (s *Sidecar) SetUnreplayable(qs []proxy.UnreplayableQueue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unreplayable = qs
}

// newSidecar starts a sidecar on log; rp is nil for a serving one. A
// target's replay starts held (Hold) or holds after holdAfter records
// (HoldAfter), set before its first step.
func newSidecar(log *Log, apps []*App, rp *Replay, held bool, holdAfter uint64, b *broker) *Sidecar {
	s := &Sidecar{log: log, app: apps[0], apps: apps, mode: ModeServing, replay: rp, stopped: make(chan struct{}), broker: b}
	if rp != nil {
		s.held, s.holdAfter = held, holdAfter
		s.mode = ModeReplaying
		s.replayed = rp.Start
		log.mu.Lock()
		s.logEnd, s.logEndEpoch = log.lastID, log.epoch
		if log.dropped > rp.Start {
			s.replayErr = fmt.Sprintf("%v: it starts at ID %d, but replay needs %d onwards (start %d)", replay.ErrRetention, log.dropped+1, rp.Start+1, rp.Start)
		}
		log.mu.Unlock()
		s.cutoff = s.extend(rp.Cutoff, rp.Epoch)
		if rp.ToEnd {
			s.cutoff = max(s.logEnd, rp.Start)
		}
	}
	go s.run(s.stopped)
	return s
}

func (s *Sidecar) run(stopped <-chan struct{}) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stopped:
			return
		case now := <-t.C:
			s.tick(now)
		}
	}
}

// tick moves the simulation on: a serving sidecar takes the deliveries due
// by now, a replaying one replays up to 20 records.
func (s *Sidecar) tick(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broker.down() {
		return // no deliveries, no log reads or writes; the queue keeps what comes meanwhile
	}
	if m := s.pendingMarker; m != nil {
		s.log.mu.Lock()
		s.log.markers = append(s.log.markers, *m)
		s.log.mu.Unlock()
		s.pendingMarker = nil
	}
	switch s.mode {
	case ModeServing:
		if s.next.IsZero() {
			s.next = now
		}
		for !now.Before(s.next) {
			s.log.mu.Lock()
			s.log.lastID++
			id := s.log.lastID
			s.log.mu.Unlock()
			s.handed = id
			s.deliver(id, "the primary queue")
			s.next = s.next.Add(time.Duration(float64(time.Second) / Lambda))
		}
	case ModeReplaying:
		if s.held || s.replayErr != "" {
			return
		}
		s.log.mu.Lock()
		end := s.log.lastID
		if s.cutoff == 0 {
			for _, m := range s.log.markers {
				if m.Epoch > s.replay.Epoch && m.ID >= s.replay.Start {
					s.cutoff = s.extend(m.ID, m.Epoch)
					break
				}
			}
		}
		s.log.mu.Unlock()
		if s.cutoff != 0 {
			end = min(end, s.cutoff)
		}
		if s.holdAfter > 0 {
			end = min(end, s.replay.Start+s.holdAfter)
		}
		for n := 0; n < 20 && s.replayed < end; n++ {
			s.replayed++
			s.handed = s.replayed
			s.deliver(s.replayed, "the replay")
			t := now
			s.lastRep = &t
		}
		if s.cutoff != 0 && s.replayed >= s.cutoff {
			t := now
			s.switched = &t
			s.mode = ModeServing
			s.next = now
		}
	}
}

// deliver hands delivery id to the app that consumes its queue.
func (s *Sidecar) deliver(id uint64, via string) {
	for _, a := range s.apps {
		if a.takes(id) {
			a.process(id, via)
			return
		}
	}
}

// appsLast is the last delivery ID any of the pod's apps processed.
func (s *Sidecar) appsLast() uint64 {
	var last uint64
	for _, a := range s.apps {
		last = max(last, a.State().Last)
	}
	return last
}

// extend is cutoff moved past what this identity took before the sidecar
// started (replay.Range.LogEnd).
func (s *Sidecar) extend(cutoff, epoch uint64) uint64 {
	if cutoff != 0 && epoch != 0 && s.logEnd > cutoff && s.logEndEpoch >= epoch {
		return s.logEnd
	}
	return cutoff
}

// HoldAfter holds a target's replay once it has replayed n records (0:
// no such hold).
func (s *Sidecar) HoldAfter(n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdAfter = n
}

// Replayed is the last ID a target replayed to its app.
func (s *Sidecar) Replayed() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replayed
}

// Hold holds (true) or releases a target's replay: it stays in replay
// mode with what it replayed so far.
func (s *Sidecar) Hold(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = on
}

// appRestarted is the app's restart: one in the middle of the replay,
// after replayed records, is counted as the real sidecar counts it; the
// replay goes on from where it was, so the app lacks what it had.
func (s *Sidecar) appRestarted() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode == ModeReplaying && s.replayed > s.replay.Start {
		s.interrupted++
	}
}

// Mode is the sidecar's mode.
func (s *Sidecar) Mode() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mode
}

// close stops the simulation: the pod is gone, or its containers died.
func (s *Sidecar) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode != ModeDead {
		s.mode = ModeDead
		close(s.stopped)
	}
}

// restart brings a dead sidecar back, as the kubelet restarts a sidecar
// container that exited: it knows nothing of a quiesce before, and starts
// as its MS2M_* variables say, serving, or a restored pod's replaying its
// range again; but a stop it recorded in its state folder it keeps: it
// starts stopped, as the real one does. forget plays a sidecar without a
// state folder (a pod injected before MS2M_STATE_DIR): it forgets its stop.
func (s *Sidecar) restart(forget bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode != ModeDead {
		return
	}
	if forget {
		s.recorded = nil
	}
	defer func() {
		if s.recorded != nil {
			s.mode = ModeStopped
		}
	}()
	s.mode, s.handed, s.next, s.stopped = ModeServing, 0, time.Time{}, make(chan struct{})
	if rp := s.replay; rp != nil {
		s.mode, s.replayed, s.switched, s.lastRep, s.interrupted = ModeReplaying, rp.Start, nil, nil, 0
		s.log.mu.Lock()
		s.logEnd, s.logEndEpoch = s.log.lastID, s.log.epoch
		s.log.mu.Unlock()
		s.cutoff = s.extend(rp.Cutoff, rp.Epoch)
		if rp.ToEnd {
			s.cutoff = max(s.logEnd, rp.Start)
		}
	}
	go s.run(s.stopped)
}

// errDead is what a dead sidecar's control API would not answer; the
// simulated pod's server drops the request before it gets here.
var errDead = errors.New("the sidecar is not running")

// State is GET /state, in the real sidecar's shape.
func (s *Sidecar) State() control.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log.mu.Lock()
	logLast, epoch := s.log.lastID, s.log.epoch
	s.log.mu.Unlock()
	var queues []tracking.QueueStats
	for i, a := range s.apps {
		app, q := a.State(), Queue
		if i > 0 {
			q = fmt.Sprintf("%s-%d", Queue, i)
		}
		queues = append(queues, tracking.QueueStats{Queue: q, LastDeliveredID: app.Last, LastAckedID: app.Last, Delivered: app.Count, Acked: app.Count, Lambda: Lambda, Mu: Mu})
	}
	st := control.State{LogName: s.log.name, Ready: true, State: proxy.State{
		Mode:   s.mode,
		Queues: queues,
		Log:    shadowqueue.TeeStatus{LastID: logLast, ConfirmedID: logLast, Epoch: epoch},

		Unreplayable: s.unreplayable,
	}}
	if s.replay != nil {
		rng := replay.Range{Start: s.replay.Start, Cutoff: s.replay.Cutoff, Epoch: s.replay.Epoch}
		st.Source = &replay.Status{Range: rng.String(), Cutoff: s.cutoff, Complete: s.cutoff != 0 && s.replayed >= s.cutoff, LogLast: logLast, Error: s.replayErr}
		lag := logLast - min(logLast, s.replayed)
		st.ReplayLag = &lag
		rs := &proxy.ReplayState{Replayed: s.replayed - s.replay.Start, LastReplayedID: s.replayed, LastReplayedAt: s.lastRep, SwitchedAt: s.switched, Switched: []string{}, Interrupted: s.interrupted}
		if s.switched == nil {
			rs.Replaying = 1
		} else {
			rs.Switched = []string{Queue}
		}
		st.Replay = rs
	}
	return st
}

// ErrReplaying is the answer to a quiesce or stop of a sidecar that has
// not taken over yet.
var ErrReplaying = fmt.Errorf("%w: the sidecar is still replaying", control.ErrConflict)

// Quiesce holds deliveries back and returns the checkpoint ID and epoch.
// As the real one waits for the app's acks to be upstream, it waits for
// the broker while it is away (until ctx ends: the sidecar stays
// quiesced).
func (s *Sidecar) Quiesce(ctx context.Context) (control.Cut, error) {
	s.mu.Lock()
	switch s.mode {
	case ModeReplaying:
		s.mu.Unlock()
		return control.Cut{}, ErrReplaying
	case ModeStopped:
		s.mu.Unlock()
		return control.Cut{}, fmt.Errorf("%w: %w", control.ErrConflict, proxy.ErrStopped)
	case ModeDead:
		s.mu.Unlock()
		return control.Cut{}, errDead
	}
	s.mode = ModeQuiesced
	s.log.mu.Lock()
	cut := control.Cut{ID: max(s.handed, s.appsLast()), Epoch: s.log.epoch}
	s.log.mu.Unlock()
	s.mu.Unlock()
	if err := s.broker.wait(ctx); err != nil {
		return control.Cut{}, fmt.Errorf("quiesce: the acks are not upstream: %w", err)
	}
	return cut, nil
}

// Resume serves again after a quiesce or a stop.
func (s *Sidecar) Resume(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode == ModeReplaying {
		return ErrReplaying
	}
	if s.mode != ModeServing {
		s.mode = ModeServing
		s.next = time.Time{}
	}
	s.recorded = nil
	return nil
}

// Stop ends the sidecar's tenure: it takes no more deliveries and writes
// a cutoff marker at its last one, of a new epoch. While the broker is
// away it waits for it, stopped (until ctx ends; the marker is then
// written once the broker is back), as the real one waits for its marker
// to be durable.
func (s *Sidecar) Stop(ctx context.Context) (control.StopResult, error) {
	s.mu.Lock()
	started := time.Now()
	switch s.mode {
	case ModeReplaying:
		s.mu.Unlock()
		return control.StopResult{}, ErrReplaying
	case ModeStopped:
		s.mu.Unlock()
		return control.StopResult{}, fmt.Errorf("%w: %w", control.ErrConflict, proxy.ErrStopped)
	case ModeDead:
		s.mu.Unlock()
		return control.StopResult{}, errDead
	}
	s.mode = ModeStopped
	cut := max(s.handed, s.appsLast())
	s.mu.Unlock()
	if err := s.broker.wait(ctx); err != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.log.mu.Lock()
		s.log.epoch++
		s.pendingMarker = &Marker{ID: cut, Epoch: s.log.epoch}
		s.log.mu.Unlock()
		return control.StopResult{}, fmt.Errorf("write the cutoff marker (cutoff ID %d) to the replay log: %w", cut, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log.mu.Lock()
	s.log.epoch++
	m := Marker{ID: cut, Epoch: s.log.epoch}
	s.log.markers = append(s.log.markers, m)
	s.log.mu.Unlock()
	res := control.StopResult{StartedAt: started, CutoffID: m.ID, Epoch: m.Epoch, StoppedAt: time.Now()}
	s.recorded = &res
	return res, nil
}

// Ready is always nil: a simulated sidecar's log is open at once.
func (s *Sidecar) Ready() error { return nil }

var _ control.Sidecar = (*Sidecar)(nil)

// archiveAppFile is where a checkpoint archive carries the app's state.
const archiveAppFile = "ms2m-sim/app.json"

func encodeApp(s AppState) ([]byte, error) { return json.Marshal(s) }

func decodeApp(b []byte) (AppState, error) {
	var s AppState
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("the app state in the checkpoint: %w", err)
	}
	if s.Count == 0 && s.Last != 0 {
		return s, errors.New("the app state in the checkpoint is inconsistent")
	}
	return s, nil
}
