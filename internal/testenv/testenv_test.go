package testenv

import (
	"net"
	"strconv"
	"testing"
)

// TestFreeAddr: the ports lie below the kernel's ephemeral range (which
// outgoing connections and binds to port 0 take from), are free, and are
// never handed out twice by one process.
func TestFreeAddr(t *testing.T) {
	lo, hi := freePortRange()
	seen := map[string]bool{}
	for range 200 {
		addr := FreeAddr(t)
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := strconv.Atoi(port)
		if host != "127.0.0.1" || p < lo || p >= hi {
			t.Fatalf("FreeAddr = %s, want 127.0.0.1 and a port in %d..%d", addr, lo, hi-1)
		}
		if seen[addr] {
			t.Fatalf("FreeAddr handed out %s twice", addr)
		}
		seen[addr] = true
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen on %s from FreeAddr: %v", addr, err)
		}
		_ = l.Close()
	}
	// What the Python consumer failed on: a port from the ephemeral range,
	// free when asked for, taken by the next bind to port 0.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, port, _ := net.SplitHostPort(l.Addr().String()); port != "" {
		if p, _ := strconv.Atoi(port); p >= lo && p < hi {
			t.Errorf("the kernel gave port %d to a bind to port 0: FreeAddr's range %d..%d overlaps the ephemeral one", p, lo, hi-1)
		}
	}
}
