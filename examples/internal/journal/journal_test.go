package journal

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestNewFold(t *testing.T) {
	now := time.Unix(100, 0)
	sent := now.Add(-30 * time.Millisecond)
	for name, tc := range map[string]struct {
		id   string
		sent time.Time
		want Fold
	}{
		"id and stamp":  {id: "7", sent: sent, want: Fold{ID: 7, LatencyMS: 30, AtNS: now.UnixNano(), SentNS: sent.UnixNano()}},
		"no stamp":      {id: "8", want: Fold{ID: 8, LatencyMS: -1, AtNS: now.UnixNano()}},
		"no numeric id": {id: "msg-9", sent: sent, want: Fold{ID: -1, LatencyMS: 30, AtNS: now.UnixNano(), SentNS: sent.UnixNano()}},
		"nothing":       {want: Fold{ID: -1, LatencyMS: -1, AtNS: now.UnixNano()}},
	} {
		if diff := cmp.Diff(tc.want, NewFold(tc.id, tc.sent, now)); diff != "" {
			t.Errorf("%s: (-want +got)\n%s", name, diff)
		}
	}
}

func TestJournalBounded(t *testing.T) {
	var j Journal
	if got := j.Snapshot(); len(got.Folds) != 0 || got.Dropped != 0 {
		t.Fatalf("empty journal: %+v", got)
	}
	for i := range Max + 3 {
		j.Add(Fold{ID: int64(i)})
	}
	got := j.Snapshot()
	if got.Dropped != Max/2 || len(got.Folds) != Max-Max/2+3 || got.Folds[0].ID != Max/2 || got.Folds[len(got.Folds)-1].ID != Max+2 {
		t.Errorf("after %d folds: %d kept (first %d, last %d), %d dropped", Max+3, len(got.Folds), got.Folds[0].ID, got.Folds[len(got.Folds)-1].ID, got.Dropped)
	}
	got.Folds[0].ID = -5 // a copy: the journal keeps its own
	if j.Snapshot().Folds[0].ID != Max/2 {
		t.Error("Snapshot shares the journal's folds")
	}
}

// TestFoldsJSON pins the field names e2e/lab/journal reads.
func TestFoldsJSON(t *testing.T) {
	b, err := json.Marshal(Folds{Folds: []Fold{{ID: 1, LatencyMS: 2.5, AtNS: 3, SentNS: 4}}, Dropped: 5})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"folds":[{"id":1,"latency_ms":2.5,"at_ns":3,"sent_ns":4}],"dropped":5}`; string(b) != want {
		t.Errorf("JSON %s, want %s", b, want)
	}
}
