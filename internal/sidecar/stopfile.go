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

// writeStop records r durably in dir (writeState).
func writeStop(dir, logName string, r proxy.StopResult) error {
	return writeState(dir, stopFileName, "the stop", stopRecord{LogName: logName, CutoffID: r.CutoffID, Epoch: r.Epoch, StoppedAt: r.StoppedAt})
}

// readStop reads the stop recorded in dir; ok is false when there is none.
// A record of another log, or one that does not parse, is an error: the
// sidecar does not start on a state it cannot read.
func readStop(dir, logName string) (r proxy.StopResult, ok bool, err error) {
	var rec stopRecord
	ok, err = readState(dir, stopFileName, "stop", logName, &rec, func() string { return rec.LogName })
	if err != nil || !ok {
		return proxy.StopResult{}, false, err
	}
	return proxy.StopResult{CutoffID: rec.CutoffID, Epoch: rec.Epoch, StoppedAt: rec.StoppedAt}, true, nil
}

// writeState records v, what, durably in dir as file: written to a
// temporary file, synced, renamed over file, and the folder synced.
func writeState(dir, file, what string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	fail := func(err error) error { return fmt.Errorf("record %s in MS2M_STATE_DIR=%s: %w", what, dir, err) }
	tmp, err := os.CreateTemp(dir, "."+file+"-*")
	if err != nil {
		return fail(err)
	}
	defer os.Remove(tmp.Name()) // gone after the rename; left only on failure
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, file)); err != nil {
		return fail(err)
	}
	return syncDir(dir)
}

// readState reads file in dir into v, the record of a what; ok is false
// when there is none. logOf returns the log v names once read: a record
// of another log than logName, or one that does not parse, is an error.
func readState(dir, file, what, logName string, v any, logOf func() string) (ok bool, err error) {
	path := filepath.Join(dir, file)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the recorded %s in MS2M_STATE_DIR=%s: %w", what, dir, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("the recorded %s %s: %w; the sidecar cannot tell its state: delete the pod", what, path, err)
	}
	if l := logOf(); l != logName {
		return false, fmt.Errorf("the recorded %s %s is of log %q, not of this sidecar's %q (MS2M_LOG_NAME changed?); delete the pod", what, path, l, logName)
	}
	return true, nil
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
