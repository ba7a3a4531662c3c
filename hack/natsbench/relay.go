package main

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
)

// relay is the cheapest proxy that sees the bytes: it copies them between
// each connection it accepts and one of its own to the server, both ways,
// through a buffer in user space, with no parsing, no log and no gating.
// Its path is the floor that any sidecar between the consumer and the
// server pays on this machine (a second TCP hop, its reads, writes and
// wake-ups), against which the sidecar's own work can be told apart. It
// reads into user space on purpose: io.Copy between two TCP connections
// would splice them in the kernel, which a proxy that records what passes
// cannot do.
type relay struct {
	ln       net.Listener
	upstream string
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

// startRelay listens on a loopback port of its own and relays to upstream
// (host:port) until close.
func startRelay(upstream string) (*relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay{ln: ln, upstream: upstream}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) accept() {
	defer r.wg.Done()
	for {
		app, err := r.ln.Accept()
		if err != nil {
			return
		}
		srv, err := net.Dial("tcp", r.upstream)
		if err != nil {
			_ = app.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, app, srv)
		r.mu.Unlock()
		r.wg.Add(2)
		go r.pipe(srv, app)
		go r.pipe(app, srv)
	}
}

// pipe copies from src to dst until either ends, then closes both.
func (r *relay) pipe(dst, src net.Conn) {
	defer r.wg.Done()
	buf := make([]byte, 32<<10)
	// Only src's Read: a bare net.Conn would let io.CopyBuffer splice.
	_, _ = io.CopyBuffer(dst, struct{ io.Reader }{src}, buf)
	_ = dst.Close()
	_ = src.Close()
}

// close stops accepting, ends every relayed connection and waits for the
// copies to return.
func (r *relay) close() error {
	err := r.ln.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// viaRelay drains a fresh stream through a relay.
func (b *bench) viaRelay(ctx context.Context, w int, r *result) (err error) {
	stream, err := b.fill(ctx, w)
	if stream != "" {
		defer func() { err = errors.Join(err, b.js.DeleteStream(context.WithoutCancel(ctx), stream)) }()
	}
	if err != nil {
		return err
	}
	rl, err := startRelay(b.o.server)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, rl.close()) }()
	return b.consume(ctx, "nats://"+rl.addr(), stream, r, nil)
}
