package sidecar_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// produce runs the sample producer to the end and returns its hash.
func produce(t *testing.T, e *env, q string, n int, rate string) string {
	t.Helper()
	out, err := exec.Command(testenv.Build(t, "examples/producer"),
		"-url", e.broker.AMQPURL, "-queue", q, "-count", fmt.Sprint(n), "-rate", rate, "-declare=false").Output()
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	var p struct {
		Hash string `json:"hash"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &p); err != nil {
		t.Fatalf("producer printed %q: %v", out, err)
	}
	return p.Hash
}

func goConsumer(t *testing.T, sc *sidecar.Sidecar, q string, prefetch int) (addr string, cmd *exec.Cmd) {
	t.Helper()
	return goConsumerWork(t, sc, q, prefetch, 2)
}

// goConsumerWork is goConsumer whose app works workMS per message.
func goConsumerWork(t *testing.T, sc *sidecar.Sidecar, q string, prefetch, workMS int) (addr string, cmd *exec.Cmd) {
	t.Helper()
	cmd = exec.Command(testenv.Build(t, "examples/consumer"))
	addr = testenv.FreeAddr(t)
	runApp(t, cmd, map[string]string{
		"AMQP_URL": "amqp://guest:guest@" + sc.AMQPAddr() + "/",
		"QUEUE":    q, "PREFETCH": fmt.Sprint(prefetch), "WORK_MS": fmt.Sprint(workMS), "HTTP_ADDR": addr, "DECLARE": "false",
	})
	return addr, cmd
}

// sourceThenStop lets a source consume part of n messages, stops it, and
// returns the cutoff ID and the producer's hash.
func sourceThenStop(t *testing.T, e *env, q string, n int) (cutoff uint64, hash string) {
	t.Helper()
	cutoff, _, hash = sourceThenStopEpoch(t, e, q, n)
	return cutoff, hash
}

// sourceThenStopEpoch is sourceThenStop that also returns the stop's epoch.
func sourceThenStopEpoch(t *testing.T, e *env, q string, n int) (cutoff, epoch uint64, hash string) {
	t.Helper()
	source := e.start(sidecar.Options{})
	src := &env{t: t, broker: e.broker, log: e.log, sc: source}
	srcApp, _ := goConsumer(t, source, q, 10)
	hash = produce(t, e, q, n, "0")
	testenv.Eventually(t, 30*time.Second, "the source to process a part", func() bool {
		s, _ := appStateAt(srcApp)
		return s.Count >= n/3
	})
	var stop struct {
		CutoffID uint64 `json:"cutoffId"`
		Epoch    uint64 `json:"epoch"`
	}
	if code := src.call("POST", "/stop?timeout=20s", &stop); code != 200 {
		t.Fatalf("stop = %d", code)
	}
	return stop.CutoffID, stop.Epoch, hash
}

// TestHandoffCheckCanFail: a target told to stop one message short of the
// real cutoff loses that message, and the hash check catches it.
func TestHandoffCheckCanFail(t *testing.T) {
	const n = 300
	e := newEnv(t)
	q := e.queue()
	cutoff, want := sourceThenStop(t, e, q, n)
	cfg := e.config()
	cfg.ReplayStart, cfg.ReplayCutoff = "0", fmt.Sprint(cutoff-1) // deliberately wrong
	target := e.startConfig(cfg, sidecar.Options{})
	dstApp, _ := goConsumer(t, target, q, 10)
	var got appState
	testenv.Eventually(t, 60*time.Second, "the target to drain the queue", func() bool {
		got, _ = appStateAt(dstApp)
		return got.Count >= n-1
	})
	time.Sleep(300 * time.Millisecond)
	got, _ = appStateAt(dstApp)
	if got.Count != n-1 || got.Hash == want {
		t.Fatalf("target with a cutoff one short: %+v; want %d messages and a hash that is NOT the producer's", got, n-1)
	}
}

// TestTargetRestartMidReplay: a target killed in the middle of its replay
// (sidecar and app) and started again replays from the start and ends exact.
func TestTargetRestartMidReplay(t *testing.T) {
	const n = 300
	e := newEnv(t)
	q := e.queue()
	_, want := sourceThenStop(t, e, q, n)
	cfg := e.config()
	cfg.ReplayStart, cfg.ReplayCutoff = "0", "marker"

	first := e.startConfig(cfg, sidecar.Options{})
	firstApp, firstCmd := goConsumer(t, first, q, 5)
	testenv.Eventually(t, 30*time.Second, "the first target to replay a part", func() bool {
		s, _ := appStateAt(firstApp)
		return s.Count >= 20
	})
	firstCmd.Process.Kill()
	first.Close()

	second := e.startConfig(cfg, sidecar.Options{})
	secondApp, _ := goConsumer(t, second, q, 5)
	var got appState
	testenv.Eventually(t, 60*time.Second, "the restarted target to process everything", func() bool {
		got, _ = appStateAt(secondApp)
		return got.Count >= n
	})
	if got.Count != n || got.Hash != want || got.Skipped != 0 {
		t.Fatalf("restarted target %+v, want %d messages and the producer's hash %s", got, n, want)
	}
}

// TestTargetAppRestartInterruptsReplay: the app of a target killed in the
// middle of its replay and started again over the same sidecar, as the
// kubelet restarts a container, starts from the checkpoint's state again
// (here: empty, the start is ID 0), but the sidecar goes on after what the
// first app had acked. It cannot tell a restart from a reconnect, so its
// /state says the replay was interrupted, and the migrator's handover
// helpers give such a target up instead of letting it take over with the
// first app's part of the replay missing.
func TestTargetAppRestartInterruptsReplay(t *testing.T) {
	const n = 300
	e := newEnv(t)
	q := e.queue()
	_, want := sourceThenStop(t, e, q, n)
	cfg := e.config()
	cfg.ReplayStart, cfg.ReplayCutoff = "0", "marker"
	target := e.startConfig(cfg, sidecar.Options{})
	dst := &env{t: t, broker: e.broker, log: e.log, sc: target}
	ep := control.Client{URL: "http://" + target.ControlAddr(), Token: token, HTTP: http.DefaultClient}

	firstApp, firstCmd := goConsumer(t, target, q, 5)
	testenv.Eventually(t, 30*time.Second, "the first app to replay a part", func() bool {
		s, _ := appStateAt(firstApp)
		return s.Count >= 20
	})
	if got := interruptions(dst); got != 0 {
		t.Fatalf("replay.interrupted = %d while the first app replays, want 0", got)
	}
	firstCmd.Process.Kill()
	testenv.Eventually(t, 10*time.Second, "/state to count the interrupted replay", func() bool { return interruptions(dst) == 1 })

	// The app comes back with the checkpoint's state.
	secondApp, _ := goConsumer(t, target, q, 5)
	_, err := ep.WaitSwitched(t.Context(), 30*time.Second)
	if err == nil || !strings.Contains(err.Error(), "lost its connection in the middle of the replay") {
		t.Errorf("WaitSwitched on the interrupted target: %v; want it to refuse the target", err)
	}
	// What the refusal spares: the restarted app misses what the first
	// one had acked.
	var got appState
	prev := -1
	testenv.Eventually(t, 60*time.Second, "the restarted app to drain the log and the queue", func() bool {
		time.Sleep(time.Second)
		got, _ = appStateAt(secondApp)
		done := got.Count > n/2 && got.Count == prev
		prev = got.Count
		return done
	})
	t.Logf("restarted app: %d messages (producer %d), hash equal: %t", got.Count, n, got.Hash == want)
	if got.Hash == want {
		t.Errorf("the restarted app ended with the producer's hash: the test did not restart it in the middle of the replay")
	}
}

// interruptions reads replay.interrupted from a target's /state.
func interruptions(e *env) int {
	var st struct {
		Replay struct {
			Interrupted int `json:"interrupted"`
		} `json:"replay"`
	}
	e.call("GET", "/state", &st)
	return st.Replay.Interrupted
}

// cutter relays TCP connections to addr and can cut all of them at once.
type cutter struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCutter(t *testing.T, addr string) *cutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{ln: ln}
	t.Cleanup(func() { ln.Close(); c.cut() })
	go func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", addr)
			if err != nil {
				a.Close()
				continue
			}
			c.mu.Lock()
			c.conns = append(c.conns, a, b)
			c.mu.Unlock()
			go func() {
				_, _ = io.Copy(b, a) // a relay ends when either side does
				b.Close()
			}()
			go func() {
				_, _ = io.Copy(a, b) // a relay ends when either side does
				a.Close()
			}()
		}
	}()
	return c
}

func (c *cutter) addr() string { return c.ln.Addr().String() }

func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, x := range c.conns {
		x.Close()
	}
	c.conns = nil
}

// TestTargetAppReconnectsMidReplay: the restored app's connection drops in
// the middle of the replay (as after a CRIU restore with --tcp-close); the
// app reconnects, and the replay goes on from its first unacked record, with
// the redelivered flag, and ends exact.
//
// The cut keeps the app's memory (unlike a restore, which rolls it back to
// the checkpoint), so deliveries it folded but whose acks died with the
// connection come again, redelivered, as any AMQP broker sends them: an app
// must drop those itself. This is the one sidecar test with the example
// consumer's SKIP_REDELIVERIES on, and it bounds what the skip may hide by
// the prefetch window that was in flight at the cut.
func TestTargetAppReconnectsMidReplay(t *testing.T) {
	const n = 300
	e := newEnv(t)
	q := e.queue()
	_, want := sourceThenStop(t, e, q, n)
	target := e.startConfig(targetConfig(e), sidecar.Options{})
	cut := newCutter(t, target.AMQPAddr())
	addr := testenv.FreeAddr(t)
	runApp(t, exec.Command(testenv.Build(t, "examples/consumer")), map[string]string{
		"AMQP_URL": "amqp://guest:guest@" + cut.addr() + "/",
		"QUEUE":    q, "PREFETCH": "10", "WORK_MS": "2", "HTTP_ADDR": addr, "DECLARE": "false",
		"SKIP_REDELIVERIES": "true",
	})
	testenv.Eventually(t, 30*time.Second, "the target to replay a part", func() bool {
		s, _ := appStateAt(addr)
		return s.Count >= 30
	})
	cut.cut()
	var got appState
	testenv.Eventually(t, 60*time.Second, "the target to process everything after reconnecting", func() bool {
		got, _ = appStateAt(addr)
		return got.Count >= n
	})
	time.Sleep(200 * time.Millisecond)
	got, _ = appStateAt(addr)
	if got.Count != n || got.Hash != want || got.Skipped > 10 {
		t.Fatalf("target after a reconnect: %+v, want %d messages, the producer's hash %s and at most the prefetch window (10) skipped", got, n, want)
	}
}
