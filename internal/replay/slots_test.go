package replay

import "testing"

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
