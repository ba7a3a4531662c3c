package proxy

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/ms2m/ms2m/internal/amqpwire"
)

// pumpDown reads the broker's frames, tees deliveries and writes the frames
// on to the app.
func (c *conn) pumpDown() error {
	buf := make([]byte, 64<<10)
	out := make([]byte, 0, 64<<10)
	first := true
	for {
		if err := c.waitLogRoom(); err != nil {
			return err
		}
		n, err := c.up.Read(buf)
		if n > 0 {
			if first && buf[0] == amqpwire.ProtocolHeader[0] {
				// The broker refuses the app's protocol version and says which
				// one it speaks: pass it on as it is.
				c.writeAppRaw(buf[:n])
				return c.copyRawDown(buf)
			}
			first = false
			out = out[:0]
			c.mu.Lock()
			c.lastDown = time.Now()
			perr := c.downP.Parse(buf[:n], func(f amqpwire.Frame) error { return c.onDown(f, &out) })
			// The sidecar's own frames go up before the app sees what
			// follows: an absorbed redelivery's ack must precede the app's
			// acks of later deliveries (absorbRedelivery).
			c.push(segment{raw: c.takeLateLocked()})
			closed := c.upClose != nil
			c.appMu.Lock()
			c.mu.Unlock()
			_, werr := c.app.Write(out)
			c.appMu.Unlock()
			if perr != nil {
				c.protocolError("broker", perr)
				return perr
			}
			if werr != nil {
				return werr
			}
			if closed {
				return errBrokerClosed
			}
		}
		if err != nil {
			return err
		}
	}
}

// waitLogRoom blocks while the replay log's backlog is at its bound
// (backpressure): the broker's frames stay unread, TCP flow control stops the
// broker from sending more, and nothing is dropped or piles up in memory. An
// auto-ack consumer has nothing else that bounds it. While it waits, the app
// gets heartbeats from the sidecar in place of the broker's, which stay
// unread, so that its client does not give the connection up.
func (c *conn) waitLogRoom() error {
	for {
		ctx, cancel := c.ctx, context.CancelFunc(func() {})
		if hb := time.Duration(c.heartbeat.Load()); hb > 0 {
			ctx, cancel = context.WithTimeout(c.ctx, hb/2)
		}
		err := c.p.tee.WaitRoom(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if c.ctx.Err() != nil {
			return net.ErrClosed
		}
		c.writeAppRaw(amqpwire.AppendHeartbeat(nil))
	}
}

func (c *conn) writeAppRaw(b []byte) {
	c.appMu.Lock()
	defer c.appMu.Unlock()
	if _, err := c.app.Write(b); err != nil {
		c.failApp(err)
	}
}

func (c *conn) copyRawDown(buf []byte) error {
	for {
		n, err := c.up.Read(buf)
		if n > 0 {
			c.writeAppRaw(buf[:n])
		}
		if err != nil {
			return err
		}
	}
}

// onDown handles one frame from the broker. It runs with c.mu held.
func (c *conn) onDown(f amqpwire.Frame, out *[]byte) error {
	if c.upClose != nil {
		return nil // the broker closed the connection: nothing follows
	}
	switch f.Type {
	case amqpwire.FrameHeartbeat:
	case amqpwire.FrameMethod:
		if f.Channel == 0 {
			key, err := amqpwire.PayloadKey(f.Payload)
			if err == nil && key == amqpwire.KeyConnectionClose && !c.closing {
				return c.brokerClosed(f)
			}
			if err == nil && (key == amqpwire.KeyConnectionClose || key == amqpwire.KeyConnectionCloseOk) {
				c.closing = true
			}
			break
		}
		return c.onDownMethod(f, out)
	case amqpwire.FrameHeader:
		ch := c.channel(f.Channel)
		d := ch.down
		if d == nil || d.header {
			return unexpected(f, "content header from the broker without a content method")
		}
		size, err := amqpwire.ContentHeaderBodySize(f.Payload)
		if err != nil {
			return err
		}
		d.header, d.size = true, size
		if d.record {
			props, err := amqpwire.ContentHeaderRawProps(f.Payload)
			if err != nil {
				return err
			}
			d.rec.Properties = bytes.Clone(props)
			d.rec.Body = make([]byte, 0, min(size, 1<<20))
		}
		c.emit(d, f, out)
		if size == 0 {
			c.complete(ch, d, out)
		}
		return nil
	case amqpwire.FrameBody:
		ch := c.channel(f.Channel)
		d := ch.down
		if d == nil || !d.header {
			return unexpected(f, "body frame from the broker without a content header")
		}
		d.got += uint64(len(f.Payload))
		if d.got > d.size {
			return &amqpwire.Error{Code: amqpwire.FrameError, Text: fmt.Sprintf("body on channel %d is longer than its content header says (%d bytes)", f.Channel, d.size)}
		}
		if d.record {
			d.rec.Body = append(d.rec.Body, f.Payload...)
		}
		c.emit(d, f, out)
		if d.got == d.size {
			c.complete(ch, d, out)
		}
		return nil
	default:
		return &amqpwire.Error{Code: amqpwire.FrameError, Text: fmt.Sprintf("unknown frame type %d on channel %d", f.Type, f.Channel)}
	}
	*out = append(*out, f.Raw...)
	return nil
}

// onDownMethod handles one method frame from the broker on a channel other
// than 0, with c.mu held: it appends to out what goes to the app. A method
// without a handler here passes as it is.
func (c *conn) onDownMethod(f amqpwire.Frame, out *[]byte) error {
	ch := c.channel(f.Channel)
	if ch.down != nil {
		return unexpected(f, "method frame from the broker in the middle of a delivery's content")
	}
	pass, err := c.downMethod(ch, f, out)
	if err != nil {
		return err
	}
	if pass {
		*out = append(*out, f.Raw...)
	}
	return nil
}

// downMethod dispatches a method frame from the broker to its handler. Each
// handler reports whether the frame passes to the app as it is; one that
// returns false has written what the app gets, if anything, itself.
func (c *conn) downMethod(ch *channel, f amqpwire.Frame, out *[]byte) (pass bool, err error) {
	key, err := amqpwire.PayloadKey(f.Payload)
	if err != nil {
		return false, err
	}
	switch key {
	case amqpwire.KeyBasicDeliver:
		return c.downDeliver(ch, f, out)
	case amqpwire.KeyBasicGetOk:
		return c.downGetOk(ch, f, out)
	case amqpwire.KeyBasicAck, amqpwire.KeyBasicNack:
		return c.downConfirm(ch, f, key, out)
	case amqpwire.KeyBasicReturn:
		return c.downReturn(ch)
	case amqpwire.KeyBasicGetEmpty:
		return c.downGetEmpty(ch)
	case amqpwire.KeyBasicConsumeOk:
		return c.downConsumeOk(ch, f)
	case amqpwire.KeyBasicCancelOk:
		return c.downCancelOk(ch, f)
	case amqpwire.KeyBasicCancel:
		return c.downCancel(ch, f)
	case amqpwire.KeyQueueDeclareOk:
		return c.downQueueDeclareOk(ch, f)
	case amqpwire.KeyChannelClose, amqpwire.KeyChannelCloseOk:
		return c.downChannelClose(ch)
	}
	return true, nil
}

// downDeliver handles basic.deliver, whose content frames follow.
//   - Serving: the delivery goes to the app as the broker sent it, and into
//     the log once its content is complete (complete, deliverLocked).
//   - Quiesced, stopped: it is held back from the app, and kept out of the
//     log, until Resume hands it over or Stop releases it (releaseHeld). One
//     that comes after Stop released the held ones goes back to the broker
//     (basic.reject with requeue), or to the app if it is auto-ack.
//   - Replaying (a renumbered channel): as in the other modes, with the
//     sidecar's delivery tag in place of the broker's (startContent).
func (c *conn) downDeliver(ch *channel, f amqpwire.Frame, out *[]byte) (bool, error) {
	m, err := decode[*amqpwire.BasicDeliver](f.Payload)
	if err != nil {
		return false, err
	}
	d := &content{record: true, held: c.mode != Serving, tag: m.DeliveryTag, upTag: m.DeliveryTag}
	if cons := ch.consumers[m.ConsumerTag]; cons != nil {
		d.rec.Queue, d.noAck = cons.queue, cons.noAck
	}
	d.rec.ConsumerTag, d.rec.Exchange, d.rec.RoutingKey, d.rec.Redelivered = m.ConsumerTag, m.Exchange, m.RoutingKey, m.Redelivered
	c.startContent(ch, d, f, m, &m.DeliveryTag, out)
	return false, nil
}

// downGetOk handles basic.get-ok, whose content frames follow, in every mode
// as downDeliver does a delivery; it answers the channel's oldest pending
// basic.get, which gives its queue.
func (c *conn) downGetOk(ch *channel, f amqpwire.Frame, out *[]byte) (bool, error) {
	m, err := decode[*amqpwire.BasicGetOk](f.Payload)
	if err != nil {
		return false, err
	}
	d := &content{record: true, held: c.mode != Serving, tag: m.DeliveryTag, upTag: m.DeliveryTag, get: true}
	if len(ch.gets) > 0 {
		d.rec.Queue, d.noAck = ch.gets[0].queue, ch.gets[0].noAck
		ch.gets = ch.gets[1:]
	}
	d.rec.Exchange, d.rec.RoutingKey, d.rec.Redelivered = m.Exchange, m.RoutingKey, m.Redelivered
	c.startContent(ch, d, f, m, &m.DeliveryTag, out)
	return false, nil
}

// downConfirm handles the broker's basic.ack and basic.nack: publisher
// confirms. Serving, quiesced and stopped they pass; on a channel where the
// sidecar absorbed publishes while replaying, and confirmed them itself,
// they are renumbered to follow on (renumberConfirm).
func (c *conn) downConfirm(ch *channel, f amqpwire.Frame, key amqpwire.MethodKey, out *[]byte) (bool, error) {
	if ch.absorbed == 0 {
		return true, nil
	}
	return false, c.renumberConfirm(ch, f, key, out)
}

// downReturn handles basic.return, the same in every mode: it passes with
// its content, which is neither held nor logged.
func (c *conn) downReturn(ch *channel) (bool, error) {
	ch.down = &content{}
	return true, nil
}

// downGetEmpty handles basic.get-empty, the same in every mode: it passes,
// and answers the channel's oldest pending basic.get.
func (c *conn) downGetEmpty(ch *channel) (bool, error) {
	if len(ch.gets) > 0 {
		ch.gets = ch.gets[1:]
	}
	return true, nil
}

// downConsumeOk handles basic.consume-ok, which confirms the channel's
// oldest pending consume; its consumer counts from now on.
//   - Serving, quiesced: it passes.
//   - Stopped: it passes, and the sidecar cancels the consumer at once: the
//     broker confirmed it after the stop cancelled the others.
//   - The sidecar's own consumes (Resume after a stop; the switch to the
//     broker at the end of a replay) are not the app's to see: their
//     consume-ok stops here, and a switch's marks when the target took the
//     queue over.
func (c *conn) downConsumeOk(ch *channel, f amqpwire.Frame) (bool, error) {
	m, err := decode[*amqpwire.BasicConsumeOk](f.Payload)
	if err != nil {
		return false, err
	}
	if len(ch.consumes) == 0 {
		return true, nil // not one we saw; pass it on
	}
	pc := ch.consumes[0]
	ch.consumes = ch.consumes[1:]
	pc.m.ConsumerTag = m.ConsumerTag
	cons := &consumer{queue: pc.m.Queue, noAck: pc.m.NoAck, consume: pc.m}
	ch.consumers[m.ConsumerTag] = cons
	if c.mode == Stopped {
		c.cancelLocked(ch.id, ch, m.ConsumerTag, cons)
	}
	if !pc.bySidecar {
		return true, nil
	}
	if pc.switching {
		c.p.markSwitched(c.p.opts.Now())
	}
	return false, nil
}

// downCancelOk handles basic.cancel-ok: the consumer is gone. It passes,
// except in answer to the sidecar's own cancel (Stop's), in any mode.
func (c *conn) downCancelOk(ch *channel, f amqpwire.Frame) (bool, error) {
	m, err := decode[*amqpwire.BasicCancelOk](f.Payload)
	if err != nil {
		return false, err
	}
	delete(ch.consumers, m.ConsumerTag)
	if ch.awaitCancelOk[m.ConsumerTag] {
		delete(ch.awaitCancelOk, m.ConsumerTag)
		return false, nil
	}
	return true, nil
}

// downCancel handles a basic.cancel from the broker (the consumer's queue
// was deleted, say), the same in every mode: it passes, and the consumer is
// forgotten, with any cancel of the sidecar's still waiting for it.
func (c *conn) downCancel(ch *channel, f amqpwire.Frame) (bool, error) {
	m, err := decode[*amqpwire.BasicCancel](f.Payload)
	if err != nil {
		return false, err
	}
	delete(ch.consumers, m.ConsumerTag)
	delete(ch.awaitCancelOk, m.ConsumerTag)
	return true, nil
}

// downQueueDeclareOk handles queue.declare-ok, the same in every mode: it
// passes, and gives the name of a queue the app declared that a migration
// cannot replay (queues.go).
func (c *conn) downQueueDeclareOk(ch *channel, f amqpwire.Frame) (bool, error) {
	m, err := decode[*amqpwire.QueueDeclareOk](f.Payload)
	if err != nil {
		return false, err
	}
	c.onQueueDeclareOk(ch, m)
	return true, nil
}

// downChannelClose handles channel.close and channel.close-ok from the
// broker, the same in every mode: they pass and the channel is forgotten.
func (c *conn) downChannelClose(ch *channel) (bool, error) {
	c.dropChannel(ch.id)
	return true, nil
}

// renumberConfirm shifts a broker confirm's sequence number past the
// publishes the sidecar absorbed and confirmed itself.
func (c *conn) renumberConfirm(ch *channel, f amqpwire.Frame, key amqpwire.MethodKey, out *[]byte) error {
	var m amqpwire.Method
	if key == amqpwire.KeyBasicAck {
		a, err := decode[*amqpwire.BasicAck](f.Payload)
		if err != nil {
			return err
		}
		a.DeliveryTag += ch.absorbed
		m = a
	} else {
		n, err := decode[*amqpwire.BasicNack](f.Payload)
		if err != nil {
			return err
		}
		n.DeliveryTag += ch.absorbed
		m = n
	}
	*out = amqpwire.AppendMethodFrame(*out, f.Channel, m)
	return nil
}

// startContent begins a delivery on ch with its method frame m, whose
// delivery tag is *tag. On a renumbered channel the frame goes out with the
// sidecar's tag instead of the broker's.
//
// A redelivery, while the app has acked messages whose acks may not have
// reached the broker, waits for its content: complete decides whether it
// is absorbed, and only then does its method frame go out (checked).
func (c *conn) startContent(ch *channel, d *content, f amqpwire.Frame, m amqpwire.Method, tag *uint64, out *[]byte) {
	ch.down = d
	if d.rec.Redelivered && !c.p.ackedLost.empty() {
		d.check, d.method, d.tagp = true, m, tag
		return
	}
	if !ch.renumber {
		c.emit(d, f, out)
		return
	}
	ch.appTag++
	*tag, d.tag = ch.appTag, ch.appTag
	c.emitRaw(d, amqpwire.AppendMethodFrame(nil, f.Channel, m), out)
}

// emit passes a frame of a content on, or keeps it while the content is held.
func (c *conn) emit(d *content, f amqpwire.Frame, out *[]byte) {
	c.emitRaw(d, f.Raw, out)
}

func (c *conn) emitRaw(d *content, raw []byte, out *[]byte) {
	if d.held || d.check {
		d.raw = append(d.raw, raw...)
		return
	}
	*out = append(*out, raw...)
}

// complete finishes a content whose last frame has arrived.
func (c *conn) complete(ch *channel, d *content, out *[]byte) {
	ch.down = nil
	if !d.record {
		return
	}
	if d.check {
		d.check = false
		if c.p.ackedLost.take(printOf(&d.rec)) {
			c.absorbRedelivery(ch, d, out)
			return
		}
		c.checked(ch, d, out)
	}
	switch {
	case !d.held:
		c.deliverLocked(ch, d)
	case d.noAck && c.requeued:
		// Auto-ack: the broker already forgot it, so it cannot go back.
		// Hand it to the app rather than lose it.
		*out = append(*out, d.raw...)
		c.deliverLocked(ch, d)
	case c.requeued:
		c.late = amqpwire.AppendMethodFrame(c.late, ch.id, &amqpwire.BasicReject{DeliveryTag: d.upTag, Requeue: true})
		c.p.opts.Metrics.requeued.Inc()
	default:
		ch.held = append(ch.held, d)
	}
}

// checked sends on a redelivery that was not absorbed: its method frame,
// with the app's tag on a renumbered channel, then its content.
func (c *conn) checked(ch *channel, d *content, out *[]byte) {
	if ch.renumber {
		ch.appTag++
		*d.tagp, d.tag = ch.appTag, ch.appTag
	}
	frames := amqpwire.AppendMethodFrame(nil, ch.id, d.method)
	frames = append(frames, d.raw...)
	d.raw = nil
	c.emitRaw(d, frames, out)
}

// deliverLocked tees a delivery the app now has, and tracks it until the app
// settles it.
func (c *conn) deliverLocked(ch *channel, d *content) {
	now := c.p.opts.Now()
	d.rec.Time = now
	var print messagePrint
	if !d.noAck || d.rec.Redelivered {
		print = printOf(&d.rec)
	}
	if d.rec.Redelivered {
		d.rec.Repeats = c.p.requeuedMsgs.take(print)
		if d.rec.Repeats != 0 {
			c.p.opts.Metrics.repeats.Inc()
		}
	}
	id, tk := c.p.tee.Append(d.rec)
	if c.p.opts.Replay != nil {
		c.p.markPrimary(now)
	}
	c.p.tracker.Delivered(d.rec.Queue, id, now, !d.noAck)
	c.p.opts.Metrics.deliveries.WithLabelValues(d.rec.Queue).Inc()
	if !d.noAck {
		ch.outstanding = append(ch.outstanding, delivery{tag: d.tag, upTag: d.upTag, id: id, ticket: tk, queue: d.rec.Queue, at: now,
			print: print, first: cmp.Or(d.rec.Repeats, id)})
	}
	d.raw = nil
}

// protocolError closes both sides after a malformed or unexpected frame:
// the side that sent it gets the AMQP error, the other a forced close.
func (c *conn) protocolError(side string, err error) {
	var ae *amqpwire.Error
	if !errors.As(err, &ae) {
		ae = &amqpwire.Error{Code: amqpwire.FrameError, Text: err.Error()}
	}
	c.p.opts.Metrics.frameErrors.WithLabelValues(side).Inc()
	c.log.Error("closing the connection: malformed frame", "from", side, "code", ae.Code, "err", ae.Text)
	text := shortstr(fmt.Sprintf("%s (from the sidecar)", ae.Text))
	offender := amqpwire.AppendMethodFrame(nil, 0, &amqpwire.ConnectionClose{ReplyCode: ae.Code, ReplyText: text})
	other := amqpwire.AppendMethodFrame(nil, 0, &amqpwire.ConnectionClose{ReplyCode: amqpwire.ConnectionForced,
		ReplyText: shortstr(fmt.Sprintf("the %s sent a malformed frame: %s", side, ae.Text))})
	toApp, toUp := other, offender
	if side == "app" {
		toApp, toUp = offender, other
	}
	c.writeAppRaw(toApp)
	c.upMu.Lock()
	_, _ = c.up.Write(toUp) // a courtesy: the connection closes next either way
	c.upMu.Unlock()
	c.abort()
}

func shortstr(s string) string {
	if len(s) > 255 {
		return s[:255]
	}
	return s
}
