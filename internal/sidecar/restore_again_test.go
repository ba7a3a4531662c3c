package sidecar_test

import (
	"fmt"
	"testing"
	"time"

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
