package proxy

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ms2m/ms2m/internal/amqpwire"
	"github.com/ms2m/ms2m/internal/replay"
	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// ReplaySource serves the records a target replays, per queue; a
// *replay.Source implements it.
type ReplaySource interface {
	// Next returns the i-th record (from 0) of queue to replay, or done once
	// the queue has none left up to the cutoff. It blocks until it knows.
	Next(ctx context.Context, queue string, i int) (rec shadowqueue.Record, done bool, err error)
	// Cutoff returns the cutoff ID and the epoch of its marker, once known.
	Cutoff() (id, epoch uint64, ok bool)
}

// queueReplay is the replay position of one queue, shared by every
// consumer of it on any connection, so that a consumer that comes back
// after a dropped connection goes on where the last one left off.
type queueReplay struct {
	mu       sync.Mutex
	slots    replay.Slots // where each record stands
	switched bool         // the app consumes this queue upstream now
}

// claim returns the lowest pending index and marks it in flight.
func (q *queueReplay) claim() (i int, redelivered bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.slots.Claim()
}

// release puts index i back to pending.
func (q *queueReplay) release(i int, unsent bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.slots.Release(i, unsent)
}

func (q *queueReplay) ack(i int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.slots.Ack(i)
}

// allAcked reports whether records 0..n-1 are acked.
func (q *queueReplay) allAcked(n int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.slots.Acked() >= n
}

func (q *queueReplay) isSwitched() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.switched
}

// replayConsumer is an app consumer served from the log.
type replayConsumer struct {
	m *amqpwire.BasicConsume // with its tag made explicit
	q *queueReplay
}

// replayDelivery is a replayed delivery the app has not settled.
type replayDelivery struct {
	tag     uint64
	idx     int
	q       *queueReplay
	id      uint64    // the record's ID
	queue   string    // the record's queue
	at      time.Time // when it went to the app
	fromGet bool      // answered a basic.get: counts in replayActive until settled
}

// absorbing reports whether the app's publishes are absorbed: while it is
// still being handed replayed messages, whose results the source already
// published.
func (p *Proxy) absorbing() bool {
	return p.opts.Replay != nil && p.replayActive.Load() > 0
}

// suppressed counts an absorbed publish.
func (p *Proxy) suppressed(exchange, routingKey string) {
	p.opts.Metrics.suppressed.WithLabelValues(exchange, routingKey).Inc()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.suppressedBy == nil {
		p.suppressedBy = map[[2]string]uint64{}
	}
	p.suppressedBy[[2]string{exchange, routingKey}]++
}

// replaying reports whether the app's consume of queue is served from the
// log rather than the broker.
func (p *Proxy) replaying(queue string) bool {
	return p.opts.Replay != nil && !p.queueReplay(queue).isSwitched()
}

func (p *Proxy) queueReplay(queue string) *queueReplay {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.replayQueues == nil {
		p.replayQueues = map[string]*queueReplay{}
	}
	q := p.replayQueues[queue]
	if q == nil {
		q = &queueReplay{}
		p.replayQueues[queue] = q
	}
	return q
}

// continueTee makes the tee number new deliveries after the cutoff, once.
func (p *Proxy) continueTee() {
	p.teeOnce.Do(func() {
		id, epoch, _ := p.opts.Replay.Cutoff()
		if err := p.tee.Continue(id, epoch); err != nil {
			p.log.Error("cannot continue the replay log after the cutoff", "cutoff_id", id, "err", err)
			return
		}
		p.teeContinued.Store(true)
		p.comparePublishes()
	})
}

// markReplayed records that the record with ID id went to the app at t.
func (p *Proxy) markReplayed(id uint64, t time.Time) {
	p.replayed.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastReplayedID = max(p.lastReplayedID, id)
	p.lastReplayedAt = t
}

// replayFailed keeps the last replay error for /state.
func (p *Proxy) replayFailed(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.replayErr = err.Error()
}

// markSwitched records when the broker confirmed a switch to the primary
// queue: from then on the target accepts primary deliveries.
func (p *Proxy) markSwitched(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.firstSwitch.IsZero() {
		p.firstSwitch = t
	}
}

// markPrimary records the first primary-queue delivery after replay.
func (p *Proxy) markPrimary(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.firstPrimary.IsZero() {
		p.firstPrimary = t
	}
}

// kick wakes the replay feeders of this connection. Callers hold c.mu.
func (c *conn) kick() {
	close(c.kickCh)
	c.kickCh = make(chan struct{})
}

// startReplay serves the app's basic.consume m on channel ch from the log.
// Callers hold c.mu.
func (c *conn) startReplay(ch *channel, m *amqpwire.BasicConsume) {
	if m.ConsumerTag == "" {
		ch.nextTag++
		m.ConsumerTag = "ms2m.replay." + itoa(uint64(ch.id)) + "." + itoa(uint64(ch.nextTag))
	}
	rc := &replayConsumer{m: m, q: c.p.queueReplay(m.Queue)}
	ch.replaying[m.ConsumerTag] = rc
	c.p.replayActive.Add(1)
	ch.renumber = true
	if !m.NoWait {
		c.writeApp(amqpwire.AppendMethodFrame(nil, ch.id, &amqpwire.BasicConsumeOk{ConsumerTag: m.ConsumerTag}))
	}
	c.log.Info("replaying to the app's consumer", "queue", m.Queue, "consumer_tag", m.ConsumerTag)
	go c.feed(ch.id, rc)
}

func itoa(u uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + u%10)
		u /= 10
		if u == 0 {
			return string(b[i:])
		}
	}
}

// feed hands the queue's records to one replay consumer, honouring the
// channel's prefetch, and switches it to the broker once the app has acked
// every record up to the cutoff.
func (c *conn) feed(chID uint16, rc *replayConsumer) {
	src := c.p.opts.Replay
	for {
		c.mu.Lock()
		ch := c.chans[chID]
		if c.ctx.Err() != nil || c.draining || ch == nil || ch.replaying[rc.m.ConsumerTag] != rc {
			c.mu.Unlock()
			return
		}
		wake := c.kickCh
		credit := ch.prefetch == 0 || len(ch.replayOut)+len(ch.outstanding) < int(ch.prefetch)
		c.mu.Unlock()
		if !credit {
			if !c.wait(wake) {
				return
			}
			continue
		}

		idx, redelivered := rc.q.claim()
		rec, done, err := src.Next(c.ctx, rc.m.Queue, idx)
		if err == nil && !done {
			err = replayable(&rec, c.downP.MaxFrame())
		}
		if err != nil {
			rc.q.release(idx, true)
			if c.ctx.Err() == nil {
				c.log.Error("replay failed; the app's consumer gets nothing more and nothing is consumed upstream", "queue", rc.m.Queue, "err", err)
				c.p.replayFailed(err)
			}
			return
		}
		if done {
			rc.q.release(idx, true)
			if rc.q.allAcked(idx) {
				c.switchToBroker(chID, rc)
				return
			}
			if !c.wait(wake) {
				return
			}
			continue
		}

		c.mu.Lock()
		ch = c.chans[chID]
		if ch == nil || ch.replaying[rc.m.ConsumerTag] != rc {
			c.mu.Unlock()
			rc.q.release(idx, !redelivered)
			return
		}
		ch.appTag++
		d := &amqpwire.BasicDeliver{ConsumerTag: rc.m.ConsumerTag, DeliveryTag: ch.appTag,
			Redelivered: rec.Redelivered || redelivered, Exchange: rec.Exchange, RoutingKey: rec.RoutingKey}
		raw := amqpwire.AppendMethodFrame(nil, chID, d)
		raw = amqpwire.AppendRawHeaderFrame(raw, chID, 60, uint64(len(rec.Body)), propsOf(rec))
		raw = amqpwire.AppendBodyFrames(raw, chID, rec.Body, c.downP.MaxFrame())
		now := c.p.opts.Now()
		c.p.tracker.Delivered(rc.m.Queue, rec.ID, now, !rc.m.NoAck)
		if rc.m.NoAck {
			rc.q.ack(idx)
			ch.replayDone++
		} else {
			ch.replayOut = append(ch.replayOut, replayDelivery{tag: ch.appTag, idx: idx, q: rc.q, id: rec.ID, queue: rc.m.Queue, at: now})
		}
		c.writeApp(raw)
		c.p.markReplayed(rec.ID, now)
		c.mu.Unlock()
	}
}

// wait blocks until wake is closed or the connection ends.
func (c *conn) wait(wake <-chan struct{}) bool {
	select {
	case <-wake:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// switchToBroker issues the app's consume upstream: from now on the app
// gets the primary queue, with delivery tags renumbered to follow on.
func (c *conn) switchToBroker(chID uint16, rc *replayConsumer) {
	c.p.continueTee()
	rc.q.mu.Lock()
	rc.q.switched = true
	rc.q.mu.Unlock()
	c.mu.Lock()
	ch := c.chans[chID]
	if ch == nil || ch.replaying[rc.m.ConsumerTag] != rc {
		c.mu.Unlock()
		return
	}
	delete(ch.replaying, rc.m.ConsumerTag)
	c.p.replayActive.Add(-1)
	m := *rc.m
	m.NoWait = false
	ch.consumes = append(ch.consumes, pendingConsume{m: &m, bySidecar: true, switching: true})
	c.late = amqpwire.AppendMethodFrame(c.late, chID, &m)
	late := c.takeLateLocked()
	c.mu.Unlock()
	c.push(segment{raw: late})
	c.log.Info("replay done; consuming the primary queue", "queue", rc.m.Queue, "consumer_tag", rc.m.ConsumerTag)
}

// settleRenumbered handles an ack, nack or reject on a channel whose tags
// the sidecar assigns. Replayed deliveries are settled here and never reach
// the broker; broker deliveries are settled as usual, and the frame is
// rewritten with the broker's tag. It returns the frame for the broker, or
// nil. Callers hold c.mu.
func (c *conn) settleRenumbered(ch *channel, seg *segment, tag uint64, multiple, ack, requeue bool, rewrite func(upTag uint64) amqpwire.Method) []byte {
	keep := ch.replayOut[:0]
	now := c.p.opts.Now()
	for _, r := range ch.replayOut {
		covered := r.tag == tag || (multiple && (tag == 0 || r.tag <= tag))
		switch {
		case !covered:
			keep = append(keep, r)
			continue
		case ack || !requeue:
			r.q.ack(r.idx)
			ch.replayDone++
			if ack {
				c.p.replayAcked(r.id)
			}
		default:
			r.q.release(r.idx, false) // comes again, marked redelivered
			c.p.replayRequeued(r.id)
		}
		if r.fromGet {
			c.p.replayActive.Add(-1)
		}
		// The target's μ counts replayed work too: the migrator sizes the
		// cutoff with it.
		if ack {
			c.p.tracker.Acked(r.queue, r.id, r.at, now, 1)
		} else {
			c.p.tracker.Rejected(r.queue, 1)
		}
	}
	ch.replayOut = keep
	c.kick()
	covered := c.settle(ch, seg, tag, multiple, ack)
	if len(covered) == 0 {
		return nil
	}
	c.rejected(covered, !ack && requeue)
	up := covered[0].upTag
	for _, d := range covered {
		up = max(up, d.upTag)
	}
	if multiple && tag == 0 {
		up = 0
	}
	return amqpwire.AppendMethodFrame(nil, ch.id, rewrite(up))
}

// dropReplay puts the channel's unsettled replayed deliveries back, to be
// replayed again (as redeliveries) to the app's next consumer. A channel
// that goes away while a consumer of it is still served from the log,
// after the app settled replayed deliveries on it, interrupts the replay
// (ReplayState.Interrupted).
func (c *conn) dropReplay(ch *channel) {
	if len(ch.replaying) > 0 && ch.replayDone > 0 {
		c.p.mu.Lock()
		c.p.interrupted++
		c.p.mu.Unlock()
		c.log.Warn("the app's channel went away in the middle of the replay, after it had settled replayed deliveries: an app restarted from the checkpoint would lack them",
			"channel", ch.id, "settled", ch.replayDone, "unsettled", len(ch.replayOut))
	}
	for _, r := range ch.replayOut {
		r.q.release(r.idx, false)
		c.p.replayRequeued(r.id)
		c.p.tracker.Dropped(r.queue, 1)
		if r.fromGet {
			c.p.replayActive.Add(-1)
		}
	}
	ch.replayOut = nil
	c.p.replayActive.Add(-int64(len(ch.replaying)))
	ch.replaying = map[string]*replayConsumer{}
}

// replayingCount counts the app's consumers still served from the log.
func (c *conn) replayingCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ch := range c.chans {
		n += len(ch.replaying)
	}
	return n
}

// getWait bounds how long a replayed basic.get waits for its record to
// reach the log before it answers get-empty, as a broker would for an
// empty queue.
const getWait = 100 * time.Millisecond

// replayGet answers the app's basic.get m on a queue still being replayed:
// with the next record, with get-empty if none is there yet, or, once the
// app has acked every record up to the cutoff, by switching the queue to
// the broker and sending m (raw) there.
func (c *conn) replayGet(chID uint16, m *amqpwire.BasicGet, raw []byte) {
	q := c.p.queueReplay(m.Queue)
	idx, redelivered := q.claim()
	ctx, cancel := context.WithTimeout(c.ctx, getWait)
	rec, done, err := c.p.opts.Replay.Next(ctx, m.Queue, idx)
	cancel()
	if err == nil && !done {
		err = replayable(&rec, c.downP.MaxFrame())
	}
	empty := amqpwire.AppendMethodFrame(nil, chID, &amqpwire.BasicGetEmpty{})

	c.mu.Lock()
	ch := c.chans[chID]
	if c.ctx.Err() != nil || ch == nil {
		c.mu.Unlock()
		q.release(idx, !redelivered)
		return
	}
	switch {
	case err != nil && ctx.Err() == nil && c.ctx.Err() == nil:
		q.release(idx, true)
		c.p.replayFailed(err)
		c.log.Error("replay failed; basic.get gets get-empty and nothing is consumed upstream", "queue", m.Queue, "err", err)
		c.writeApp(empty)
	case err != nil:
		q.release(idx, !redelivered)
		c.writeApp(empty)
	case done:
		q.release(idx, true)
		if !q.allAcked(idx) {
			c.writeApp(empty) // replayed records still unacked
			break
		}
		q.mu.Lock()
		q.switched = true
		q.mu.Unlock()
		c.p.continueTee()
		c.p.markSwitched(c.p.opts.Now())
		ch.gets = append(ch.gets, pendingGet{queue: m.Queue, noAck: m.NoAck})
		c.late = append(c.late, raw...)
	default:
		ch.appTag++
		now := c.p.opts.Now()
		out := amqpwire.AppendMethodFrame(nil, chID, &amqpwire.BasicGetOk{DeliveryTag: ch.appTag,
			Redelivered: rec.Redelivered || redelivered, Exchange: rec.Exchange, RoutingKey: rec.RoutingKey})
		out = amqpwire.AppendRawHeaderFrame(out, chID, 60, uint64(len(rec.Body)), propsOf(rec))
		out = amqpwire.AppendBodyFrames(out, chID, rec.Body, c.downP.MaxFrame())
		c.p.tracker.Delivered(m.Queue, rec.ID, now, !m.NoAck)
		if m.NoAck {
			q.ack(idx)
		} else {
			ch.replayOut = append(ch.replayOut, replayDelivery{tag: ch.appTag, idx: idx, q: q, id: rec.ID, queue: m.Queue, at: now, fromGet: true})
			c.p.replayActive.Add(1)
		}
		c.writeApp(out)
		c.p.markReplayed(rec.ID, now)
	}
	late := c.takeLateLocked()
	c.mu.Unlock()
	c.push(segment{raw: late})
}

// replayable checks that rec can go to the app as a delivery: its exchange
// and routing key fit AMQP short strings, and its content header fits the
// app connection's frame max (maxFrame, as the Parser takes it). The log's
// decoder holds records to the short-string limits already
// (shadowqueue.DecodeRecord); this keeps a ReplaySource that does not from
// making the proxy build a frame it cannot encode, which would panic. An
// error fails the replay: a record cannot be skipped without breaking
// exactness.
func replayable(rec *shadowqueue.Record, maxFrame uint32) error {
	for _, f := range []struct{ name, v string }{{"exchange", rec.Exchange}, {"routing key", rec.RoutingKey}} {
		if len(f.v) > 255 {
			return fmt.Errorf("replay log record ID %d: its %s is %d bytes, over the 255 of an AMQP short string; the log holds data no broker delivered, so the replay stops here",
				rec.ID, f.name, len(f.v))
		}
	}
	const headerFixed = 2 + 2 + 8 // class, weight, body size
	if maxFrame != 0 && amqpwire.FrameOverhead+headerFixed+len(propsOf(*rec)) > int(max(maxFrame, amqpwire.FrameMinSize)) {
		return fmt.Errorf("replay log record ID %d: its %d bytes of properties do not fit the app connection's frame max of %d bytes; raise the app's frame max, or the replay cannot hand this message over",
			rec.ID, len(rec.Properties), maxFrame)
	}
	return nil
}

// propsOf returns a record's raw basic properties, or an empty property
// list (flags 0) for a record written without any.
func propsOf(rec shadowqueue.Record) []byte {
	if len(rec.Properties) < 2 {
		return []byte{0, 0}
	}
	return rec.Properties
}
