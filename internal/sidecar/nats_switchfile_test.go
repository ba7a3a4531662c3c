package sidecar_test

import (
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestNATSTargetSidecarRestartedAfterTheSwitch is
// TestTargetSidecarRestartedAfterTheSwitch for a NATS target, with the Go
// sample consumer on a pull consumer: restarted after it took the log
// over, the sidecar serves instead of replaying the log to the app again.
func TestNATSTargetSidecarRestartedAfterTheSwitch(t *testing.T) {
	const n1, n2 = 200, 100
	ctx := t.Context()
	nt, js, work, logName := natsWork(t, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxAckPending: 50})
	var h natsChain // the producer's chain, as the app folds it
	publish := func(from, to int) { h.publish(t, ctx, js, work+".in", from, to) }
	startApp := func(sc *sidecar.Sidecar) string {
		addr := testenv.FreeAddr(t)
		argv := testenv.NATSConsumer(t, "go")
		runApp(t, exec.Command(argv[0], argv[1:]...), map[string]string{
			"NATS_URL": "nats://" + sc.AMQPAddr(), "STREAM": work, "CONSUMER": "worker", "MODE": "pull",
			"PREFETCH": "10", "WORK_MS": "2", "HTTP_ADDR": addr,
		})
		return addr
	}

	source, err := sidecar.Start(ctx, natsConfig(nt, logName, "127.0.0.1:0"), sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = source.Close() })
	srcApp := startApp(source)
	publish(0, n1)
	testenv.Eventually(t, 30*time.Second, "the source to process a part", func() bool {
		s, _ := appStateAt(srcApp)
		return s.Count >= n1/3
	})
	stop, err := control.Client{URL: "http://" + source.ControlAddr(), Token: token}.Stop(ctx, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}

	cfg := natsConfig(nt, logName, testenv.FreeAddr(t))
	cfg.StateDir = t.TempDir()
	cfg.ReplayStart, cfg.ReplayCutoff, cfg.ReplayEpoch = "0", fmt.Sprint(stop.CutoffID), fmt.Sprint(stop.Epoch)
	target, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	app := startApp(target)
	ctl := control.Client{URL: "http://" + target.ControlAddr(), Token: token}
	testenv.Eventually(t, 60*time.Second, "the target to switch and its app to fold everything", func() bool {
		s, _ := appStateAt(app)
		sw, err := ctl.Switched(ctx)
		return err == nil && sw && s.Count >= n1
	})
	if s, _ := appStateAt(app); s.Count != n1 {
		t.Fatalf("the target's app folded %d messages before the restart, want %d", s.Count, n1)
	}

	if err := target.Shutdown(); err != nil { // SIGTERM: the app's last acks reach the server first
		t.Fatalf("target: %v", err)
	}
	if err := target.Close(); err != nil {
		t.Fatalf("target: %v", err)
	}
	target, err = sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	ctl.URL = "http://" + target.ControlAddr()
	st, err := ctl.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TookOver == nil || st.TookOver.CutoffID != stop.CutoffID || st.Mode != control.ModeServing {
		t.Errorf("the restarted target: mode %s, took over %+v; want serving, taken over at cutoff %d", st.Mode, st.TookOver, stop.CutoffID)
	}
	testenv.Eventually(t, 30*time.Second, "the app to reconnect", func() bool {
		s, _ := appStateAt(app)
		return s.Connected && s.Reconnects >= 1
	})
	publish(n1, n1+n2)
	foldsExactly(t, app, n1+n2, h.hex())
}

// TestNATSShutdownLetsTheAppFinish is TestShutdownLetsTheAppFinish for a
// NATS sidecar: stopped by SIGTERM while the Go sample consumer works on
// the messages it pulled, it lets the app ack them first. A sidecar that
// comes after knows nothing of those deliveries and absorbs their acks, so
// without the drain the server redelivers them after the ack wait and the
// app, which runs on, folds them twice.
func TestNATSShutdownLetsTheAppFinish(t *testing.T) {
	const n = 20
	const ackWait = 3 * time.Second
	ctx := t.Context()
	nt, js, work, logName := natsWork(t, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	var h natsChain // the producer's chain, as the app folds it
	h.publish(t, ctx, js, work+".in", 0, n)
	cfg := natsConfig(nt, logName, testenv.FreeAddr(t)) // the restarted sidecar's too: the app reconnects
	sc, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Close() })
	app := testenv.FreeAddr(t)
	argv := testenv.NATSConsumer(t, "go")
	runApp(t, exec.Command(argv[0], argv[1:]...), map[string]string{
		"NATS_URL": "nats://" + sc.AMQPAddr(), "STREAM": work, "CONSUMER": "worker", "MODE": "pull",
		"PREFETCH": "5", "WORK_MS": "300", "HTTP_ADDR": app,
	})
	testenv.Eventually(t, 30*time.Second, "the app to be in the middle of its deliveries", func() bool {
		s, _ := appStateAt(app)
		return s.Count >= 3
	})
	began := time.Now()
	if err := sc.Shutdown(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	s, _ := appStateAt(app)
	t.Logf("shut down in %v with the app at %d messages", time.Since(began).Round(time.Millisecond), s.Count)
	if sc, err = sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Close() })
	foldsExactly(t, app, n, h.hex())
	time.Sleep(ackWait) // a redelivery of an ack that was lost comes after the ack wait
	if s, _ := appStateAt(app); s.Count != n {
		t.Fatalf("the app folded %d messages after the ack wait, want %d: the server redelivered what it had acked", s.Count, n)
	}
}

// natsWork makes a stream of the test's own (subjects <work>.>) with the
// consumer cc, named "worker", and names a replay log; both go when the
// test ends.
func natsWork(t *testing.T, cc jetstream.ConsumerConfig) (nt testenv.NATS, js jetstream.JetStream, work, logName string) {
	t.Helper()
	nt = testenv.RequireNATS(t)
	logName = testenv.UniqueName("ms2m-test-natslog")
	work = testenv.UniqueName("ms2m-test-natswork")
	js = natsAdmin(t, nt, work, logName)
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: work, Subjects: []string{work + ".>"}}); err != nil {
		t.Fatal(err)
	}
	cc.Durable = "worker"
	if _, err := js.CreateOrUpdateConsumer(t.Context(), work, cc); err != nil {
		t.Fatal(err)
	}
	return nt, js, work, logName
}

// TestNATSShutdownGivesBackWhatItHeld: a sidecar shut down (SIGTERM)
// while it holds deliveries back from its app, made quiesced on pull
// requests the app had sent before, gives them back to the server
// (ReturnHeld) before it closes. The next consumer gets them at once and
// before the later messages: without it they waited out the consumer's
// ack wait (a minute here) and came behind the messages published
// meanwhile, which is how TestNATSShutdownLetsTheAppFinish's app, whose
// sidecar held part of its prefetch at the SIGTERM, once folded 20 of 20
// in the wrong order.
func TestNATSShutdownGivesBackWhatItHeld(t *testing.T) {
	ctx := t.Context()
	nt, js, work, logName := natsWork(t, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	sc, err := sidecar.Start(ctx, natsConfig(nt, logName, "127.0.0.1:0"), sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Close() })
	app, err := nats.Connect("nats://"+sc.AMQPAddr(), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Close)
	appJS, err := jetstream.New(app)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := appJS.Consumer(ctx, work, "worker")
	if err != nil {
		t.Fatal(err)
	}
	// The app's pull request waits on the server for the first message.
	go func() {
		if b, err := cons.Fetch(1, jetstream.FetchMaxWait(20*time.Second)); err == nil {
			for range b.Messages() { // nothing: the sidecar holds m0
			}
		}
	}()
	admin, err := js.Consumer(ctx, work, "worker")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the app's pull request to wait on the server", func() bool {
		info, err := admin.Info(ctx)
		return err == nil && info.NumWaiting == 1
	})
	ctl := control.Client{URL: "http://" + sc.ControlAddr(), Token: token}
	if _, err := ctl.Quiesce(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, work+".in", []byte("m0")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the sidecar to hold m0 back from the app", func() bool {
		st, err := ctl.State(ctx)
		return err == nil && st.Held == 1
	})
	if _, err := js.Publish(ctx, work+".in", []byte("m1")); err != nil {
		t.Fatal(err)
	}
	if err := sc.Shutdown(); err != nil {
		t.Fatal(err)
	}
	app.Close()

	began := time.Now()
	b, err := admin.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for m := range b.Messages() {
		got = append(got, string(m.Data()))
		_ = m.Ack()
	}
	t.Logf("the next consumer got %q in %v", got, time.Since(began).Round(time.Millisecond))
	if len(got) != 2 || got[0] != "m0" || got[1] != "m1" {
		t.Fatalf("the next consumer got %q within 5s, want [m0 m1]: the held delivery was not given back (it would come after the ack wait, behind m1)", got)
	}
}
