package sidecar

import (
	"context"
	"sync"
	"time"

	"github.com/ms2m/ms2m/internal/proxy"
)

// A takeover must outlive the sidecar's container too. A target's env
// describes its replay (MS2M_REPLAY_START, _CUTOFF, _EPOCH) for as long as
// the pod lives, so a sidecar that the kubelet restarts after the switch
// (OOM-killed, a failed liveness probe) while its app runs on would
// replay the log again to an app that has folded it: each replayed
// message twice. So once the target has taken over (its replay done, every
// app consumer on the broker) it records that in MS2M_STATE_DIR, before
// /state reports it switched; a sidecar configured for replay that finds
// the record at start serves as a source does instead, continuing the
// log's IDs after its last record. A later stop of this pod, as the
// source of the next migration, is recorded beside it (stopped.json), and
// a restart after both starts stopped, as any source's restart does.

// switchFileName is the takeover's file in the state folder.
const switchFileName = "switched.json"

// switchRecord is what switched.json holds.
type switchRecord struct {
	LogName    string    `json:"logName"`  // the replay log taken over
	CutoffID   uint64    `json:"cutoffId"` // the last ID replayed
	Epoch      uint64    `json:"epoch"`    // the cutoff's epoch
	SwitchedAt time.Time `json:"switchedAt"`
}

// readSwitch reads the takeover recorded in dir; ok is false when there is
// none. A record of another log, or one that does not parse, is an error.
func readSwitch(dir, logName string) (r switchRecord, ok bool, err error) {
	ok, err = readState(dir, switchFileName, "takeover", logName, &r, func() string { return r.LogName })
	return r, ok, err
}

// switchRecorder writes a target's takeover once, when its proxy first
// reports it switched.
type switchRecorder struct {
	s *Sidecar

	mu   sync.Mutex
	done bool
}

// switched says whether a target's replay is done and every app consumer
// consumes from the broker (control.State's switched).
func switched(st proxy.State) bool {
	r := st.Replay
	return r != nil && r.SwitchedAt != nil && r.Replaying == 0
}

// record writes the takeover if st reports it and it is not written yet;
// it returns whether the takeover is recorded (always true without a
// state folder: there is nothing to write to).
func (w *switchRecorder) record(st proxy.State) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done || w.s.cfg.StateDir == "" {
		return true, nil
	}
	if !switched(st) {
		return false, nil
	}
	id, epoch, _ := w.s.source.Cutoff()
	rec := switchRecord{LogName: w.s.cfg.LogName, CutoffID: id, Epoch: epoch, SwitchedAt: *st.Replay.SwitchedAt}
	if err := writeState(w.s.cfg.StateDir, switchFileName, "the takeover", rec); err != nil {
		return false, err
	}
	w.done = true
	w.s.log.Info("took the replay log over: recorded, so that a restart of this sidecar serves rather than replays again", "cutoff_id", id, "epoch", epoch)
	return true, nil
}

// watch records the takeover as soon as the proxy reports it, without
// waiting for a read of /state, until it is recorded or ctx is done. A
// record that cannot be written is logged at once, then once a minute
// while it fails (each attempt's error names a fresh temporary file, so
// its text never repeats), not on every try or read of /state.
func (w *switchRecorder) watch(ctx context.Context) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var (
		failing time.Time // since when the record fails; zero while it does not
		logged  time.Time
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ok, err := w.record(w.s.front.State())
		if ok {
			return
		}
		if err == nil {
			continue
		}
		now := time.Now()
		if failing.IsZero() {
			failing = now
		}
		if now.Sub(logged) >= switchLogEvery {
			logged = now
			w.s.log.Error("cannot record the takeover; /state does not report the switch until it is recorded, and the migration waits (make MS2M_STATE_DIR writable)",
				"err", err, "failing_since", failing)
		}
	}
}

// switchLogEvery is how often watch logs a takeover it cannot record.
const switchLogEvery = time.Minute
