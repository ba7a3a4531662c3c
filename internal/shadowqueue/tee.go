package shadowqueue

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Ticket identifies one record handed to a Tee. Tickets grow by one per
// record (deliveries and markers alike); Wait takes one.
type Ticket uint64

// TeeOptions tunes a Tee. The zero value is usable.
type TeeOptions struct {
	// MaxBatch caps the records per Log.Write. Default 512.
	MaxBatch int
	// RetryMin and RetryMax bound the back-off between failed writes.
	// Defaults 50 ms and 2 s.
	RetryMin, RetryMax time.Duration
	// MaxPendingBytes and MaxPendingRecords bound the records assigned but
	// not yet confirmed by the log (bytes as encoded). Append never blocks;
	// once either bound is reached, WaitRoom blocks until the log has taken
	// records off again, which is how the proxy stops reading from the
	// broker (backpressure) instead of holding an unbounded backlog in
	// memory while the log is down. Defaults 64 MiB and 65536.
	MaxPendingBytes   int64
	MaxPendingRecords int
	// Logger gets one line per failure and one per recovery, and one when
	// backpressure starts and when it ends.
	Logger *slog.Logger
	// Now is the clock that stamps records. Default time.Now.
	Now func() time.Time
}

// TeeStatus is a snapshot of a Tee.
type TeeStatus struct {
	LastID      uint64 `json:"lastId"`      // last delivery ID assigned
	ConfirmedID uint64 `json:"confirmedId"` // last delivery ID known durable
	Pending     int    `json:"pending"`     // records assigned but not yet confirmed
	// PendingBytes is the encoded size of the pending records.
	PendingBytes int64 `json:"pendingBytes"`
	// Backpressure is true while pending records are at a bound
	// (TeeOptions.MaxPendingBytes or MaxPendingRecords): reads from the
	// broker are paused until the log takes records off.
	Backpressure bool `json:"backpressure"`
	// BackpressureEpisodes counts the times backpressure started.
	BackpressureEpisodes uint64 `json:"backpressureEpisodes"`
	Degraded             bool   `json:"degraded"`            // the last write to the log failed
	LastError            string `json:"lastError,omitempty"` // the last write error
	Epoch                uint64 `json:"epoch"`               // epoch of the last marker written
	Writes               uint64 `json:"writes"`              // log writes confirmed since start
	Written              uint64 `json:"written"`             // records in those writes
}

// Tee numbers deliveries and writes them to a Log, in order.
type Tee struct {
	log  Log
	opts TeeOptions

	mu        sync.Mutex
	lastID    uint64        // last delivery ID assigned
	epoch     uint64        // last marker epoch assigned
	nextTk    Ticket        // next ticket to hand out
	queue     []Record      // assigned, not yet taken by the writer
	queueTk   []Ticket      // ticket of each queued record (parallel to queue)
	inflight  int           // records taken by the writer, not yet confirmed
	pendBytes int64         // encoded size of queue and the in-flight batch
	inflightB int64         // encoded size of the in-flight batch
	full      bool          // a pending bound is reached: WaitRoom blocks
	episodes  uint64        // times full became true
	roomCh    chan struct{} // closed when full becomes false
	fullSince time.Time     // when full last became true
	// bpLogged is when the last backpressure line was logged, at
	// bpLoggedEpisodes episodes; bpOpen says its end is still to log.
	bpLogged         time.Time
	bpLoggedEpisodes uint64
	bpOpen           bool
	durableTk        Ticket // every ticket below this is durable
	durableID        uint64 // last delivery ID that is durable
	degraded         bool
	lastErr          string
	writes           uint64        // confirmed Log.Write calls
	written          uint64        // records in them
	wake             chan struct{} // closed when records are queued
	advanced         chan struct{} // closed when durableTk grows
}

// NewTee returns a Tee whose first delivery gets ID last.ID+1. last is the
// log's last record (zero Record for an empty log). Start it with Run.
func NewTee(log Log, last Record, opts TeeOptions) *Tee {
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 512
	}
	if opts.RetryMin <= 0 {
		opts.RetryMin = 50 * time.Millisecond
	}
	if opts.RetryMax <= 0 {
		opts.RetryMax = 2 * time.Second
	}
	if opts.MaxPendingBytes <= 0 {
		opts.MaxPendingBytes = 64 << 20
	}
	if opts.MaxPendingRecords <= 0 {
		opts.MaxPendingRecords = 65536
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Tee{
		log:       log,
		opts:      opts,
		lastID:    last.ID,
		epoch:     last.Epoch,
		durableID: last.ID,
		wake:      make(chan struct{}),
		advanced:  make(chan struct{}),
		roomCh:    make(chan struct{}),
	}
}

// Continue makes the next delivery ID last+1 in epoch: a target sidecar
// takes over the log at the source's cutoff. It fails once anything was
// appended.
func (t *Tee) Continue(last, epoch uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nextTk != 0 {
		return fmt.Errorf("continue the replay log at ID %d: the sidecar has already written %d records", last+1, t.nextTk)
	}
	t.lastID, t.epoch, t.durableID = last, epoch, last
	return nil
}

// Append assigns r the next delivery ID, stamps it, and queues it for the
// log. It returns the ID and the ticket to Wait on. r.Body and r.Properties
// must not be changed afterwards.
func (t *Tee) Append(r Record) (uint64, Ticket) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lastID++
	r.Kind = KindDelivery
	r.ID = t.lastID
	r.Epoch = t.epoch
	if r.Time.IsZero() {
		r.Time = t.opts.Now()
	}
	return r.ID, t.enqueueLocked(r)
}

// AppendMarker queues a cutoff or resume marker that carries the last
// delivery ID assigned so far. A cutoff opens a new epoch; a resume closes
// the current one. It returns the marker's ID, epoch and ticket.
func (t *Tee) AppendMarker(kind Kind) (id, epoch uint64, tk Ticket) {
	return t.appendMarker(kind, nil)
}

// AppendCutoff queues a KindCutoff marker, as AppendMarker does, that names
// the queues the app consumes (CutoffBody): a target learns from it which
// of the app's queues are the source's, also those with no delivery in
// the log.
func (t *Tee) AppendCutoff(queues []string) (id, epoch uint64, tk Ticket) {
	return t.appendMarker(KindCutoff, CutoffBody(queues))
}

func (t *Tee) appendMarker(kind Kind, body []byte) (id, epoch uint64, tk Ticket) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if kind == KindCutoff {
		t.epoch++
	}
	r := Record{Kind: kind, ID: t.lastID, Epoch: t.epoch, Time: t.opts.Now(), Body: body}
	return r.ID, r.Epoch, t.enqueueLocked(r)
}

// AppendPublish queues a KindPublish record: the app published digest (the
// SHA-256 of the body) to exchange with routingKey while it handled delivery
// forID. Nothing waits for it: the publish itself is never held.
func (t *Tee) AppendPublish(forID uint64, exchange, routingKey string, digest []byte) Ticket {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := Record{Kind: KindPublish, ID: t.lastID, Epoch: t.epoch, Time: t.opts.Now(), For: forID, Exchange: exchange, RoutingKey: routingKey, Body: digest}
	return t.enqueueLocked(r)
}

func (t *Tee) enqueueLocked(r Record) Ticket {
	tk := t.nextTk
	t.nextTk++
	t.queue = append(t.queue, r)
	t.queueTk = append(t.queueTk, tk)
	t.pendBytes += int64(encodedRecordLen(&r))
	if len(t.queue) == 1 {
		close(t.wake)
		t.wake = make(chan struct{})
	}
	t.checkFullLocked()
	return tk
}

// checkFullLocked updates full from the pending records and wakes WaitRoom
// when backpressure ends. Backpressure starts at either bound and ends once
// the backlog is down to half of both, so that a log that is merely slower
// than the broker does not flip it on every write. It logs the start of an
// episode, at most once per backpressureLogEvery (with the episodes since
// the last line), and the end of an episode whose start it logged.
func (t *Tee) checkFullLocked() {
	records := len(t.queue) + t.inflight
	var full bool
	if t.full {
		full = 2*t.pendBytes > t.opts.MaxPendingBytes || 2*records > t.opts.MaxPendingRecords
	} else {
		full = t.pendBytes >= t.opts.MaxPendingBytes || records >= t.opts.MaxPendingRecords
	}
	if full == t.full {
		return
	}
	t.full = full
	now := t.opts.Now()
	if full {
		t.episodes++
		t.fullSince = now
		if t.bpLogged.IsZero() || now.Sub(t.bpLogged) >= backpressureLogEvery {
			t.opts.Logger.Warn("replay log backlog at its bound; pausing reads from the broker until the log takes records off (nothing is dropped)",
				"pending_records", records, "pending_bytes", t.pendBytes,
				"max_records", t.opts.MaxPendingRecords, "max_bytes", t.opts.MaxPendingBytes,
				"log_failing", t.degraded, "episodes", t.episodes-t.bpLoggedEpisodes)
			t.bpLogged, t.bpLoggedEpisodes, t.bpOpen = now, t.episodes, true
		}
		return
	}
	if t.bpOpen {
		t.opts.Logger.Info("replay log backlog down to half its bound; reading from the broker again",
			"pending_records", records, "pending_bytes", t.pendBytes, "paused_for", now.Sub(t.fullSince).String())
		t.bpOpen = false
	}
	close(t.roomCh)
	t.roomCh = make(chan struct{})
}

// backpressureLogEvery spaces the log lines of a Tee whose backlog keeps
// reaching its bound.
const backpressureLogEvery = 30 * time.Second

// WaitRoom blocks while the pending records are at a bound
// (TeeOptions.MaxPendingBytes, MaxPendingRecords), until the log has taken
// some off or ctx is done. The proxy calls it before each read from the
// broker: while it blocks, TCP flow control holds the broker back.
func (t *Tee) WaitRoom(ctx context.Context) error {
	for {
		t.mu.Lock()
		if !t.full {
			t.mu.Unlock()
			return nil
		}
		ch := t.roomCh
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// Full reports whether the pending records are at a bound.
func (t *Tee) Full() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.full
}

// Durable reports whether the record with ticket tk is in the log.
func (t *Tee) Durable(tk Ticket) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return tk < t.durableTk
}

// Wait blocks until the record with ticket tk is durably in the log, or ctx
// is done.
func (t *Tee) Wait(ctx context.Context, tk Ticket) error {
	for {
		t.mu.Lock()
		if tk < t.durableTk {
			t.mu.Unlock()
			return nil
		}
		ch := t.advanced
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// Status returns a snapshot.
func (t *Tee) Status() TeeStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	return TeeStatus{
		LastID:               t.lastID,
		ConfirmedID:          t.durableID,
		Pending:              len(t.queue) + t.inflight,
		PendingBytes:         t.pendBytes,
		Backpressure:         t.full,
		BackpressureEpisodes: t.episodes,
		Degraded:             t.degraded,
		LastError:            t.lastErr,
		Epoch:                t.epoch,
		Writes:               t.writes,
		Written:              t.written,
	}
}

// Run writes queued records to the log until ctx is done. A failed write is
// retried with the same records, with back-off, for as long as it takes.
func (t *Tee) Run(ctx context.Context) error {
	// batch is reused from write to write (Log.Write keeps no reference
	// to it): a fresh one per write was the largest allocation per record
	// on the NATS source path, and its records hold pointers for the
	// garbage collector to scan.
	var batch []Record
	for {
		t.mu.Lock()
		for len(t.queue) == 0 {
			wake := t.wake
			t.mu.Unlock()
			select {
			case <-wake:
			case <-ctx.Done():
				return nil
			}
			t.mu.Lock()
		}
		n := min(len(t.queue), t.opts.MaxBatch)
		batch = append(batch[:0], t.queue[:n]...)
		lastTk := t.queueTk[n-1]
		rest := copy(t.queue, t.queue[n:])
		clear(t.queue[rest:]) // the records moved up or taken: drop the stale copies' bodies
		t.queue = t.queue[:rest]
		t.queueTk = append(t.queueTk[:0], t.queueTk[n:]...)
		t.inflight = n
		t.inflightB = 0
		for i := range batch {
			t.inflightB += int64(encodedRecordLen(&batch[i]))
		}
		t.mu.Unlock()

		if err := t.writeWithRetry(ctx, batch); err != nil {
			return nil // ctx done; records stay unconfirmed, acks stay held
		}

		lastID := uint64(0)
		for i := range batch {
			if batch[i].Kind == KindDelivery {
				lastID = batch[i].ID
			}
		}
		t.mu.Lock()
		t.inflight = 0
		t.pendBytes -= t.inflightB
		t.inflightB = 0
		t.checkFullLocked()
		t.writes++
		t.written += uint64(n)
		t.durableTk = lastTk + 1
		if lastID > 0 {
			t.durableID = lastID
		}
		close(t.advanced)
		t.advanced = make(chan struct{})
		t.mu.Unlock()
		clear(batch) // the bodies are the GC's once written
	}
}

func (t *Tee) writeWithRetry(ctx context.Context, batch []Record) error {
	delay := t.opts.RetryMin
	for {
		err := t.log.Write(ctx, batch)
		if err == nil {
			t.setDegraded(nil)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		t.setDegraded(err)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
		delay = min(2*delay, t.opts.RetryMax)
	}
}

func (t *Tee) setDegraded(err error) {
	t.mu.Lock()
	was := t.degraded
	t.degraded = err != nil
	if err != nil {
		t.lastErr = err.Error()
	}
	t.mu.Unlock()
	switch {
	case err != nil && !was:
		t.opts.Logger.Error("replay log write failed; holding the app's acks until it recovers", "err", err)
	case err == nil && was:
		t.opts.Logger.Info("replay log recovered")
	}
}
