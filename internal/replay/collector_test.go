package replay

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ms2m/ms2m/internal/shadowqueue"
)

func del(id uint64, q string) shadowqueue.Record {
	return shadowqueue.Record{Kind: shadowqueue.KindDelivery, ID: id, Queue: q}
}

func marker(kind shadowqueue.Kind, id, epoch uint64) shadowqueue.Record {
	return shadowqueue.Record{Kind: kind, ID: id, Epoch: epoch}
}

// rep is a redelivery, with ID id, of the message first delivered as first.
func rep(id, first uint64, q string) shadowqueue.Record {
	r := del(id, q)
	r.Redelivered, r.Repeats = true, first
	return r
}

func ids(recs []shadowqueue.Record) []uint64 {
	var out []uint64
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

func TestCollector(t *testing.T) {
	for name, tc := range map[string]struct {
		rng          Range
		log          []shadowqueue.Record
		wantA, wantB []uint64
		wantCutoff   uint64
		wantComplete bool
		wantRepeats  int
		wantErr      error
	}{
		"fixed cutoff": {
			rng:   Range{Start: 2, Cutoff: 5},
			log:   []shadowqueue.Record{del(1, "a"), del(2, "a"), del(3, "a"), del(4, "b"), del(5, "a"), del(6, "a")},
			wantA: []uint64{3, 5}, wantB: []uint64{4}, wantCutoff: 5, wantComplete: true,
		},
		"cutoff equals start: nothing to replay": {
			rng:        Range{Start: 3, Cutoff: 3},
			log:        []shadowqueue.Record{del(1, "a"), del(2, "b"), del(3, "a")},
			wantCutoff: 3, wantComplete: true,
		},
		"fixed cutoff not reached yet": {
			rng:   Range{Start: 0, Cutoff: 5},
			log:   []shadowqueue.Record{del(1, "a"), del(2, "b")},
			wantA: []uint64{1}, wantB: []uint64{2}, wantCutoff: 5,
		},
		"marker cutoff": {
			rng:   Range{Start: 1},
			log:   []shadowqueue.Record{del(1, "a"), del(2, "a"), del(3, "b"), marker(shadowqueue.KindCutoff, 3, 1)},
			wantA: []uint64{2}, wantB: []uint64{3}, wantCutoff: 3, wantComplete: true,
		},
		"marker before the start is an older migration's": {
			rng:   Range{Start: 3},
			log:   []shadowqueue.Record{del(1, "a"), marker(shadowqueue.KindCutoff, 1, 1), del(2, "a"), del(3, "a"), del(4, "a")},
			wantA: []uint64{4},
		},
		"resume voids the cutoff": {
			rng:   Range{Start: 0},
			log:   []shadowqueue.Record{del(1, "a"), marker(shadowqueue.KindCutoff, 1, 1), marker(shadowqueue.KindResume, 1, 1), del(2, "a")},
			wantA: []uint64{1, 2},
		},
		"cutoff at the start replays nothing": {
			rng:          Range{Start: 2},
			log:          []shadowqueue.Record{del(1, "a"), del(2, "a"), marker(shadowqueue.KindCutoff, 2, 1)},
			wantCutoff:   2,
			wantComplete: true,
		},
		"duplicates from a retried write are skipped": {
			rng:   Range{Start: 0, Cutoff: 3},
			log:   []shadowqueue.Record{del(1, "a"), del(2, "a"), del(2, "a"), del(3, "a")},
			wantA: []uint64{1, 2, 3}, wantCutoff: 3, wantComplete: true,
		},
		"skipped IDs are not replayed": {
			rng:   Range{Start: 1, Cutoff: 6, Skip: []uint64{3, 4, 6}},
			log:   []shadowqueue.Record{del(1, "a"), del(2, "a"), del(3, "a"), del(4, "b"), del(5, "a"), del(6, "b"), del(7, "a")},
			wantA: []uint64{2, 5}, wantCutoff: 6, wantComplete: true,
		},
		"a repeat of a replayed delivery is left out": {
			rng:   Range{Start: 1, Cutoff: 6},
			log:   []shadowqueue.Record{del(1, "a"), del(2, "a"), del(3, "a"), rep(4, 2, "a"), rep(5, 2, "a"), del(6, "a")},
			wantA: []uint64{2, 3, 6}, wantCutoff: 6, wantComplete: true, wantRepeats: 2,
		},
		"a repeat of a delivery before the checkpoint is replayed": {
			rng:   Range{Start: 2, Cutoff: 4},
			log:   []shadowqueue.Record{del(1, "a"), del(2, "a"), rep(3, 2, "a"), del(4, "a")},
			wantA: []uint64{3, 4}, wantCutoff: 4, wantComplete: true,
		},
		"a repeat of a skipped delivery is replayed in its place": {
			// A rebuild: the crashed app never settled 2 (nor its first
			// redelivery, 4); its last redelivery, 5, is what it folds.
			rng:   Range{Start: 1, Cutoff: 6, Skip: []uint64{2, 4}},
			log:   []shadowqueue.Record{del(1, "a"), del(2, "a"), del(3, "b"), rep(4, 2, "a"), rep(5, 2, "a"), del(6, "a")},
			wantA: []uint64{5, 6}, wantB: []uint64{3}, wantCutoff: 6, wantComplete: true,
		},
		"start older than retention": {
			rng:     Range{Start: 2},
			log:     []shadowqueue.Record{del(5, "a")},
			wantErr: ErrRetention,
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := NewCollector(tc.rng)
			var err error
			for _, r := range tc.log {
				if err = c.Add(r); err != nil {
					break
				}
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Add error = %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr != nil {
				return
			}
			if d := cmp.Diff(tc.wantA, ids(c.Records("a"))); d != "" {
				t.Errorf("queue a (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.wantB, ids(c.Records("b"))); d != "" {
				t.Errorf("queue b (-want +got):\n%s", d)
			}
			if cut, _ := c.Cutoff(); cut != tc.wantCutoff || c.Complete() != tc.wantComplete {
				t.Errorf("cutoff %d complete %v, want %d %v", cut, c.Complete(), tc.wantCutoff, tc.wantComplete)
			}
			if c.Repeats() != tc.wantRepeats {
				t.Errorf("%d repeats left out, want %d", c.Repeats(), tc.wantRepeats)
			}
		})
	}
}

func TestRangeValidate(t *testing.T) {
	for _, skip := range [][]uint64{{5}, {7}, {6, 6}, {6, 5}} {
		if err := (Range{Start: 5, Cutoff: 6, Skip: skip}).Validate(); err == nil {
			t.Errorf("skip %v in (5, 6] validated", skip)
		}
	}
	if err := (Range{Start: 5, Cutoff: 6, Skip: []uint64{6}}).Validate(); err != nil {
		t.Errorf("skip [6] in (5, 6]: %v", err)
	}
	if err := (Range{Start: 5, Cutoff: 3}).Validate(); err == nil {
		t.Error("cutoff below start accepted")
	}
	if err := (Range{Start: 5}).Validate(); err != nil {
		t.Errorf("marker range rejected: %v", err)
	}
}

func pub(last, forID uint64, rk string) shadowqueue.Record {
	return shadowqueue.Record{Kind: shadowqueue.KindPublish, ID: last, For: forID, Exchange: "x", RoutingKey: rk, Body: make([]byte, shadowqueue.PublishDigestLen)}
}

// TestCollectorPublishes: the source's publishes are kept for the range's
// deliveries, and given out only once a cutoff marker closed the range.
func TestCollectorPublishes(t *testing.T) {
	for name, tc := range map[string]struct {
		rng    Range
		log    []shadowqueue.Record
		want   map[uint64][]string // routing keys by delivery ID
		wantOK bool
	}{
		"marker cutoff": {
			rng: Range{Start: 1},
			log: []shadowqueue.Record{del(1, "a"), pub(1, 1, "r1"), del(2, "a"), pub(2, 2, "r2a"), pub(2, 2, "r2b"),
				del(3, "a"), pub(3, 3, "r3"), marker(shadowqueue.KindCutoff, 3, 1), pub(3, 3, "late")},
			want:   map[uint64][]string{2: {"r2a", "r2b"}, 3: {"r3"}},
			wantOK: true,
		},
		"not complete yet": {
			rng: Range{Start: 0},
			log: []shadowqueue.Record{del(1, "a"), pub(1, 1, "r1")},
		},
		"cutoff up front": {
			rng: Range{Start: 0, Cutoff: 1},
			log: []shadowqueue.Record{del(1, "a"), pub(1, 1, "r1")},
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := NewCollector(tc.rng)
			for _, r := range tc.log {
				if err := c.Add(r); err != nil {
					t.Fatal(err)
				}
			}
			got, ok := c.Publishes()
			if ok != tc.wantOK {
				t.Fatalf("Publishes ok = %v, want %v", ok, tc.wantOK)
			}
			keys := map[uint64][]string{}
			for id, ps := range got {
				for _, p := range ps {
					keys[id] = append(keys[id], p.RoutingKey)
				}
			}
			if tc.want == nil {
				tc.want = map[uint64][]string{}
			}
			if diff := cmp.Diff(tc.want, keys); diff != "" {
				t.Errorf("publishes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCollectorIgnoresAnEarlierMigrationsMarker: a log migrated before
// holds that migration's cutoff marker. A second migration whose
// checkpoint came with no delivery since (start = the old cutoff) must
// not take the old marker for its own: only a marker of a later epoch
// than the checkpoint's ends its replay. Without the epoch, it would.
func TestCollectorIgnoresAnEarlierMigrationsMarker(t *testing.T) {
	log := []shadowqueue.Record{del(1, "a"), del(2, "a"), marker(shadowqueue.KindCutoff, 2, 1)}
	c := NewCollector(Range{Start: 2, Epoch: 1})
	for _, r := range log {
		if err := c.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	if id, ok := c.Cutoff(); ok {
		t.Fatalf("took the earlier migration's marker (cutoff %d) for its own", id)
	}
	for _, r := range []shadowqueue.Record{del(3, "a"), marker(shadowqueue.KindCutoff, 3, 2)} {
		if err := c.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	if id, ok := c.Cutoff(); !ok || id != 3 || !c.Complete() || c.Epoch() != 2 {
		t.Fatalf("cutoff %d %v complete %v epoch %d; want 3, complete, epoch 2", id, ok, c.Complete(), c.Epoch())
	}
	if got := ids(c.Records("a")); !cmp.Equal(got, []uint64{3}) {
		t.Errorf("records %v, want [3]", got)
	}

	old := NewCollector(Range{Start: 2}) // no epoch: the bug this guards against
	for _, r := range log {
		if err := old.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := old.Cutoff(); !ok {
		t.Error("without the epoch the stale marker is not taken; this test no longer shows what it guards")
	}
}

// TestCollectorKnownCutoffKeepsTheStopsEpoch: for a known cutoff the
// target goes on with the epoch of the stop that made it.
func TestCollectorKnownCutoffKeepsTheStopsEpoch(t *testing.T) {
	c := NewCollector(Range{Start: 2, Cutoff: 2, Epoch: 4})
	for _, r := range []shadowqueue.Record{del(1, "a"), del(2, "a")} {
		if err := c.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	if !c.Complete() || c.Epoch() != 4 {
		t.Fatalf("complete %v epoch %d; want complete, epoch 4", c.Complete(), c.Epoch())
	}
}

// TestCollectorGoesOnThroughWhatTheIdentityTook: deliveries beyond the
// cutoff that were in the log when the replay began were this restore's
// predecessor's, which had taken over: the replay goes on through them
// (Range.LogEnd), for a fixed cutoff and for one from a marker; a replay
// to the log's end (Range.ToEnd) stops at the end it was given. Without
// LogEnd, the pod made again would skip what its predecessor processed.
func TestCollectorGoesOnThroughWhatTheIdentityTook(t *testing.T) {
	// The source's deliveries (epoch 0), its stop at 3 (epoch 1), and its
	// successor's deliveries (epoch 1).
	after := func(id uint64) shadowqueue.Record { r := del(id, "a"); r.Epoch = 1; return r }
	served := []shadowqueue.Record{del(1, "a"), del(2, "a"), del(3, "a"), marker(shadowqueue.KindCutoff, 3, 1), after(4), after(5)}
	for _, tc := range []struct {
		name string
		rng  Range
		log  []shadowqueue.Record
		want []uint64
	}{
		{"fixed cutoff, no predecessor", Range{Start: 1, Cutoff: 3, Epoch: 1, LogEnd: 3, LogEndEpoch: 1}, served[:4], []uint64{2, 3}},
		{"fixed cutoff, the predecessor served", Range{Start: 1, Cutoff: 3, Epoch: 1, LogEnd: 5, LogEndEpoch: 1}, served, []uint64{2, 3, 4, 5}},
		{"a cutoff short of the source's own deliveries", Range{Start: 1, Cutoff: 2, Epoch: 1, LogEnd: 3, LogEndEpoch: 0}, served[:3], []uint64{2}},
		{"fixed cutoff without the stop's epoch", Range{Start: 1, Cutoff: 3, LogEnd: 5, LogEndEpoch: 1}, served, []uint64{2, 3}},
		{"marker, the predecessor served", Range{Start: 1, LogEnd: 5, LogEndEpoch: 1}, served, []uint64{2, 3, 4, 5}},
		{"marker, the source still served at the start", Range{Start: 1, LogEnd: 2}, served, []uint64{2, 3}},
		{"to the end", Range{Start: 1, ToEnd: true, LogEnd: 4}, served, []uint64{2, 3, 4}},
		{"to the end, which is the start", Range{Start: 3, ToEnd: true, LogEnd: 3}, served[:4], nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCollector(tc.rng)
			for _, r := range tc.log {
				if err := c.Add(r); err != nil {
					t.Fatal(err)
				}
			}
			if !c.Complete() {
				t.Fatalf("not complete after %d records", len(tc.log))
			}
			if got := ids(c.Records("a")); !cmp.Equal(got, tc.want) {
				t.Errorf("records %v, want %v", got, tc.want)
			}
		})
	}
	if err := (Range{Start: 1, Cutoff: 3, ToEnd: true}).Validate(); err == nil {
		t.Error("a range to the log's end with a cutoff ID validates")
	}
}

// cutoffNaming is a stop's cutoff marker that names the app's queues.
func cutoffNaming(id, epoch uint64, queues ...string) shadowqueue.Record {
	r := marker(shadowqueue.KindCutoff, id, epoch)
	r.Body = shadowqueue.CutoffBody(queues)
	return r
}

// TestCollectorQueuesFromTheStop: a queue the source's app consumed that
// had no delivery in the log is known from the stop's cutoff marker, so
// a target switches it to the broker instead of refusing it. With a fixed
// cutoff from a stop (the epoch given), whether a queue is the source's is
// final only once that stop's marker, which follows the record at the
// cutoff, or anything after it was read.
func TestCollectorQueuesFromTheStop(t *testing.T) {
	t.Run("marker cutoff", func(t *testing.T) {
		c := NewCollector(Range{Start: 0, Epoch: 0})
		for _, r := range []shadowqueue.Record{del(1, "a"), cutoffNaming(1, 1, "a", "idle")} {
			if err := c.Add(r); err != nil {
				t.Fatal(err)
			}
		}
		if !c.Complete() || !c.QueuesKnown() || !c.Known("idle") || c.Known("other") {
			t.Fatalf("complete %v, queues known %v, idle known %v, other known %v; want true, true, true, false", c.Complete(), c.QueuesKnown(), c.Known("idle"), c.Known("other"))
		}
	})
	t.Run("never fed: cutoff 0 from its own marker", func(t *testing.T) {
		c := NewCollector(Range{Start: 0, Epoch: 0}) // Restore.atStop(0, 1)
		if err := c.Add(cutoffNaming(0, 1, "idle")); err != nil {
			t.Fatal(err)
		}
		if !c.Complete() || !c.QueuesKnown() || !c.Known("idle") || len(c.Records("idle")) != 0 {
			t.Fatalf("complete %v, queues known %v, idle known %v, %d records; want complete with idle known and nothing to replay", c.Complete(), c.QueuesKnown(), c.Known("idle"), len(c.Records("idle")))
		}
	})
	t.Run("fixed cutoff from a stop", func(t *testing.T) {
		c := NewCollector(Range{Start: 1, Cutoff: 2, Epoch: 3})
		for _, r := range []shadowqueue.Record{del(1, "a"), del(2, "a")} {
			if err := c.Add(r); err != nil {
				t.Fatal(err)
			}
		}
		if !c.Complete() || c.QueuesKnown() || c.Known("idle") {
			t.Fatalf("at the cutoff: complete %v, queues known %v, idle known %v; want true, false, false", c.Complete(), c.QueuesKnown(), c.Known("idle"))
		}
		if err := c.Add(cutoffNaming(2, 3, "a", "idle")); err != nil {
			t.Fatal(err)
		}
		if !c.QueuesKnown() || !c.Known("idle") {
			t.Fatalf("after the stop's marker: queues known %v, idle known %v; want both", c.QueuesKnown(), c.Known("idle"))
		}
	})
	t.Run("fixed cutoff, a record after it", func(t *testing.T) {
		c := NewCollector(Range{Start: 0, Cutoff: 1, Epoch: 1})
		for _, r := range []shadowqueue.Record{del(1, "a"), del(2, "a")} { // an old sidecar's stop: no marker naming queues
			if err := c.Add(r); err != nil {
				t.Fatal(err)
			}
		}
		if !c.QueuesKnown() || c.Known("idle") {
			t.Fatalf("queues known %v, idle known %v; want true, false", c.QueuesKnown(), c.Known("idle"))
		}
	})
	t.Run("fixed cutoff without a stop's epoch", func(t *testing.T) {
		c := NewCollector(Range{Start: 0, Cutoff: 1})
		if err := c.Add(del(1, "a")); err != nil {
			t.Fatal(err)
		}
		if !c.Complete() || !c.QueuesKnown() {
			t.Fatalf("complete %v, queues known %v; want both", c.Complete(), c.QueuesKnown())
		}
	})
}
