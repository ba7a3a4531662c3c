package natsproxy

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestStoppedProxyAnswersPullRequests: while stopped, the proxy keeps the
// app's pull requests from the server and answers them as the server
// would: idle heartbeats if asked for, a 408 Request Timeout with the
// batch pending at the request's expiry, a 404 for a no_wait request; no
// message reaches the app. After a resume a request goes to the server
// again.
func TestStoppedProxyAnswersPullRequests(t *testing.T) {
	h := newHarness(t)
	stream, subject := h.stream(t)
	ctx := t.Context()
	for i := range 3 {
		if _, err := h.js.Publish(ctx, subject, fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "proc", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	nc, _ := h.app(t)
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.proxy.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	next := "$JS.API.CONSUMER.MSG.NEXT." + stream + ".proc"
	began := time.Now()
	if err := nc.PublishRequest(next, inbox, []byte(`{"batch":2,"expires":600000000,"idle_heartbeat":100000000}`)); err != nil {
		t.Fatal(err)
	}
	heartbeats := 0
	for {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("after %d heartbeats: %v; want a 408 at the request's expiry", heartbeats, err)
		}
		if len(m.Data) > 0 {
			t.Fatalf("a stopped proxy handed the app %q", m.Data)
		}
		st := m.Header.Get("Status")
		if st == "100" {
			heartbeats++
			continue
		}
		if st != "408" || m.Header.Get("Nats-Pending-Messages") != "2" {
			t.Fatalf("status %q, header %v; want 408 with 2 messages pending", st, m.Header)
		}
		break
	}
	if took := time.Since(began); heartbeats == 0 || took < 500*time.Millisecond {
		t.Errorf("408 after %v and %d heartbeats; want it at the expiry (600ms), heartbeats before", took, heartbeats)
	}
	if err := nc.PublishRequest(next, inbox, []byte(`{"batch":1,"no_wait":true}`)); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(5 * time.Second); err != nil || m.Header.Get("Status") != "404" {
		t.Fatalf("no_wait request: %v, %v; want a 404", m, err)
	}
	if err := h.proxy.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(next, inbox, []byte(`{"batch":1,"expires":2000000000}`)); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("after the resume: %v; want the first message from the server", err)
		}
		if len(m.Data) == 0 {
			continue // a status left from before
		}
		if string(m.Data) != "m0" {
			t.Fatalf("after the resume the app got %q, want m0", m.Data)
		}
		break
	}
}
