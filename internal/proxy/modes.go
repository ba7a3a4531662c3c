package proxy

import "github.com/ms2m/ms2m/internal/amqpwire"

// A connection's side of the mode changes that Proxy.Quiesce, Stop and
// Resume make: what happens to the deliveries held and the consumers
// cancelled. What each method does in each mode is with its handler
// (conn_up.go, conn_down.go).

// setMode switches what the connection does with new deliveries.
func (c *conn) setMode(m Mode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mode = m
}

// unsettled reports the deliveries the app has not settled and the segments
// not yet written to the broker.
func (c *conn) unsettled() (inFlight, queued int) {
	c.mu.Lock()
	for _, ch := range c.chans {
		inFlight += len(ch.outstanding)
	}
	c.mu.Unlock()
	return inFlight, int(c.queued.Load())
}

func (c *conn) heldCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ch := range c.chans {
		n += len(ch.held)
	}
	return n
}

// cancelConsumers cancels every consumer of the app upstream, on stop.
func (c *conn) cancelConsumers() {
	c.mu.Lock()
	for id, ch := range c.chans {
		for tag, cons := range ch.consumers {
			if !ch.awaitCancelOk[tag] {
				c.cancelLocked(id, ch, tag, cons)
			}
		}
	}
	late := c.takeLateLocked()
	c.mu.Unlock()
	c.push(segment{raw: late})
}

func (c *conn) cancelLocked(id uint16, ch *channel, tag string, cons *consumer) {
	ch.awaitCancelOk[tag] = true
	ch.cancelled = append(ch.cancelled, cons)
	c.late = amqpwire.AppendMethodFrame(c.late, id, &amqpwire.BasicCancel{ConsumerTag: tag})
}

// cancelsPending reports whether a sidecar cancel, or a consume that the
// stop must cancel once it is confirmed, is still unanswered.
func (c *conn) cancelsPending() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.chans {
		if len(ch.awaitCancelOk) > 0 || len(ch.consumes) > 0 {
			return true
		}
	}
	return false
}

// releaseHeld ends the holding of deliveries, on stop: by default the app
// gets every held delivery, so that it takes the broker's deliveries in
// the broker's order; with requeue they go back to the broker. Auto-ack
// deliveries cannot go back; the app gets them either way. Deliveries that
// still arrive later (a basic.get answered late) go back to the broker.
func (c *conn) releaseHeld(requeue bool) (handed, requeued int) {
	c.mu.Lock()
	var toApp []byte
	for id, ch := range c.chans {
		for _, d := range ch.held {
			if !requeue || d.noAck {
				toApp = append(toApp, d.raw...)
				c.deliverLocked(ch, d)
				handed++
				continue
			}
			c.late = amqpwire.AppendMethodFrame(c.late, id, &amqpwire.BasicReject{DeliveryTag: d.upTag, Requeue: true})
			requeued++
		}
		ch.held = nil
	}
	c.requeued = true
	late := c.takeLateLocked()
	if len(toApp) > 0 {
		c.writeApp(toApp)
	}
	c.mu.Unlock()
	c.push(segment{raw: late})
	c.p.opts.Metrics.heldHanded.Add(float64(handed))
	c.p.opts.Metrics.requeued.Add(float64(requeued))
	return handed, requeued
}

// resume hands held deliveries to the app and, after a stop, consumes again.
func (c *conn) resume(afterStop bool) {
	c.mu.Lock()
	c.mode = Serving
	c.requeued = false
	var toApp []byte
	for id, ch := range c.chans {
		for _, d := range ch.held {
			toApp = append(toApp, d.raw...)
			c.deliverLocked(ch, d)
		}
		ch.held = nil
		if afterStop {
			for _, cons := range ch.cancelled {
				m := *cons.consume
				m.NoWait = false
				ch.consumes = append(ch.consumes, pendingConsume{m: &m, bySidecar: true})
				c.late = amqpwire.AppendMethodFrame(c.late, id, &m)
			}
			ch.cancelled = nil
		}
	}
	if len(toApp) > 0 {
		c.writeApp(toApp)
	}
	late := c.takeLateLocked()
	c.mu.Unlock()
	c.push(segment{raw: late})
}
