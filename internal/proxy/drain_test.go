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
