package natsproxy

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"testing"

	"github.com/ms2m/ms2m/internal/natswire"
	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// countTee is a replay log that keeps nothing and has every record
// durable at once: the allocation guard measures the proxy, not a log.
type countTee struct{ last uint64 }

func (t *countTee) Append(shadowqueue.Record) (uint64, shadowqueue.Ticket) {
	t.last++
	return t.last, shadowqueue.Ticket(t.last)
}

func (t *countTee) AppendMarker(shadowqueue.Kind) (id, epoch uint64, tk shadowqueue.Ticket) {
	t.last++
	return t.last, 1, shadowqueue.Ticket(t.last)
}
func (t *countTee) AppendCutoff([]string) (id, epoch uint64, tk shadowqueue.Ticket) {
	return t.AppendMarker(shadowqueue.KindCutoff)
}
func (t *countTee) Status() shadowqueue.TeeStatus                  { return shadowqueue.TeeStatus{} }
func (t *countTee) Durable(shadowqueue.Ticket) bool                { return true }
func (t *countTee) Wait(context.Context, shadowqueue.Ticket) error { return nil }
func (t *countTee) Continue(uint64, uint64) error                  { return nil }
func (t *countTee) WaitRoom(context.Context) error                 { return nil }
func (discardConn) Write(b []byte) (int, error)                    { return len(b), nil }
func (discardConn) Close() error                                   { return nil }

// discardConn is the app's side of the connection: what the proxy writes
// to the app goes nowhere.
type discardConn struct{ net.Conn }

// Allocations per pass-through round: a pull consumer's JetStream
// delivery (100-byte body, no header) forwarded to the app, and the app's
// +ACK of it forwarded to the server, serving: the delivery's ack subject
// (the key of the deliveries not yet acked; its body goes into a block
// shared with the deliveries around it, an allocation per 32 KiB), and
// the ack's chunk for the writer (one a read from the app, here one
// an ack). Measured when the guard
// was written; lower it when the path gets cheaper, never raise it
// without a reason in the commit.
const (
	maxAllocsDelivery = 1
	maxAllocsAck      = 1
)

// TestPassThroughAllocs guards the hot path: the proxy's work per
// JetStream delivery and per ack stays at the allocations it has now.
func TestPassThroughAllocs(t *testing.T) {
	p := New(&countTee{}, Options{Logger: slog.New(slog.DiscardHandler), MaxUnacked: 1 << 20})
	c := newConn(p, discardConn{}, discardConn{}, p.log)
	ctx := t.Context()
	down, up := natswire.NewParser(0), natswire.NewParser(0)
	if _, err := c.parseApp(ctx, up, []byte("SUB _INBOX.abc 1\r\n")); err != nil {
		t.Fatal(err)
	}

	const runs = 500
	body := make([]byte, 100)
	msgs := make([][]byte, runs+1) // AllocsPerRun runs once more to warm up
	acks := make([][]byte, runs+1)
	for i := range msgs {
		reply := fmt.Appendf(nil, "$JS.ACK.ORDERS.proc.1.%d.%d.1700000000000000000.%d", i+1, i+1, runs-i)
		msgs[i] = natswire.AppendMsg(nil, []byte("_INBOX.abc"), []byte("1"), reply, nil, body)
		acks[i] = natswire.AppendPub(nil, reply, nil, nil, natswire.AckAck)
	}

	out := make([]byte, 0, 4096)
	i := 0
	delivery := testing.AllocsPerRun(runs, func() {
		var err error
		if out, err = c.passDown(down, msgs[i], out[:0]); err != nil {
			t.Fatal(err)
		}
		i++
	})
	i = 0
	ack := testing.AllocsPerRun(runs, func() {
		r, err := c.parseApp(ctx, up, acks[i])
		if err != nil || len(r.ch.data) != len(acks[i]) || r.ch.gated {
			t.Fatalf("the ack: %v, %d bytes for the server, gated %v", err, len(r.ch.data), r.ch.gated)
		}
		i++
	})
	if got := p.Stats().JSDeliveries; got != runs+1 {
		t.Fatalf("%d deliveries teed, want %d", got, runs+1)
	}
	t.Logf("allocations: %.2f per delivery, %.2f per ack", delivery, ack)
	if delivery > maxAllocsDelivery {
		t.Errorf("%.2f allocations per delivery, want at most %d", delivery, maxAllocsDelivery)
	}
	if ack > maxAllocsAck {
		t.Errorf("%.2f allocations per ack, want at most %d", ack, maxAllocsAck)
	}
}

// BenchmarkSourcePath is the source sidecar's own CPU per message on the
// pass-through path, without the network: reads of 100 pull deliveries
// from the server (100-byte bodies) teed into a real Tee, whose log has
// every write durable at once, and the app's read of their 100 acks.
// ns/op is per message.
func BenchmarkSourcePath(b *testing.B) {
	log := &gateLog{open: make(chan struct{})}
	close(log.open)
	tee := shadowqueue.NewTee(log, shadowqueue.Record{}, shadowqueue.TeeOptions{})
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan struct{})
	go func() { _ = tee.Run(ctx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	p := New(tee, Options{Logger: slog.New(slog.DiscardHandler), MaxUnacked: 1 << 20})
	c := newConn(p, discardConn{}, discardConn{}, p.log)
	down, up := natswire.NewParser(0), natswire.NewParser(0)
	if _, err := c.parseApp(ctx, up, []byte("SUB _INBOX.abc 1\r\n")); err != nil {
		b.Fatal(err)
	}
	// Ack subjects are unique per delivery, as the server's are (stream
	// sequence, delivery count): batches cycles through reads of distinct
	// ones.
	const perRead, reads = 100, 64
	body := make([]byte, 100)
	var msgs, acks [reads][]byte
	for r := range reads {
		for i := range perRead {
			seq := r*perRead + i + 1
			reply := fmt.Appendf(nil, "$JS.ACK.ORDERS.proc.1.%d.%d.1700000000000000000.%d", seq, seq, perRead-i)
			msgs[r] = natswire.AppendMsg(msgs[r], []byte("_INBOX.abc"), []byte("1"), reply, nil, body)
			acks[r] = natswire.AppendPub(acks[r], reply, nil, nil, natswire.AckAck)
		}
	}
	out := make([]byte, 0, len(msgs[0]))
	b.ResetTimer()
	for i, r := 0, 0; i < b.N; i, r = i+perRead, (r+1)%reads {
		var err error
		if out, err = c.passDown(down, msgs[r], out[:0]); err != nil {
			b.Fatal(err)
		}
		ch, err := c.parseApp(ctx, up, acks[r])
		if err != nil || len(ch.ch.data) != len(acks[r]) {
			b.Fatalf("the acks: %v, %d bytes for the server", err, len(ch.ch.data))
		}
		if err := tee.WaitRoom(ctx); err != nil { // as the downstream pump does
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if st := p.Stats(); st.AcksAbsorbed != 0 || p.unacked.len() != 0 {
		b.Fatalf("%d acks absorbed, %d deliveries unacked: want every ack to settle its delivery", st.AcksAbsorbed, p.unacked.len())
	}
}
