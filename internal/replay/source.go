package replay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ms2m/ms2m/internal/shadowqueue"
)

// ErrRetention is returned when the log no longer holds the records right
// after the start ID: replaying would skip messages, so nothing is replayed.
var ErrRetention = errors.New("the replay log no longer holds the records after the start ID")

// ErrUnknownQueue is returned for a queue that the app consumes but that
// never appears in the log: most likely the app or the log is not the one
// the migration is about.
var ErrUnknownQueue = errors.New("the app consumes a queue that never appears in the replay log")

// Range says which records to replay.
type Range struct {
	// Start is exclusive: the checkpoint ID, whose effects the restored app
	// already has.
	Start uint64
	// Cutoff is inclusive. Zero means: learn it from the first cutoff marker
	// written after the record with ID Start (a resume marker of the same
	// epoch voids it).
	Cutoff uint64
	// Epoch is the log's epoch at the checkpoint: cutoff markers of this
	// epoch or an earlier one were written before the checkpoint (by an
	// earlier migration of the same log) and are ignored. Without it, a
	// stale marker whose ID equals Start would end the replay at once.
	Epoch uint64
	// ToEnd (MS2M_REPLAY_CUTOFF=end): the cutoff is LogEnd, the log's end
	// when the replay began. It is exact only when nothing writes the log
	// any more: the migrator asks for it once the last writer is gone (a
	// dead shadow, deleted and confirmed stopped).
	ToEnd bool
	// LogEnd and LogEndEpoch are the last record's delivery ID and epoch
	// in the log when the replay began (the sidecar reads it at its start).
	// Deliveries beyond the cutoff of the stop's epoch or a later one (a
	// delivery carries the epoch of the last marker before it) that are
	// already in the log then were taken by this restore's identity itself:
	// under the handoff only the restore consumes after the stop, so they
	// are a predecessor's that took over and went away (a StatefulSet's pod
	// deleted after it served, before its pending-migration record went).
	// The replay goes on through LogEnd, so that the pod made again has
	// what its predecessor processed instead of skipping it. The source's
	// own deliveries, of an earlier epoch, never extend a cutoff, nor does
	// a fixed cutoff without the stop's epoch (Epoch 0).
	LogEnd, LogEndEpoch uint64
	// Skip are delivery IDs in the range not to replay: deliveries the
	// app was handed and never acked before its connection ended, which
	// the broker requeued and delivered again under other IDs (the
	// sidecar reports them in /state's requeued; the migrator passes
	// them when it rebuilds a restarted app's state, MS2M_REPLAY_SKIP).
	// Ascending, at most MaxSkip.
	Skip []uint64
}

// MaxSkip bounds Range.Skip.
const MaxSkip = 10000

func (r Range) String() string {
	switch {
	case r.ToEnd:
		return fmt.Sprintf("(%d, log end %d]", r.Start, r.end())
	case r.Cutoff == 0:
		return fmt.Sprintf("(%d, cutoff marker]", r.Start)
	}
	return fmt.Sprintf("(%d, %d]", r.Start, r.Cutoff)
}

// end is the cutoff of a ToEnd range: the log's end, or Start if the log
// ends there.
func (r Range) end() uint64 { return max(r.LogEnd, r.Start) }

// extend moves cutoff, made by a stop of epoch, past the deliveries this
// identity took after it before the replay began (see LogEnd).
func (r Range) extend(cutoff, epoch uint64) uint64 {
	if cutoff != 0 && epoch != 0 && r.LogEnd > cutoff && r.LogEndEpoch >= epoch {
		return r.LogEnd
	}
	return cutoff
}

// Validate checks the range on its own.
func (r Range) Validate() error {
	if r.ToEnd && r.Cutoff != 0 {
		return fmt.Errorf("a replay to the log's end has no cutoff ID (got %d)", r.Cutoff)
	}
	if r.Cutoff != 0 && r.Cutoff < r.Start {
		return fmt.Errorf("cutoff ID %d is below start ID %d: nothing can be replayed; check the migration's checkpoint and cutoff", r.Cutoff, r.Start)
	}
	if len(r.Skip) > MaxSkip {
		return fmt.Errorf("%d IDs to skip, more than %d", len(r.Skip), MaxSkip)
	}
	for i, id := range r.Skip {
		if id <= r.Start || (r.Cutoff != 0 && id > r.Cutoff) || (i > 0 && id <= r.Skip[i-1]) {
			return fmt.Errorf("the IDs to skip must ascend within the range (%d, cutoff]; %d does not", r.Start, id)
		}
	}
	return nil
}

// Collector sorts a log's records, in log order, into the per-queue lists
// to replay. It is pure: Source feeds it from the log.
type Collector struct {
	rng      Range
	cutoff   uint64 // known cutoff, 0 until known
	epoch    uint64 // epoch of the pending cutoff marker
	passed   bool   // the record with ID rng.Start has been seen (or Start is 0)
	lastID   uint64 // highest delivery ID seen
	seenAny  bool
	queues   map[string][]shadowqueue.Record
	known    map[string]bool // every queue with a delivery anywhere in the log, or named by a cutoff marker
	complete bool
	// pubs holds the source's recorded publishes (publish checking) by the
	// delivery ID they are attributed to, for IDs in the range.
	pubs map[uint64][]shadowqueue.Publish
	// skip are the range's IDs not to replay (Range.Skip).
	skip map[uint64]bool
	// repeats counts the range's records left out as repeats of a
	// delivery the replay has (Record.Repeats).
	repeats int
	// wantStop is set for a fixed cutoff that a stop made (Range.Epoch is
	// its epoch): its cutoff marker follows the record at the cutoff and
	// names the queues the source's app consumed. stopSeen is set once
	// that marker (or anything after it) was read: from then on a queue
	// that is not Known is not the source's.
	wantStop, stopSeen bool
}

// NewCollector returns a Collector for rng.
func NewCollector(rng Range) *Collector {
	wantStop := rng.Cutoff != 0 && rng.Epoch != 0 // a stop's cutoff, not the log's end
	if rng.ToEnd {
		rng.Cutoff, rng.ToEnd = rng.end(), false // a fixed cutoff from here on
	}
	c := &Collector{rng: rng, cutoff: rng.extend(rng.Cutoff, rng.Epoch), passed: rng.Start == 0, queues: map[string][]shadowqueue.Record{}, known: map[string]bool{},
		wantStop: wantStop}
	if len(rng.Skip) > 0 {
		c.skip = make(map[uint64]bool, len(rng.Skip))
		for _, id := range rng.Skip {
			c.skip[id] = true
		}
	}
	return c
}

// Add takes the next record of the log. It returns ErrRetention if the
// records after Start are gone.
func (c *Collector) Add(r shadowqueue.Record) error {
	switch r.Kind {
	case shadowqueue.KindDelivery:
		if c.seenAny && r.ID <= c.lastID {
			return nil // a record written twice by a retried write
		}
		if !c.seenAny && r.ID > c.rng.Start+1 {
			return fmt.Errorf("%w: it starts at ID %d, but replay needs %d onwards (start %d); raise the log's retention (MS2M_LOG_MAX_AGE, MS2M_LOG_MAX_BYTES) or migrate sooner after the checkpoint",
				ErrRetention, r.ID, c.rng.Start+1, c.rng.Start)
		}
		c.seenAny, c.lastID = true, r.ID
		c.known[r.Queue] = true
		if r.ID >= c.rng.Start {
			c.passed = true
		}
		if r.ID <= c.rng.Start {
			if c.cutoff != 0 && r.ID == c.cutoff {
				// Start == Cutoff (stop-and-copy): nothing to replay, and
				// the record at the cutoff says so.
				c.complete, c.epoch = true, r.Epoch
			}
			return nil
		}
		if c.cutoff != 0 && r.ID > c.cutoff {
			c.complete, c.stopSeen = true, true // a stop's marker precedes this
			return nil
		}
		switch {
		case r.Repeats > c.rng.Start && !c.skip[r.Repeats]:
			// The broker's redelivery of a message whose first delivery
			// this replay gives the app: the app folds it once. One whose
			// first delivery precedes the checkpoint is replayed: whether
			// the app had folded that one when it was checkpointed (it
			// worked on it) or not (it was prefetched, or the app
			// rejected it) the sidecar cannot tell.
			c.repeats++
		case !c.skip[r.ID]:
			c.queues[r.Queue] = append(c.queues[r.Queue], r)
		}
		if c.cutoff != 0 && r.ID == c.cutoff {
			c.complete, c.epoch = true, r.Epoch
		}
	case shadowqueue.KindCutoff:
		queues, err := r.CutoffQueues()
		if err != nil {
			return fmt.Errorf("the cutoff marker after delivery ID %d: %w", r.ID, err)
		}
		for _, q := range queues {
			c.known[q] = true
		}
		if c.wantStop && r.ID >= c.rng.Cutoff && r.Epoch >= c.rng.Epoch {
			c.stopSeen = true
		}
		if c.rng.Cutoff != 0 || !c.passed || r.ID < c.rng.Start || r.Epoch <= c.rng.Epoch {
			return nil
		}
		c.cutoff, c.epoch = c.rng.extend(r.ID, r.Epoch), r.Epoch
		c.complete = c.lastID >= c.cutoff || c.cutoff == c.rng.Start
	case shadowqueue.KindPublish:
		if r.For > c.rng.Start && (c.cutoff == 0 || r.For <= c.cutoff) && !c.complete {
			if c.pubs == nil {
				c.pubs = map[uint64][]shadowqueue.Publish{}
			}
			c.pubs[r.For] = append(c.pubs[r.For], r.Publish())
		}
	case shadowqueue.KindResume:
		if c.rng.Cutoff == 0 && c.cutoff != 0 && r.Epoch == c.epoch {
			// The source went on serving: its cutoff no longer holds.
			c.cutoff, c.epoch, c.complete = 0, 0, false
		}
	}
	return nil
}

// Cutoff returns the cutoff ID, once known.
func (c *Collector) Cutoff() (uint64, bool) { return c.cutoff, c.cutoff != 0 }

// Epoch returns the epoch the source was in at the cutoff: that of its
// cutoff marker, or, for a known cutoff, at least the range's Epoch (which
// the migrator sets to the epoch of the stop that made the cutoff), so that
// a target goes on with the epoch the log is in.
func (c *Collector) Epoch() uint64 { return max(c.epoch, c.rng.Epoch) }

// Complete reports whether every record up to the cutoff has been seen.
func (c *Collector) Complete() bool { return c.complete }

// Records returns the records of queue collected so far, in ID order.
func (c *Collector) Records(queue string) []shadowqueue.Record { return c.queues[queue] }

// QueuesKnown reports whether Known is final for the range's queues: the
// range's cutoff is a stop's and that stop's marker, which names the
// source's queues, has been read (or the range has no such marker).
func (c *Collector) QueuesKnown() bool { return !c.wantStop || c.stopSeen }

// Known reports whether queue has a delivery anywhere in the log read so
// far, or a cutoff marker names it (a queue the source's app consumed when
// it stopped, whether or not it ever had a delivery).
func (c *Collector) Known(queue string) bool { return c.known[queue] }

// Queues returns the queues that have records.
func (c *Collector) Queues() []string {
	out := make([]string, 0, len(c.queues))
	for q := range c.queues {
		out = append(out, q)
	}
	return out
}

// Publishes returns the source's recorded publishes by delivery ID. They
// are complete only once the cutoff came from a marker and the range is
// complete: the source wrote every publish before its cutoff marker. With
// a cutoff given up front, the publishes made for the last deliveries may
// follow them in the log, so ok is false.
func (c *Collector) Publishes() (byID map[uint64][]shadowqueue.Publish, ok bool) {
	if !c.complete || c.rng.Cutoff != 0 {
		return nil, false
	}
	return c.pubs, true
}

// Repeats returns how many records in the range were left out as the
// broker's redeliveries of a message the replay already has
// (shadowqueue.Record.Repeats).
func (c *Collector) Repeats() int { return c.repeats }

// LastID returns the highest delivery ID seen in the log.
func (c *Collector) LastID() uint64 { return c.lastID }

// Follower reads a log live, from an offset on (*shadowqueue.StreamLog
// implements it). FollowFrom returns the offset to go on from; after an
// error wrapping shadowqueue.ErrReaderDisconnected, the Source follows again
// from there.
type Follower interface {
	FollowFrom(ctx context.Context, o shadowqueue.FollowOptions, fn func(offset int64, r shadowqueue.Record) error) (next int64, err error)
}

// Reader states, as Status reports them.
const (
	ReaderConnecting   = "connecting"   // before the first subscription
	ReaderFollowing    = "following"    // subscribed, reading the log
	ReaderReconnecting = "reconnecting" // the connection failed; retrying with back-off
	ReaderDone         = "done"         // the range is complete, or Run ended
	ReaderFailed       = "failed"       // a failure that retrying cannot mend
)

// Source follows a replay log and serves its records per queue. It follows
// the log again, from the offset after the last record it took, whenever
// the reader's connection fails (a broker restart, a closed connection), so
// that a replay neither misses nor repeats a record.
type Source struct {
	log Follower
	// RetryMin and RetryMax bound the back-off between reconnects. Defaults
	// 100 ms and 5 s. Set them before Run.
	RetryMin, RetryMax time.Duration
	// Logger gets a line when the reader loses its connection and when it
	// is back. Default slog.Default(). Set it before Run.
	Logger *slog.Logger

	mu         sync.Mutex
	col        *Collector
	err        error
	changed    chan struct{}
	reader     string
	offset     int64     // the next offset to read
	reconnects uint64    // times the reader followed the log again after losing it
	lostAt     time.Time // when the connection was lost; zero while following
	lostErr    string    // why
}

// NewSource returns a Source over log for rng. Start it with Run.
func NewSource(log Follower, rng Range) (*Source, error) {
	if err := rng.Validate(); err != nil {
		return nil, err
	}
	return &Source{log: log, col: NewCollector(rng), changed: make(chan struct{}), reader: ReaderConnecting}, nil
}

// Run follows the log until ctx is done, the range is complete, or the log
// fails in a way that reconnecting cannot mend (then Next returns the
// error). A lost connection is retried with back-off for as long as it
// takes; Status says "reconnecting" meanwhile.
func (s *Source) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	retryMin, retryMax, logger := s.RetryMin, s.RetryMax, s.Logger
	if retryMin <= 0 {
		retryMin = 100 * time.Millisecond
	}
	if retryMax <= 0 {
		retryMax = 5 * time.Second
	}
	if logger == nil {
		logger = slog.Default()
	}
	errDone := errors.New("replay range complete")
	delay := retryMin
	for {
		s.mu.Lock()
		from := s.offset
		s.mu.Unlock()
		next, err := s.log.FollowFrom(ctx, shadowqueue.FollowOptions{From: from, Subscribed: func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.reader == ReaderReconnecting {
				logger.Info("replay log reader reconnected; following the log again from where it stopped",
					"offset", s.offset, "down_for", time.Since(s.lostAt).String(), "last_id", s.col.LastID())
				s.reconnects++
			}
			s.reader, s.lostAt, s.lostErr = ReaderFollowing, time.Time{}, ""
			s.notifyLocked()
		}}, func(_ int64, r shadowqueue.Record) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			if err := s.col.Add(r); err != nil {
				return err
			}
			s.notifyLocked()
			if s.col.Complete() && s.col.QueuesKnown() {
				return errDone
			}
			return nil
		})
		s.mu.Lock()
		if next > s.offset {
			s.offset = next
			delay = retryMin // it got somewhere: start the back-off over
		}
		s.mu.Unlock()
		switch {
		case errors.Is(err, errDone):
			s.setReader(ReaderDone, "")
			return nil
		case ctx.Err() != nil:
			s.setReader(ReaderDone, "")
			return err
		case errors.Is(err, shadowqueue.ErrReaderDisconnected):
			s.mu.Lock()
			if s.reader != ReaderReconnecting {
				s.lostAt = time.Now()
				logger.Warn("replay log reader lost its connection; reconnecting with back-off, the replay waits meanwhile",
					"offset", s.offset, "last_id", s.col.LastID(), "err", err)
			}
			s.reader, s.lostErr = ReaderReconnecting, err.Error()
			s.notifyLocked()
			s.mu.Unlock()
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				s.setReader(ReaderDone, "")
				return context.Cause(ctx)
			}
			delay = min(2*delay, retryMax)
		default:
			s.mu.Lock()
			s.err = err
			s.reader = ReaderFailed
			s.notifyLocked()
			s.mu.Unlock()
			return err
		}
	}
}

func (s *Source) setReader(state, lostErr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reader, s.lostErr = state, lostErr
	s.notifyLocked()
}

func (s *Source) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Next returns the i-th record (from 0) to replay for queue. done is true
// when queue has no more records up to the cutoff. It blocks until one of
// the two is known, ctx is done, or the log fails.
func (s *Source) Next(ctx context.Context, queue string, i int) (rec shadowqueue.Record, done bool, err error) {
	for {
		s.mu.Lock()
		recs := s.col.Records(queue)
		switch {
		case s.err != nil:
			err = s.err
		case i < len(recs):
			rec = recs[i]
		case s.col.Complete() && !s.col.Known(queue) && s.col.QueuesKnown():
			err = fmt.Errorf("%w: queue %q; the sidecar consumes nothing upstream for it (check the app's queue and MS2M_LOG_NAME)", ErrUnknownQueue, queue)
		case s.col.Complete() && s.col.Known(queue):
			done = true
		default:
			ch := s.changed
			s.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return rec, false, context.Cause(ctx)
			}
		}
		s.mu.Unlock()
		return rec, done, err
	}
}

// Cutoff returns the cutoff ID and its epoch, once every record up to it
// has been read.
func (s *Source) Cutoff() (id, epoch uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, _ = s.col.Cutoff()
	return id, s.col.Epoch(), s.col.Complete()
}

// ExpectedPublishes returns what the source published per delivery ID,
// once known (see Collector.Publishes).
func (s *Source) ExpectedPublishes() (map[uint64][]shadowqueue.Publish, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.col.Publishes()
}

// Status is a snapshot of a Source.
type Status struct {
	Range string `json:"range"`
	// Start is the range's exclusive start, the checkpoint ID: the restored
	// app already has the effects of every delivery up to it.
	Start    uint64 `json:"startId"`
	Cutoff   uint64 `json:"cutoffId,omitempty"`
	Complete bool   `json:"complete"`
	LogLast  uint64 `json:"logLastId"`
	// Repeats counts the records in the range left out as the broker's
	// redeliveries of a message the replay gives the app already
	// (shadowqueue.Record.Repeats).
	Repeats int    `json:"repeats,omitempty"`
	Error   string `json:"error,omitempty"`
	// Reader is the log reader's state: connecting, following,
	// reconnecting (the connection failed; the replay waits), done or
	// failed.
	Reader string `json:"reader"`
	// Offset is the next stream offset the reader reads.
	Offset int64 `json:"offset"`
	// Reconnects counts the times the reader came back after losing its
	// connection.
	Reconnects uint64 `json:"reconnects"`
	// DisconnectedSince and Disconnected say, while reconnecting, since when
	// and why.
	DisconnectedSince *time.Time `json:"disconnectedSince,omitempty"`
	Disconnected      string     `json:"disconnected,omitempty"`
}

// Status returns a snapshot.
func (s *Source) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	cut, _ := s.col.Cutoff()
	st := Status{Range: s.col.rng.String(), Start: s.col.rng.Start, Cutoff: cut, Complete: s.col.Complete(), LogLast: s.col.LastID(),
		Repeats: s.col.Repeats(), Reader: s.reader, Offset: s.offset, Reconnects: s.reconnects, Disconnected: s.lostErr}
	if !s.lostAt.IsZero() {
		at := s.lostAt
		st.DisconnectedSince = &at
	}
	if s.err != nil {
		st.Error = s.err.Error()
	}
	return st
}
