package soak

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
)

// Result is how a migration ended, as the migrator saw it.
type Result string

const (
	// Completed: the target serves.
	Completed Result = "completed"
	// RolledBack: the migration failed and the source serves again.
	RolledBack Result = "rolled-back"
	// Failed: the migration failed and neither the source nor a target
	// was seen serving (or the run could not tell which).
	Failed Result = "failed"
)

// Outcome is what the oracle found: the app's record of the messages it
// processed, after the migration.
type Outcome string

const (
	// Exact: every message up to the one checked processed once, in order.
	Exact Outcome = "exact"
	// Lost: a message was skipped.
	Lost Outcome = "lost"
	// Doubled: a message was processed twice (or the record does not
	// match in a way that is not only a gap).
	Doubled Outcome = "doubled"
	// Stuck: the migration, or the app, did not get on within its
	// deadline, so that nothing could be checked.
	Stuck Outcome = "stuck"
)

// Record is one migration of a soak, one line of its JSONL file.
type Record struct {
	Mode     string  `json:"mode"`
	Index    int     `json:"index"`          // 1, 2, ... within the mode's file
	Run      string  `json:"run,omitempty"`  // the chunk that made it
	Seed     int64   `json:"seed,omitempty"` // what drew its choices, where drawn
	Strategy string  `json:"strategy"`
	Workload string  `json:"workload,omitempty"` // Deployment, StatefulSet
	From     string  `json:"from,omitempty"`
	To       string  `json:"to,omitempty"`
	Fault    string  `json:"fault,omitempty"` // what was injected, "" for none
	Rate     float64 `json:"rate,omitempty"`  // messages per second
	Result   Result  `json:"result"`
	Outcome  Outcome `json:"outcome"`
	TotalMS  float64 `json:"total_ms"`
	// DowntimeMS is the migrator's switch time; GapMS the processing gap
	// from the apps' journals, where the mode can read it.
	DowntimeMS float64  `json:"downtime_ms,omitempty"`
	GapMS      *float64 `json:"gap_ms,omitempty"`
	// Checked is how many messages the app had processed when it was
	// checked.
	Checked int       `json:"checked,omitempty"`
	Error   string    `json:"error,omitempty"`
	At      time.Time `json:"at"`
}

// Validate says what is wrong with r, or nil.
func (r Record) Validate() error {
	var errs []error
	if r.Mode == "" {
		errs = append(errs, errors.New("no mode"))
	}
	if r.Index < 1 {
		errs = append(errs, fmt.Errorf("index %d: want 1 or more", r.Index))
	}
	if r.Strategy == "" {
		errs = append(errs, errors.New("no strategy"))
	}
	switch r.Result {
	case Completed, RolledBack, Failed:
	default:
		errs = append(errs, fmt.Errorf("result %q: want %s, %s or %s", r.Result, Completed, RolledBack, Failed))
	}
	switch r.Outcome {
	case Exact, Lost, Doubled, Stuck:
	default:
		errs = append(errs, fmt.Errorf("outcome %q: want %s, %s, %s or %s", r.Outcome, Exact, Lost, Doubled, Stuck))
	}
	if r.TotalMS < 0 || r.DowntimeMS < 0 || (r.GapMS != nil && *r.GapMS < 0) {
		errs = append(errs, errors.New("a negative duration"))
	}
	return errors.Join(errs...)
}

// Marshal is r as one line of a soak file, newline included.
func (r Record) Marshal() ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("record %d of %s: %w", r.Index, r.Mode, err)
	}
	// Tenths of a millisecond, and seconds of a time, are all the records
	// need, and keep the files small.
	r.TotalMS, r.DowntimeMS = tenths(r.TotalMS), tenths(r.DowntimeMS)
	if r.GapMS != nil {
		g := tenths(*r.GapMS)
		r.GapMS = &g
	}
	r.At = r.At.Truncate(time.Second)
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func tenths(ms float64) float64 { return math.Round(ms*10) / 10 }

// ParseRecord reads one line of a soak file.
func ParseRecord(line []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(line, &r); err != nil {
		return r, err
	}
	return r, r.Validate()
}
