package tracking

import (
	"math"
	"time"
)

// Rate estimates events per second with an exponentially decaying counter
// of time constant Tau: each event adds 1/Tau, and the sum decays by
// e^(-dt/Tau). For a steady rate r it converges to r within a few Tau.
type Rate struct {
	Tau   time.Duration
	value float64
	last  time.Time
}

// Add records n events at time at.
func (r *Rate) Add(at time.Time, n int) {
	r.value = r.At(at) + float64(n)/r.Tau.Seconds()
	if at.After(r.last) {
		r.last = at
	}
}

// At returns the estimate at time at.
func (r *Rate) At(at time.Time) float64 {
	if r.last.IsZero() {
		return 0
	}
	dt := at.Sub(r.last).Seconds()
	if dt <= 0 {
		return r.value
	}
	return r.value * math.Exp(-dt/r.Tau.Seconds())
}

// Service estimates the mean time an app spends on one message from the
// times it acks them: each ack's busy time is the time since the later of
// the message's delivery and the previous ack. This separates the time a
// message waited in the app's prefetch buffer from the time it was worked on.
// Mu is 1 / the mean service time.
type Service struct {
	Alpha   float64 // EWMA weight of a new sample, (0,1]
	mean    float64 // seconds
	samples int
	lastAck time.Time
}

// Done records that n messages, the earliest delivered at delivered, were
// acked at at.
func (s *Service) Done(delivered, at time.Time, n int) {
	if n <= 0 {
		return
	}
	start := delivered
	if s.lastAck.After(start) {
		start = s.lastAck
	}
	if at.After(s.lastAck) {
		s.lastAck = at
	}
	busy := at.Sub(start).Seconds()
	if busy < 0 {
		busy = 0
	}
	per := busy / float64(n)
	for range n {
		if s.samples == 0 {
			s.mean = per
		} else {
			s.mean += s.Alpha * (per - s.mean)
		}
		s.samples++
	}
}

// Mu returns the estimated processing rate in messages per second, or 0
// before the first sample.
func (s *Service) Mu() float64 {
	if s.samples == 0 {
		return 0
	}
	if s.mean <= 0 {
		return math.Inf(1)
	}
	return 1 / s.mean
}

// MeanService returns the mean service time.
func (s *Service) MeanService() time.Duration {
	return time.Duration(s.mean * float64(time.Second))
}
