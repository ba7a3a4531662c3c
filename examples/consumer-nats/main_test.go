package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"

	"github.com/ms2m/ms2m/examples/internal/journal"
)

func TestStamps(t *testing.T) {
	sent := time.Unix(100, 5)
	for name, tc := range map[string]struct {
		h        nats.Header
		wantID   string
		wantSent time.Time
	}{
		"both":       {h: nats.Header{"Nats-Msg-Id": {"12"}, "x-sent-at": {"100000000005"}}, wantID: "12", wantSent: sent},
		"no headers": {},
		"bad stamp":  {h: nats.Header{"Nats-Msg-Id": {"3"}, "x-sent-at": {"soon"}}, wantID: "3"},
		"zero stamp": {h: nats.Header{"x-sent-at": {"0"}}},
		// Headers are case-sensitive in NATS: another spelling is not the stamp.
		"other case": {h: nats.Header{"X-Sent-At": {"100000000005"}}},
	} {
		id, got := stamps(tc.h)
		if id != tc.wantID || !got.Equal(tc.wantSent) {
			t.Errorf("%s: stamps = %q, %v; want %q, %v", name, id, got, tc.wantID, tc.wantSent)
		}
	}
}

// TestFoldsServed: every fold is journaled with its stamps, and GET /folds
// serves the journal in the AMQP consumer's form.
func TestFoldsServed(t *testing.T) {
	var s state
	now := time.Unix(200, 0)
	sent := now.Add(-40 * time.Millisecond)
	s.fold([]byte("msg-1"), nats.Header{"Nats-Msg-Id": {"1"}, "x-sent-at": {"199960000000"}}, now)
	s.fold([]byte("msg-2"), nil, now.Add(time.Millisecond))
	if s.count != 2 || s.last != "msg-2" {
		t.Errorf("count %d last %q, want 2 and msg-2", s.count, s.last)
	}

	srv := httptest.NewServer(s.handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/folds")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got journal.Folds
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := journal.Folds{Folds: []journal.Fold{
		{ID: 1, LatencyMS: 40, AtNS: now.UnixNano(), SentNS: sent.UnixNano()},
		{ID: -1, LatencyMS: -1, AtNS: now.Add(time.Millisecond).UnixNano()},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("GET /folds (-want +got)\n%s", diff)
	}
}
