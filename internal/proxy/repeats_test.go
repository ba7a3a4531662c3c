package proxy

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

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

// TestRequeuedMessagesSeed: a restarted sidecar remembers each message of
// the log's last deliveries once, under its first delivery's ID, and a
// redelivery is matched to the oldest printed alike.
func TestRequeuedMessagesSeed(t *testing.T) {
	rec := func(kind shadowqueue.Kind, id uint64, body string, repeats uint64) shadowqueue.Record {
		return shadowqueue.Record{Kind: kind, ID: id, Queue: "q", Exchange: "x", RoutingKey: "k", Body: []byte(body), Repeats: repeats}
	}
	del := func(id uint64, body string) shadowqueue.Record { return rec(shadowqueue.KindDelivery, id, body, 0) }
	tests := map[string]struct {
		recs      []shadowqueue.Record
		wantAdded int
		// wantTakes are, by body, the IDs take returns in turn, ending
		// with 0 where the body's entries are used up.
		wantTakes map[string][]uint64
	}{
		"none": {
			wantTakes: map[string][]uint64{"a": {0}},
		},
		"deliveries, each under its own ID": {
			recs:      []shadowqueue.Record{del(5, "a"), del(6, "b"), del(7, "c")},
			wantAdded: 3,
			wantTakes: map[string][]uint64{"a": {5, 0}, "b": {6, 0}, "c": {7, 0}},
		},
		"markers and publishes are not deliveries": {
			recs: []shadowqueue.Record{
				rec(shadowqueue.KindCutoff, 4, "", 0), del(5, "a"), rec(shadowqueue.KindResume, 5, "", 0),
				rec(shadowqueue.KindPublish, 5, "a", 0),
			},
			wantAdded: 1,
			wantTakes: map[string][]uint64{"a": {5, 0}},
		},
		"a repeat of a delivery in the tail adds nothing": {
			recs:      []shadowqueue.Record{del(5, "a"), rec(shadowqueue.KindDelivery, 9, "a", 5)},
			wantAdded: 1,
			wantTakes: map[string][]uint64{"a": {5, 0}},
		},
		"a repeat of a delivery older than the tail names that one": {
			recs:      []shadowqueue.Record{del(5, "b"), rec(shadowqueue.KindDelivery, 9, "a", 2), rec(shadowqueue.KindDelivery, 12, "a", 2)},
			wantAdded: 2,
			wantTakes: map[string][]uint64{"a": {2, 0}, "b": {5, 0}},
		},
		"an unmatched redelivery is a first": {
			recs:      []shadowqueue.Record{{Kind: shadowqueue.KindDelivery, ID: 5, Queue: "q", Exchange: "x", RoutingKey: "k", Body: []byte("a"), Redelivered: true}},
			wantAdded: 1,
			wantTakes: map[string][]uint64{"a": {5, 0}},
		},
		"the same body twice: oldest first": {
			recs:      []shadowqueue.Record{del(5, "a"), del(6, "b"), del(7, "a")},
			wantAdded: 3,
			wantTakes: map[string][]uint64{"a": {5, 7, 0}, "b": {6, 0}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var m requeuedMessages
			if got := m.seed(tc.recs); got != tc.wantAdded {
				t.Errorf("seed = %d, want %d", got, tc.wantAdded)
			}
			got := map[string][]uint64{}
			for body, want := range tc.wantTakes {
				p := printOf(&shadowqueue.Record{Queue: "q", Exchange: "x", RoutingKey: "k", Body: []byte(body)})
				for range want {
					got[body] = append(got[body], m.take(p))
				}
			}
			if diff := cmp.Diff(tc.wantTakes, got); diff != "" {
				t.Errorf("takes (-want +got):\n%s", diff)
			}
			if n := m.len(); n != 0 {
				t.Errorf("%d left after the takes, want 0", n)
			}
		})
	}
}

// TestRequeuedMessagesSeedBounded: of more deliveries than it keeps, a
// seed remembers the newest.
func TestRequeuedMessagesSeedBounded(t *testing.T) {
	var recs []shadowqueue.Record
	for id := range uint64(maxRequeuedMessages + 5) {
		recs = append(recs, shadowqueue.Record{Kind: shadowqueue.KindDelivery, ID: id + 1, Queue: "q", Body: fmt.Appendf(nil, "m-%d", id+1)})
	}
	var m requeuedMessages
	m.seed(recs)
	if n := m.len(); n != maxRequeuedMessages {
		t.Fatalf("%d kept, want %d", n, maxRequeuedMessages)
	}
	for _, c := range []struct {
		id   uint64
		want uint64
	}{{5, 0}, {6, 6}, {maxRequeuedMessages + 5, maxRequeuedMessages + 5}} {
		if got := m.take(printOf(&shadowqueue.Record{Queue: "q", Body: fmt.Appendf(nil, "m-%d", c.id)})); got != c.want {
			t.Errorf("take of delivery %d = %d, want %d", c.id, got, c.want)
		}
	}
}
