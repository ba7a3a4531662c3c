package sidecar_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestNATSStopSurvivesARestart is TestStopSurvivesARestart for a NATS
// sidecar: restarted after its stop, it starts stopped; the app's pull
// requests, from an unmodified nats.go client that reconnected by itself,
// get nothing while the server holds the messages, until POST /resume.
func TestNATSStopSurvivesARestart(t *testing.T) {
	n := testenv.RequireNATS(t)
	ctx := t.Context()
	logName := testenv.UniqueName("ms2m-test-natslog")
	work := testenv.UniqueName("ms2m-test-natswork")
	admin, err := nats.Connect(n.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx := context.WithoutCancel(ctx)
		if err := js.DeleteStream(cctx, work); err != nil {
			t.Logf("cleanup: %v", err)
		}
		if err := shadowqueue.DeleteJetStream(cctx, n.URL, logName); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: work, Subjects: []string{work + ".>"}}); err != nil {
		t.Fatal(err)
	}
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := js.Publish(ctx, work+".job", fmt.Appendf(nil, "job-%d", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(0, 3)
	if _, err := js.CreateOrUpdateConsumer(ctx, work, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	addr := testenv.FreeAddr(t)
	cfg := natsConfig(n, logName, addr)
	cfg.StateDir = t.TempDir()
	first, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	app, err := nats.Connect("nats://"+addr, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	ajs, err := jetstream.New(app)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := ajs.Consumer(ctx, work, "worker")
	if err != nil {
		t.Fatal(err)
	}
	fetch := func(want int, wait time.Duration) int {
		b, err := cons.Fetch(max(want, 1), jetstream.FetchMaxWait(wait))
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for m := range b.Messages() {
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
			k++
		}
		return k
	}
	if got := fetch(3, 5*time.Second); got != 3 {
		t.Fatalf("fetched %d of 3 through the first sidecar", got)
	}
	ctl := control.Client{URL: "http://" + first.ControlAddr(), Token: token, HTTP: http.DefaultClient}
	stop, err := ctl.Stop(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatalf("first sidecar: %v", err)
	}

	second, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Close() })
	ctl.URL = "http://" + second.ControlAddr()
	st, err := ctl.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != control.ModeStopped || st.CutoffID != stop.CutoffID {
		t.Fatalf("the restarted sidecar is %s at cutoff %d, want stopped at %d", st.Mode, st.CutoffID, stop.CutoffID)
	}
	publish(3, 5)
	testenv.Eventually(t, 10*time.Second, "the app to reconnect", app.IsConnected)
	if got := fetch(2, 500*time.Millisecond); got != 0 {
		t.Fatalf("the stopped sidecar handed the app %d messages", got)
	}
	if err := ctl.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	got := 0
	testenv.Eventually(t, 20*time.Second, "the app to get the two messages after the resume", func() bool {
		got += fetch(2-got, time.Second)
		return got >= 2
	})
	if got != 2 {
		t.Errorf("after the resume: %d messages, want 2", got)
	}
}
