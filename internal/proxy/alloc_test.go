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
