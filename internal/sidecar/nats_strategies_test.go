package sidecar_test

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestNATSStrategyRanges is the message half of the migrator's strategies
// other than ms2m, for a NATS consumer against the real nats-server: the
// replay ranges they give a target, each with an app whose memory (the
// messages it handled, in order) is carried from the source to the target
// as a checkpoint carries it.
//
//   - stop-and-copy: the source stops at a cutoff, the app's memory at the
//     stop goes to the target, which replays nothing (start = cutoff) and
//     consumes from the server at once;
//   - statefulset: the app's memory at a quiesce (the live checkpoint);
//     the source serves on and then stops; the target replays from the
//     checkpoint to that fixed cutoff, with the stop's epoch;
//   - end: the same with MS2M_REPLAY_CUTOFF=end, the recovery's replay to
//     the log's end once its last writer is gone.
//
// The app on the target ends with every message once, in order; the
// sidecars report rates (λ and μ, which ms2m-cutoff sizes its cutoff with)
// from the source's deliveries and acks and from the target's replay.
func TestNATSStrategyRanges(t *testing.T) {
	for _, strategy := range []string{"stop-and-copy", "statefulset", "end"} {
		for _, mode := range []string{"push", "pull"} {
			t.Run(strategy+"/"+mode, func(t *testing.T) { natsStrategyRange(t, strategy, mode) })
		}
	}
}

func natsStrategyRange(t *testing.T, strategy, mode string) {
	const first, second, n = 30, 60, 100
	nt := testenv.RequireNATS(t)
	ctx := t.Context()
	logName := testenv.UniqueName("ms2m-test-natslog")
	work := testenv.UniqueName("ms2m-test-natswork")
	js := natsAdmin(t, nt, work, logName)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: work, Subjects: []string{work + ".in"}}); err != nil {
		t.Fatal(err)
	}
	cc := jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 20}
	if mode == "push" {
		cc.DeliverSubject = "deliver." + work
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, work, cc); err != nil {
		t.Fatal(err)
	}
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := js.Publish(ctx, work+".in", []byte(strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}

	source, err := sidecar.Start(ctx, natsConfig(nt, logName, "127.0.0.1:0"), sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = source.Close() })
	srcCtl := control.Client{URL: "http://" + source.ControlAddr(), Token: token, HTTP: http.DefaultClient}
	a := startMemoryApp(t, source.AMQPAddr(), work, mode, nil)

	publish(0, first)
	a.waitFor(t, first)
	memory := a.handled() // stop-and-copy replaces it at the stop
	var start, epoch uint64
	if strategy != "stop-and-copy" {
		cut, err := srcCtl.Quiesce(ctx, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		memory, start, epoch = a.handled(), cut.ID, cut.Epoch // the checkpoint
		if err := srcCtl.Resume(ctx); err != nil {
			t.Fatal(err)
		}
	}
	publish(first, second)
	a.waitFor(t, second)
	if lambda, mu, err := srcCtl.Rates(ctx); err != nil || lambda <= 0 || mu <= 0 {
		t.Errorf("the source's rates: λ %v μ %v (%v); want both measured", lambda, mu, err)
	}
	stop, err := srcCtl.Stop(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a.close()
	if stop.CutoffID != second {
		t.Fatalf("cutoff %d, want %d: the source handed the app every message", stop.CutoffID, second)
	}
	cfg := natsConfig(nt, logName, "127.0.0.1:0")
	cfg.ReplayStart, cfg.ReplayCutoff, cfg.ReplayEpoch = strconv.FormatUint(start, 10), strconv.FormatUint(stop.CutoffID, 10), strconv.FormatUint(stop.Epoch, 10)
	switch strategy {
	case "stop-and-copy":
		memory, start = a.handled(), stop.CutoffID // the checkpoint, taken once stopped
		cfg.ReplayStart = cfg.ReplayCutoff
	case "end":
		cfg.ReplayCutoff, cfg.ReplayEpoch = "end", strconv.FormatUint(epoch, 10)
	}
	publish(second, second+10) // while nothing consumes
	target, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	dstCtl := control.Client{URL: "http://" + target.ControlAddr(), Token: token, HTTP: http.DefaultClient}
	b := startMemoryApp(t, target.AMQPAddr(), work, mode, memory)
	publish(second+10, n) // while it replays, or once it has switched
	if _, err := dstCtl.WaitSwitched(ctx, 30*time.Second); err != nil {
		st, serr := dstCtl.State(ctx)
		t.Fatalf("the target did not switch: %v; its state %+v (%v), replay %+v; the app handled %v", err, st, serr, st.Replay, b.handled())
	}
	b.waitFor(t, n)
	want := make([]string, n)
	for i := range want {
		want[i] = strconv.Itoa(i)
	}
	if got := b.handled(); !slices.Equal(got, want) {
		t.Fatalf("the target's app handled %d messages, want 0..%d once each in order; got %v", len(got), n-1, got)
	}
	st, err := dstCtl.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if wantReplayed := stop.CutoffID - start; st.Replay == nil || st.Replay.Replayed != wantReplayed {
		t.Errorf("the target's replay %+v: want %d replayed", st.Replay, wantReplayed)
	}
	if _, mu, err := dstCtl.Rates(ctx); strategy != "stop-and-copy" && (err != nil || mu <= 0) {
		t.Errorf("the target's μ after its replay: %v (%v); want it measured", mu, err)
	}
}

// memoryApp is a NATS consumer whose memory is the list of messages it
// handled: a checkpoint copies it, a restore starts a new one with it.
type memoryApp struct {
	nc   *nats.Conn
	stop func()
	mu   sync.Mutex
	seen []string
}

// startMemoryApp starts a nats.go consumer of work's durable consumer
// "worker" at addr (push on deliver.<work>, or pull), that remembers
// memory and then every message it handles, and acks each.
func startMemoryApp(t *testing.T, addr, work, mode string, memory []string) *memoryApp {
	t.Helper()
	a := &memoryApp{seen: slices.Clone(memory)}
	nc, err := nats.Connect("nats://"+addr, nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	a.nc = nc
	t.Cleanup(a.close)
	if mode == "push" {
		sub, err := nc.Subscribe("deliver."+work, func(m *nats.Msg) {
			a.add(string(m.Data))
			_ = m.Ack() // a lost ack is redelivered, which the test sees
		})
		if err != nil {
			t.Fatal(err)
		}
		a.stop = func() { _ = sub.Unsubscribe() }
		return a
	}
	ajs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := ajs.Consumer(t.Context(), work, "worker")
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		a.add(string(m.Data()))
		_ = m.Ack() // as above
	}, jetstream.PullMaxMessages(5), jetstream.PullExpiry(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	a.stop = cc.Stop
	return a
}

func (a *memoryApp) add(s string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = append(a.seen, s)
}

func (a *memoryApp) handled() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.seen)
}

func (a *memoryApp) waitFor(t *testing.T, n int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("the app to handle %d messages", n), func() bool {
		return len(a.handled()) >= n
	})
}

func (a *memoryApp) close() {
	if a.stop != nil {
		a.stop()
	}
	a.nc.Close()
}

// TestNATSStoppedTargetTakesItsPushSubscriptionOff: a target whose app's
// push subscription was fed from the log and then went to the server is
// a source in turn (statefulset-shadow's shadow): its stop takes that
// subscription off the server even when the server has delivered nothing
// on it since the switch, so that nothing is pushed to the stopped sidecar
// and dropped (the server would redeliver it behind later messages).
func TestNATSStoppedTargetTakesItsPushSubscriptionOff(t *testing.T) {
	nt := testenv.RequireNATS(t)
	ctx := t.Context()
	logName := testenv.UniqueName("ms2m-test-natslog")
	work := testenv.UniqueName("ms2m-test-natswork")
	js := natsAdmin(t, nt, work, logName)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: work, Subjects: []string{work + ".in"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, work, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, DeliverSubject: "deliver." + work})
	if err != nil {
		t.Fatal(err)
	}
	source, err := sidecar.Start(ctx, natsConfig(nt, logName, "127.0.0.1:0"), sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = source.Close() })
	a := startMemoryApp(t, source.AMQPAddr(), work, "push", nil)
	for i := range 5 {
		if _, err := js.Publish(ctx, work+".in", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	a.waitFor(t, 5)
	srcCtl := control.Client{URL: "http://" + source.ControlAddr(), Token: token, HTTP: http.DefaultClient}
	if _, err := srcCtl.Stop(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	a.close()

	cfg := natsConfig(nt, logName, "127.0.0.1:0")
	cfg.ReplayStart = "0"
	shadow, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shadow.Close() })
	b := startMemoryApp(t, shadow.AMQPAddr(), work, "push", nil)
	shCtl := control.Client{URL: "http://" + shadow.ControlAddr(), Token: token, HTTP: http.DefaultClient}
	if _, err := shCtl.WaitSwitched(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, 5)
	testenv.Eventually(t, 10*time.Second, "the app's subscription to reach the server at the switch", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.PushBound
	})
	if _, err := shCtl.Stop(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ci.PushBound {
		t.Fatal("the stopped shadow left the app's push subscription on the server: what the server pushes now is dropped and comes back behind later messages")
	}
	if _, err := js.Publish(ctx, work+".in", []byte("5")); err != nil {
		t.Fatal(err)
	}
	if ci, err = cons.Info(ctx); err != nil || ci.NumAckPending != 0 {
		t.Errorf("after a publish to the stopped shadow's consumer: %d pushed and unacked (%v), want 0", ci.NumAckPending, err)
	}
}
