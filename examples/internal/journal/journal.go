package journal

import (
	"strconv"
	"time"
)

// Max bounds a journal (32 bytes a fold, 3.2 MiB); when it is full the
// older half goes.
const Max = 100_000

// Fold is one folded message: its numeric message-id (-1 without one), the
// time from the producer's send stamp to its fold (-1 without one), when it
// was folded, and when it was sent (0 without a stamp), both in Unix
// nanoseconds of the host's clock.
type Fold struct {
	ID        int64   `json:"id"`
	LatencyMS float64 `json:"latency_ms"`
	AtNS      int64   `json:"at_ns"`
	SentNS    int64   `json:"sent_ns"`
}

// NewFold is the fold at now of a message with message-id id (its numeric
// value counts; anything else is none) sent at sent (zero: unknown).
func NewFold(id string, sent, now time.Time) Fold {
	f := Fold{ID: -1, LatencyMS: -1, AtNS: now.UnixNano()}
	if n, err := strconv.ParseInt(id, 10, 64); err == nil {
		f.ID = n
	}
	if !sent.IsZero() {
		f.LatencyMS = float64(now.Sub(sent)) / float64(time.Millisecond)
		f.SentNS = sent.UnixNano()
	}
	return f
}

// Journal is the last Max folds. The zero value is empty. It is not safe
// for concurrent use: the consumer's state lock guards it.
type Journal struct {
	folds   []Fold
	dropped int
}

// Add appends f, dropping the older half first when the journal is full
// (amortised).
func (j *Journal) Add(f Fold) {
	if len(j.folds) == Max {
		n := copy(j.folds, j.folds[Max/2:])
		j.folds = j.folds[:n]
		j.dropped += Max / 2
	}
	j.folds = append(j.folds, f)
}

// Folds is the body of GET /folds: the journal, oldest first, and how many
// folds fell out of it.
type Folds struct {
	Folds   []Fold `json:"folds"`
	Dropped int    `json:"dropped"`
}

// Snapshot copies the journal.
func (j *Journal) Snapshot() Folds {
	return Folds{Folds: append([]Fold{}, j.folds...), Dropped: j.dropped}
}
