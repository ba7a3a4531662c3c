package sidecar_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestRestoredAgainReplaysWhatItsPredecessorTook: a restore (fixed cutoff,
// as a StatefulSet's) that took over and consumed live goes away, and the
// same restore is started again from the same checkpoint, as the
// StatefulSet makes the pod again while its pending-migration record is
// still there. The second finds deliveries beyond its cutoff in the log at
// its start, which only its predecessor can have taken, and replays
// through them (replay.Range.LogEnd): the producer's hash, nothing skipped.
// Without that, it replays to the old cutoff and lacks what the first one
// processed live.
func TestRestoredAgainReplaysWhatItsPredecessorTook(t *testing.T) {
	const n = 300
	e := newEnv(t)
	q := e.queue()
	cutoff, epoch, want := sourceThenStopEpoch(t, e, q, n)
	cfg := e.config()
	// As the migrator makes a StatefulSet's restore: the stop's cutoff and
	// epoch.
	cfg.ReplayStart, cfg.ReplayCutoff, cfg.ReplayEpoch = "0", fmt.Sprint(cutoff), fmt.Sprint(epoch)

	first := e.startConfig(cfg, sidecar.Options{})
	firstApp, firstCmd := goConsumer(t, first, q, 5)
	testenv.Eventually(t, 60*time.Second, "the first restore to consume live", func() bool {
		s, _ := appStateAt(firstApp)
		return s.Count > int(cutoff)+20
	})
	// It goes away cleanly (a graceful delete): what its app was handed
	// is acked, so the broker redelivers nothing of it.
	dst := &env{t: t, broker: e.broker, log: e.log, sc: first}
	if code := dst.call("POST", "/stop?timeout=20s", nil); code != 200 {
		t.Fatalf("stop the first restore = %d", code)
	}
	firstCmd.Process.Kill()
	first.Close()

	cfg.StateDir = t.TempDir() // a new pod: a new emptyDir
	second := e.startConfig(cfg, sidecar.Options{})
	secondApp, _ := goConsumer(t, second, q, 5)
	var got appState
	testenv.Eventually(t, 60*time.Second, "the second restore to process everything", func() bool {
		got, _ = appStateAt(secondApp)
		return got.Count >= n
	})
	if got.Count != n || got.Hash != want || got.Skipped != 0 {
		t.Fatalf("the restore made again: %+v, want %d messages, the producer's hash %s and none skipped", got, n, want)
	}
}

// TestReplayToTheLogsEnd: a target with MS2M_REPLAY_CUTOFF=end, as the
// migrator makes a StatefulSet's restore whose shadow died, takes the
// log's last record at its start as the cutoff: here the source stopped
// and nothing writes the log any more, so it replays exactly what the
// source took and consumes the rest: the producer's hash.
func TestReplayToTheLogsEnd(t *testing.T) {
	const n = 300
	e := newEnv(t)
	q := e.queue()
	_, epoch, want := sourceThenStopEpoch(t, e, q, n)
	cfg := e.config()
	// The stop's epoch: a cutoff marker of it would not end this replay
	// (no later stop comes), so only the log's end can.
	cfg.ReplayStart, cfg.ReplayCutoff, cfg.ReplayEpoch = "0", "end", fmt.Sprint(epoch)
	target := e.startConfig(cfg, sidecar.Options{})
	app, _ := goConsumer(t, target, q, 5)
	var got appState
	testenv.Eventually(t, 60*time.Second, "the target to process everything", func() bool {
		got, _ = appStateAt(app)
		return got.Count >= n
	})
	if got.Count != n || got.Hash != want || got.Skipped != 0 {
		t.Fatalf("target replaying to the log's end: %+v, want %d messages, the producer's hash %s and none skipped", got, n, want)
	}
}

// TestRebuildSkipsWhatTheCrashedAppHeld: a restored pod's app (here from
// checkpoint 0: empty) is killed while it holds its prefetch window
// unacked; the broker requeues those deliveries, which are in the log
// already, and the app restarted from the checkpoint takes them again
// under new IDs. The sidecar lists the IDs it handed out and never acked
// in /state's requeued. The rebuild the controller then makes (the stop's
// cutoff, the same checkpoint) skips them (MS2M_REPLAY_SKIP): the
// producer's hash, each message once. Replaying them as well would fold
// each twice; the log holds their redeliveries, which shows it.
func TestRebuildSkipsWhatTheCrashedAppHeld(t *testing.T) {
	const n = 300
	e := newEnv(t)
	q := e.queue()
	want, requeued, stop := killedHoldingThenStopped(t, e, q, n)
	var skip []string
	for _, id := range requeued {
		if id <= stop.CutoffID {
			skip = append(skip, fmt.Sprint(id))
		}
	}
	// The fault fired: each skipped delivery is in the log again, redelivered.
	bodies := map[string]bool{}
	redelivered := 0
	for _, r := range e.records() {
		if r.Kind != shadowqueue.KindDelivery {
			continue
		}
		if slices.Contains(requeued, r.ID) {
			bodies[string(r.Body)] = true
		} else if r.Redelivered && bodies[string(r.Body)] {
			redelivered++
		}
	}
	if len(skip) == 0 || redelivered < len(skip) {
		t.Fatalf("requeued %v, of them %d redelivered into the log: the fault did not fire", requeued, redelivered)
	}
	t.Logf("the killed app held %d deliveries unacked: %v", len(skip), skip)

	cfg := e.config()
	cfg.ReplayStart, cfg.ReplayCutoff, cfg.ReplayEpoch = "0", fmt.Sprint(stop.CutoffID), fmt.Sprint(stop.Epoch)
	cfg.ReplaySkip = strings.Join(skip, ",")
	rebuilt := e.startConfig(cfg, sidecar.Options{})
	app, _ := goConsumer(t, rebuilt, q, 10)
	var got appState
	testenv.Eventually(t, 60*time.Second, "the rebuilt app to process everything", func() bool {
		got, _ = appStateAt(app)
		return got.Count >= n
	})
	if got.Count != n || got.Hash != want || got.Skipped != 0 {
		t.Fatalf("the rebuilt app: %+v, want %d messages, the producer's hash %s and none skipped", got, n, want)
	}
}

// TestReplayGivesAHeldMessageOnce: a source's app is killed holding its
// prefetch window unacked, after the checkpoint (here checkpoint 0: the
// empty app), and the app that comes back takes the broker's
// redeliveries. The log holds each such message twice: its first delivery
// and its redelivery, which the sidecar logs as repeating the first
// (Record.Repeats). A target restored from the checkpoint replays to the
// stop's cutoff and gets each message once: the producer's hash. Without
// the repeat mark it folded them twice (docs/faults.md).
func TestReplayGivesAHeldMessageOnce(t *testing.T) {
	const n = 300
	e := newEnv(t)
	q := e.queue()
	want, requeued, stop := killedHoldingThenStopped(t, e, q, n)

	// The log marks each redelivery of a requeued delivery, and only those.
	firstOf := map[string]uint64{}
	repeats := 0
	for _, r := range e.records() {
		if r.Kind != shadowqueue.KindDelivery || r.ID > stop.CutoffID {
			continue
		}
		switch {
		case r.Repeats != 0:
			if !slices.Contains(requeued, r.Repeats) || firstOf[string(r.Body)] != r.Repeats || !r.Redelivered {
				t.Errorf("record %d repeats %d (redelivered %v); the requeued are %v, and its body was first delivered as %d", r.ID, r.Repeats, r.Redelivered, requeued, firstOf[string(r.Body)])
			}
			repeats++
		case r.Redelivered && slices.Contains(requeued, firstOf[string(r.Body)]):
			t.Errorf("record %d, the redelivery of requeued %d, is not marked as its repeat", r.ID, firstOf[string(r.Body)])
		default:
			if _, seen := firstOf[string(r.Body)]; !seen {
				firstOf[string(r.Body)] = r.ID
			}
		}
	}
	if repeats == 0 {
		t.Fatalf("requeued %v, no repeat in the log up to the cutoff %d: the fault did not fire", requeued, stop.CutoffID)
	}
	t.Logf("the killed app held %d deliveries; %d of their redeliveries came before the cutoff", len(requeued), repeats)
	replayFromEmpty(t, e, q, n, want, stop)
}

// replayFromEmpty restores a target from the empty checkpoint (ID 0) to
// stop's cutoff, with the Go consumer on q, and checks that its app folds
// the n messages once each: the producer's hash want, none skipped.
func replayFromEmpty(t *testing.T, e *env, q string, n int, want string, stop stopResult) {
	t.Helper()
	cfg := e.config()
	cfg.ReplayStart, cfg.ReplayCutoff, cfg.ReplayEpoch = "0", fmt.Sprint(stop.CutoffID), fmt.Sprint(stop.Epoch)
	target := e.startConfig(cfg, sidecar.Options{})
	app, _ := goConsumer(t, target, q, 10)
	foldsExactly(t, app, n, want)
}

// TestSidecarKilledWithItsAppHoldingDeliveries: a source's app is killed
// holding its prefetch window unacked, and its sidecar with it, before it
// noted what the app held (as when the pod's containers restart together:
// the replay log on the broker survives). A new sidecar continues the log
// and a new app takes the broker's redeliveries; the new sidecar, which
// remembers the log's last deliveries (proxy.Options.Recent), logs each as
// repeating its first delivery. A target restored from the empty
// checkpoint replays the whole log to the stop's cutoff and folds each
// message once: the producer's hash. Without the memory the redeliveries
// are logged as first deliveries and the target folds them twice.
func TestSidecarKilledWithItsAppHoldingDeliveries(t *testing.T) {
	const n = 300
	e := newEnv(t)
	q := e.queue()
	cfg := e.config() // one pod: both sidecars share its state folder
	first := e.startConfig(cfg, sidecar.Options{})
	want := produce(t, e, q, n, "0")
	// 20 ms a message, as in killedHoldingThenStopped: the app holds its
	// window when it is killed.
	app, appCmd := goConsumerWork(t, first, q, 10, 20)
	testenv.Eventually(t, 30*time.Second, "the app to process a part", func() bool {
		s, _ := appStateAt(app)
		return s.Count >= n/4
	})
	_ = appCmd.Process.Kill() // SIGKILL: its unacked deliveries stay unacked
	first.Close()             // at once: the sidecar's memory goes with it
	var lastBefore uint64
	for _, r := range e.records() {
		lastBefore = max(lastBefore, r.ID)
	}

	second := e.startConfig(cfg, sidecar.Options{})
	se := &env{t: t, broker: e.broker, log: e.log, sc: second}
	app2, app2Cmd := goConsumer(t, second, q, 10)
	testenv.Eventually(t, 30*time.Second, "the new app to process a part", func() bool {
		s, _ := appStateAt(app2)
		return s.Count >= n/4
	})
	var stop stopResult
	if code := se.call("POST", "/stop?timeout=20s", &stop); code != 200 {
		t.Fatalf("stop = %d", code)
	}
	_ = app2Cmd.Process.Kill()
	second.Close()

	// Each redelivery to the new sidecar is marked as repeating the
	// message's first delivery.
	firstOf := map[string]uint64{}
	redeliveries := 0
	for _, r := range e.records() {
		if r.Kind != shadowqueue.KindDelivery || r.ID > stop.CutoffID {
			continue
		}
		if f, seen := firstOf[string(r.Body)]; seen {
			if r.ID > lastBefore && r.Redelivered {
				redeliveries++
			}
			if r.Repeats != f || !r.Redelivered {
				t.Errorf("record %d (redelivered %v) repeats %d, want %d: its body was first delivered as %d", r.ID, r.Redelivered, r.Repeats, f, f)
			}
			continue
		}
		if r.Repeats != 0 {
			t.Errorf("record %d, the first delivery of its body, repeats %d", r.ID, r.Repeats)
		}
		firstOf[string(r.Body)] = r.ID
	}
	if redeliveries == 0 {
		t.Fatalf("no redelivery to the new sidecar (log up to %d before the restart, cutoff %d): the fault did not fire", lastBefore, stop.CutoffID)
	}
	t.Logf("the killed app held %d deliveries that the new sidecar's app took again (log up to %d before the restart)", redeliveries, lastBefore)
	replayFromEmpty(t, e, q, n, want, stop)
}

// stopResult is what the tests read of POST /stop.
type stopResult struct {
	CutoffID uint64 `json:"cutoffId"`
	Epoch    uint64 `json:"epoch"`
}

// killedHoldingThenStopped runs n messages on q through a sidecar whose
// app (the Go consumer, prefetch 10) is SIGKILLed a quarter in, holding
// its prefetch window unacked, and started again, which takes the broker's
// redeliveries; then it stops the sidecar and closes it. It returns the
// producer's hash, the IDs /state listed as requeued, and the stop's
// cutoff and epoch.
func killedHoldingThenStopped(t *testing.T, e *env, q string, n int) (want string, requeued []uint64, stop stopResult) {
	t.Helper()
	served := e.start(sidecar.Options{})
	se := &env{t: t, broker: e.broker, log: e.log, sc: served}
	want = produce(t, e, q, n, "0")
	// 20 ms a message: the app cannot finish the queue between the poll
	// that sees a quarter done and the kill, even on a loaded machine (at
	// 2 ms it once did, and held nothing when killed).
	first, firstCmd := goConsumerWork(t, served, q, 10, 20)
	testenv.Eventually(t, 30*time.Second, "the app to process a part", func() bool {
		s, _ := appStateAt(first)
		return s.Count >= n/4
	})
	_ = firstCmd.Process.Kill() // SIGKILL: its unacked deliveries stay unacked
	var st struct {
		Requeued []uint64 `json:"requeued"`
	}
	testenv.Eventually(t, 30*time.Second, "the sidecar to list what the killed app held", func() bool {
		se.call("GET", "/state", &st)
		return len(st.Requeued) > 0
	})
	second, secondCmd := goConsumer(t, served, q, 10)
	testenv.Eventually(t, 30*time.Second, "the app started again to process a part", func() bool {
		s, _ := appStateAt(second)
		return s.Count >= n/4
	})
	if code := se.call("POST", "/stop?timeout=20s", &stop); code != 200 {
		t.Fatalf("stop = %d", code)
	}
	se.call("GET", "/state", &st)
	_ = secondCmd.Process.Kill()
	served.Close()
	return want, st.Requeued, stop
}
