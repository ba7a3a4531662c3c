package journal

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestProcessingGap(t *testing.T) {
	t0 := time.Unix(1_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// f is message id, sent at sentMS, folded at atMS.
	f := func(id int64, sentMS, atMS int) Fold {
		return Fold{ID: id, LatencyMS: float64(atMS - sentMS), AtNS: at(atMS).UnixNano(), SentNS: at(sentMS).UnixNano()}
	}
	gap := func(fromMS, toMS int) Gap { return Gap{Start: at(fromMS), End: at(toMS)} }
	tests := map[string]struct {
		journals [][]Fold
		sent     map[int64]time.Time // nil: SendTimes(journals)
		from, to int                 // the window, ms after t0
		want     Gap
	}{
		"steady: each message waits only for its own work": {
			// Sent every 100 ms, each folded 50 ms later.
			journals: [][]Fold{{f(1, 0, 50), f(2, 100, 150), f(3, 200, 250), f(4, 300, 350)}},
			from:     0, to: 400,
			want: gap(0, 50),
		},
		"a freeze in the middle": {
			// The source is frozen from 220 to 600: messages 4 and 5 wait,
			// the target (restored) folds 4 at 650.
			journals: [][]Fold{
				{f(1, 0, 50), f(2, 100, 150), f(3, 200, 250)},
				{f(1, 0, 50), f(2, 100, 150), f(3, 200, 250), f(4, 300, 650), f(5, 400, 700), f(6, 500, 750)},
			},
			from: 200, to: 700,
			want: gap(300, 650),
		},
		"idle time with nothing waiting does not count": {
			// The producer pauses from 150 to 1,000: 850 ms with no fold,
			// but nothing waits; then 6 waits 80 ms.
			journals: [][]Fold{{f(1, 0, 50), f(2, 100, 150), f(3, 1000, 1080), f(4, 1100, 1150)}},
			from:     0, to: 1200,
			want: gap(1000, 1080),
		},
		"a backlog: the gap starts at the fold before, not at the send": {
			// 3 is sent while 2 is in work; nothing is folded from 150 to 400.
			journals: [][]Fold{{f(1, 0, 50), f(2, 60, 150), f(3, 100, 400)}},
			from:     0, to: 500,
			want: gap(150, 400),
		},
		"overlapping instances: a replay of processed messages is no progress": {
			// The source folds 1..4 live; the target, restored at the
			// checkpoint after 2, replays 3 and 4 at 420 and 430, and folds
			// 5, which waited from 400 while the source stopped at 350, at 600.
			journals: [][]Fold{
				{f(1, 0, 50), f(2, 100, 150), f(3, 200, 250), f(4, 300, 350)},
				{f(1, 0, 50), f(2, 100, 150), f(3, 200, 420), f(4, 300, 430), f(5, 400, 600), f(6, 500, 650)},
			},
			from: 100, to: 700,
			want: gap(400, 600),
		},
		"overlapping instances: live folds on either instance are progress": {
			// Source and shadow both fold for a while, alternating.
			journals: [][]Fold{
				{f(1, 0, 40), f(3, 20, 120)},
				{f(2, 10, 80), f(4, 30, 160)},
			},
			from: 0, to: 200,
			want: gap(0, 40),
		},
		"the journals in any order": {
			journals: [][]Fold{
				{f(1, 0, 50), f(2, 100, 150), f(3, 200, 250), f(4, 300, 650), f(5, 400, 700)},
				{f(1, 0, 50), f(2, 100, 150), f(3, 200, 250)},
			},
			from: 200, to: 700,
			want: gap(300, 650),
		},
		"a stall that ends after the window counts whole": {
			// The migrator returns at 500; the target's first fold is at 700.
			journals: [][]Fold{{f(1, 0, 50), f(2, 100, 700)}},
			from:     0, to: 500,
			want: gap(100, 700),
		},
		"a stall before the window does not count": {
			journals: [][]Fold{{f(1, 0, 500), f(2, 600, 650), f(3, 700, 750)}},
			from:     600, to: 800,
			want: gap(600, 650),
		},
		"a message never folded waits until the window ends": {
			journals: [][]Fold{{f(1, 0, 50)}},
			sent:     map[int64]time.Time{1: at(0), 2: at(100)},
			from:     0, to: 900,
			want: gap(100, 900),
		},
		"folds without an id or a send time": {
			journals: [][]Fold{{f(1, 0, 50), {ID: -1, LatencyMS: -1, AtNS: at(60).UnixNano()}, {ID: 2, LatencyMS: -1, AtNS: at(300).UnixNano()}, f(3, 350, 380)}},
			from:     0, to: 400,
			want: gap(0, 50),
		},
		"nothing waited": {
			journals: [][]Fold{{f(1, 0, 0)}},
			from:     0, to: 100,
		},
		"no journals": {},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			sent := tc.sent
			if sent == nil {
				sent = SendTimes(tc.journals)
			}
			got := ProcessingGap(tc.journals, sent, at(tc.from), at(tc.to))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ProcessingGap (-want +got):\n%s", diff)
			}
		})
	}
}

// TestProcessingGapAgainstBruteForce compares ProcessingGap with a search
// of every interval on a millisecond grid, on random journals: messages
// sent in order, each first folded by some instance, some folded again
// later by another (a replay), and a random window.
func TestProcessingGapAgainstBruteForce(t *testing.T) {
	t0 := time.Unix(1_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 500 {
		n := 1 + rng.IntN(8)
		journals := make([][]Fold, 1+rng.IntN(3))
		sent, first := map[int64]int{}, map[int64]int{}
		s := 0
		for id := int64(1); id <= int64(n); id++ {
			s += rng.IntN(30)
			f := s + rng.IntN(60)
			sent[id], first[id] = s, f
			j := rng.IntN(len(journals))
			journals[j] = append(journals[j], Fold{ID: id, AtNS: at(f).UnixNano(), SentNS: at(s).UnixNano()})
			if rng.IntN(3) == 0 { // replayed later by another instance
				k := rng.IntN(len(journals))
				journals[k] = append(journals[k], Fold{ID: id, AtNS: at(f + 1 + rng.IntN(40)).UnixNano(), SentNS: at(s).UnixNano()})
			}
		}
		end := 0
		for _, f := range first {
			end = max(end, f)
		}
		from := rng.IntN(end + 1)
		to := from + rng.IntN(end-from+1)

		// Brute force: the longest [a, b] on the grid with no first fold
		// strictly inside, something waiting in every millisecond of it,
		// and overlapping the window.
		progress := map[int]bool{}
		for _, f := range first {
			progress[f] = true
		}
		waiting := func(k int) bool { // in [k, k+1)
			for id, s := range sent {
				if s <= k && first[id] > k {
					return true
				}
			}
			return false
		}
		want := 0
		for a := 0; a <= end; a++ {
			for b := a + 1; b <= end; b++ {
				if !waiting(b - 1) {
					break
				}
				if b > from && a < to {
					want = max(want, b-a)
				}
				if progress[b] {
					break
				}
			}
		}
		got := ProcessingGap(journals, SendTimes(journals), at(from), at(to))
		if got.Duration() != time.Duration(want)*time.Millisecond {
			t.Fatalf("round %d: ProcessingGap = %v (%v to %v), brute force %d ms; window %d..%d ms, sent %v, first folds %v",
				round, got.Duration(), got.Start.Sub(t0), got.End.Sub(t0), want, from, to, sent, first)
		}
	}
}
