package tracking

import (
	"math"
	"sort"
	"sync"
	"time"
)

// QueueStats is a snapshot of one queue's bookkeeping.
type QueueStats struct {
	Queue           string  `json:"queue"`
	LastDeliveredID uint64  `json:"lastDeliveredId"`
	LastAckedID     uint64  `json:"lastAckedId"`
	InFlight        int     `json:"inFlight"`
	Delivered       uint64  `json:"delivered"`
	Acked           uint64  `json:"acked"`
	Rejected        uint64  `json:"rejected"` // nacked or rejected, requeued or not
	Lambda          float64 `json:"lambda"`   // deliveries per second
	Mu              float64 `json:"mu"`       // messages processed per second
}

// Tracker holds QueueStats for every queue the app consumes. It is safe for
// concurrent use.
type Tracker struct {
	tau   time.Duration
	alpha float64

	mu     sync.Mutex
	queues map[string]*queue
}

type queue struct {
	stats   QueueStats
	arrival Rate
	service Service
}

// NewTracker returns a Tracker whose λ estimate has time constant tau and
// whose μ estimate weighs each new sample by alpha.
func NewTracker(tau time.Duration, alpha float64) *Tracker {
	return &Tracker{tau: tau, alpha: alpha, queues: map[string]*queue{}}
}

func (t *Tracker) queue(name string) *queue {
	q := t.queues[name]
	if q == nil {
		q = &queue{stats: QueueStats{Queue: name}, arrival: Rate{Tau: t.tau}, service: Service{Alpha: t.alpha}}
		t.queues[name] = q
	}
	return q
}

// Delivered records delivery id on queue at time at. inFlight is false for
// auto-ack deliveries, which the app never acks.
func (t *Tracker) Delivered(queue string, id uint64, at time.Time, inFlight bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.queue(queue)
	q.stats.LastDeliveredID = id
	q.stats.Delivered++
	q.arrival.Add(at, 1)
	if inFlight {
		q.stats.InFlight++
	}
}

// Acked records that the app acked n deliveries of queue at time at; the
// highest ID among them is lastID, and the earliest was delivered at first.
func (t *Tracker) Acked(queue string, lastID uint64, first, at time.Time, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.queue(queue)
	q.stats.InFlight -= n
	q.stats.Acked += uint64(n)
	if lastID > q.stats.LastAckedID {
		q.stats.LastAckedID = lastID
	}
	q.service.Done(first, at, n)
}

// Rejected records that the app nacked or rejected n deliveries of queue.
func (t *Tracker) Rejected(queue string, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.queue(queue)
	q.stats.InFlight -= n
	q.stats.Rejected += uint64(n)
}

// Dropped records that n in-flight deliveries of queue went back to the
// broker because their channel or connection closed.
func (t *Tracker) Dropped(queue string, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.queue(queue).stats.InFlight -= n
}

// Snapshot returns every queue's stats at time now, sorted by queue name.
func (t *Tracker) Snapshot(now time.Time) []QueueStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]QueueStats, 0, len(t.queues))
	for _, q := range t.queues {
		s := q.stats
		s.Lambda = round3(q.arrival.At(now))
		if mu := q.service.Mu(); !math.IsInf(mu, 0) {
			s.Mu = round3(mu)
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Queue < out[j].Queue })
	return out
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }
