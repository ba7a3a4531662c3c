package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestHandoff is the message half of a migration, without CRIU: a source
// consumer serves behind its sidecar while a target consumer starts empty
// behind a target sidecar that replays the log from ID 0. At a random point
// the source is stopped at a cutoff; the target replays up to it, switches to
// the primary queue, and ends with the producer's hash.
func TestHandoff(t *testing.T) {
	const n = 400
	for _, tc := range []struct {
		name     string
		app      string
		prefetch int
	}{
		{"go prefetch 1", "go", 1},
		{"go prefetch 50", "go", 50},
		{"python prefetch 10", "python", 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			q := e.queue()
			source := e.start(sidecar.Options{})
			cfg := e.config()
			cfg.ReplayStart, cfg.ReplayCutoff = "0", "marker"
			target := e.startConfig(cfg, sidecar.Options{})
			dst := &env{t: t, broker: e.broker, log: e.log, sc: target}

			startApp := func(sc *sidecar.Sidecar) string {
				var cmd *exec.Cmd
				if tc.app == "go" {
					cmd = exec.Command(testenv.Build(t, "examples/consumer"))
				} else {
					cmd = exec.Command(testenv.RequirePika(t), filepath.Join(testenv.ModuleRoot(t), "examples/consumer-python/consumer.py"))
				}
				addr := testenv.FreeAddr(t)
				runApp(t, cmd, map[string]string{
					"AMQP_URL": "amqp://guest:guest@" + sc.AMQPAddr() + "/",
					"QUEUE":    q, "PREFETCH": fmt.Sprint(tc.prefetch), "WORK_MS": "2", "HTTP_ADDR": addr, "DECLARE": "false",
				})
				return addr
			}
			srcApp := startApp(source)
			dstApp := startApp(target)

			producer := exec.Command(testenv.Build(t, "examples/producer"),
				"-url", e.broker.AMQPURL, "-queue", q, "-count", fmt.Sprint(n), "-rate", "200", "-declare=false")
			var out bytes.Buffer
			producer.Stdout = &out
			if err := producer.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { producer.Process.Kill(); producer.Wait() })

			// Hand over at a random point while the producer is running.
			handoverPoint(t, srcApp)
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			stop, err := control.Handover(ctx,
				control.Client{URL: "http://" + source.ControlAddr(), Token: token},
				control.Client{URL: "http://" + target.ControlAddr(), Token: token},
				control.HandoverOptions{MaxLag: 5})
			if err != nil {
				t.Fatalf("handover: %v", err)
			}
			if stop.Switched.Before(stop.StopStarted) || stop.Downtime <= 0 || stop.Stopped.Before(stop.StopStarted) {
				t.Errorf("handover timings out of order: %+v", stop)
			}
			t.Logf("handover: cutoff %d, lag at stop %d, downtime %s", stop.CutoffID, stop.LagAtStop, stop.Downtime)
			if err := producer.Wait(); err != nil {
				t.Fatalf("producer: %v", err)
			}
			var want struct {
				Count int    `json:"count"`
				Hash  string `json:"hash"`
			}
			if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &want); err != nil {
				t.Fatalf("producer printed %q: %v", out.String(), err)
			}

			srcState, _ := appStateAt(srcApp)
			if uint64(srcState.Count) != stop.CutoffID {
				t.Errorf("source app processed %d messages, cutoff ID is %d", srcState.Count, stop.CutoffID)
			}
			var got appState
			testenv.Eventually(t, 60*time.Second, "the target to process every message", func() bool {
				got, _ = appStateAt(dstApp)
				return got.Count >= n
			})
			if got.Count != n || got.Hash != want.Hash || got.Skipped != 0 {
				t.Fatalf("target app %+v, want count %d and the producer's hash %s (cutoff %d)", got, n, want.Hash, stop.CutoffID)
			}
			// The target took the log over: its deliveries follow the cutoff.
			testenv.Eventually(t, 10*time.Second, "the target's log writes", func() bool {
				return dst.state().Log.ConfirmedID == n
			})
			var ids []uint64
			for _, r := range e.records() {
				if r.Kind == shadowqueue.KindDelivery {
					ids = append(ids, r.ID)
				}
			}
			deliveries(t, e.records(), 1)
			if len(ids) != n {
				t.Errorf("log holds %d deliveries, want %d", len(ids), n)
			}
			t.Logf("cutoff at %d of %d", stop.CutoffID, n)
		})
	}
}
