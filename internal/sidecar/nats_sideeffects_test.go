package sidecar_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestNATSReplayAbsorbsPublishes: an app publishes a result to a JetStream
// stream for every message it handles (nats.go's js.Publish, which waits
// for the server's publish ack). The source's app handles the first
// messages; a target replays them to a second app, whose publishes for
// them the target absorbs, answering each js.Publish itself; after the
// switch its publishes reach the server. The results stream ends with
// every result exactly once.
func TestNATSReplayAbsorbsPublishes(t *testing.T) {
	const first, later = 20, 10
	nt := testenv.RequireNATS(t)
	ctx := t.Context()
	logName := testenv.UniqueName("ms2m-test-natslog")
	work := testenv.UniqueName("ms2m-test-natswork")
	js := natsAdmin(t, nt, work, logName)
	results := work + "-results"
	for _, sc := range []jetstream.StreamConfig{{Name: work, Subjects: []string{work + ".in"}}, {Name: results, Subjects: []string{work + ".out"}}} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.WithoutCancel(ctx), results) })
	if _, err := js.CreateOrUpdateConsumer(ctx, work, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := js.Publish(ctx, work+".in", fmt.Appendf(nil, "job-%d", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(0, first)

	// app consumes through the sidecar at addr: each message's result is
	// published with js.Publish before the message is acked.
	type app struct {
		mu      sync.Mutex
		handled int
		pubErrs []error
	}
	runApp := func(addr string) *app {
		a := &app{}
		nc, err := nats.Connect("nats://" + addr)
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
		cc, err := cons.Consume(func(m jetstream.Msg) {
			_, perr := ajs.Publish(ctx, work+".out", append([]byte("result-"), m.Data()...))
			a.mu.Lock()
			a.handled++
			if perr != nil {
				a.pubErrs = append(a.pubErrs, perr)
			}
			a.mu.Unlock()
			_ = m.Ack()
		}, jetstream.PullMaxMessages(5))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cc.Stop)
		return a
	}
	handled := func(a *app) int {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.handled
	}

	source, err := sidecar.Start(ctx, natsConfig(nt, logName, "127.0.0.1:0"), sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = source.Close() })
	a := runApp(source.AMQPAddr())
	testenv.Eventually(t, 20*time.Second, "the source's app handles the first messages", func() bool { return handled(a) == first })
	src := control.Client{URL: "http://" + source.ControlAddr(), Token: token, HTTP: http.DefaultClient}
	stop, err := src.Stop(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if stop.CutoffID != first {
		t.Fatalf("cutoff %d, want %d", stop.CutoffID, first)
	}

	cfg := natsConfig(nt, logName, "127.0.0.1:0")
	cfg.ReplayStart, cfg.ReplayCutoff = "0", "marker"
	target, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	b := runApp(target.AMQPAddr())
	dst := control.Client{URL: "http://" + target.ControlAddr(), Token: token, HTTP: http.DefaultClient}
	if _, err := dst.WaitSwitched(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	publish(first, first+later)
	testenv.Eventually(t, 20*time.Second, "the target's app handles the replayed and the later messages", func() bool { return handled(b) == first+later })

	b.mu.Lock()
	if len(b.pubErrs) > 0 {
		t.Errorf("the target's app's js.Publish failed %d times, first: %v", len(b.pubErrs), b.pubErrs[0])
	}
	b.mu.Unlock()
	st, err := dst.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var absorbed uint64
	for _, s := range st.Replay.Suppressed {
		absorbed += s.Count
	}
	if absorbed != first {
		t.Errorf("the target absorbed %d publishes (%+v), want %d: one per replayed message", absorbed, st.Replay.Suppressed, first)
	}
	rs, err := js.Stream(ctx, results)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for seq := uint64(1); ; seq++ {
		m, err := rs.GetMsg(ctx, seq)
		if err != nil {
			break
		}
		seen[string(m.Data)]++
	}
	for i := range first + later {
		if k := seen[fmt.Sprintf("result-job-%d", i)]; k != 1 {
			t.Errorf("result of job-%d is in the results stream %d times, want once", i, k)
		}
	}
	if len(seen) != first+later {
		t.Errorf("results stream holds %d distinct results, want %d", len(seen), first+later)
	}
}
