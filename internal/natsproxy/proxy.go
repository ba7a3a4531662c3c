package natsproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ms2m/ms2m/internal/natswire"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/tracking"
)

// Tee is the replay log as the proxy uses it; *shadowqueue.Tee implements it.
type Tee interface {
	Append(shadowqueue.Record) (uint64, shadowqueue.Ticket)
	AppendMarker(shadowqueue.Kind) (id, epoch uint64, tk shadowqueue.Ticket)
	// AppendCutoff writes a stop's cutoff marker naming the app's consumers.
	AppendCutoff(keys []string) (id, epoch uint64, tk shadowqueue.Ticket)
	Status() shadowqueue.TeeStatus
	Durable(shadowqueue.Ticket) bool
	Wait(context.Context, shadowqueue.Ticket) error
	// Continue makes the next delivery ID last+1 in epoch (a target takes
	// the log over at the source's cutoff).
	Continue(last, epoch uint64) error
	// WaitRoom blocks while the log's pending records are at their bound:
	// each connection calls it before it reads from the server again.
	WaitRoom(context.Context) error
}

// Options configure a Proxy.
type Options struct {
	// Upstream is the NATS server's host:port.
	Upstream string
	// ConnectTimeout bounds how long one app connection waits for the
	// server, retrying with back-off, before it is closed. Default 10 s.
	ConnectTimeout time.Duration
	// DrainTimeout bounds how long the app's last messages (acks waiting on
	// the log) are still forwarded after the app closed its side. Default 10 s.
	DrainTimeout time.Duration
	// MaxUnacked bounds the JetStream deliveries the proxy remembers until
	// the app settles them. Beyond it the oldest are forgotten, and an ack
	// for one of them is absorbed (the server redelivers it). Default 1<<20.
	MaxUnacked int
	Logger     *slog.Logger
	// Dial connects to the server. Default net.Dialer.DialContext.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Replay, if set, makes this a target sidecar: the app's JetStream
	// consumers are served from the log up to the cutoff, then from the
	// server. Lookup must be set with it.
	Replay ReplaySource
	Lookup Lookup
	// Recover, if set, lets a stop read back the push deliveries the
	// server made to no one while the stop took the app's subscriptions
	// off it (void.go).
	Recover Recoverer
}

// Stats counts what the proxy did since it started.
type Stats struct {
	Connections  uint64 `json:"connections"`  // app connections accepted
	JSDeliveries uint64 `json:"jsDeliveries"` // JetStream deliveries teed
	// Repeats counts the teed redeliveries of messages whose first
	// delivery the log has, logged as repeats of it.
	Repeats uint64 `json:"repeats,omitempty"`
	// RedeliveriesAbsorbed counts, on a target, the server's redeliveries
	// of messages the replay had given the app, acked by the sidecar.
	RedeliveriesAbsorbed uint64 `json:"redeliveriesAbsorbed,omitempty"`
	// PullSlotsReleased counts, of those, the ones that came for the
	// app's pull requests, which were told with a 408 not to wait for them.
	PullSlotsReleased uint64 `json:"pullSlotsReleased,omitempty"`
	CoreTeed          uint64 `json:"coreTeed"`     // core NATS messages teed best effort
	Acks              uint64 `json:"acks"`         // acks forwarded
	AcksWaited        uint64 `json:"acksWaited"`   // of those, acks that had to wait on the log
	AcksAbsorbed      uint64 `json:"acksAbsorbed"` // acks of deliveries this proxy did not hand out
	INFOStripped      uint64 `json:"infoStripped"` // INFOs whose cluster URLs were removed
	// PullsAbsorbed counts pull requests not sent on while quiesced or stopped.
	PullsAbsorbed uint64 `json:"pullsAbsorbed"`
	// Dropped counts deliveries dropped while stopped, on open connections.
	Dropped int `json:"dropped"`
}

// Proxy serves NATS connections from the app.
type Proxy struct {
	opts Options
	tee  Tee
	log  *slog.Logger

	unacked unackedSet
	// firsts are the first deliveries of the messages logged lately, so
	// that a redelivery is logged as a repeat (Record.Repeats).
	firsts firstDeliveries
	// replayedMsgs are the messages a target's replay gave the app, so
	// that the server's redelivery of one after the switch is absorbed.
	replayedMsgs firstDeliveries
	// tracker measures each consumer's rates (λ from deliveries, μ from
	// acks), by ReplayKey, for ms2m-cutoff's T_cutoff.
	tracker *tracking.Tracker

	mu    sync.Mutex
	conns map[*conn]struct{}
	// The stop in force: its cutoff, epoch and time (guarded by mu).
	cutoffID, stopEpoch uint64
	stopAt              time.Time

	mode   atomic.Int32  // a proxy.Mode
	modeCh chan struct{} // closed and replaced at each mode switch (guarded by mu)
	rp     *replayer     // target sidecars only
	opMu   sync.Mutex    // serialises Quiesce, Resume and Stop

	connections, jsDeliveries, repeats, redeliveriesAbsorbed, coreTeed, acks, acksWaited, acksAbsorbed, infoStripped, pullsAbsorbed, pullSlotsReleased atomic.Uint64
}

// New returns a Proxy that tees into tee.
func New(tee Tee, opts Options) *Proxy {
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = 10 * time.Second
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 10 * time.Second
	}
	if opts.MaxUnacked <= 0 {
		opts.MaxUnacked = 1 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Dial == nil {
		var d net.Dialer
		opts.Dial = d.DialContext
	}
	p := &Proxy{
		opts:    opts,
		tee:     tee,
		log:     opts.Logger,
		conns:   map[*conn]struct{}{},
		unacked: newUnackedSet(opts.MaxUnacked),
		tracker: tracking.NewTracker(5*time.Second, 0.2),
		modeCh:  make(chan struct{}),
	}
	if opts.Replay != nil {
		p.rp = newReplayer(opts.Replay, opts.Lookup)
	}
	return p
}

// settled tells the tracker that the app settled delivery id of key, handed
// to it at at, at now, with the ack body: -NAK hands it back, anything else
// (+ACK, +TERM, +NXT) is the app done with it.
func (p *Proxy) settled(key string, id uint64, at, now time.Time, body []byte) {
	if bytes.HasPrefix(body, natswire.AckNak) {
		p.tracker.Rejected(key, 1)
		return
	}
	p.tracker.Acked(key, id, at, now, 1)
}

// modeWake returns a channel closed at the next mode switch.
func (p *Proxy) modeWake() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.modeCh
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	return Stats{
		Connections:          p.connections.Load(),
		JSDeliveries:         p.jsDeliveries.Load(),
		Repeats:              p.repeats.Load(),
		RedeliveriesAbsorbed: p.redeliveriesAbsorbed.Load(),
		PullSlotsReleased:    p.pullSlotsReleased.Load(),
		CoreTeed:             p.coreTeed.Load(),
		Acks:                 p.acks.Load(),
		AcksWaited:           p.acksWaited.Load(),
		AcksAbsorbed:         p.acksAbsorbed.Load(),
		INFOStripped:         p.infoStripped.Load(),
		PullsAbsorbed:        p.pullsAbsorbed.Load(),
		Dropped:              p.dropped(),
	}
}

func (p *Proxy) dropped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		_, d := c.heldCount()
		n += d
	}
	return n
}

// Serve accepts app connections on ln until ctx is done, then closes ln and
// every open connection.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
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
		p.connections.Add(1)
		wg.Go(func() { p.handle(ctx, nc) })
	}
}

func (p *Proxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.abort()
	}
}

// handle connects one app connection to the server and runs it.
func (p *Proxy) handle(ctx context.Context, app net.Conn) {
	log := p.log.With("app", app.RemoteAddr().String())
	up, err := p.dialUpstream(ctx)
	if err != nil {
		log.Error("cannot reach the NATS server; closing the app's connection so that it retries", "upstream", p.opts.Upstream, "err", err)
		_ = app.Close() // nothing was sent on it
		return
	}
	c := newConn(p, app, up, log)
	p.mu.Lock()
	c.mode = p.Mode()
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	c.run(ctx)
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	p.unacked.connEnded(c.origin)
}

func (p *Proxy) dialUpstream(ctx context.Context) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.ConnectTimeout)
	defer cancel()
	delay := 50 * time.Millisecond
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, 2*time.Second)
		nc, err := p.opts.Dial(attempt, "tcp", p.opts.Upstream)
		cancelAttempt()
		if err == nil {
			return nc, nil
		}
		p.log.Warn("NATS server connection failed; retrying", "upstream", p.opts.Upstream, "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to NATS server %s within %s: %w", p.opts.Upstream, p.opts.ConnectTimeout, err)
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// unackedSet remembers the JetStream deliveries handed to the app and not
// yet settled, by ack subject, with the ticket of their log record. It is
// shared by all connections: an ack is a publish to the delivery's ack
// subject, which the app may make on any connection, also after the one
// the delivery came on has ended. nats.go, nats-py and nats.js reconnect
// and send the publishes they buffered meanwhile, acks among them, on the
// new connection; an app that held a message across a cut acks it there.
// Beyond max entries the oldest are forgotten.
//
// A quiesce or stop waits only for the deliveries whose connection is
// still open (awaited): those of a connection that ended stay known, so
// that a later ack of one is honoured as any other, but nothing waits for
// them, since the app that held them may have died with the connection.
//
// A redelivery of a message replaces its earlier delivery: the server
// gave that one up (its ack wait passed, as when the app that held it
// died), and an ack of it would never come, so a quiesce or stop would
// wait for it in vain.
type unackedSet struct {
	mu      sync.Mutex
	max     int
	m       map[string]delivery
	byMsg   map[messageKey]string // the ack subject of each message's latest delivery in m
	order   []string              // insertion order, for forgetting the oldest; may hold settled subjects
	head    int
	waiting int // the deliveries in m whose connection is open
}

// delivery is a JetStream delivery the app has not settled: its log
// record's ticket and ID, its consumer (ReplayKey) and when it went to the
// app, for the rates.
type delivery struct {
	tk   shadowqueue.Ticket
	id   uint64
	key  string
	at   time.Time
	msg  messageKey
	from *connOrigin // the connection it came on; nil: none awaits it
}

// connOrigin is what an unackedSet knows of one connection: how many of
// the deliveries it holds came on it, while it is open, and whether it has
// ended (guarded by the set's mu). It is not the conn itself, so that the
// deliveries of an ended connection do not keep its buffers alive.
type connOrigin struct {
	open  int
	ended bool
}

func newUnackedSet(maxEntries int) unackedSet {
	return unackedSet{max: maxEntries, m: map[string]delivery{}, byMsg: map[messageKey]string{}}
}

func (s *unackedSet) add(subject string, d delivery) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.remove(subject)
	if old, ok := s.byMsg[d.msg]; ok {
		s.remove(old)
	}
	s.m[subject] = d
	s.byMsg[d.msg] = subject
	if d.from != nil && !d.from.ended {
		d.from.open++
		s.waiting++
	}
	s.order = append(s.order, subject)
	for len(s.m) > s.max && s.head < len(s.order) {
		s.remove(s.order[s.head])
		s.order[s.head] = ""
		s.head++
	}
	// order keeps settled subjects until it is rebuilt: rebuild it from
	// the live ones once it is more than twice their number, so that it
	// stays within a constant factor of the deliveries in flight.
	if live := len(s.m); len(s.order)-s.head > 2*live+1024 {
		kept := make([]string, 0, 2*live+1024)
		for _, subj := range s.order[s.head:] {
			if _, ok := s.m[subj]; ok {
				kept = append(kept, subj)
			}
		}
		s.order, s.head = kept, 0
	}
}

// lookup returns the delivery whose ack subject is subject, whether its
// connection is open or not; settle removes it as well (a final ack:
// +ACK, -NAK, +TERM, +NXT).
func (s *unackedSet) lookup(subject []byte, settle bool) (delivery, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.m[string(subject)]
	if ok && settle {
		// remove's work, inline: string(subject) as a map key does not
		// allocate, as an argument it would.
		delete(s.m, string(subject))
		if s.byMsg[d.msg] == string(subject) {
			delete(s.byMsg, d.msg)
		}
		s.unwait(d)
	}
	return d, ok
}

// connEnded stops awaiting the deliveries that came on the connection o
// stands for, which has ended: a quiesce or stop no longer waits for
// them, while an ack of one that comes on another connection is still
// honoured. Those the app never acks go when the server redelivers them
// (add) or as the oldest beyond max.
func (s *unackedSet) connEnded(o *connOrigin) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting -= o.open
	o.open, o.ended = 0, true
}

// remove forgets the delivery whose ack subject is subject, if there is
// one; s.mu is held.
func (s *unackedSet) remove(subject string) {
	d, ok := s.m[subject]
	if !ok {
		return
	}
	delete(s.m, subject)
	if s.byMsg[d.msg] == subject {
		delete(s.byMsg, d.msg)
	}
	s.unwait(d)
}

// unwait stops awaiting d, which has left the set; s.mu is held.
func (s *unackedSet) unwait(d delivery) {
	if d.from != nil && !d.from.ended {
		d.from.open--
		s.waiting--
	}
}

// awaited returns how many deliveries a quiesce or stop waits for: those
// not settled whose connection is open.
func (s *unackedSet) awaited() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting
}

// len returns how many deliveries the set remembers, awaited or not.
func (s *unackedSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
