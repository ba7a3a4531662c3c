package sidecar

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/ms2m/ms2m/internal/proxy"
)

// A stop must outlive the sidecar's container. Between a source's stop and
// the target's takeover, a sidecar that the kubelet restarts (a crash, a
// failed liveness probe) would otherwise start serving: what it takes
// then lies after the cutoff the target replays to, and is lost when the
// source goes. So a stop is written to MS2M_STATE_DIR, an emptyDir that
// lives as long as the pod, before /stop answers; a sidecar that finds it
// at start starts stopped at that cutoff; /resume removes it once the
// sidecar serves again. A pod made from a checkpoint gets a new emptyDir,
// so a restored target never starts stopped.

// stopFileName is the stop's file in the state folder.
const stopFileName = "stopped.json"

// stopRecord is what stopped.json holds.
type stopRecord struct {
	LogName   string    `json:"logName"` // the replay log the cutoff is in
	CutoffID  uint64    `json:"cutoffId"`
	Epoch     uint64    `json:"epoch"`
	StoppedAt time.Time `json:"stoppedAt"`
}

// writeStop records r durably in dir: written to a temporary file, synced,
// renamed over stopped.json, and the folder synced.
func writeStop(dir, logName string, r proxy.StopResult) error {
	b, err := json.Marshal(stopRecord{LogName: logName, CutoffID: r.CutoffID, Epoch: r.Epoch, StoppedAt: r.StoppedAt})
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".stopped-*.json")
	if err != nil {
		return fmt.Errorf("record the stop in MS2M_STATE_DIR=%s: %w", dir, err)
	}
	defer os.Remove(tmp.Name()) // gone after the rename; left only on failure
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("record the stop in MS2M_STATE_DIR=%s: %w", dir, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("record the stop in MS2M_STATE_DIR=%s: %w", dir, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("record the stop in MS2M_STATE_DIR=%s: %w", dir, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, stopFileName)); err != nil {
		return fmt.Errorf("record the stop in MS2M_STATE_DIR=%s: %w", dir, err)
	}
	return syncDir(dir)
}

// readStop reads the stop recorded in dir; ok is false when there is none.
// A record of another log, or one that does not parse, is an error: the
// sidecar does not start on a state it cannot read.
func readStop(dir, logName string) (r proxy.StopResult, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, stopFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return proxy.StopResult{}, false, nil
	}
	if err != nil {
		return proxy.StopResult{}, false, fmt.Errorf("read the recorded stop in MS2M_STATE_DIR=%s: %w", dir, err)
	}
	var rec stopRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return proxy.StopResult{}, false, fmt.Errorf("the recorded stop %s: %w; the sidecar cannot tell whether it was stopped: delete the pod", filepath.Join(dir, stopFileName), err)
	}
	if rec.LogName != logName {
		return proxy.StopResult{}, false, fmt.Errorf("the recorded stop %s is of log %q, not of this sidecar's %q (MS2M_LOG_NAME changed?); delete the pod", filepath.Join(dir, stopFileName), rec.LogName, logName)
	}
	return proxy.StopResult{CutoffID: rec.CutoffID, Epoch: rec.Epoch, StoppedAt: rec.StoppedAt}, true, nil
}

// clearStop removes the stop recorded in dir, if any, durably.
func clearStop(dir string) error {
	err := os.Remove(filepath.Join(dir, stopFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove the recorded stop from MS2M_STATE_DIR=%s: %w", dir, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync MS2M_STATE_DIR=%s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync MS2M_STATE_DIR=%s: %w", dir, err)
	}
	return nil
}
