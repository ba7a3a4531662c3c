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
	// Logger gets one line per failure and one per recovery.
	Logger *slog.Logger
	// Now is the clock that stamps records. Default time.Now.
	Now func() time.Time
}

// TeeStatus is a snapshot of a Tee.
type TeeStatus struct {
	LastID      uint64 `json:"lastId"`              // last delivery ID assigned
	ConfirmedID uint64 `json:"confirmedId"`         // last delivery ID known durable
	Pending     int    `json:"pending"`             // records assigned but not yet confirmed
	Degraded    bool   `json:"degraded"`            // the last write to the log failed
	LastError   string `json:"lastError,omitempty"` // the last write error
	Epoch       uint64 `json:"epoch"`               // epoch of the last marker written
	Writes      uint64 `json:"writes"`              // log writes confirmed since start
	Written     uint64 `json:"written"`             // records in those writes
}

// Tee numbers deliveries and writes them to a Log, in order.
type Tee struct {
	log  Log
	opts TeeOptions

	mu        sync.Mutex
	lastID    uint64   // last delivery ID assigned
	epoch     uint64   // last marker epoch assigned
	nextTk    Ticket   // next ticket to hand out
	queue     []Record // assigned, not yet taken by the writer
	queueTk   []Ticket // ticket of each queued record (parallel to queue)
	inflight  int      // records taken by the writer, not yet confirmed
	durableTk Ticket   // every ticket below this is durable
	durableID uint64   // last delivery ID that is durable
	degraded  bool
	lastErr   string
	writes    uint64        // confirmed Log.Write calls
	written   uint64        // records in them
	wake      chan struct{} // closed when records are queued
	advanced  chan struct{} // closed when durableTk grows
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
	t.mu.Lock()
	defer t.mu.Unlock()
	if kind == KindCutoff {
		t.epoch++
	}
	r := Record{Kind: kind, ID: t.lastID, Epoch: t.epoch, Time: t.opts.Now()}
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
	if len(t.queue) == 1 {
		close(t.wake)
		t.wake = make(chan struct{})
	}
	return tk
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
		LastID:      t.lastID,
		ConfirmedID: t.durableID,
		Pending:     len(t.queue) + t.inflight,
		Degraded:    t.degraded,
		LastError:   t.lastErr,
		Epoch:       t.epoch,
		Writes:      t.writes,
		Written:     t.written,
	}
}

// Run writes queued records to the log until ctx is done. A failed write is
// retried with the same records, with back-off, for as long as it takes.
func (t *Tee) Run(ctx context.Context) error {
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
		batch := make([]Record, n)
		copy(batch, t.queue)
		lastTk := t.queueTk[n-1]
		t.queue = append(t.queue[:0], t.queue[n:]...)
		t.queueTk = append(t.queueTk[:0], t.queueTk[n:]...)
		t.inflight = n
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
		t.writes++
		t.written += uint64(n)
		t.durableTk = lastTk + 1
		if lastID > 0 {
			t.durableID = lastID
		}
		close(t.advanced)
		t.advanced = make(chan struct{})
		t.mu.Unlock()
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
