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
// (the key of the deliveries not yet acked) and its body (the record's),
// and the ack's chunk for the writer (one a read from the app, here one
// an ack). Measured when the guard
// was written; lower it when the path gets cheaper, never raise it
// without a reason in the commit.
const (
	maxAllocsDelivery = 2
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
