package proxy

import (
	"bytes"
	"fmt"
	"time"

	"github.com/ms2m/ms2m/internal/amqpwire"
)

// The proxy's modes, as the handlers below speak of them. Serving, Quiesced
// and Stopped are the connection's Mode (c.mode), set by Quiesce, Stop and
// Resume. Replaying is not a mode of its own but the state of a target
// sidecar (Options.Replay set) while a queue is still served from the log:
// it holds in any of the three, and ends per queue when the app has acked
// every record up to the cutoff (replay.go).

// decode decodes a method the proxy acts on into T.
func decode[T amqpwire.Method](payload []byte) (T, error) {
	var zero T
	m, err := amqpwire.DecodeMethod(payload)
	if err != nil {
		return zero, err
	}
	t, ok := m.(T)
	if !ok {
		return zero, &amqpwire.Error{Code: amqpwire.SyntaxError, Text: fmt.Sprintf("decoded %T, expected %T", m, zero)}
	}
	return t, nil
}

// onUpMethod handles one method frame from the app. It returns the bytes to
// send to the broker: the frame as it is, a rewritten frame, or nothing. It
// runs with c.mu held. A method without a handler here passes as it is.
func (c *conn) onUpMethod(f amqpwire.Frame, seg *segment) ([]byte, error) {
	key, err := amqpwire.PayloadKey(f.Payload)
	if err != nil {
		return nil, err
	}
	if f.Channel == 0 {
		switch key {
		case amqpwire.KeyConnectionClose, amqpwire.KeyConnectionCloseOk:
			c.closing = true
		case amqpwire.KeyConnectionStartOk:
			return c.upStartOk(f)
		case amqpwire.KeyConnectionOpen:
			return c.upOpen(f)
		case amqpwire.KeyConnectionTuneOk:
			return c.upTuneOk(f)
		}
		return f.Raw, nil
	}
	ch := c.channel(f.Channel)
	if ch.up != nil {
		return nil, unexpected(f, "method frame from the app in the middle of a publish's content")
	}
	switch key {
	case amqpwire.KeyBasicPublish:
		return c.upPublish(ch, f)
	case amqpwire.KeyQueueDeclare:
		return c.upQueueDeclare(ch, f)
	case amqpwire.KeyConfirmSelect:
		return c.upConfirmSelect(ch, f)
	case amqpwire.KeyBasicQos:
		return c.upQos(ch, f)
	case amqpwire.KeyBasicConsume:
		return c.upConsume(ch, f)
	case amqpwire.KeyBasicCancel:
		return c.upCancel(ch, f)
	case amqpwire.KeyBasicGet:
		return c.upGet(ch, f)
	case amqpwire.KeyBasicAck:
		return c.upAck(ch, f, seg)
	case amqpwire.KeyBasicNack:
		return c.upNack(ch, f, seg)
	case amqpwire.KeyBasicReject:
		return c.upReject(ch, f, seg)
	case amqpwire.KeyBasicRecover, amqpwire.KeyBasicRecoverAsync:
		return c.upRecover(ch, f)
	case amqpwire.KeyChannelClose, amqpwire.KeyChannelCloseOk:
		return c.upChannelClose(ch, f)
	}
	return f.Raw, nil
}

// upStartOk handles connection.start-ok, the same in every mode: where the
// sidecar owns the broker's credentials, it puts them in place of the app's
// placeholder ones (upstream.Handshake); else the frame passes as it is.
func (c *conn) upStartOk(f amqpwire.Frame) ([]byte, error) {
	m, err := decode[*amqpwire.ConnectionStartOk](f.Payload)
	if err != nil {
		return nil, err
	}
	out := c.handshake.StartOk(m)
	if c.handshake.Unresolved() {
		c.log.Warn("the app sent ms2m's placeholder credentials, but the sidecar has no credentials to put in their place: the broker will refuse the connection",
			"fix", "give MS2M_UPSTREAM user info, or set MS2M_UPSTREAM_USERNAME and MS2M_UPSTREAM_PASSWORD")
	}
	if out != nil {
		return amqpwire.AppendMethodFrame(nil, 0, out), nil
	}
	return f.Raw, nil
}

// upOpen handles connection.open, the same in every mode: the sidecar's
// virtual host, where it owns one, replaces the app's.
func (c *conn) upOpen(f amqpwire.Frame) ([]byte, error) {
	m, err := decode[*amqpwire.ConnectionOpen](f.Payload)
	if err != nil {
		return nil, err
	}
	if out := c.handshake.Open(m); out != nil {
		return amqpwire.AppendMethodFrame(nil, 0, out), nil
	}
	return f.Raw, nil
}

// upTuneOk handles connection.tune-ok, the same in every mode: both parsers
// take the frame max the app chose, and the heartbeat interval is kept for
// the sidecar's own heartbeats. The frame passes.
func (c *conn) upTuneOk(f amqpwire.Frame) ([]byte, error) {
	t, err := decode[*amqpwire.ConnectionTuneOk](f.Payload)
	if err != nil {
		return nil, err
	}
	c.upP.SetMaxFrame(t.FrameMax)
	c.downP.SetMaxFrame(t.FrameMax)
	c.heartbeat.Store(int64(time.Duration(t.Heartbeat) * time.Second))
	c.lastUp.Store(time.Now().UnixNano()) // the tune-ok goes up next
	return f.Raw, nil
}

// upPublish handles basic.publish, whose content frames follow.
//   - Serving, quiesced, stopped: it passes, with its content. With publish
//     checking on (and, on a target, once the log is taken over), its
//     digest goes into the log, attributed to the delivery the app is
//     handling (pubcheck.go).
//   - Replaying (while the app still has replayed messages): the sidecar
//     absorbs it (absorbPublish): the source made that publish already.
//
// On a confirm channel it counts in the app's publish sequence either way.
func (c *conn) upPublish(ch *channel, f amqpwire.Frame) ([]byte, error) {
	if ch.confirm {
		ch.pubSeq++
	}
	if c.p.absorbing() {
		return c.absorbPublish(ch, f)
	}
	ch.up = &content{}
	if !c.p.recordsPublishes() {
		return f.Raw, nil
	}
	m, err := decode[*amqpwire.BasicPublish](f.Payload)
	if err != nil {
		return nil, err
	}
	if id := c.attribute(ch); id != 0 {
		ch.up.pub = newPubCapture(id, m.Exchange, m.RoutingKey)
	}
	return f.Raw, nil
}

// absorbPublish keeps an app publish made while replaying from the broker:
// it and its content go nowhere, it is counted in State, confirmed to the
// app by the sidecar on a confirm channel (publishDone), and, with publish
// checking on, compared with what the source published.
func (c *conn) absorbPublish(ch *channel, f amqpwire.Frame) ([]byte, error) {
	m, err := decode[*amqpwire.BasicPublish](f.Payload)
	if err != nil {
		return nil, err
	}
	c.p.suppressed(m.Exchange, m.RoutingKey)
	ch.up = &content{absorb: true}
	if ch.confirm {
		ch.up.tag = ch.pubSeq
	}
	if c.p.opts.CheckPublishes {
		ch.up.pub = newPubCapture(c.attribute(ch), m.Exchange, m.RoutingKey)
	}
	return nil, nil
}

// upQueueDeclare handles queue.declare, the same in every mode: it passes,
// and a queue that a migration could not replay (exclusive, auto-delete,
// server-named) is noted (queues.go).
func (c *conn) upQueueDeclare(ch *channel, f amqpwire.Frame) ([]byte, error) {
	m, err := decode[*amqpwire.QueueDeclare](f.Payload)
	if err != nil {
		return nil, err
	}
	c.onQueueDeclare(ch, m)
	return f.Raw, nil
}

// upConfirmSelect handles confirm.select, the same in every mode: it passes,
// and the channel counts the app's publishes from then on, so that
// confirms stay numbered right around absorbed publishes.
func (c *conn) upConfirmSelect(ch *channel, f amqpwire.Frame) ([]byte, error) {
	ch.confirm = true
	return f.Raw, nil
}

// upQos handles basic.qos, the same in every mode: it passes, and its
// prefetch count also bounds what the replay feeds the channel.
func (c *conn) upQos(ch *channel, f amqpwire.Frame) ([]byte, error) {
	q, err := decode[*amqpwire.BasicQos](f.Payload)
	if err != nil {
		return nil, err
	}
	ch.prefetch = q.PrefetchCount
	c.kick()
	return f.Raw, nil
}

// upConsume handles basic.consume.
//   - Serving, quiesced: it passes, and waits for its consume-ok (with
//     no-wait, the consumer counts at once). While quiesced, its deliveries
//     are held like any other.
//   - Stopped: holdConsume answers it and keeps it for Resume.
//   - Replaying (the queue is not switched to the broker yet): the sidecar
//     answers it and feeds it from the log (startReplay); nothing goes to
//     the broker until the switch.
func (c *conn) upConsume(ch *channel, f amqpwire.Frame) ([]byte, error) {
	m, err := decode[*amqpwire.BasicConsume](f.Payload)
	if err != nil {
		return nil, err
	}
	if c.mode == Stopped {
		c.holdConsume(ch, m)
		return nil, nil
	}
	c.consumed(m.Queue)
	if c.p.replaying(m.Queue) {
		c.startReplay(ch, m)
		return nil, nil
	}
	if m.NoWait {
		ch.consumers[m.ConsumerTag] = &consumer{queue: m.Queue, noAck: m.NoAck, consume: m}
	} else {
		ch.consumes = append(ch.consumes, pendingConsume{m: m})
	}
	return f.Raw, nil
}

// holdConsume consumes nothing while stopped: it answers the app's consume
// for the broker, with a tag of its own making if the app left it to the
// broker, and keeps it with the consumers the stop cancelled, for a resume.
func (c *conn) holdConsume(ch *channel, m *amqpwire.BasicConsume) {
	if m.ConsumerTag == "" {
		ch.nextTag++
		m.ConsumerTag = fmt.Sprintf("ms2m.held.%d.%d", ch.id, ch.nextTag)
	}
	ch.cancelled = append(ch.cancelled, &consumer{queue: m.Queue, noAck: m.NoAck, consume: m})
	if !m.NoWait {
		c.writeApp(amqpwire.AppendMethodFrame(nil, ch.id, &amqpwire.BasicConsumeOk{ConsumerTag: m.ConsumerTag}))
	}
}

// upCancel handles basic.cancel.
//   - Serving, quiesced, stopped: it passes; the consumer is forgotten at
//     its cancel-ok (with no-wait, at once).
//   - Replaying (a consumer served from the log): the sidecar ends the
//     consumer and answers cancel-ok itself; nothing goes to the broker.
func (c *conn) upCancel(ch *channel, f amqpwire.Frame) ([]byte, error) {
	m, err := decode[*amqpwire.BasicCancel](f.Payload)
	if err != nil {
		return nil, err
	}
	if _, ok := ch.replaying[m.ConsumerTag]; ok {
		delete(ch.replaying, m.ConsumerTag)
		c.p.replayActive.Add(-1)
		c.kick()
		if !m.NoWait {
			c.writeApp(amqpwire.AppendMethodFrame(nil, ch.id, &amqpwire.BasicCancelOk{ConsumerTag: m.ConsumerTag}))
		}
		return nil, nil
	}
	if m.NoWait {
		delete(ch.consumers, m.ConsumerTag)
	}
	return f.Raw, nil
}

// upGet handles basic.get.
//   - Serving, quiesced: it passes, and waits for its get-ok or get-empty.
//     While quiesced, a get-ok is held like a delivery.
//   - Stopped: the sidecar answers get-empty, as for an empty queue.
//   - Replaying (the queue is not switched yet): the sidecar answers it from
//     the log (replayGet), and sends it on once the replay is done.
func (c *conn) upGet(ch *channel, f amqpwire.Frame) ([]byte, error) {
	m, err := decode[*amqpwire.BasicGet](f.Payload)
	if err != nil {
		return nil, err
	}
	c.notePolled(m.Queue)
	if c.mode == Stopped {
		c.writeApp(amqpwire.AppendMethodFrame(nil, ch.id, &amqpwire.BasicGetEmpty{}))
		return nil, nil
	}
	if c.p.replaying(m.Queue) {
		ch.renumber = true
		go c.replayGet(ch.id, m, bytes.Clone(f.Raw))
		return nil, nil
	}
	ch.gets = append(ch.gets, pendingGet{queue: m.Queue, noAck: m.NoAck})
	return f.Raw, nil
}

// upAck handles the app's basic.ack. In every mode it settles the
// deliveries it covers and goes to the broker only once they are durable
// in the log (settle gates the segment: invariant I1).
//   - Serving: an ack that may stand for every delivery up to its tag is
//     written as a cumulative ack, which a following one can absorb
//     (coalesce.go).
//   - Quiesced, stopped: it passes as it is (acks are what a quiesce and a
//     stop wait for).
//   - Replaying (a renumbered channel): an ack of replayed deliveries stays
//     in the sidecar; one of broker deliveries goes with the broker's tag
//     (settleRenumbered).
func (c *conn) upAck(ch *channel, f amqpwire.Frame, seg *segment) ([]byte, error) {
	m, err := decode[*amqpwire.BasicAck](f.Payload)
	if err != nil {
		return nil, err
	}
	if ch.renumber {
		return c.settleRenumbered(ch, seg, m.DeliveryTag, m.Multiple, true, false, func(up uint64) amqpwire.Method {
			return &amqpwire.BasicAck{DeliveryTag: up, Multiple: m.Multiple}
		}), nil
	}
	if covered := c.settle(ch, seg, m.DeliveryTag, m.Multiple, true); len(covered) > 0 && c.cumulative(ch, m.DeliveryTag) {
		var merged bool
		seg.raw, merged = appendAck(seg.raw, &seg.tail, ch.id, m.DeliveryTag, f.Raw, true)
		if merged {
			c.p.opts.Metrics.acksCoalesced.Inc()
		}
		return nil, nil
	}
	return f.Raw, nil
}

// upNack handles the app's basic.nack, as upAck does an ack but never
// coalesced: serving, quiesced and stopped, it settles what it covers and
// passes, gated on the log; replaying, a nack of replayed deliveries stays
// in the sidecar (with requeue, they are replayed again as redeliveries).
func (c *conn) upNack(ch *channel, f amqpwire.Frame, seg *segment) ([]byte, error) {
	m, err := decode[*amqpwire.BasicNack](f.Payload)
	if err != nil {
		return nil, err
	}
	if ch.renumber {
		return c.settleRenumbered(ch, seg, m.DeliveryTag, m.Multiple, false, m.Requeue, func(up uint64) amqpwire.Method {
			return &amqpwire.BasicNack{DeliveryTag: up, Multiple: m.Multiple, Requeue: m.Requeue}
		}), nil
	}
	c.rejected(c.settle(ch, seg, m.DeliveryTag, m.Multiple, false), m.Requeue)
	return f.Raw, nil
}

// upReject handles the app's basic.reject exactly as upNack does a nack of
// one delivery.
func (c *conn) upReject(ch *channel, f amqpwire.Frame, seg *segment) ([]byte, error) {
	m, err := decode[*amqpwire.BasicReject](f.Payload)
	if err != nil {
		return nil, err
	}
	if ch.renumber {
		return c.settleRenumbered(ch, seg, m.DeliveryTag, false, false, m.Requeue, func(up uint64) amqpwire.Method {
			return &amqpwire.BasicReject{DeliveryTag: up, Requeue: m.Requeue}
		}), nil
	}
	c.rejected(c.settle(ch, seg, m.DeliveryTag, false, false), m.Requeue)
	return f.Raw, nil
}

// rejected remembers the messages of the deliveries the app rejected with
// requeue, as dropOutstanding does those the broker takes back, so that a
// redelivery is logged as a repeat: a replay gives the app the first
// delivery (again, should it reject it again) and not both.
func (c *conn) rejected(covered []delivery, requeue bool) {
	if !requeue {
		return
	}
	for _, d := range covered {
		c.p.requeuedMsgs.add(d.print, d.first)
	}
}

// upRecover handles basic.recover and basic.recover-async, the same in
// every mode: they pass, and the channel's unsettled deliveries are
// forgotten, since the broker redelivers everything unacked on it.
func (c *conn) upRecover(ch *channel, f amqpwire.Frame) ([]byte, error) {
	c.dropOutstanding(ch)
	return f.Raw, nil
}

// upChannelClose handles channel.close and channel.close-ok from the app,
// the same in every mode: they pass and the channel is forgotten; its
// unsettled replayed deliveries are replayed again (dropReplay).
func (c *conn) upChannelClose(ch *channel, f amqpwire.Frame) ([]byte, error) {
	c.dropChannel(ch.id)
	return f.Raw, nil
}

// settle records that the app settled the deliveries that tag covers, and
// gates seg on the log if any of them is not durable yet.
func (c *conn) settle(ch *channel, seg *segment, tag uint64, multiple, ack bool) []delivery {
	covered := ch.settle(tag, multiple)
	if len(covered) == 0 {
		return nil
	}
	now := c.p.opts.Now()
	gate := covered[0].ticket
	byQueue := map[string][]delivery{}
	for _, d := range covered {
		gate = max(gate, d.ticket)
		byQueue[d.queue] = append(byQueue[d.queue], d)
	}
	if ack {
		c.p.lastAcked.Store(covered[len(covered)-1].id)
		c.noteAcked(covered, now)
	}
	for q, ds := range byQueue {
		if ack {
			c.p.tracker.Acked(q, ds[len(ds)-1].id, ds[0].at, now, len(ds))
			c.p.opts.Metrics.settled.WithLabelValues(q, "ack").Add(float64(len(ds)))
		} else {
			c.p.tracker.Rejected(q, len(ds))
			c.p.opts.Metrics.settled.WithLabelValues(q, "reject").Add(float64(len(ds)))
		}
	}
	if !c.p.tee.Durable(gate) {
		seg.gated = true
		seg.gate = max(seg.gate, gate)
	}
	return covered
}

// dropOutstanding forgets the channel's unsettled deliveries: the broker
// takes them back.
func (c *conn) dropOutstanding(ch *channel) {
	byQueue := map[string]int{}
	ids := make([]uint64, 0, len(ch.outstanding))
	for _, d := range ch.outstanding {
		byQueue[d.queue]++
		ids = append(ids, d.id)
		c.p.requeuedMsgs.add(d.print, d.first)
	}
	c.p.noteRequeued(ids)
	for q, n := range byQueue {
		c.p.tracker.Dropped(q, n)
	}
	ch.outstanding = nil
}

// dropChannel forgets a closed channel.
func (c *conn) dropChannel(id uint16) {
	if ch := c.chans[id]; ch != nil {
		c.dropOutstanding(ch)
		c.dropReplay(ch)
		delete(c.chans, id)
		c.kick()
	}
}

func (c *conn) dropAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.chans {
		c.dropChannel(id)
	}
	c.forgetConsumed()
}

// writeApp writes frames the sidecar made to the app. Callers hold c.mu.
func (c *conn) writeApp(b []byte) {
	c.appMu.Lock()
	defer c.appMu.Unlock()
	err := c.app.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err == nil {
		_, err = c.app.Write(b)
	}
	if err == nil {
		err = c.app.SetWriteDeadline(time.Time{})
	}
	if err != nil {
		c.failApp(err)
	}
}
