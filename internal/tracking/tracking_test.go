package tracking

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRateConverges(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for name, tc := range map[string]struct {
		every time.Duration
		want  float64
	}{
		"4 per second":  {every: 250 * time.Millisecond, want: 4},
		"16 per second": {every: 62500 * time.Microsecond, want: 16},
		"1 per second":  {every: time.Second, want: 1},
	} {
		t.Run(name, func(t *testing.T) {
			r := Rate{Tau: 5 * time.Second}
			at := t0
			for at.Before(t0.Add(60 * time.Second)) {
				r.Add(at, 1)
				at = at.Add(tc.every)
			}
			got := r.At(at)
			if math.Abs(got-tc.want)/tc.want > 0.15 {
				t.Errorf("rate = %.3f, want %.3f ±15%%", got, tc.want)
			}
		})
	}
}

func TestRateDecaysWhenIdle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := Rate{Tau: 5 * time.Second}
	for i := range 100 {
		r.Add(t0.Add(time.Duration(i)*100*time.Millisecond), 1)
	}
	if got := r.At(t0.Add(70 * time.Second)); got > 0.01 {
		t.Errorf("rate after a minute idle = %.4f, want ~0", got)
	}
}

func TestServiceSeparatesWaitingFromWork(t *testing.T) {
	// Prefetch 10: ten messages arrive at once, the app works 50 ms on each.
	t0 := time.Unix(1000, 0)
	s := Service{Alpha: 0.2}
	for i := 1; i <= 10; i++ {
		s.Done(t0, t0.Add(time.Duration(i)*50*time.Millisecond), 1)
	}
	if got := s.Mu(); math.Abs(got-20) > 0.5 {
		t.Errorf("mu = %.2f, want 20", got)
	}
}

func TestServiceMultipleAck(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := Service{Alpha: 1}
	s.Done(t0, t0.Add(500*time.Millisecond), 10) // ten messages in 0.5 s
	if got := s.Mu(); math.Abs(got-20) > 0.01 {
		t.Errorf("mu = %.2f, want 20", got)
	}
}

func TestTrackerBookkeeping(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := NewTracker(5*time.Second, 0.2)
	tr.Delivered("a", 1, t0, true)
	tr.Delivered("a", 2, t0, true)
	tr.Delivered("b", 3, t0, false)
	tr.Delivered("a", 4, t0, true)
	tr.Acked("a", 2, t0, t0.Add(100*time.Millisecond), 2)
	tr.Rejected("a", 1)
	got := tr.Snapshot(t0.Add(100 * time.Millisecond))
	for i := range got {
		got[i].Lambda, got[i].Mu = 0, 0
	}
	want := []QueueStats{
		{Queue: "a", LastDeliveredID: 4, LastAckedID: 2, InFlight: 0, Delivered: 3, Acked: 2, Rejected: 1},
		{Queue: "b", LastDeliveredID: 3, Delivered: 1},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("snapshot (-want +got):\n%s", d)
	}
}
