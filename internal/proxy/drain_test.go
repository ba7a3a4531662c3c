package proxy

import (
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/amqpwire"
)

// redeliver has the broker redeliver tag on consumer c1.
func (pp *pipeProxy) redeliver(tag uint64, body string) {
	pp.broker.sendContent(&amqpwire.BasicDeliver{ConsumerTag: "c1", DeliveryTag: tag, RoutingKey: "q", Redelivered: true}, body)
}

// waitDraining waits until the connection drains.
func (pp *pipeProxy) waitDraining(t *testing.T) {
	t.Helper()
	waitFor(t, "the connection drains", func() bool {
		pp.c.mu.Lock()
		defer pp.c.mu.Unlock()
		return pp.c.draining
	})
}

// expectClosed waits until the proxy closed pe's connection.
func expectClosed(t *testing.T, pe *peer) {
	t.Helper()
	select {
	case f, ok := <-pe.frames:
		if ok {
			t.Fatalf("%s got %v, want its connection closed", pe.name, f)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the connection is still open after 5s", pe.name)
	}
}

// TestPipeBrokerLossDrainsAndAbsorbs: when the broker's connection goes
// while the app holds a delivery, the app's connection stays open until
// the app acked it, then closes. The broker redelivers that message; the
// sidecar acks the redelivery itself and keeps it from the app and out of
// the log, and the app's tags stay contiguous (renumbered): a redelivery
// of a message the app did not ack, and later deliveries, follow on.
func TestPipeBrokerLossDrainsAndAbsorbs(t *testing.T) {
	pp := startPipe(t, Options{LossDrain: 5 * time.Second})
	pp.consume(t)
	pp.deliver(1, "one")
	pp.expectDelivery(t, 1, "one")
	pp.broker.conn.Close() // the broker's connection goes with "one" in the app's hands
	pp.waitDraining(t)
	pp.app.send(&amqpwire.BasicAck{DeliveryTag: 1})
	expectClosed(t, pp.app)

	// The app connects again; the broker redelivers "one".
	pp2 := attachPipe(t, pp.p)
	pp2.consume(t)
	pp2.deliver(1, "zero")
	pp2.redeliver(2, "one")
	pp2.redeliver(3, "other") // requeued for another reason: the app has not acked it
	pp2.deliver(4, "two")
	pp2.expectDelivery(t, 1, "zero")
	pp2.expectAck(t, 2) // the sidecar's ack of the absorbed redelivery
	m, body := expectContent[*amqpwire.BasicDeliver](pp2.app)
	if m.DeliveryTag != 2 || body != "other" || !m.Redelivered {
		t.Fatalf("app got %+v %q, want the redelivery of \"other\" as tag 2", m, body)
	}
	pp2.expectDelivery(t, 3, "two")
	pp2.app.send(&amqpwire.BasicAck{DeliveryTag: 3, Multiple: true})
	if a := expect[*amqpwire.BasicAck](pp2.broker); a.DeliveryTag != 4 || !a.Multiple {
		t.Fatalf("broker got %+v, want a multiple ack of its tag 4", a)
	}
	if n := pp.tee.records(); n != 4 {
		t.Fatalf("log holds %d records, want 4: one, zero, other, two (not one's redelivery)", n)
	}
	if !pp.p.ackedLost.empty() {
		t.Fatal("the absorbed message is still remembered")
	}
}

// TestPipeBrokerLossOtherFrameEndsDrain: a frame from the app other than
// a settlement ends the drain at once; a delivery it did not ack is not
// remembered, and its redelivery goes to the app.
func TestPipeBrokerLossOtherFrameEndsDrain(t *testing.T) {
	pp := startPipe(t, Options{LossDrain: 5 * time.Second})
	pp.consume(t)
	pp.deliver(1, "one")
	pp.expectDelivery(t, 1, "one")
	pp.broker.conn.Close()
	pp.waitDraining(t)
	pp.app.send(&amqpwire.BasicQos{PrefetchCount: 1})
	expectClosed(t, pp.app)
	if !pp.p.ackedLost.empty() {
		t.Fatal("a message the app did not ack is remembered as acked")
	}
	pp2 := attachPipe(t, pp.p)
	pp2.consume(t)
	pp2.redeliver(1, "one")
	m, body := expectContent[*amqpwire.BasicDeliver](pp2.app)
	if m.DeliveryTag != 1 || body != "one" {
		t.Fatalf("app got %+v %q, want the redelivery of \"one\" as tag 1", m, body)
	}
}

// brokerClose has the broker close the connection itself, as RabbitMQ
// does on a graceful shutdown or when an operator closes the connection.
func (pp *pipeProxy) brokerClose() {
	pp.broker.write(amqpwire.AppendMethodFrame(nil, 0, &amqpwire.ConnectionClose{
		ReplyCode: amqpwire.ConnectionForced, ReplyText: "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"}))
}

// expectBrokerClose reads the next frame at the app and checks it is the
// broker's connection.close, its code and text as the broker sent them.
func expectBrokerClose(t *testing.T, pe *peer) {
	t.Helper()
	f := pe.next()
	m, ok := f.method.(*amqpwire.ConnectionClose)
	if !ok || f.channel != 0 || m.ReplyCode != amqpwire.ConnectionForced || m.ReplyText != "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'" {
		t.Fatalf("%s got %v, want the broker's connection.close (320, its text)", pe.name, f)
	}
}

// closeHolding has the broker close the connection while the app holds
// the delivery "one" (tag 1), and waits until the sidecar answered the
// close (close-ok, at once) and the connection drains.
func closeHolding(t *testing.T) *pipeProxy {
	t.Helper()
	pp := startPipe(t, Options{LossDrain: 5 * time.Second})
	pp.consume(t)
	pp.deliver(1, "one")
	pp.expectDelivery(t, 1, "one")
	pp.brokerClose()
	expect[*amqpwire.ConnectionCloseOk](pp.broker)
	pp.waitDraining(t)
	return pp
}

// TestPipeBrokerCloseDrainsAndAbsorbs: when the broker closes the
// connection itself (connection.close) while the app holds a delivery, the
// sidecar answers close-ok, and the app keeps its connection until it
// acked the delivery; only then does it get the broker's close, with the
// broker's code and text. Its ack does not go to the broker (which
// discards frames after its close) but is remembered: the redelivery on
// the next connection is absorbed. Before, the close went to the app at
// once and its ack was lost: the message was folded twice.
func TestPipeBrokerCloseDrainsAndAbsorbs(t *testing.T) {
	pp := closeHolding(t)
	select {
	case f := <-pp.app.frames:
		t.Fatalf("app got %v while it holds a delivery, want nothing until it settled it", f)
	case <-time.After(100 * time.Millisecond):
	}
	pp.app.send(&amqpwire.BasicAck{DeliveryTag: 1})
	expectBrokerClose(t, pp.app)
	pp.app.write(amqpwire.AppendMethodFrame(nil, 0, &amqpwire.ConnectionCloseOk{}))
	expectClosed(t, pp.app)
	expectClosed(t, pp.broker) // the ack and the app's close-ok went nowhere

	pp2 := attachPipe(t, pp.p)
	pp2.consume(t)
	pp2.redeliver(1, "one")
	pp2.deliver(2, "two")
	pp2.expectAck(t, 1) // the sidecar's ack of the absorbed redelivery
	pp2.expectDelivery(t, 1, "two")
	if n := pp.tee.records(); n != 2 {
		t.Fatalf("log holds %d records, want 2: one, two (not one's redelivery)", n)
	}
}

// TestPipeBrokerCloseNothingHeld: a broker's connection.close while the
// app holds nothing (a refused handshake, say) reaches the app at once,
// with its code and text; the close-ok to the broker is the sidecar's.
func TestPipeBrokerCloseNothingHeld(t *testing.T) {
	pp := startPipe(t, Options{LossDrain: 5 * time.Second})
	pp.consume(t)
	pp.brokerClose()
	expect[*amqpwire.ConnectionCloseOk](pp.broker)
	expectBrokerClose(t, pp.app)
	pp.app.write(amqpwire.AppendMethodFrame(nil, 0, &amqpwire.ConnectionCloseOk{}))
	expectClosed(t, pp.app)
}

// TestPipeBrokerCloseAppCloses: an app that closes its connection during
// the drain after a broker's close gets close-ok, not the broker's close
// on top of its own; the delivery it did not ack is not remembered.
func TestPipeBrokerCloseAppCloses(t *testing.T) {
	pp := closeHolding(t)
	pp.app.write(amqpwire.AppendMethodFrame(nil, 0, &amqpwire.ConnectionClose{ReplyCode: 200, ReplyText: "bye"}))
	if f := pp.app.next(); f.channel != 0 {
		t.Fatalf("app got %v, want connection.close-ok", f)
	} else if _, ok := f.method.(*amqpwire.ConnectionCloseOk); !ok {
		t.Fatalf("app got %v, want connection.close-ok", f)
	}
	expectClosed(t, pp.app)
	if !pp.p.ackedLost.empty() {
		t.Fatal("a message the app did not ack is remembered as acked")
	}
}
