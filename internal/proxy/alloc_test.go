package proxy

import (
	"log/slog"
	"testing"

	"github.com/ms2m/ms2m/internal/amqpwire"
	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// countTee is a replay log that keeps nothing: the allocation guard
// measures the proxy, not a log.
type countTee struct{ memTee }

func (t *countTee) Append(shadowqueue.Record) (uint64, shadowqueue.Ticket) {
	t.last++
	return t.last, shadowqueue.Ticket(t.last)
}

// passDown does what pumpDown does with a chunk from the broker, without
// the connections: it parses it under c.mu and returns what goes to the
// app.
func passDown(t testing.TB, c *conn, chunk, out []byte) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.downP.Parse(chunk, func(f amqpwire.Frame) error { return c.onDown(f, &out) }); err != nil {
		t.Fatal(err)
	}
	if len(c.late) > 0 {
		t.Fatalf("the sidecar made frames of its own for the broker: %x", c.takeLateLocked())
	}
	return out
}

// passUp does what pumpUp does with a chunk from the app, without the
// connections: it parses it under c.mu into a new segment for the broker.
func passUp(t testing.TB, c *conn, chunk []byte) segment {
	seg := segment{raw: make([]byte, 0, len(chunk))}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.upP.Parse(chunk, func(f amqpwire.Frame) error { return c.onUp(f, &seg) }); err != nil {
		t.Fatal(err)
	}
	return seg
}

// Allocations per pass-through round: a basic.deliver with a 64-byte body
// forwarded to the app, and the app's basic.ack of it forwarded to the
// broker, in serving mode. Measured when the guard was written; lower it
// when the path gets cheaper, never raise it without a reason in the
// commit.
const (
	maxAllocsDeliver = 6
	maxAllocsAck     = 5
)

// TestPassThroughAllocs guards the hot path: the proxy's work per delivery
// and per ack stays at the allocations it has now.
func TestPassThroughAllocs(t *testing.T) {
	tee := &countTee{}
	p := New(tee, Options{Logger: slog.New(slog.DiscardHandler)})
	c := newConn(p, 1, nil, nil, p.log)
	passUp(t, c, amqpwire.AppendMethodFrame(nil, 1, &amqpwire.BasicConsume{Queue: "q", ConsumerTag: "c1"}))
	passDown(t, c, amqpwire.AppendMethodFrame(nil, 1, &amqpwire.BasicConsumeOk{ConsumerTag: "c1"}), nil)

	const runs = 200
	body := make([]byte, 64)
	delivers := make([][]byte, runs+1) // AllocsPerRun runs once more to warm up
	acks := make([][]byte, runs+1)
	for i := range delivers {
		tag := uint64(i + 1)
		b := amqpwire.AppendMethodFrame(nil, 1, &amqpwire.BasicDeliver{ConsumerTag: "c1", DeliveryTag: tag, Exchange: "x", RoutingKey: "q"})
		b = amqpwire.AppendRawHeaderFrame(b, 1, amqpwire.ClassBasic, uint64(len(body)), []byte{0, 0})
		delivers[i] = amqpwire.AppendBodyFrames(b, 1, body, 0)
		acks[i] = amqpwire.AppendMethodFrame(nil, 1, &amqpwire.BasicAck{DeliveryTag: tag})
	}

	out := make([]byte, 0, 4096)
	i := 0
	deliver := testing.AllocsPerRun(runs, func() {
		out = passDown(t, c, delivers[i], out[:0])
		i++
	})
	if len(out) != len(delivers[0]) {
		t.Fatalf("the app got %d bytes of the last delivery, want %d", len(out), len(delivers[0]))
	}
	i = 0
	var seg segment
	ack := testing.AllocsPerRun(runs, func() {
		seg = passUp(t, c, acks[i])
		i++
	})
	if len(seg.raw) != len(acks[0]) || seg.gated {
		t.Fatalf("the broker got %d bytes (gated %v) for the last ack, want the ack's %d, ungated", len(seg.raw), seg.gated, len(acks[0]))
	}
	if n := len(c.chans[1].outstanding); n != 0 {
		t.Fatalf("%d deliveries left unsettled, want 0", n)
	}
	t.Logf("allocations: %v per delivery, %v per ack", deliver, ack)
	if deliver > maxAllocsDeliver {
		t.Errorf("a delivery forwarded to the app allocates %v times, want at most %d", deliver, maxAllocsDeliver)
	}
	if ack > maxAllocsAck {
		t.Errorf("an ack forwarded to the broker allocates %v times, want at most %d", ack, maxAllocsAck)
	}
}

// BenchmarkPassThrough is one round of the guarded path: a delivery with a
// 64-byte body to the app and the app's ack of it to the broker.
func BenchmarkPassThrough(b *testing.B) {
	p := New(&countTee{}, Options{Logger: slog.New(slog.DiscardHandler)})
	c := newConn(p, 1, nil, nil, p.log)
	passUp(b, c, amqpwire.AppendMethodFrame(nil, 1, &amqpwire.BasicConsume{Queue: "q", ConsumerTag: "c1"}))
	passDown(b, c, amqpwire.AppendMethodFrame(nil, 1, &amqpwire.BasicConsumeOk{ConsumerTag: "c1"}), nil)
	deliver := amqpwire.AppendMethodFrame(nil, 1, &amqpwire.BasicDeliver{ConsumerTag: "c1", DeliveryTag: 1, Exchange: "x", RoutingKey: "q"})
	deliver = amqpwire.AppendRawHeaderFrame(deliver, 1, amqpwire.ClassBasic, 64, []byte{0, 0})
	deliver = amqpwire.AppendBodyFrames(deliver, 1, make([]byte, 64), 0)
	// The tags' offsets: frame header (7), class and method ids (4), then
	// the consumer tag's shortstr for a delivery.
	tagAt, ackTagAt := 7+4+1+len("c1"), 7+4
	ack := amqpwire.AppendMethodFrame(nil, 1, &amqpwire.BasicAck{DeliveryTag: 1})
	putTag(deliver[tagAt:], 7)
	putTag(ack[ackTagAt:], 7)
	if d, ok := firstMethod(b, deliver).(*amqpwire.BasicDeliver); !ok || d.DeliveryTag != 7 {
		b.Fatalf("the delivery tag is not at offset %d", tagAt)
	}
	if a, ok := firstMethod(b, ack).(*amqpwire.BasicAck); !ok || a.DeliveryTag != 7 {
		b.Fatalf("the ack's tag is not at offset %d", ackTagAt)
	}
	out := make([]byte, 0, 4096)
	b.ReportAllocs()
	for i := range b.N {
		tag := uint64(i + 1)
		putTag(deliver[tagAt:], tag)
		putTag(ack[ackTagAt:], tag)
		out = passDown(b, c, deliver, out[:0])
		passUp(b, c, ack)
	}
}

func putTag(b []byte, tag uint64) {
	for i := range 8 {
		b[i] = byte(tag >> (56 - 8*i))
	}
}

// firstMethod decodes the first frame of raw as a method.
func firstMethod(tb testing.TB, raw []byte) amqpwire.Method {
	var m amqpwire.Method
	err := amqpwire.NewParser(0).Parse(raw, func(f amqpwire.Frame) error {
		if m == nil {
			var err error
			m, err = amqpwire.DecodeMethod(f.Payload)
			return err
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return m
}
