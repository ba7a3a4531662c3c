package sidecar_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestNATSSidecar runs a sidecar with MS2M_BROKER=nats against the real
// nats-server: an unmodified nats.go pull consumer drains a stream through
// it, the replay log (a JetStream stream) holds every delivery, and the
// control API's quiesce and stop work as for AMQP, the stop leaving a
// cutoff marker at the last delivery.
func TestNATSSidecar(t *testing.T) {
	n := testenv.RequireNATS(t)
	ctx := t.Context()
	logName := testenv.UniqueName("ms2m-test-natslog")
	work := testenv.UniqueName("ms2m-test-natswork")
	admin, err := nats.Connect(n.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close) // after the deletes below, which use it
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
	const count = 40
	for i := range count {
		if _, err := js.Publish(ctx, work+".job", fmt.Appendf(nil, "job-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, work, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}

	sc, err := sidecar.Start(ctx, natsConfig(n, logName, "127.0.0.1:0"), sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sc.Close(); err != nil {
			t.Logf("sidecar: %v", err)
		}
	})

	app, err := nats.Connect("nats://" + sc.AMQPAddr())
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
	got := 0
	for got < count {
		b, err := cons.Fetch(10, jetstream.FetchMaxWait(5*time.Second))
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
		if k == 0 {
			t.Fatalf("got %d of %d messages, then none (%v)", got, count, b.Error())
		}
		got += k
	}

	ctl := control.Client{URL: "http://" + sc.ControlAddr(), Token: token, HTTP: http.DefaultClient}
	cut, err := ctl.Quiesce(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if cut.ID != count {
		t.Errorf("quiesce at %d, want %d (every delivery)", cut.ID, count)
	}
	stop, err := ctl.Stop(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st, err := ctl.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stop.CutoffID != count || st.Mode != control.ModeStopped || st.Log.ConfirmedID != count {
		t.Errorf("stop %+v, state mode %s, log %+v", stop, st.Mode, st.Log)
	}
	if v := metricValue(t, "http://"+sc.ControlAddr(), "ms2m_sidecar_nats_acks_total"); v != count {
		t.Errorf("ms2m_sidecar_nats_acks_total = %v, want %d", v, count)
	}
	ci, err := js.Consumer(ctx, work, "worker")
	if err != nil {
		t.Fatal(err)
	}
	info, err := ci.Info(ctx)
	if err != nil || info.NumAckPending != 0 || info.AckFloor.Stream != count {
		t.Errorf("consumer after the stop: %+v, %v; want every message acked", info, err)
	}
	recs := natsLogRecords(t, n.URL, logName)
	if len(recs) != count+1 || recs[count].Kind != shadowqueue.KindCutoff || recs[count].ID != count {
		t.Fatalf("log: %d records, last %+v; want %d deliveries and the cutoff", len(recs), recs[len(recs)-1], count)
	}
	for i, r := range recs[:count] {
		if string(r.Body) != fmt.Sprintf("job-%d", i) || r.Queue != work || r.ConsumerTag != "worker" {
			t.Errorf("record %d: %+v", i, r)
		}
	}
}

func natsConfig(n testenv.NATS, logName, listen string) sidecar.Config {
	return sidecar.Config{
		Broker: sidecar.BrokerNATS, Listen: listen, Upstream: n.Addr, UpstreamConnectTimeout: 3 * time.Second,
		NATSURL: n.URL, LogName: logName, LogMaxAge: time.Hour, LogMaxBytes: 64 << 20,
		LogPendingMaxBytes: 64 << 20, LogPendingMaxRecords: 65536,
		ControlListen: "127.0.0.1:0", ControlToken: token, DrainTimeout: 5 * time.Second, StopHeld: "deliver", LogLevel: "info",
	}
}

// TestNATSAckThroughRestartedSidecar is the decision in docs/nats.md on an
// ack that reaches a restarted sidecar for a delivery the old one handed
// out: the new sidecar does not send it on (it cannot know whether the
// delivery is in the log), the server redelivers the message after its ack
// wait, and the redelivery is teed, numbered after the old sidecar's
// records, and acked normally. The app is an unmodified nats.go client
// that reconnects by itself to the same address.
func TestNATSAckThroughRestartedSidecar(t *testing.T) {
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
	const count = 5
	for i := range count {
		if _, err := js.Publish(ctx, work+".job", fmt.Appendf(nil, "job-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, work, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}

	addr := testenv.FreeAddr(t)
	first, err := sidecar.Start(ctx, natsConfig(n, logName, addr), sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	reconnected := make(chan struct{}, 1)
	app, err := nats.Connect("nats://"+addr, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
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
	b, err := cons.Fetch(count, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var held []jetstream.Msg
	for m := range b.Messages() {
		held = append(held, m)
	}
	if len(held) != count {
		t.Fatalf("fetched %d, want %d (%v)", len(held), count, b.Error())
	}
	// The deliveries are in the log before the sidecar goes (its records
	// are written behind the app's back; one closed first would leave
	// only the redeliveries there).
	firstCtl := control.Client{URL: "http://" + first.ControlAddr(), Token: token, HTTP: http.DefaultClient}
	testenv.Eventually(t, 10*time.Second, "the first sidecar's records durable", func() bool {
		st, err := firstCtl.State(ctx)
		return err == nil && st.Log.ConfirmedID == count
	})
	if err := first.Close(); err != nil {
		t.Fatalf("first sidecar: %v", err)
	}
	second, err := sidecar.Start(ctx, natsConfig(n, logName, addr), sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := second.Close(); err != nil {
			t.Logf("second sidecar: %v", err)
		}
	})
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("the app did not reconnect to the second sidecar")
	}
	for _, m := range held {
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if err := app.Flush(); err != nil {
		t.Fatal(err)
	}
	base := "http://" + second.ControlAddr()
	if v := metricValue(t, base, "ms2m_sidecar_nats_acks_absorbed_total"); v != count {
		t.Fatalf("acks absorbed by the second sidecar = %v, want %d", v, count)
	}
	// The server redelivers them after the ack wait, through the second
	// sidecar; the app acks them again.
	redelivered := 0
	deadline := time.Now().Add(20 * time.Second)
	for redelivered < count && time.Now().Before(deadline) {
		b, err := cons.Fetch(count, jetstream.FetchMaxWait(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			md, err := m.Metadata()
			if err != nil || md.NumDelivered != 2 {
				t.Fatalf("redelivery metadata %+v, %v", md, err)
			}
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
			redelivered++
		}
	}
	if redelivered != count {
		t.Fatalf("%d redeliveries, want %d", redelivered, count)
	}
	direct, err := js.Consumer(ctx, work, "worker")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "every redelivery acked upstream", func() bool {
		ci, err := direct.Info(ctx)
		return err == nil && ci.NumAckPending == 0 && ci.AckFloor.Stream == count
	})
	recs := natsLogRecords(t, n.URL, logName)
	if len(recs) != 2*count {
		t.Fatalf("log holds %d records, want %d deliveries and %d redeliveries", len(recs), count, count)
	}
	for i, r := range recs {
		if r.ID != uint64(i+1) || r.Redelivered != (i >= count) {
			t.Errorf("record %d: ID %d, redelivered %v", i, r.ID, r.Redelivered)
		}
	}
}

// natsLogRecords reads every record of the JetStream replay log logName.
func natsLogRecords(t *testing.T, url, logName string) []shadowqueue.Record {
	t.Helper()
	l, err := shadowqueue.OpenJetStream(t.Context(), shadowqueue.JetStreamOptions{URL: url, Name: logName})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	recs, err := l.ReadAll(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return recs
}
