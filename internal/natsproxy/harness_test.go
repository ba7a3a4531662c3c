package natsproxy

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// holdLog wraps the real JetStream log; while held, Write blocks, so that
// the test sees what the proxy does with acks of deliveries not yet durable.
type holdLog struct {
	*shadowqueue.JetStreamLog
	mu   sync.Mutex
	gate chan struct{} // nil: not held
}

func (h *holdLog) hold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gate == nil {
		h.gate = make(chan struct{})
	}
}

func (h *holdLog) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gate != nil {
		close(h.gate)
		h.gate = nil
	}
}

func (h *holdLog) Write(ctx context.Context, recs []shadowqueue.Record) error {
	h.mu.Lock()
	g := h.gate
	h.mu.Unlock()
	if g != nil {
		select {
		case <-g:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return h.JetStreamLog.Write(ctx, recs)
}

type harness struct {
	nats  testenv.NATS
	log   *holdLog
	tee   *shadowqueue.Tee
	proxy *Proxy
	addr  string // the proxy's address
	url   string // nats://addr
	js    jetstream.JetStream
	nc    *nats.Conn // direct to the server, for the test's own publishes
	// relay, if set, is between the proxy and the server: a cut of it
	// cuts the proxy's upstream connections.
	relay *testenv.Relay
}

// newHarness starts a Tee on a real JetStream log and a Proxy in front of
// the real nats-server.
func newHarness(t *testing.T) *harness {
	t.Helper()
	return startHarness(t, false)
}

// newRelayedHarness is newHarness with a relay between the proxy and the
// server (harness.relay).
func newRelayedHarness(t *testing.T) *harness {
	t.Helper()
	return startHarness(t, true)
}

func startHarness(t *testing.T, relayed bool) *harness {
	t.Helper()
	n := testenv.RequireNATS(t)
	ctx := t.Context()
	name := testenv.UniqueName("ms2m-natsproxy-log")
	jl, err := shadowqueue.OpenJetStream(ctx, shadowqueue.JetStreamOptions{URL: n.URL, Name: name, MaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{nats: n, log: &holdLog{JetStreamLog: jl}}
	t.Cleanup(func() {
		h.log.release()
		_ = jl.Close()
		if err := shadowqueue.DeleteJetStream(context.WithoutCancel(ctx), n.URL, name); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	h.tee = shadowqueue.NewTee(h.log, shadowqueue.Record{}, shadowqueue.TeeOptions{})
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() {
		if err := h.tee.Run(runCtx); err != nil {
			t.Errorf("tee: %v", err)
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upstream := n.Addr
	if relayed {
		h.relay = testenv.StartRelay(t, n.Addr)
		upstream = h.relay.Addr()
	}
	h.proxy = New(h.tee, Options{Upstream: upstream})
	wg.Go(func() {
		if err := h.proxy.Serve(runCtx, ln); err != nil {
			t.Errorf("proxy: %v", err)
		}
	})
	h.addr = ln.Addr().String()
	h.url = "nats://" + h.addr
	h.nc, err = nats.Connect(n.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.nc.Close)
	h.js, err = jetstream.New(h.nc)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// stream makes a work stream for the test, deleted at its end.
func (h *harness) stream(t *testing.T) (name, subject string) {
	t.Helper()
	name = testenv.UniqueName("ms2m-work")
	subject = name + ".in"
	if _, err := h.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.js.DeleteStream(context.WithoutCancel(t.Context()), name); err != nil {
			t.Logf("cleanup: delete stream %s: %v", name, err)
		}
	})
	return name, subject
}

// app connects like an unmodified app would, through the proxy, with
// nats.go's defaults but for opts.
func (h *harness) app(t *testing.T, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return testenv.ConnectJetStream(t, h.url, append([]nats.Option{nats.Name("test-app")}, opts...)...)
}
