package proxy

import (
	"slices"
	"testing"

	"github.com/ms2m/ms2m/internal/amqpwire"
	"github.com/ms2m/ms2m/internal/shadowqueue"
)

func TestRequeuedMessages(t *testing.T) {
	var m requeuedMessages
	a, b := messagePrint(1), messagePrint(2)
	if got := m.take(a); got != 0 {
		t.Fatalf("take from empty = %d, want 0", got)
	}
	m.add(a, 10)
	m.add(b, 11)
	m.add(a, 12) // the same body again: taken oldest first
	if got := m.take(a); got != 10 {
		t.Errorf("take a = %d, want 10", got)
	}
	// The redelivery of 10 goes back too: it still repeats 10.
	m.add(a, 10)
	if got := m.take(a); got != 12 {
		t.Errorf("take a = %d, want 12", got)
	}
	if got := m.take(a); got != 10 {
		t.Errorf("take a = %d, want 10", got)
	}
	if got := m.take(a); got != 0 {
		t.Errorf("take a = %d, want 0: each message is taken once", got)
	}
	if got := m.take(b); got != 11 {
		t.Errorf("take b = %d, want 11", got)
	}
	if n := m.len(); n != 0 {
		t.Errorf("%d left, want 0", n)
	}
}

func TestRequeuedMessagesBounded(t *testing.T) {
	var m requeuedMessages
	for i := range maxRequeuedMessages + 10 {
		m.add(messagePrint(i%3), uint64(i+1))
	}
	if n := m.len(); n != maxRequeuedMessages {
		t.Fatalf("%d kept, want %d", n, maxRequeuedMessages)
	}
	// The oldest ten are gone: print 0's oldest left is the first add of
	// it after them.
	if got := m.take(0); got != 13 {
		t.Errorf("take 0 = %d, want 13", got)
	}
	// A taken entry's later eviction removes nothing else.
	for i := range maxRequeuedMessages {
		m.add(messagePrint(7), uint64(100000+i))
	}
	if n := m.len(); n != maxRequeuedMessages {
		t.Errorf("%d kept, want %d", n, maxRequeuedMessages)
	}
}

func TestPrintOf(t *testing.T) {
	r := shadowqueue.Record{Queue: "q", Exchange: "x", RoutingKey: "k", Body: []byte("body"), Properties: []byte{0, 0}}
	p := printOf(&r)
	same := r
	same.Properties = []byte{0x20, 0} // a quorum queue's redelivery adds headers
	same.Redelivered, same.ID = true, 9
	if printOf(&same) != p {
		t.Error("a redelivery with other properties prints differently")
	}
	for name, f := range map[string]func(*shadowqueue.Record){
		"queue":       func(r *shadowqueue.Record) { r.Queue = "q2" },
		"exchange":    func(r *shadowqueue.Record) { r.Exchange = "" },
		"routing key": func(r *shadowqueue.Record) { r.RoutingKey = "k2" },
		"body":        func(r *shadowqueue.Record) { r.Body = []byte("bodz") },
	} {
		other := r
		f(&other)
		if printOf(&other) == p {
			t.Errorf("another %s prints the same", name)
		}
	}
	if n := testing.AllocsPerRun(100, func() { printOf(&r) }); n != 0 {
		t.Errorf("printOf allocates %v times", n)
	}
}

// TestPipeRejectedRedeliveryRepeats: the app rejects a delivery with
// requeue; the broker's redelivery of it is logged as repeating the first,
// a new delivery of the same body is not, nor is a redelivery of one
// rejected without requeue.
func TestPipeRejectedRedeliveryRepeats(t *testing.T) {
	pp := startPipe(t, Options{})
	pp.consume(t)
	redeliver := func(tag uint64, body string) {
		pp.broker.sendContent(&amqpwire.BasicDeliver{ConsumerTag: "c1", DeliveryTag: tag, RoutingKey: "q", Redelivered: true}, body)
		if m, got := expectContent[*amqpwire.BasicDeliver](pp.app); m.DeliveryTag != tag || got != body || !m.Redelivered {
			t.Fatalf("app got %+v %q, want the redelivery %d %q", m, got, tag, body)
		}
	}
	pp.deliver(1, "one")
	pp.expectDelivery(t, 1, "one")
	pp.app.send(&amqpwire.BasicNack{DeliveryTag: 1, Requeue: true})
	expect[*amqpwire.BasicNack](pp.broker)
	redeliver(2, "one")
	pp.deliver(3, "one")
	pp.expectDelivery(t, 3, "one")
	pp.deliver(4, "two")
	pp.expectDelivery(t, 4, "two")
	pp.app.send(&amqpwire.BasicReject{DeliveryTag: 4})
	expect[*amqpwire.BasicReject](pp.broker)
	redeliver(5, "two")
	pp.app.send(&amqpwire.BasicReject{DeliveryTag: 2, Requeue: true})
	expect[*amqpwire.BasicReject](pp.broker)
	redeliver(6, "one")

	pp.tee.mu.Lock()
	defer pp.tee.mu.Unlock()
	var got []uint64
	for _, r := range pp.tee.recs {
		got = append(got, r.Repeats)
	}
	// 2 and 6 repeat 1 (6 is the redelivery of 2, itself 1's); 3 is a
	// new message with the same body; 5 was rejected without requeue.
	if want := []uint64{0, 1, 0, 0, 0, 1}; !slices.Equal(got, want) {
		t.Fatalf("Repeats of the records = %v, want %v", got, want)
	}
}
