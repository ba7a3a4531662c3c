package replay

// Slots is where each record of a replay stands, by its index in the
// collected records of one queue (AMQP) or consumer (JetStream): pending
// (to be handed to the app), in flight, or acked; and whether it went to
// the app before, so that handing it out again is a redelivery. Both
// proxies keep one per queue or consumer. It does no locking: its owner
// holds its own lock around every call.
type Slots struct {
	state []uint8
	sent  []bool
	acked int
	// low is where Claim starts looking: no index below it is pending.
	// Without it every Claim scanned the acked prefix, which made a
	// replay of n records cost O(n²).
	low int
}

const (
	slotPending uint8 = iota
	slotInFlight
	slotAcked
)

// Claim returns the lowest pending index, marked in flight, and whether it
// was handed out before.
func (s *Slots) Claim() (i int, redelivered bool) {
	for i = s.low; i < len(s.state); i++ {
		if s.state[i] == slotPending {
			break
		}
	}
	for len(s.state) <= i {
		s.state = append(s.state, slotPending)
		s.sent = append(s.sent, false)
	}
	s.state[i] = slotInFlight
	s.low = i + 1
	redelivered, s.sent[i] = s.sent[i], true
	return i, redelivered
}

// Release puts an in-flight index back to pending; unsent says it never
// reached the app, so that handing it out again is not a redelivery.
func (s *Slots) Release(i int, unsent bool) {
	if s.state[i] == slotInFlight {
		s.state[i] = slotPending
		s.low = min(s.low, i)
	}
	if unsent {
		s.sent[i] = false
	}
}

// Requeue puts index i back to pending whatever its state (the app's
// negative ack).
func (s *Slots) Requeue(i int) {
	s.state[i] = slotPending
	s.low = min(s.low, i)
}

// Ack marks index i acked, once.
func (s *Slots) Ack(i int) {
	if s.state[i] != slotAcked {
		s.state[i] = slotAcked
		s.acked++
	}
}

// Acked is how many indexes are acked.
func (s *Slots) Acked() int { return s.acked }
