package natsproxy

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// gateLog is a log whose writes succeed only once let through: the
// writer's test decides when a record becomes durable.
type gateLog struct{ open chan struct{} }

func (g *gateLog) Write(ctx context.Context, _ []shadowqueue.Record) error {
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gateLog) Last(context.Context) (shadowqueue.Record, bool, error) {
	return shadowqueue.Record{}, false, nil
}

func (g *gateLog) Close() error { return nil }

// TestWriterBatchesOnlyDurableChunks is invariant I1 for the writer's
// batching: chunks queued behind one that waits on the log are not
// written ahead of it, and once its record is durable they all go out,
// in order.
func TestWriterBatchesOnlyDurableChunks(t *testing.T) {
	ctx := t.Context()
	log := &gateLog{open: make(chan struct{})}
	tee := shadowqueue.NewTee(log, shadowqueue.Record{}, shadowqueue.TeeOptions{})
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { _ = tee.Run(runCtx) })

	up, server := net.Pipe()
	t.Cleanup(func() { _ = up.Close(); _ = server.Close() })
	c := newConn(New(tee, Options{}), nil, up, slog.New(slog.DiscardHandler))
	_, tk := tee.Append(shadowqueue.Record{Queue: "q", Body: []byte("x")})

	send := func(data string, gated bool) {
		c.queued.Add(1)
		c.queue <- chunk{data: []byte(data), gate: tk, gated: gated}
	}
	send("a;", false)
	send("b;", true) // an ack of the record not yet durable
	send("c;", false)
	send("d;", false)
	werr := make(chan error, 1)
	go func() { werr <- c.writer(ctx) }()

	read := func(want string) {
		t.Helper()
		got := make([]byte, len(want))
		_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(server, got); err != nil || string(got) != want {
			t.Fatalf("the server read %q (%v), want %q", got, err, want)
		}
	}
	read("a;")
	// Nothing more may reach the server while b's record is not durable.
	_ = server.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := server.Read(make([]byte, 16)); n != 0 || err == nil {
		t.Fatalf("the server read %d more bytes before the record was durable", n)
	}
	close(log.open)
	read("b;c;d;")
	close(c.queue)
	if err := <-werr; err != nil {
		t.Fatalf("writer: %v", err)
	}
	if q := c.queued.Load(); q != 0 {
		t.Errorf("queued = %d after every chunk was written, want 0", q)
	}
}
