package sidecar_test

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestNATSReplayAbsorbsPublishes: the sample consumer publishes a result
// to a JetStream stream for every message it handles (RESULT_SUBJECT: a
// JetStream publish that waits for the server's publish ack, before the
// message's ack). The source's app handles the first messages; a target
// replays them to a second app, whose publishes for them the target
// absorbs, answering each publish itself; after the switch its publishes
// reach the server. The results stream ends with every result exactly
// once. With each sample consumer: Go (nats.go), Python (nats-py), Node
// (nats.js).
func TestNATSReplayAbsorbsPublishes(t *testing.T) {
	for _, lang := range testenv.NATSClients {
		t.Run(lang, func(t *testing.T) { natsReplayAbsorbsPublishes(t, lang) })
	}
}

func natsReplayAbsorbsPublishes(t *testing.T, lang string) {
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

	// startApp runs the sample consumer through the sidecar at addr and
	// returns the address of its state.
	argv := testenv.NATSConsumer(t, lang)
	startApp := func(addr string) string {
		httpAddr := testenv.FreeAddr(t)
		runApp(t, exec.Command(argv[0], argv[1:]...), map[string]string{
			"NATS_URL": "nats://" + addr, "STREAM": work, "CONSUMER": "worker", "MODE": "pull",
			"PREFETCH": "5", "WORK_MS": "0", "HTTP_ADDR": httpAddr, "RESULT_SUBJECT": work + ".out",
		})
		return httpAddr
	}
	handled := func(addr string) int {
		s, err := appStateAt(addr)
		if err != nil {
			return -1
		}
		return s.Count
	}

	source, err := sidecar.Start(ctx, natsConfig(nt, logName, "127.0.0.1:0"), sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = source.Close() })
	a := startApp(source.AMQPAddr())
	testenv.Eventually(t, 30*time.Second, "the source's app handles the first messages", func() bool { return handled(a) == first })
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
	b := startApp(target.AMQPAddr())
	dst := control.Client{URL: "http://" + target.ControlAddr(), Token: token, HTTP: http.DefaultClient}
	if _, err := dst.WaitSwitched(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	publish(first, first+later)
	testenv.Eventually(t, 30*time.Second, "the target's app handles the replayed and the later messages", func() bool { return handled(b) == first+later })

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
	// The later results may still be on their way after the app's count.
	seen := map[string]int{}
	testenv.Eventually(t, 10*time.Second, "every result in the results stream", func() bool {
		info, err := rs.Info(ctx)
		return err == nil && info.State.Msgs >= first+later
	})
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
