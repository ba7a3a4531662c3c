package sidecar_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestNATSReplayInterrupted: a target's app that goes away in the middle
// of its replay, after it settled replayed messages, makes the target say
// so (replay.interrupted): an app restarted from the checkpoint would
// lack those messages, so the handover gives the target up. The records
// the app had unsettled go back to be replayed, each on its own subject.
func TestNATSReplayInterrupted(t *testing.T) {
	const count = 20
	nt := testenv.RequireNATS(t)
	ctx := t.Context()
	logName := testenv.UniqueName("ms2m-test-natslog")
	work := testenv.UniqueName("ms2m-test-natswork")
	js := natsAdmin(t, nt, work, logName)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: work, Subjects: []string{work + ".in"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, work, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for i := range count {
		if _, err := js.Publish(ctx, work+".in", fmt.Appendf(nil, "job-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	consume := func(addr string, handle func(jetstream.Msg)) *nats.Conn {
		nc, err := nats.Connect("nats://"+addr, nats.NoReconnect())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		ajs, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := ajs.Consumer(ctx, work, "worker")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cons.Consume(handle, jetstream.PullMaxMessages(2)); err != nil {
			t.Fatal(err)
		}
		return nc
	}

	source, err := sidecar.Start(ctx, natsConfig(nt, logName, "127.0.0.1:0"), sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = source.Close() })
	var a atomic.Int64
	consume(source.AMQPAddr(), func(m jetstream.Msg) { a.Add(1); _ = m.Ack() })
	testenv.Eventually(t, 20*time.Second, "the source's app handles every message", func() bool { return a.Load() == count })
	src := control.Client{URL: "http://" + source.ControlAddr(), Token: token, HTTP: http.DefaultClient}
	if _, err := src.Stop(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	cfg := natsConfig(nt, logName, "127.0.0.1:0")
	cfg.ReplayStart, cfg.ReplayCutoff = "0", "marker"
	target, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	var b atomic.Int64
	gone := make(chan struct{})
	var nc *nats.Conn
	nc = consume(target.AMQPAddr(), func(m jetstream.Msg) {
		if b.Add(1) <= 5 {
			_ = m.Ack()
			return
		}
		select { // the sixth: the app goes away without settling it
		case <-gone:
		default:
			close(gone)
			go nc.Close()
		}
	})
	<-gone
	dst := control.Client{URL: "http://" + target.ControlAddr(), Token: token, HTTP: http.DefaultClient}
	testenv.Eventually(t, 10*time.Second, "the target counts the interrupted replay", func() bool {
		st, err := dst.State(ctx)
		return err == nil && st.Replay != nil && st.Replay.Interrupted == 1
	})
	_, err = dst.WaitSwitched(ctx, 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "middle of the replay") {
		t.Errorf("WaitSwitched = %v, want the interrupted replay", err)
	}
	// What the app had unsettled is replayed again, to the next connection,
	// each on its message's own subject, as the server sends a pull
	// consumer's messages (nats.js drops one on its inbox's subject).
	var c, wrongSubject atomic.Int64
	consume(target.AMQPAddr(), func(m jetstream.Msg) {
		if m.Subject() != work+".in" {
			wrongSubject.Add(1)
		}
		c.Add(1)
		_ = m.Ack()
	})
	testenv.Eventually(t, 20*time.Second, "a new connection gets the rest of the replay", func() bool { return c.Load() == count-5 })
	if n := wrongSubject.Load(); n > 0 {
		t.Errorf("%d replayed messages came on another subject than %s.in, the one they were published to", n, work)
	}
}
