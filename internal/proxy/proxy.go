package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/tracking"
	"github.com/ms2m/ms2m/internal/upstream"
)

// Tee is the replay log as the proxy uses it; *shadowqueue.Tee implements it.
type Tee interface {
	Append(shadowqueue.Record) (uint64, shadowqueue.Ticket)
	AppendMarker(shadowqueue.Kind) (id, epoch uint64, tk shadowqueue.Ticket)
	// AppendCutoff writes a stop's cutoff marker naming the app's queues.
	AppendCutoff(queues []string) (id, epoch uint64, tk shadowqueue.Ticket)
	Durable(shadowqueue.Ticket) bool
	Wait(context.Context, shadowqueue.Ticket) error
	Status() shadowqueue.TeeStatus
	// Continue makes the next delivery ID last+1, before any Append.
	Continue(last, epoch uint64) error
	// AppendPublish records an app publish for publish checking.
	AppendPublish(forID uint64, exchange, routingKey string, digest []byte) shadowqueue.Ticket
	// WaitRoom blocks while the log's pending records are at their bound:
	// each connection calls it before it reads from the broker again.
	WaitRoom(context.Context) error
}

// Mode is what the proxy does with new deliveries.
type Mode int32

const (
	// Serving hands deliveries to the app.
	Serving Mode = iota
	// Quiesced holds new deliveries back; Resume hands them over.
	Quiesced
	// Stopped has cancelled the app's consumers upstream and released what
	// was held; Resume consumes again.
	Stopped
)

func (m Mode) String() string {
	switch m {
	case Serving:
		return "serving"
	case Quiesced:
		return "quiesced"
	case Stopped:
		return "stopped"
	}
	return fmt.Sprintf("Mode(%d)", int32(m))
}

// ErrStopped is returned by Quiesce on a stopped proxy.
var ErrStopped = errors.New("the sidecar is stopped")

// Options configure a Proxy.
type Options struct {
	// Upstream connects to the broker (its addresses in order, TLS) and
	// rewrites the app's handshake where the sidecar owns the
	// credentials. Required.
	Upstream *upstream.Dialer
	// ConnectTimeout bounds how long one app connection waits for the
	// broker, retrying with back-off, before it is closed. Default 10 s.
	ConnectTimeout time.Duration
	// DrainTimeout bounds how long the app's last frames (acks waiting on the
	// log) are still forwarded after the app closed its side. Default 10 s.
	DrainTimeout time.Duration
	// LossDrain bounds how long, once the broker's connection is gone, the
	// app's connection stays open for the app to settle the deliveries it
	// holds (conn.drainApp). Default 5 s.
	LossDrain time.Duration
	// InitialFrameMax is the frame size limit before connection.tune-ok
	// negotiates one. Default 131072, RabbitMQ's default frame-max.
	InitialFrameMax uint32
	Logger          *slog.Logger
	Metrics         *Metrics
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Replay, if set, makes this a target sidecar: the app's consumes are
	// served from the log first, and switched to the broker after the
	// cutoff.
	Replay ReplaySource
	// CheckPublishes turns publish checking on (see pubcheck.go): a serving
	// sidecar records the app's publishes in the log, and a target compares
	// the publishes it absorbs during replay against them.
	CheckPublishes bool
	// RequeueHeldOnStop makes Stop give the deliveries it held since the
	// quiesce back to the broker instead of to the app. The stop is then
	// shorter by their processing time, but the next consumer may get later
	// messages before those (RabbitMQ can act on its basic.consume before
	// the source's reject), so an app that drops what it takes for an old
	// redelivery loses them. Default false: the app takes them, in order.
	RequeueHeldOnStop bool
	// Recent are the replay log's last records (at most MaxRequeued), in
	// log order, when this sidecar continues a log that a sidecar before it
	// wrote: their deliveries may be held by an app that died with that
	// sidecar, and the broker's redelivery of one is logged as repeating
	// it (requeuedMessages.seed). New keeps no reference to them.
	Recent []shadowqueue.Record
}

// Proxy serves AMQP connections from the app.
type Proxy struct {
	opts    Options
	tee     Tee
	tracker *tracking.Tracker
	log     *slog.Logger

	mu     sync.Mutex
	mode   Mode
	conns  map[*conn]struct{}
	nextID uint64
	// stopEpoch is the epoch of the cutoff marker of the current stop.
	stopEpoch uint64
	stopAt    time.Time
	cutoffID  uint64
	// opMu serialises Quiesce, Resume and Stop.
	opMu sync.Mutex

	accepted atomic.Uint64

	// Replay (target sidecars only).
	replayQueues   map[string]*queueReplay // guarded by mu
	teeOnce        sync.Once
	replayed       atomic.Uint64 // replayed deliveries handed to the app
	lastReplayedID uint64        // guarded by mu
	lastReplayedAt time.Time     // guarded by mu
	firstSwitch    time.Time     // guarded by mu
	firstPrimary   time.Time     // guarded by mu
	replayErr      string        // guarded by mu
	interrupted    int           // guarded by mu; see ReplayState.Interrupted
	// replayActive counts the app's consumers still served from the log and
	// replayed basic.get deliveries it has not settled: while it is above
	// zero, the app's publishes are absorbed.
	replayActive atomic.Int64
	suppressedBy map[[2]string]uint64 // by exchange and routing key; guarded by mu

	// declared maps the queues the app declared that cannot be replayed to
	// why; unreplayable holds those of them, and server-named ones, that
	// the app consumes (queues.go). Guarded by mu.
	declared     map[string]string
	unreplayable map[string]*unreplayable

	// requeued are the delivery IDs the app was handed and never settled
	// when its channel or connection ended (or it asked basic.recover):
	// the broker took them back and delivers them again under new IDs.
	// The oldest go beyond maxRequeued; requeuedEvicted is the highest
	// of those. Guarded by requeuedMu alone (taken under conn.mu).
	requeuedMu      sync.Mutex
	requeued        []uint64
	requeuedEvicted uint64
	// requeuedMsgs are the same deliveries' messages, so that their
	// redeliveries are logged as repeats (Record.Repeats).
	requeuedMsgs requeuedMessages
	// ackedLost are the messages the app acked whose acks may not have
	// reached the broker before its connection went: their redeliveries
	// are absorbed.
	ackedLost ackedMessages

	// Publish checking.
	lastAcked    atomic.Uint64 // the last delivery ID the app acked
	teeContinued atomic.Bool   // a target has taken the log over
	pubs         pubCheck      // guarded by mu
}

// New returns a Proxy that tees into tee.
func New(tee Tee, opts Options) *Proxy {
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = 10 * time.Second
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 10 * time.Second
	}
	if opts.LossDrain <= 0 {
		opts.LossDrain = 5 * time.Second
	}
	if opts.InitialFrameMax == 0 {
		opts.InitialFrameMax = 131072
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	p := &Proxy{
		tee:     tee,
		tracker: tracking.NewTracker(5*time.Second, 0.2),
		log:     opts.Logger,
		conns:   map[*conn]struct{}{},
	}
	if n := p.requeuedMsgs.seed(opts.Recent); n > 0 {
		p.log.Info("remembering the log's last deliveries, which an app that died with the sidecar before may have held: a redelivery of one is logged as repeating it",
			"deliveries", n, "from_id", opts.Recent[0].ID, "to_id", opts.Recent[len(opts.Recent)-1].ID)
	}
	opts.Recent = nil
	p.opts = opts
	return p
}

// Serve accepts app connections on ln until ctx is done, then closes ln and
// every open connection.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				p.closeAll()
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			p.closeAll()
			return fmt.Errorf("accept app connections on %s: %w", ln.Addr(), err)
		}
		p.accepted.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.handle(ctx, nc)
		}()
	}
}

func (p *Proxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.abort()
	}
}

// handle connects one app connection to the broker and runs it.
func (p *Proxy) handle(ctx context.Context, app net.Conn) {
	log := p.log.With("app", app.RemoteAddr().String())
	up, addr, err := p.dialUpstream(ctx)
	if err != nil {
		log.Error("cannot reach the broker; closing the app's connection so that it retries", "upstream", p.opts.Upstream.String(), "err", err)
		p.opts.Metrics.upstreamDialFailures.Inc()
		app.Close()
		return
	}
	c := p.newConn(app, up, log.With("broker", addr))
	p.opts.Metrics.connections.Inc()
	defer p.opts.Metrics.connections.Dec()
	c.run(ctx)
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// dialUpstream connects to the first broker that answers, going round the
// list with back-off until one does or ConnectTimeout passes.
func (p *Proxy) dialUpstream(ctx context.Context) (net.Conn, string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.ConnectTimeout)
	defer cancel()
	delay := 50 * time.Millisecond
	for {
		nc, addr, err := p.opts.Upstream.Dial(ctx)
		if err == nil {
			return nc, addr, nil
		}
		p.log.Warn("broker connection failed; retrying", "upstream", p.opts.Upstream.String(), "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return nil, "", fmt.Errorf("connect to broker %s within %s: %w", p.opts.Upstream.String(), p.opts.ConnectTimeout, err)
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

func (p *Proxy) newConn(app, up net.Conn, log *slog.Logger) *conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nextID++
	c := newConn(p, p.nextID, app, up, log.With("conn", p.nextID))
	c.handshake = p.opts.Upstream.NewHandshake()
	c.mode = p.mode
	p.conns[c] = struct{}{}
	return c
}

func (p *Proxy) snapshotConns() []*conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		out = append(out, c)
	}
	return out
}

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

func (p *Proxy) setMode(m Mode) {
	p.mu.Lock()
	p.mode = m
	p.mu.Unlock()
	p.opts.Metrics.mode.Set(float64(m))
}

// Quiesce holds new deliveries back from the app and waits until the app
// has settled every delivery it has and those acks are upstream. It returns
// the checkpoint ID, the last delivery the app was given, and the log's
// epoch (that of its last marker), which a replay of this checkpoint
// passes on so that older cutoff markers are not taken for its own. ctx bounds the
// wait; on error the proxy stays quiesced and Resume undoes it.
func (p *Proxy) Quiesce(ctx context.Context) (id, epoch uint64, err error) {
	p.opMu.Lock()
	defer p.opMu.Unlock()
	if p.Mode() == Stopped {
		return 0, 0, fmt.Errorf("quiesce: %w; resume it first", ErrStopped)
	}
	p.setMode(Quiesced)
	for _, c := range p.snapshotConns() {
		c.setMode(Quiesced)
	}
	if err := p.waitSettled(ctx); err != nil {
		return 0, 0, err
	}
	st := p.tee.Status()
	p.log.Info("quiesced", "checkpoint_id", st.LastID, "epoch", st.Epoch)
	return st.LastID, st.Epoch, nil
}

// waitSettled waits until no delivery is in flight in any connection and the
// app's acks have been written upstream.
func (p *Proxy) waitSettled(ctx context.Context) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		inFlight, queued := 0, 0
		for _, c := range p.snapshotConns() {
			i, q := c.unsettled()
			inFlight += i
			queued += q
		}
		if inFlight == 0 && queued == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the app to ack its %d deliveries in flight (%d frames queued for the broker): %w", inFlight, queued, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// waitCancelled waits until the broker confirmed every consume the app sent
// before the stop and every cancel the stop sent: after that, no more
// deliveries come.
func (p *Proxy) waitCancelled(ctx context.Context, conns []*conn) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		pending := false
		for _, c := range conns {
			pending = pending || c.cancelsPending()
		}
		if !pending {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the broker to confirm the app's consumes and the stop's cancels: %w", context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// StopResult is what Stop reports.
type StopResult struct {
	// StartedAt is when the stop began cancelling the app's consumers: from
	// then on this instance accepts no primary-queue deliveries.
	StartedAt time.Time `json:"startedAt"`
	CutoffID  uint64    `json:"cutoffId"`
	Epoch     uint64    `json:"epoch"`
	// Held counts the deliveries held back (since a quiesce, or that came
	// while the stop waited for the broker) that the stop gave the app; they
	// are at or before the cutoff. Requeued counts those it gave back to the
	// broker instead (RequeueHeldOnStop).
	Held      int       `json:"held"`
	Requeued  int       `json:"requeued"`
	StoppedAt time.Time `json:"stoppedAt"`
	// Recovered counts, for NATS push consumers, the deliveries the server
	// made during the stop to a subject no one listened on any more, which
	// the stop read back from the stream and logged before the cutoff: the
	// target replays them in order, and the app of this sidecar never had
	// them.
	Recovered int `json:"recovered,omitempty"`
}

// Stop ends this sidecar's tenure of the app's queues: it cancels the app's
// consumers upstream and waits for the broker to confirm, so that no more
// deliveries come. The deliveries held back since a quiesce, or that came
// meanwhile, are the broker's next ones in order: it gives them to the app (or, with
// RequeueHeldOnStop, back to the broker). It waits until the app has settled
// all it has and writes a cutoff marker with the last delivery ID to the
// log, returning once the marker is durable. The app keeps its connection;
// Resume consumes again.
func (p *Proxy) Stop(ctx context.Context) (StopResult, error) {
	p.opMu.Lock()
	defer p.opMu.Unlock()
	if p.Mode() == Stopped {
		return StopResult{CutoffID: p.cutoffID, Epoch: p.stopEpoch, StoppedAt: p.stopAt}, nil
	}
	started := p.opts.Now()
	p.setMode(Stopped)
	conns := p.snapshotConns()
	for _, c := range conns {
		c.setMode(Stopped)
		c.cancelConsumers()
	}
	if err := p.waitSettled(ctx); err != nil {
		return StopResult{}, err
	}
	if err := p.waitCancelled(ctx, conns); err != nil {
		return StopResult{}, err
	}
	held, requeued := 0, 0
	for _, c := range conns {
		h, r := c.releaseHeld(p.opts.RequeueHeldOnStop)
		held, requeued = held+h, requeued+r
	}
	if err := p.waitSettled(ctx); err != nil {
		return StopResult{}, err
	}
	queues := map[string]bool{}
	for _, c := range conns {
		c.appQueues(queues)
	}
	id, epoch, tk := p.tee.AppendCutoff(slices.Collect(maps.Keys(queues)))
	if err := p.tee.Wait(ctx, tk); err != nil {
		return StopResult{}, fmt.Errorf("write the cutoff marker (cutoff ID %d) to the replay log: %w", id, err)
	}
	now := p.opts.Now()
	p.mu.Lock()
	p.cutoffID, p.stopEpoch, p.stopAt = id, epoch, now
	p.mu.Unlock()
	p.log.Info("stopped", "cutoff_id", id, "epoch", epoch, "held", held, "requeued", requeued)
	return StopResult{StartedAt: started, CutoffID: id, Epoch: epoch, Held: held, Requeued: requeued, StoppedAt: now}, nil
}

// StartStopped makes a proxy that serves no app yet stopped at r, a stop
// that a previous run of the sidecar made and recorded: the app's
// consumers are answered and kept for Resume, as after Stop, and /state
// and Stop report r's cutoff. Call it before Serve.
func (p *Proxy) StartStopped(r StopResult) {
	p.opMu.Lock()
	defer p.opMu.Unlock()
	p.setMode(Stopped)
	p.mu.Lock()
	p.cutoffID, p.stopEpoch, p.stopAt = r.CutoffID, r.Epoch, r.StoppedAt
	p.mu.Unlock()
}

// Resume hands deliveries to the app again. After a Stop it consumes again
// with the app's consumers and writes a resume marker that voids the cutoff.
func (p *Proxy) Resume(ctx context.Context) error {
	p.opMu.Lock()
	defer p.opMu.Unlock()
	was := p.Mode()
	if was == Serving {
		return nil
	}
	if was == Stopped {
		_, _, tk := p.tee.AppendMarker(shadowqueue.KindResume)
		if err := p.tee.Wait(ctx, tk); err != nil {
			return fmt.Errorf("write the resume marker to the replay log: %w", err)
		}
	}
	p.setMode(Serving)
	for _, c := range p.snapshotConns() {
		c.resume(was == Stopped)
	}
	p.log.Info("resumed", "from", was.String())
	return nil
}

// State is a snapshot of the proxy.
type State struct {
	Mode        string                `json:"mode"`
	Connections int                   `json:"connections"`
	Held        int                   `json:"held"`
	Queues      []tracking.QueueStats `json:"queues"`
	Log         shadowqueue.TeeStatus `json:"log"`
	Degraded    bool                  `json:"degraded"`
	CutoffID    uint64                `json:"cutoffId,omitempty"`
	Epoch       uint64                `json:"epoch,omitempty"`
	Replay      *ReplayState          `json:"replay,omitempty"`
	// Unreplayable lists the queues the app consumes that a migration
	// cannot carry over (exclusive, auto-delete, server-named): a
	// migrator refuses to checkpoint such an app.
	Unreplayable []UnreplayableQueue `json:"unreplayable,omitempty"`
	// Requeued are the delivery IDs, ascending, that the app was handed
	// and never settled when its channel or connection ended: the broker
	// requeued them, and they are in the log a second time under the IDs
	// of their redeliveries. A replay for an app that lost its state with
	// them (it restarted from a checkpoint) skips them (MS2M_REPLAY_SKIP).
	// The list keeps the last MaxRequeued; RequeuedEvictedThrough is the
	// highest ID dropped from it, so below it the list is not complete.
	Requeued               []uint64 `json:"requeued,omitempty"`
	RequeuedEvictedThrough uint64   `json:"requeuedEvictedThrough,omitempty"`
}

// MaxRequeued bounds State.Requeued.
const MaxRequeued = 4096

// noteRequeued records ids, which the broker took back (State.Requeued).
func (p *Proxy) noteRequeued(ids []uint64) {
	if len(ids) == 0 {
		return
	}
	p.requeuedMu.Lock()
	defer p.requeuedMu.Unlock()
	p.requeued = append(p.requeued, ids...)
	slices.Sort(p.requeued)
	if n := len(p.requeued) - MaxRequeued; n > 0 {
		p.requeuedEvicted = max(p.requeuedEvicted, p.requeued[n-1])
		p.requeued = append(p.requeued[:0], p.requeued[n:]...)
	}
}

// ReplayState is a target sidecar's replay progress.
type ReplayState struct {
	Replayed       uint64     `json:"replayed"`                 // replayed deliveries handed to the app
	LastReplayedID uint64     `json:"lastReplayedId"`           // highest ID replayed to the app
	LastReplayedAt *time.Time `json:"lastReplayedAt,omitempty"` // when the last replayed delivery went to the app
	Replaying      int        `json:"replaying"`                // app consumers still served from the log
	Switched       []string   `json:"switched"`                 // queues consumed from the broker now
	SwitchedAt     *time.Time `json:"switchedAt,omitempty"`     // when the broker confirmed the first switch
	FirstPrimaryAt *time.Time `json:"firstPrimaryAt,omitempty"` // first primary-queue delivery after replay
	Error          string     `json:"error,omitempty"`          // why a replay stopped, if one did
	// Interrupted counts the app's channels that went away in the middle
	// of the replay (a consumer of theirs still served from the log) after
	// the app had settled replayed deliveries on them. A consumer that
	// comes back goes on after those; an app that kept its state has them,
	// but one that was restarted does not: in a restored pod the kubelet
	// restores a restarted app from the checkpoint again. So the migrator
	// gives up a target whose replay was interrupted.
	Interrupted int `json:"interrupted"`
	// Suppressed counts the app's publishes absorbed during replay, by
	// exchange and routing key: the source already made them.
	Suppressed []Suppressed `json:"suppressed"`
	// PublishCheck compares the absorbed publishes against the source's,
	// when publish checking is on.
	PublishCheck *PublishCheck `json:"publishCheck,omitempty"`
}

// Suppressed is a count of absorbed publishes.
type Suppressed struct {
	Exchange   string `json:"exchange"`
	RoutingKey string `json:"routingKey"`
	Count      uint64 `json:"count"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// State returns a snapshot.
func (p *Proxy) State() State {
	conns := p.snapshotConns()
	held := 0
	for _, c := range conns {
		held += c.heldCount()
	}
	ts := p.tee.Status()
	p.mu.Lock()
	mode, cutoff, epoch := p.mode, p.cutoffID, p.stopEpoch
	unreplayable := p.unreplayableLocked()
	p.mu.Unlock()
	st := State{
		Mode:        mode.String(),
		Connections: len(conns),
		Held:        held,
		Queues:      p.tracker.Snapshot(p.opts.Now()),
		Log:         ts,
		Degraded:    ts.Degraded,
	}
	if len(unreplayable) > 0 {
		st.Unreplayable = unreplayable
	}
	p.requeuedMu.Lock()
	st.Requeued, st.RequeuedEvictedThrough = slices.Clone(p.requeued), p.requeuedEvicted
	p.requeuedMu.Unlock()
	if mode == Stopped {
		st.CutoffID, st.Epoch = cutoff, epoch
	}
	if p.opts.Replay != nil {
		rs := &ReplayState{Replayed: p.replayed.Load(), Switched: []string{}}
		for _, c := range conns {
			rs.Replaying += c.replayingCount()
		}
		p.mu.Lock()
		for q, qr := range p.replayQueues {
			if qr.isSwitched() {
				rs.Switched = append(rs.Switched, q)
			}
		}
		rs.LastReplayedID = p.lastReplayedID
		rs.LastReplayedAt = timePtr(p.lastReplayedAt)
		rs.SwitchedAt = timePtr(p.firstSwitch)
		rs.FirstPrimaryAt = timePtr(p.firstPrimary)
		rs.Error = p.replayErr
		rs.Interrupted = p.interrupted
		rs.PublishCheck = p.publishCheckLocked()
		rs.Suppressed = []Suppressed{}
		for k, n := range p.suppressedBy {
			rs.Suppressed = append(rs.Suppressed, Suppressed{Exchange: k[0], RoutingKey: k[1], Count: n})
		}
		p.mu.Unlock()
		sort.Slice(rs.Suppressed, func(i, j int) bool {
			a, b := rs.Suppressed[i], rs.Suppressed[j]
			return a.Exchange < b.Exchange || (a.Exchange == b.Exchange && a.RoutingKey < b.RoutingKey)
		})
		sort.Strings(rs.Switched)
		st.Replay = rs
	}
	return st
}
