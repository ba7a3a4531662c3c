package sidecar_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestNATSPushSubscriptionAfterReplay: a target keeps the app's push
// subscription from the server while it feeds it from the log; at the
// switch it subscribes at the server, and from then on the subscription is
// the app's own: its UNSUB reaches the server (push_bound goes false).
func TestNATSPushSubscriptionAfterReplay(t *testing.T) {
	const count = 10
	nt := testenv.RequireNATS(t)
	ctx := t.Context()
	logName := testenv.UniqueName("ms2m-test-natslog")
	work := testenv.UniqueName("ms2m-test-natswork")
	js := natsAdmin(t, nt, work, logName)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: work, Subjects: []string{work + ".in"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, work, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, DeliverSubject: "deliver." + work}); err != nil {
		t.Fatal(err)
	}
	source, err := sidecar.Start(ctx, natsConfig(nt, logName, "127.0.0.1:0"), sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = source.Close() })
	cfg := natsConfig(nt, logName, "127.0.0.1:0")
	cfg.ReplayStart, cfg.ReplayCutoff = "0", "marker"
	target, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })

	pushApp := func(addr string, got *int, mu chan struct{}) jetstream.ConsumeContext {
		nc, err := nats.Connect("nats://" + addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		ajs, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := ajs.PushConsumer(ctx, work, "worker")
		if err != nil {
			t.Fatal(err)
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			mu <- struct{}{}
			*got++
			<-mu
			_ = m.Ack()
		})
		if err != nil {
			t.Fatal(err)
		}
		return cc
	}
	var a, b int
	amu, bmu := make(chan struct{}, 1), make(chan struct{}, 1)
	read := func(n *int, mu chan struct{}) int { mu <- struct{}{}; defer func() { <-mu }(); return *n }
	pushApp(source.AMQPAddr(), &a, amu)
	bound := func() bool {
		c, err := js.PushConsumer(ctx, work, "worker")
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.PushBound
	}
	testenv.Eventually(t, 10*time.Second, "the source's subscription is at the server", bound)
	for i := range count {
		if _, err := js.Publish(ctx, work+".in", fmt.Appendf(nil, "job-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, "the source's app handles every message", func() bool { return read(&a, amu) == count })
	cc := pushApp(target.AMQPAddr(), &b, bmu)
	testenv.Eventually(t, 10*time.Second, "the target replays every message", func() bool { return read(&b, bmu) == count })
	if _, err := (control.Client{URL: "http://" + source.ControlAddr(), Token: token, HTTP: http.DefaultClient}).Stop(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	dst := control.Client{URL: "http://" + target.ControlAddr(), Token: token, HTTP: http.DefaultClient}
	if _, err := dst.WaitSwitched(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the target's subscription is at the server after the switch", bound)
	if _, err := js.Publish(ctx, work+".in", []byte("live")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the target's app gets a live message", func() bool { return read(&b, bmu) == count+1 })
	cc.Stop()
	testenv.Eventually(t, 10*time.Second, "the app's UNSUB reaches the server", func() bool { return !bound() })
}
