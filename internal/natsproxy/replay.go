package natsproxy

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ms2m/ms2m/internal/natswire"
	"github.com/ms2m/ms2m/internal/proxy"
	"github.com/ms2m/ms2m/internal/replay"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/tracking"
)

// ReplaySource serves the records a target replays, per JetStream consumer
// (the key ReplayKey names); a *replay.Source over a KeyedFollower
// implements it.
type ReplaySource interface {
	// Next returns the i-th record (from 0) of key to replay, or done once
	// key has none left up to the cutoff. It blocks until it knows; with
	// a ctx already done it waits for nothing: it returns what it knows
	// already, or the ctx's cause.
	Next(ctx context.Context, key string, i int) (rec shadowqueue.Record, done bool, err error)
	// Cutoff returns the cutoff ID and the epoch of its marker, once known.
	Cutoff() (id, epoch uint64, ok bool)
}

// Lookup answers what a target sidecar must ask the NATS server.
type Lookup interface {
	// PushConsumer returns the JetStream push consumer whose deliver
	// subject is subject; ok is false if none is.
	PushConsumer(ctx context.Context, subject string) (stream, consumer string, ok bool, err error)
	// StreamOf returns the stream that stores messages published on
	// subject; ok is false if none does.
	StreamOf(ctx context.Context, subject string) (stream string, ok bool, err error)
}

// ReplayKey names the records of one JetStream consumer. Stream and
// consumer names hold no '.', so the key is unambiguous.
func ReplayKey(stream, consumer string) string { return stream + "." + consumer }

// KeyedFollower wraps a replay log so that every delivery's Queue is its
// ReplayKey (a NATS record's Queue is its stream and its ConsumerTag its
// consumer): a replay.Source over it sorts the records per consumer.
func KeyedFollower(f replay.Follower) replay.Follower { return keyed{f} }

type keyed struct{ f replay.Follower }

func (k keyed) FollowFrom(ctx context.Context, o shadowqueue.FollowOptions, fn func(int64, shadowqueue.Record) error) (int64, error) {
	return k.f.FollowFrom(ctx, o, func(off int64, r shadowqueue.Record) error {
		if r.Kind == shadowqueue.KindDelivery && r.ConsumerTag != "" {
			r.Queue = ReplayKey(r.Queue, r.ConsumerTag)
		}
		return fn(off, r)
	})
}

// replayAckPrefix starts the reply subject of every replayed delivery: a
// v2 $JS.ACK subject (so that nats.go's Metadata reads it) whose account
// hash token marks it as the sidecar's own. Its last token is the record's
// ID. The app's acks to it are absorbed, never sent to the server.
const replayAckPrefix = natswire.AckPrefix + "_.MS2MREPLAY."

// keyReplay is the replay position of one JetStream consumer, shared by
// every app subscription and pull request for it on any connection.
type keyReplay struct {
	key, stream, consumer string
	// feed is held by whoever hands out this key's records, so that they
	// reach the app in order (a channel, so that a wait for it can end).
	feed chan struct{}

	mu          sync.Mutex
	slots       replay.Slots      // where each record stands
	ids         map[uint64]flight // record ID -> in flight
	switched    bool
	lastAckedID uint64 // highest replayed record ID the app acked
	delivered   uint64
	kick        chan struct{}
}

type flight struct {
	idx int
	c   *conn
	at  time.Time // handed to the app
}

func newKeyReplay(stream, consumer string) *keyReplay {
	return &keyReplay{key: ReplayKey(stream, consumer), stream: stream, consumer: consumer,
		feed: make(chan struct{}, 1), ids: map[uint64]flight{}, kick: make(chan struct{})}
}

// claim returns the lowest pending index and marks it in flight.
func (k *keyReplay) claim() (i int, redelivered bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.slots.Claim()
}

// release puts index i back to pending (unsent: as if never handed out).
func (k *keyReplay) release(i int, unsent bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.slots.Release(i, unsent)
}

// handedOut records that record id (index i) went to the app on c at at.
func (k *keyReplay) handedOut(id uint64, i int, c *conn, at time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ids[id] = flight{idx: i, c: c, at: at}
	k.delivered++
}

// settle applies the app's ack body to record id: +ACK, +TERM and +NXT
// settle it, -NAK puts it back to be replayed again, +WPI changes nothing.
// It reports whether id was in flight, and since when.
func (k *keyReplay) settle(id uint64, body []byte) (time.Time, bool) {
	k.mu.Lock()
	f, ok := k.ids[id]
	if !ok {
		k.mu.Unlock()
		return time.Time{}, false
	}
	switch {
	case bytes.HasPrefix(body, natswire.AckProgress):
		k.mu.Unlock()
		return f.at, true
	case bytes.HasPrefix(body, natswire.AckNak):
		k.slots.Requeue(f.idx)
	default:
		k.slots.Ack(f.idx)
		k.lastAckedID = max(k.lastAckedID, id)
	}
	delete(k.ids, id)
	k.wakeLocked()
	k.mu.Unlock()
	return f.at, true
}

// dropConn puts the records in flight on c back, to be replayed again.
func (k *keyReplay) dropConn(c *conn) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for id, f := range k.ids {
		if f.c == c {
			k.slots.Release(f.idx, false)
			delete(k.ids, id)
		}
	}
	k.wakeLocked()
}

// allAcked reports whether records 0..n-1 are settled.
func (k *keyReplay) allAcked(n int) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.slots.Acked() >= n
}

func (k *keyReplay) inFlightCount() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.ids)
}

func (k *keyReplay) isSwitched() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.switched
}

// wake returns a channel closed at the next settle or drop.
func (k *keyReplay) wake() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.kick
}

func (k *keyReplay) wakeLocked() {
	close(k.kick)
	k.kick = make(chan struct{})
}

// lockFeed takes the key's feed, or fails when ctx ends first.
func (k *keyReplay) lockFeed(ctx context.Context) bool {
	select {
	case k.feed <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (k *keyReplay) unlockFeed() { <-k.feed }

// replayer is a target sidecar's replay: what the proxy needs beyond
// serving.
type replayer struct {
	src    ReplaySource
	lookup Lookup

	// active counts the app's subscriptions and (connection, consumer)
	// pulls served from the log; while any is, the app's publishes are
	// absorbed.
	active       atomic.Int64
	replayed     atomic.Uint64
	teeContinued atomic.Bool

	mu          sync.Mutex
	keys        map[string]*keyReplay
	lastID      uint64
	lastAt      time.Time
	firstSwitch time.Time
	err         string
	interrupted int
	suppressed  map[string]uint64 // absorbed publishes by subject
	streamOf    map[string]string // subject -> stream, for publish acks ("" none)
}

func newReplayer(src ReplaySource, lookup Lookup) *replayer {
	return &replayer{src: src, lookup: lookup, keys: map[string]*keyReplay{}, suppressed: map[string]uint64{}, streamOf: map[string]string{}}
}

func (r *replayer) key(stream, consumer string) *keyReplay {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := r.keys[ReplayKey(stream, consumer)]
	if k == nil {
		k = newKeyReplay(stream, consumer)
		r.keys[k.key] = k
	}
	return k
}

func (r *replayer) failed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == "" {
		r.err = err.Error()
	}
}

// markReplayed counts the records ids as replayed (written to the app)
// at t.
func (r *replayer) markReplayed(ids []uint64, t time.Time) {
	if len(ids) == 0 {
		return
	}
	r.replayed.Add(uint64(len(ids)))
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		r.lastID = max(r.lastID, id)
	}
	r.lastAt = t
}

// teeReady reports whether the tee numbers deliveries after the cutoff:
// it makes it so once the cutoff is known. Until then a target must not
// append anything.
func (p *Proxy) teeReady() bool {
	r := p.rp
	if r.teeContinued.Load() {
		return true
	}
	id, epoch, ok := r.src.Cutoff()
	if !ok {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.teeContinued.Load() {
		return true
	}
	if err := p.tee.Continue(id, epoch); err != nil {
		p.log.Error("cannot continue the replay log after the cutoff", "cutoff_id", id, "err", err)
		if r.err == "" {
			r.err = err.Error()
		}
		return false
	}
	r.teeContinued.Store(true)
	return true
}

// switchKey makes k consumed from the server from now on.
func (p *Proxy) switchKey(k *keyReplay) {
	p.teeReady()
	k.mu.Lock()
	was := k.switched
	k.switched = true
	k.mu.Unlock()
	if was {
		return
	}
	now := time.Now()
	p.rp.mu.Lock()
	if p.rp.firstSwitch.IsZero() {
		p.rp.firstSwitch = now
	}
	p.rp.mu.Unlock()
	for _, c := range p.snapshotConns() {
		c.stopReplaying(k)
	}
	p.log.Info("replay done; consuming from the server", "stream", k.stream, "consumer", k.consumer)
}

// replayRecordErr checks that rec can go to the app as a delivery: its
// fields come from the log, which is tenant data, and go into protocol
// lines. An error fails the replay: a record cannot be skipped without
// breaking exactness.
func replayRecordErr(rec *shadowqueue.Record, k *keyReplay) error {
	bad := func(what string) error {
		return fmt.Errorf("replay log record ID %d: %s; the log holds data no NATS server delivered, so the replay stops here", rec.ID, what)
	}
	if !validSubject(rec.RoutingKey) {
		return bad(fmt.Sprintf("its subject %q is not a NATS subject", rec.RoutingKey))
	}
	ack, ok := natswire.ParseJSAck([]byte(rec.Exchange))
	if !ok || string(ack.Stream) != k.stream || string(ack.Consumer) != k.consumer {
		return bad(fmt.Sprintf("its ack subject %q is not one of consumer %s", rec.Exchange, k.key))
	}
	if h := rec.Properties; len(h) > 0 && (!bytes.HasPrefix(h, []byte("NATS/1.0")) || !bytes.HasSuffix(h, []byte("\r\n\r\n"))) {
		return bad("its header block is not a NATS header block")
	}
	return nil
}

// validSubject reports whether s is a plain NATS subject: not empty, no
// whitespace or control bytes, no wildcard.
func validSubject(s string) bool {
	if s == "" || len(s) > maxName {
		return false
	}
	for i := 0; i < len(s); i++ {
		if b := s[i]; b <= ' ' || b == 0x7f || b == '*' || b == '>' {
			return false
		}
	}
	return true
}

// replayReply is the reply subject of a replayed delivery: the record's
// own metadata in a v2 $JS.ACK subject of the sidecar's.
func replayReply(rec *shadowqueue.Record, redelivered bool) []byte {
	ack, _ := natswire.ParseJSAck([]byte(rec.Exchange)) // checked by replayRecordErr
	delivered := ack.Delivered
	if redelivered {
		delivered++
	}
	b := append([]byte(nil), replayAckPrefix...)
	b = append(b, ack.Stream...)
	b = append(b, '.')
	b = append(b, ack.Consumer...)
	for _, v := range [...]uint64{delivered, ack.StreamSeq, ack.ConsumerSeq, ack.Timestamp, ack.Pending, rec.ID} {
		b = append(b, '.')
		b = strconv.AppendUint(b, v, 10)
	}
	return b
}

// onReplayAck absorbs the app's ack of a replayed delivery, made at now,
// and reports whether it settled one.
func (p *Proxy) onReplayAck(subject, body []byte, now time.Time) bool {
	ack, ok := natswire.ParseJSAck(subject)
	if !ok {
		return false
	}
	i := bytes.LastIndexByte(subject, '.')
	id, err := strconv.ParseUint(string(subject[i+1:]), 10, 64)
	if err != nil {
		return false
	}
	p.rp.mu.Lock()
	k := p.rp.keys[ReplayKey(string(ack.Stream), string(ack.Consumer))]
	p.rp.mu.Unlock()
	if k == nil || bytes.HasPrefix(body, natswire.AckProgress) {
		return false
	}
	at, ok := k.settle(id, body)
	if ok {
		p.settled(k.key, id, at, now, body)
	}
	return ok
}

// absorbing reports whether the app's publishes are absorbed: while it is
// still handed replayed messages, whose results the source published.
func (p *Proxy) absorbing() bool {
	return p.rp != nil && p.rp.active.Load() > 0
}

// replayState fills in a target's part of the proxy's State: each
// replayed consumer's replay, with the rates the tracker measured (in
// queues, which it takes the replayed consumers out of).
func (p *Proxy) replayState(st *proxy.State, queues map[string]tracking.QueueStats) {
	r := p.rp
	rs := &proxy.ReplayState{Replayed: r.replayed.Load(), Switched: []string{}, Suppressed: []proxy.Suppressed{}, Replaying: int(r.active.Load())}
	r.mu.Lock()
	keys := make([]*keyReplay, 0, len(r.keys))
	for _, k := range r.keys {
		keys = append(keys, k)
	}
	rs.LastReplayedID = r.lastID
	if !r.lastAt.IsZero() {
		t := r.lastAt
		rs.LastReplayedAt = &t
	}
	if !r.firstSwitch.IsZero() {
		t := r.firstSwitch
		rs.SwitchedAt = &t
	}
	rs.Error, rs.Interrupted = r.err, r.interrupted
	for subj, n := range r.suppressed {
		rs.Suppressed = append(rs.Suppressed, proxy.Suppressed{RoutingKey: subj, Count: n})
	}
	r.mu.Unlock()
	sort.Slice(keys, func(i, j int) bool { return keys[i].key < keys[j].key })
	sort.Slice(rs.Suppressed, func(i, j int) bool { return rs.Suppressed[i].RoutingKey < rs.Suppressed[j].RoutingKey })
	for _, k := range keys {
		k.mu.Lock()
		t := queues[k.key]
		delete(queues, k.key)
		st.Queues = append(st.Queues, tracking.QueueStats{Queue: k.key, LastAckedID: k.lastAckedID, InFlight: len(k.ids),
			Delivered: k.delivered, Acked: uint64(k.slots.Acked()), Lambda: t.Lambda, Mu: t.Mu})
		if k.switched {
			rs.Switched = append(rs.Switched, k.key)
		}
		k.mu.Unlock()
	}
	st.Replay = rs
}

// maxReplayInFlight bounds the replayed deliveries a push subscription has
// unacked, as a consumer's max_ack_pending would.
const maxReplayInFlight = 1000
