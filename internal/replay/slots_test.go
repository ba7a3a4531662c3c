package replay

import (
	"math/rand/v2"
	"testing"
)

// TestSlots: records are handed out lowest pending first; one handed out
// again after a release is a redelivery unless it never reached the app;
// an ack counts once.
func TestSlots(t *testing.T) {
	var s Slots
	for want := range 3 {
		if i, re := s.Claim(); i != want || re {
			t.Fatalf("claim %d = %d, %v; want %d, first time", want, i, re, want)
		}
	}
	s.Release(1, false)
	if i, re := s.Claim(); i != 1 || !re {
		t.Fatalf("claim after release = %d, %v; want 1, a redelivery", i, re)
	}
	s.Release(0, true)
	if i, re := s.Claim(); i != 0 || re {
		t.Fatalf("claim after an unsent release = %d, %v; want 0, not a redelivery", i, re)
	}
	s.Ack(0)
	s.Ack(0)
	s.Ack(2)
	if s.Acked() != 2 {
		t.Fatalf("acked %d, want 2", s.Acked())
	}
	s.Requeue(1)
	if i, re := s.Claim(); i != 1 || !re {
		t.Fatalf("claim after a requeue = %d, %v; want 1, a redelivery", i, re)
	}
	if i, _ := s.Claim(); i != 3 {
		t.Fatalf("next claim = %d, want 3 (a new index)", i)
	}
}

// TestSlotsLowestPending checks Claim against a model that scans every
// index, through a random mix of claims, releases, requeues and acks: the
// start hint that spares Claim the acked prefix never skips a pending
// index.
func TestSlotsLowestPending(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var s Slots
	var model []uint8 // the same states, kept by scanning
	lowest := func() int {
		for i, st := range model {
			if st == slotPending {
				return i
			}
		}
		return len(model)
	}
	for step := range 20000 {
		switch op := rng.IntN(10); {
		case op < 5 || len(model) == 0:
			want := lowest()
			if want == len(model) {
				model = append(model, slotPending)
			}
			if got, _ := s.Claim(); got != want {
				t.Fatalf("step %d: claim = %d, want the lowest pending %d", step, got, want)
			}
			model[want] = slotInFlight
		case op < 7:
			i := rng.IntN(len(model))
			s.Release(i, rng.IntN(2) == 0)
			if model[i] == slotInFlight {
				model[i] = slotPending
			}
		case op < 8:
			i := rng.IntN(len(model))
			s.Requeue(i)
			model[i] = slotPending
		default:
			i := rng.IntN(len(model))
			s.Ack(i)
			model[i] = slotAcked
		}
	}
}

// BenchmarkSlotsInOrder is a replay's usual course: claim the next record,
// ack it. Each claim costs the same however many records are acked.
func BenchmarkSlotsInOrder(b *testing.B) {
	b.ReportAllocs()
	var s Slots
	for range b.N {
		i, _ := s.Claim()
		s.Ack(i)
	}
}
