package proxy

import (
	"bytes"
	"fmt"
	"time"

	"github.com/ms2m/ms2m/internal/amqpwire"
)

// Method ids the proxy acts on, as (class<<16 | method).
const (
	mConnectionStartOk = 10<<16 | 11
	mConnectionTuneOk  = 10<<16 | 31
	mConnectionOpen    = 10<<16 | 40
	mQueueDeclare      = 50<<16 | 10
	mQueueDeclareOk    = 50<<16 | 11
	mChannelClose      = 20<<16 | 40
	mChannelCloseOk    = 20<<16 | 41
	mBasicQos          = 60<<16 | 10
	mBasicConsume      = 60<<16 | 20
	mBasicConsumeOk    = 60<<16 | 21
	mBasicCancel       = 60<<16 | 30
	mBasicCancelOk     = 60<<16 | 31
	mBasicPublish      = 60<<16 | 40
	mBasicReturn       = 60<<16 | 50
	mBasicDeliver      = 60<<16 | 60
	mBasicGet          = 60<<16 | 70
	mBasicGetOk        = 60<<16 | 71
	mBasicGetEmpty     = 60<<16 | 72
	mBasicAck          = 60<<16 | 80
	mBasicReject       = 60<<16 | 90
	mBasicRecoverAsync = 60<<16 | 100
	mBasicRecover      = 60<<16 | 110
	mBasicNack         = 60<<16 | 120
	mConfirmSelect     = 85<<16 | 10
)

func methodKey(payload []byte) (uint32, error) {
	class, method, err := amqpwire.MethodID(payload)
	return uint32(class)<<16 | uint32(method), err
}

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
// runs with c.mu held.
func (c *conn) onUpMethod(f amqpwire.Frame, seg *segment) ([]byte, error) {
	key, err := methodKey(f.Payload)
	if err != nil {
		return nil, err
	}
	if f.Channel == 0 {
		switch key {
		case mConnectionStartOk:
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
		case mConnectionOpen:
			m, err := decode[*amqpwire.ConnectionOpen](f.Payload)
			if err != nil {
				return nil, err
			}
			if out := c.handshake.Open(m); out != nil {
				return amqpwire.AppendMethodFrame(nil, 0, out), nil
			}
		case mConnectionTuneOk:
			t, err := decode[*amqpwire.ConnectionTuneOk](f.Payload)
			if err != nil {
				return nil, err
			}
			c.upP.SetMaxFrame(t.FrameMax)
			c.downP.SetMaxFrame(t.FrameMax)
			c.heartbeat.Store(int64(time.Duration(t.Heartbeat) * time.Second))
			c.lastUp.Store(time.Now().UnixNano()) // the tune-ok goes up next
		}
		return f.Raw, nil
	}
	ch := c.channel(f.Channel)
	if ch.up != nil {
		return nil, unexpected(f, "method frame from the app in the middle of a publish's content")
	}
	switch key {
	case mBasicPublish:
		if ch.confirm {
			ch.pubSeq++
		}
		if c.p.absorbing() {
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
		ch.up = &content{}
		if c.p.recordsPublishes() {
			m, err := decode[*amqpwire.BasicPublish](f.Payload)
			if err != nil {
				return nil, err
			}
			if id := c.attribute(ch); id != 0 {
				ch.up.pub = newPubCapture(id, m.Exchange, m.RoutingKey)
			}
		}
	case mQueueDeclare:
		m, err := decode[*amqpwire.QueueDeclare](f.Payload)
		if err != nil {
			return nil, err
		}
		c.onQueueDeclare(ch, m)
	case mConfirmSelect:
		ch.confirm = true
	case mBasicQos:
		q, err := decode[*amqpwire.BasicQos](f.Payload)
		if err != nil {
			return nil, err
		}
		ch.prefetch = q.PrefetchCount
		c.kick()
	case mBasicConsume:
		m, err := decode[*amqpwire.BasicConsume](f.Payload)
		if err != nil {
			return nil, err
		}
		if c.mode == Stopped {
			// Consume nothing while stopped: answer for the broker and keep
			// the consume for a resume.
			if m.ConsumerTag == "" {
				ch.nextTag++
				m.ConsumerTag = fmt.Sprintf("ms2m.held.%d.%d", f.Channel, ch.nextTag)
			}
			ch.cancelled = append(ch.cancelled, &consumer{queue: m.Queue, noAck: m.NoAck, consume: m})
			if !m.NoWait {
				c.writeApp(amqpwire.AppendMethodFrame(nil, f.Channel, &amqpwire.BasicConsumeOk{ConsumerTag: m.ConsumerTag}))
			}
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
	case mBasicCancel:
		m, err := decode[*amqpwire.BasicCancel](f.Payload)
		if err != nil {
			return nil, err
		}
		if _, ok := ch.replaying[m.ConsumerTag]; ok {
			delete(ch.replaying, m.ConsumerTag)
			c.p.replayActive.Add(-1)
			c.kick()
			if !m.NoWait {
				c.writeApp(amqpwire.AppendMethodFrame(nil, f.Channel, &amqpwire.BasicCancelOk{ConsumerTag: m.ConsumerTag}))
			}
			return nil, nil
		}
		if m.NoWait {
			delete(ch.consumers, m.ConsumerTag)
		}
	case mBasicGet:
		m, err := decode[*amqpwire.BasicGet](f.Payload)
		if err != nil {
			return nil, err
		}
		if c.mode == Stopped {
			c.writeApp(amqpwire.AppendMethodFrame(nil, f.Channel, &amqpwire.BasicGetEmpty{}))
			return nil, nil
		}
		if c.p.replaying(m.Queue) {
			ch.renumber = true
			go c.replayGet(f.Channel, m, bytes.Clone(f.Raw))
			return nil, nil
		}
		ch.gets = append(ch.gets, pendingGet{queue: m.Queue, noAck: m.NoAck})
	case mBasicAck:
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
			seg.raw, merged = appendAck(seg.raw, &seg.tail, f.Channel, m.DeliveryTag, f.Raw, true)
			if merged {
				c.p.opts.Metrics.acksCoalesced.Inc()
			}
			return nil, nil
		}
	case mBasicNack:
		m, err := decode[*amqpwire.BasicNack](f.Payload)
		if err != nil {
			return nil, err
		}
		if ch.renumber {
			return c.settleRenumbered(ch, seg, m.DeliveryTag, m.Multiple, false, m.Requeue, func(up uint64) amqpwire.Method {
				return &amqpwire.BasicNack{DeliveryTag: up, Multiple: m.Multiple, Requeue: m.Requeue}
			}), nil
		}
		c.settle(ch, seg, m.DeliveryTag, m.Multiple, false)
	case mBasicReject:
		m, err := decode[*amqpwire.BasicReject](f.Payload)
		if err != nil {
			return nil, err
		}
		if ch.renumber {
			return c.settleRenumbered(ch, seg, m.DeliveryTag, false, false, m.Requeue, func(up uint64) amqpwire.Method {
				return &amqpwire.BasicReject{DeliveryTag: up, Requeue: m.Requeue}
			}), nil
		}
		c.settle(ch, seg, m.DeliveryTag, false, false)
	case mBasicRecover, mBasicRecoverAsync:
		// The broker redelivers everything unacked on the channel.
		c.dropOutstanding(ch)
	case mChannelClose, mChannelCloseOk:
		c.dropChannel(f.Channel)
	}
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
	for _, d := range ch.outstanding {
		byQueue[d.queue]++
	}
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
