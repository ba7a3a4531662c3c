package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Relay forwards TCP connections from a loopback port of its own to an
// address, and can cut every one of them at once, as a network failure
// would; it goes on accepting new ones after a cut. It stops at the end
// of the test that started it.
type Relay struct {
	ln    net.Listener
	to    string
	wg    sync.WaitGroup
	mu    sync.Mutex
	pairs [][2]net.Conn
}

// StartRelay starts a Relay to to.
func StartRelay(t testing.TB, to string) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("relay to %s: %v", to, err)
	}
	r := &Relay{ln: ln, to: to}
	r.wg.Go(r.serve)
	t.Cleanup(func() {
		_ = ln.Close() // ends serve
		r.Cut()
		r.wg.Wait()
	})
	return r
}

// Addr is the relay's host:port.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

func (r *Relay) serve() {
	for {
		a, err := r.ln.Accept()
		if err != nil {
			return // closed
		}
		b, err := net.Dial("tcp", r.to)
		if err != nil {
			_ = a.Close() // the client sees the refusal as a cut
			continue
		}
		r.mu.Lock()
		r.pairs = append(r.pairs, [2]net.Conn{a, b})
		r.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src) // a relayed connection ends when either side does
			_ = dst.Close()
			_ = src.Close()
		}
		r.wg.Go(func() { pipe(b, a) })
		r.wg.Go(func() { pipe(a, b) })
	}
}

// Cut closes both sides of every connection relayed since the last cut,
// and returns how many there were.
func (r *Relay) Cut() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.pairs)
	for _, p := range r.pairs {
		_ = p[0].Close()
		_ = p[1].Close()
	}
	r.pairs = nil
	return n
}
