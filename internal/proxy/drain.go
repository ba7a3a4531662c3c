package proxy

import (
	"bytes"
	"errors"
	"time"

	"github.com/ms2m/ms2m/internal/amqpwire"
)

// What the sidecar does when the broker's connection goes while the app
// holds deliveries. The broker takes back every delivery it has no ack
// of and hands each out again (redelivered set). An app that worked on
// one and folded it would fold it twice: its ack fails with the closed
// connection. So, instead of closing the app's connection at once, the
// sidecar drains it (drainApp): for up to Options.LossDrain, or until the
// app holds no delivery, it reads on and settles the app's acks, nacks
// and rejects, and remembers the messages the app acked (Proxy.ackedLost),
// with those it acked shortly before the loss, whose acks may have been
// lost with the connection. Any other frame from the app ends the drain at
// once. Then the app's connection closes, as before. When the broker
// redelivers one of those messages, on any connection, the sidecar acks
// it upstream itself and the app never sees it (absorbRedelivery).
//
// A broker that closes the connection itself (connection.close: a graceful
// shutdown or restart, a connection closed by an operator) takes back the
// app's deliveries just the same, and frames the app sends after it are
// discarded. So the sidecar answers the close with close-ok itself, keeps
// it from the app, and drains as for a loss, from the close on
// (brokerClosed); once the drain ends, the app gets the broker's close,
// its reply code and text, and its connection closes (closeApp).

// recentAckWindow is how long before the sidecar last heard from the
// broker an ack counts as maybe lost with the broker's connection.
const recentAckWindow = 2 * time.Second

// closeOkWait is how long, after it got the broker's connection.close at
// the end of a drain, the app has to answer close-ok and hang up before
// the sidecar closes its connection.
const closeOkWait = time.Second

// errBrokerClosed ends pumpDown once the broker closed the connection.
var errBrokerClosed = errors.New("the broker closed the connection")

// drainApp runs once pumpDown ended: if the broker's connection went, or
// the broker closed it (and not the app's, nor by a connection.close the
// app began), it keeps the app's connection while the app settles what it
// holds, within LossDrain.
func (c *conn) drainApp() {
	if c.ctx.Err() != nil || c.appDone.Load() {
		return
	}
	c.mu.Lock()
	if c.closing || c.drainEnded {
		c.mu.Unlock()
		return
	}
	c.startDrainLocked()
	held := c.outstandingLocked()
	if held == 0 {
		c.endDrainLocked()
	}
	c.mu.Unlock()
	if held == 0 {
		return
	}
	c.log.Info("the broker's connection is gone or closed; waiting for the app to settle the deliveries it holds before closing its connection",
		"outstanding", held, "within", c.p.opts.LossDrain)
	t := time.NewTimer(c.p.opts.LossDrain)
	defer t.Stop()
	select {
	case <-c.drained:
	case <-t.C:
		c.log.Warn("the app did not settle its deliveries within the drain: the broker redelivers them", "within", c.p.opts.LossDrain)
	case <-c.ctx.Done():
	}
	c.mu.Lock()
	c.endDrainLocked()
	c.mu.Unlock()
}

// startDrainLocked starts the drain, once: what the app acked from here on,
// and in the recentAckWindow before the sidecar last heard from the
// broker, is remembered as acked but maybe not by the broker. Callers
// hold c.mu.
func (c *conn) startDrainLocked() {
	if c.draining {
		return
	}
	c.draining = true
	c.recent.since(c.lastDown.Add(-recentAckWindow), c.p.ackedLost.add)
	c.recent = recentAcks{}
}

// brokerClosed handles the broker's own connection.close, f: the sidecar
// answers close-ok, keeps the close for the app (closeApp) and starts the
// drain at once, so that no ack of the app's goes to a broker that
// discards it. pumpDown ends after it (errBrokerClosed). It runs with c.mu
// held.
func (c *conn) brokerClosed(f amqpwire.Frame) error {
	m, err := decode[*amqpwire.ConnectionClose](f.Payload)
	if err != nil {
		return err
	}
	c.upClose = bytes.Clone(f.Raw)
	c.late = amqpwire.AppendMethodFrame(c.late, 0, &amqpwire.ConnectionCloseOk{})
	c.startDrainLocked()
	c.log.Info("the broker closed the connection; the app gets its close once it settled what it holds",
		"code", m.ReplyCode, "text", m.ReplyText, "outstanding", c.outstandingLocked())
	return nil
}

// closeApp closes the app's connection once the drain is over. After a
// connection.close of the broker's, the app gets that close first (or,
// had it asked to close in the drain, the close-ok), and closeOkWait to
// answer and hang up.
func (c *conn) closeApp() {
	c.mu.Lock()
	last := c.upClose
	if last != nil && c.appClose {
		last = amqpwire.AppendMethodFrame(nil, 0, &amqpwire.ConnectionCloseOk{})
	}
	c.mu.Unlock()
	if last != nil && c.ctx.Err() == nil && !c.appDone.Load() {
		c.writeApp(last)
		t := time.NewTimer(closeOkWait)
		select {
		case <-c.appGone:
		case <-t.C:
		case <-c.ctx.Done():
		}
		t.Stop()
	}
	c.app.Close()
}

// endDrainLocked ends the drain, once. Callers hold c.mu.
func (c *conn) endDrainLocked() {
	if !c.drainEnded {
		c.drainEnded = true
		close(c.drained)
	}
}

// outstandingLocked counts the broker deliveries the app holds.
func (c *conn) outstandingLocked() int {
	n := 0
	for _, ch := range c.chans {
		n += len(ch.outstanding)
	}
	return n
}

// onDrainFrame handles a frame from the app while the connection drains:
// nothing goes to the broker. Acks, nacks and rejects settle what they
// cover (settle remembers what an ack covers); anything else ends the
// drain, as does the app's last outstanding delivery settled. A
// connection.close of the app's is noted: after a close of the broker's,
// closeApp answers it close-ok.
func (c *conn) onDrainFrame(f amqpwire.Frame) error {
	if c.drainEnded || f.Type == amqpwire.FrameHeartbeat {
		return nil
	}
	if f.Type != amqpwire.FrameMethod {
		c.endDrainLocked()
		return nil
	}
	key, err := amqpwire.PayloadKey(f.Payload)
	if err != nil {
		return err
	}
	if f.Channel == 0 {
		c.appClose = key == amqpwire.KeyConnectionClose
		c.endDrainLocked()
		return nil
	}
	ch := c.channel(f.Channel)
	var seg segment // goes nowhere
	switch key {
	case amqpwire.KeyBasicAck:
		_, err = c.upAck(ch, f, &seg)
	case amqpwire.KeyBasicNack:
		_, err = c.upNack(ch, f, &seg)
	case amqpwire.KeyBasicReject:
		_, err = c.upReject(ch, f, &seg)
	default:
		c.endDrainLocked()
		return nil
	}
	if err != nil {
		return err
	}
	if c.outstandingLocked() == 0 {
		c.endDrainLocked()
	}
	return nil
}

// noteAcked remembers deliveries the app acked: while draining, as acks
// the broker never got; else as recent ones, in case its connection goes.
// Callers hold c.mu.
func (c *conn) noteAcked(covered []delivery, now time.Time) {
	for _, d := range covered {
		if c.draining {
			c.p.ackedLost.add(d.print)
			continue
		}
		c.recent.add(recentAck{print: d.print, at: now})
	}
}

// absorbRedelivery takes d, a redelivery of a message the app acked
// already (Proxy.ackedLost), out of the app's way: the sidecar acks it
// upstream (after what it sent before; pumpDown queues it before the app
// sees anything that follows), it is not logged, and the channel numbers
// the app's delivery tags from here on (renumber), so that they stay
// contiguous. A basic.get answered by it gets get-empty. Callers hold c.mu.
func (c *conn) absorbRedelivery(ch *channel, d *content, out *[]byte) {
	if !ch.renumber {
		// So far the app's tags are the broker's, all of them below d's.
		ch.renumber = true
		ch.appTag = d.upTag - 1
	}
	if !d.noAck {
		c.late = amqpwire.AppendMethodFrame(c.late, ch.id, &amqpwire.BasicAck{DeliveryTag: d.upTag})
	}
	if d.get {
		*out = amqpwire.AppendMethodFrame(*out, ch.id, &amqpwire.BasicGetEmpty{})
	}
	c.p.opts.Metrics.absorbed.Inc()
	c.log.Info("absorbed a redelivery of a message the app acked while the broker's connection went",
		"queue", d.rec.Queue, "channel", ch.id, "delivery_tag", d.upTag)
}
