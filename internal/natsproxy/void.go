package natsproxy

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// A stop takes the app's push subscriptions off the server (UNSUB) and
// waits for the PONG of a PING sent after them, so that every delivery the
// server routed to this sidecar arrives first. But nats-server learns
// that a deliver subject lost its interest asynchronously: a push
// delivery it makes in that window goes to a subject no one listens on,
// stays pending, and would reach the next consumer only after the ack
// wait, behind the messages delivered since (right count, wrong order).
// So after the PONG the stop asks the server, on the sidecar's own
// connection, how far each push consumer has delivered, reads any message
// beyond what this sidecar saw back from the stream, and logs it before
// the cutoff marker: the target replays it in order, and absorbs the
// server's redelivery of it after the switch, as for any replayed
// message. Only a consumer with one subscriber is read back: a push
// subscription of this app without a queue group, and the server saying
// after the UNSUB that the consumer has no subscriber left.

// Recoverer reads what a stop needs from the server.
type Recoverer interface {
	// Delivered says how far consumer of stream has delivered.
	Delivered(ctx context.Context, stream, consumer string) (ConsumerDelivered, error)
	// Message returns the message stream stores at seq; ok is false if it
	// has none there (deleted, or never stored).
	Message(ctx context.Context, stream string, seq uint64) (m StoredMsg, ok bool, err error)
	// PushConsumers maps the deliver subject of every push consumer the
	// server has to its ReplayKey.
	PushConsumers(ctx context.Context) (map[string]string, error)
}

// ConsumerDelivered is a consumer's delivered position.
type ConsumerDelivered struct {
	StreamSeq uint64   // the last stream sequence it delivered
	Filters   []string // its filter subjects (none: every subject)
	Bound     bool     // a push consumer with a subscriber on its deliver subject
}

// StoredMsg is a message as the stream stores it.
type StoredMsg struct {
	Subject string
	Header  []byte // the NATS/1.0 header block, or nil
	Body    []byte
	Time    time.Time
}

// seenConsumer is the last delivery of one JetStream consumer a
// connection handed the app.
type seenConsumer struct {
	stream, consumer string
	streamSeq        uint64
	sid              string
}

// maxRecover bounds the messages a stop reads back for one consumer: more
// is not a window's deliveries, and the stop fails instead (the migrator
// resumes the source).
const maxRecover = 10000

// voidSettle is how long the stop waits between two reads of a consumer's
// delivered sequence: equal twice, the server has stopped delivering.
const voidSettle = 15 * time.Millisecond

// noteSeen records a JetStream delivery on the app's subscription sid.
// The caller holds c.mu.
func (c *conn) noteSeen(n *deliveryNames, seq uint64, sid []byte) {
	e := c.seen[n.key]
	if e == nil {
		if len(c.seen) >= maxSubs {
			return
		}
		e = &seenConsumer{stream: n.stream, consumer: n.consumer}
		c.seen[n.key] = e
	}
	if seq > e.streamSeq {
		e.streamSeq = seq
	}
	if string(sid) != e.sid {
		e.sid = string(sid)
	}
}

// pushSeen returns the consumers this connection's app got deliveries of
// on a push subscription without a queue group, by ReplayKey.
func (c *conn) pushSeen() map[string]seenConsumer {
	c.mu.Lock()
	seen := make([]seenConsumer, 0, len(c.seen))
	for _, e := range c.seen {
		seen = append(seen, *e)
	}
	c.mu.Unlock()
	c.subMu.Lock()
	defer c.subMu.Unlock()
	out := map[string]seenConsumer{}
	for _, e := range seen {
		if s, ok := c.subs[e.sid]; ok && !s.pull && s.queue == "" {
			out[ReplayKey(e.stream, e.consumer)] = e
		}
	}
	return out
}

// recoverVoid logs, before the cutoff, the push deliveries the server
// made to no one during the stop, and returns how many. The caller holds
// opMu, with the proxy stopped and the app settled.
func (p *Proxy) recoverVoid(ctx context.Context) (int, error) {
	if p.opts.Recover == nil {
		return 0, nil
	}
	var (
		cands = map[string]seenConsumer{}
		conns = map[string]int{}
	)
	for _, c := range p.snapshotConns() {
		for k, e := range c.pushSeen() {
			conns[k]++
			if e.streamSeq > cands[k].streamSeq {
				cands[k] = e
			}
		}
	}
	total := 0
	for k, e := range cands {
		if conns[k] > 1 {
			continue // two subscribers: what went past one may be the other's
		}
		d, err := p.settledDelivered(ctx, e)
		if err != nil {
			return total, err
		}
		if d.StreamSeq <= e.streamSeq {
			continue
		}
		if d.Bound {
			p.log.Warn("a push consumer delivered past what this sidecar saw, but the server says another subscriber listens on its deliver subject: not read back; the target may get those messages late, after the ack wait",
				"stream", e.stream, "consumer", e.consumer, "seen", e.streamSeq, "delivered", d.StreamSeq)
			continue
		}
		if d.StreamSeq-e.streamSeq > maxRecover {
			return total, fmt.Errorf("consumer %s of stream %s delivered up to %d, %d past the last delivery this sidecar saw (%d): more than a stop's window", e.consumer, e.stream, d.StreamSeq, d.StreamSeq-e.streamSeq, e.streamSeq)
		}
		n, err := p.readBack(ctx, e, d)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// settledDelivered reads e's consumer's delivered position until two reads
// voidSettle apart agree: the server no longer delivers.
func (p *Proxy) settledDelivered(ctx context.Context, e seenConsumer) (ConsumerDelivered, error) {
	var last ConsumerDelivered
	for i := range 40 {
		if i > 0 {
			select {
			case <-ctx.Done():
				return last, context.Cause(ctx)
			case <-time.After(voidSettle):
			}
		}
		d, err := p.opts.Recover.Delivered(ctx, e.stream, e.consumer)
		if err != nil {
			return last, fmt.Errorf("read consumer %s of stream %s: %w", e.consumer, e.stream, err)
		}
		if i > 0 && d.StreamSeq == last.StreamSeq && !d.Bound {
			return d, nil
		}
		last = d
	}
	return last, nil // still moving, or bound: recoverVoid says so
}

// readBack logs the messages of e's consumer after e up to d, as
// deliveries, and waits until they are durable.
func (p *Proxy) readBack(ctx context.Context, e seenConsumer, d ConsumerDelivered) (int, error) {
	n := 0
	var last shadowqueue.Ticket
	for seq := e.streamSeq + 1; seq <= d.StreamSeq; seq++ {
		m, ok, err := p.opts.Recover.Message(ctx, e.stream, seq)
		if err != nil {
			return n, fmt.Errorf("read message %d of stream %s: %w", seq, e.stream, err)
		}
		if !ok || !matchesAny(d.Filters, m.Subject) {
			continue
		}
		reply := voidReply(e.stream, e.consumer, seq, m.Time)
		if len(m.Subject) > maxName || len(reply) > maxName {
			return n, fmt.Errorf("message %d of stream %s: its subject or ack subject is longer than the replay log's 255 bytes", seq, e.stream)
		}
		id, tk := p.tee.Append(shadowqueue.Record{
			Queue: e.stream, ConsumerTag: e.consumer, RoutingKey: m.Subject, Exchange: reply,
			Properties: m.Header, Body: m.Body, Time: time.Now(),
		})
		p.firsts.note(keyOf([]byte(e.stream), []byte(e.consumer), seq), id)
		last = tk
		n++
	}
	if n == 0 {
		return 0, nil
	}
	p.log.Warn("read back push deliveries the server made to no one during the stop; logged before the cutoff, for the target",
		"stream", e.stream, "consumer", e.consumer, "messages", n, "after", e.streamSeq, "through", d.StreamSeq)
	return n, p.tee.Wait(ctx, last)
}

// voidReply is the ack subject a delivery of stream's message seq to
// consumer would have had (delivery count 1; the consumer sequence is not
// known and is 0).
func voidReply(stream, consumer string, seq uint64, at time.Time) string {
	return "$JS.ACK." + stream + "." + consumer + ".1." + strconv.FormatUint(seq, 10) + ".0." + strconv.FormatInt(at.UnixNano(), 10) + ".0"
}

// matchesAny reports whether subject matches one of filters (none: all).
func matchesAny(filters []string, subject string) bool {
	if len(filters) == 0 {
		return true
	}
	for _, f := range filters {
		if f == "" || matchSubject(f, subject) {
			return true
		}
	}
	return false
}

// matchSubject matches a NATS subject against a filter with the '*' (one
// token) and '>' (one or more tokens, last) wildcards.
func matchSubject(filter, subject string) bool {
	ft, st := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, f := range ft {
		if f == ">" {
			return len(st) > i
		}
		if i >= len(st) || (f != "*" && f != st[i]) {
			return false
		}
	}
	return len(ft) == len(st)
}

// notePulled remembers the pull consumer "<stream>.<consumer>" (the rest
// of a pull request's subject, which is its ReplayKey) that the app asked
// for messages.
func (c *conn) notePulled(key []byte) {
	i := bytes.IndexByte(key, '.')
	if i <= 0 || i == len(key)-1 || bytes.ContainsAny(key[i+1:], ".*> ") {
		return
	}
	c.subMu.Lock()
	defer c.subMu.Unlock()
	if c.pulled[string(key)] || len(c.pulled) >= maxSubs {
		return
	}
	if c.pulled == nil {
		c.pulled = map[string]bool{}
	}
	c.pulled[string(key)] = true
}

// appKeys adds to keys the JetStream consumers (ReplayKey) the app takes
// from on this connection: those it had deliveries of and the pull
// consumers it asked. It returns the subjects of the app's other
// subscriptions (no pull inbox, nothing delivered on them yet): a push
// consumer's deliver subject among them names a consumer that had no
// delivery here, which only the server can name.
func (c *conn) appKeys(keys map[string]bool) (unresolved []string) {
	c.mu.Lock()
	fed := map[string]bool{}
	for k, e := range c.seen {
		keys[k] = true
		fed[e.sid] = true
	}
	for sid := range c.jsSIDs {
		fed[sid] = true
	}
	c.mu.Unlock()
	c.subMu.Lock()
	defer c.subMu.Unlock()
	for k := range c.pulled {
		keys[k] = true
	}
	for sid, s := range c.subs {
		// A deliver subject has no wildcard (nats.go's request inbox "_INBOX.<id>.*" does).
		if !s.pull && !fed[sid] && !strings.ContainsAny(s.subject, "*>") {
			unresolved = append(unresolved, s.subject)
		}
	}
	return unresolved
}

// cutoffKeys returns the JetStream consumers the app takes from, for the
// stop's cutoff marker: a target then switches those that have no record
// in the log to the server at once (replay.Collector.Known). The deliver
// subjects of subscriptions that had no delivery are looked up on the
// server once; if that fails, the marker names what is known (a target
// then refuses such a consumer as before) and the stop goes on.
func (p *Proxy) cutoffKeys(ctx context.Context) []string {
	keys := map[string]bool{}
	var unresolved []string
	for _, c := range p.snapshotConns() {
		unresolved = append(unresolved, c.appKeys(keys)...)
	}
	if len(unresolved) > 0 && p.opts.Recover != nil {
		byDeliver, err := p.opts.Recover.PushConsumers(ctx)
		if err != nil {
			p.log.Warn("stop: could not look up the push consumers of subscriptions that had no delivery; the cutoff marker does not name them", "err", err)
		}
		for _, subj := range unresolved {
			if k, ok := byDeliver[subj]; ok {
				keys[k] = true
			}
		}
	}
	return slices.Collect(maps.Keys(keys))
}
