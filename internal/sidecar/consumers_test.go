package sidecar_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

type appState struct {
	Count int    `json:"count"`
	Hash  string `json:"hash"`
	Last  string `json:"last"`
	// Skipped counts redeliveries the example consumer dropped as already
	// folded. Its skip is off unless SKIP_REDELIVERIES=true, so this is 0
	// wherever the hash is the whole oracle.
	Skipped int `json:"skipped_redeliveries"`
	// Connected is true while a consumer session consumes.
	Connected bool `json:"connected"`
	// Reconnects counts the sessions that started consuming after the
	// first.
	Reconnects int `json:"reconnects"`
}

// runApp starts a sample app with env, killed when the test ends.
func runApp(t *testing.T, cmd *exec.Cmd, env map[string]string) {
	t.Helper()
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) // fails only if it has exited already
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }() // how it ended shows in its logs
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(cmd.Path), logs.String())
		}
	})
}

// handoverPoint returns at a random point while a handoff test's producer
// runs, once the source's app (its state at srcApp) has processed a first
// message through its sidecar: an app still starting (a Python one takes
// seconds on a loaded machine) would otherwise be handed over before it
// consumed anything, at cutoff 0, which is not the migration under test.
func handoverPoint(t *testing.T, srcApp string) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, "the source's app to process a first message", func() bool {
		s, err := appStateAt(srcApp)
		return err == nil && s.Count > 0
	})
	time.Sleep(time.Duration(rand.IntN(900)) * time.Millisecond) // the random point, not a wait
}

func appStateAt(addr string) (appState, error) {
	var s appState
	resp, err := http.Get("http://" + addr + "/state")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// TestUnmodifiedConsumers runs the sample Go (amqp091-go) and Python (pika)
// consumers behind the sidecar, fed by the sample producer: each ends with
// the producer's hash, and the log holds every message once, in order.
func TestUnmodifiedConsumers(t *testing.T) {
	const n = 300
	for _, app := range []string{"go", "python"} {
		t.Run(app, func(t *testing.T) {
			e := newEnv(t)
			e.start(sidecar.Options{})
			q := e.queue()

			producer := exec.Command(testenv.Build(t, "examples/producer"),
				"-url", e.broker.AMQPURL, "-queue", q, "-count", fmt.Sprint(n), "-rate", "0", "-declare=false")
			out, err := producer.Output()
			if err != nil {
				t.Fatalf("producer: %v", err)
			}
			var want struct {
				Count int    `json:"count"`
				Hash  string `json:"hash"`
			}
			if err := json.Unmarshal(bytes.TrimSpace(out), &want); err != nil || want.Count != n {
				t.Fatalf("producer printed %q (%v), want a JSON line with count %d", out, err, n)
			}

			var cmd *exec.Cmd
			if app == "go" {
				cmd = exec.Command(testenv.Build(t, "examples/consumer"))
			} else {
				cmd = exec.Command(testenv.RequirePika(t), filepath.Join(testenv.ModuleRoot(t), "examples/consumer-python/consumer.py"))
			}
			httpAddr := testenv.FreeAddr(t)
			runApp(t, cmd, map[string]string{
				"AMQP_URL": "amqp://guest:guest@" + e.sc.AMQPAddr() + "/",
				"QUEUE":    q, "PREFETCH": "20", "WORK_MS": "0", "HTTP_ADDR": httpAddr, "DECLARE": "false",
			})
			var got appState
			testenv.Eventually(t, 60*time.Second, "the consumer to process every message", func() bool {
				got, _ = appStateAt(httpAddr)
				return got.Count >= n
			})
			if got.Count != n || got.Hash != want.Hash || got.Skipped != 0 {
				t.Fatalf("consumer state %+v, want count %d and the producer's hash %s", got, n, want.Hash)
			}
			testenv.Eventually(t, 10*time.Second, "the log to confirm every delivery", func() bool {
				return e.state().Log.ConfirmedID == n
			})
			recs := deliveries(t, e.records(), 1)
			if len(recs) != n {
				t.Fatalf("log holds %d deliveries, want %d", len(recs), n)
			}
			for i, r := range recs {
				if want := fmt.Sprintf("msg-%d", i+1); string(r.Body) != want || r.Queue != q || r.ConsumerTag == "" {
					t.Fatalf("log record %d = %q on queue %q tag %q, want %q on %q", r.ID, r.Body, r.Queue, r.ConsumerTag, want, q)
				}
			}
		})
	}
}
