package main

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ms2m/ms2m/examples/internal/hashchain"
	"github.com/ms2m/ms2m/examples/internal/journal"
)

func TestApply(t *testing.T) {
	msg := func(id string, redelivered bool) message {
		return message{body: []byte("msg-" + id), messageID: id, redelivered: redelivered}
	}
	tests := map[string]struct {
		noSkip      bool // the default: SKIP_REDELIVERIES unset
		in          []message
		wantFolded  []string // bodies, in order
		wantSkipped int
	}{
		"without the skip, a redelivery is folded again": {
			noSkip:     true,
			in:         []message{msg("1", false), msg("2", false), msg("2", true), msg("3", false)},
			wantFolded: []string{"msg-1", "msg-2", "msg-2", "msg-3"},
		},
		"in order": {
			in:         []message{msg("1", false), msg("2", false), msg("3", false)},
			wantFolded: []string{"msg-1", "msg-2", "msg-3"},
		},
		"redelivery of folded messages is skipped": {
			in:          []message{msg("1", false), msg("2", false), msg("2", true), msg("3", true)},
			wantFolded:  []string{"msg-1", "msg-2", "msg-3"},
			wantSkipped: 1,
		},
		"redelivery below the last id is skipped": {
			in:          []message{msg("1", false), msg("2", false), msg("3", false), msg("2", true), msg("3", true), msg("4", true)},
			wantFolded:  []string{"msg-1", "msg-2", "msg-3", "msg-4"},
			wantSkipped: 2,
		},
		"a first delivery is folded even with an old id": {
			in:         []message{msg("5", false), msg("1", false)},
			wantFolded: []string{"msg-5", "msg-1"},
		},
		"redelivery without a numeric id is folded": {
			in:         []message{msg("a", false), msg("a", true)},
			wantFolded: []string{"msg-a", "msg-a"},
		},
		"redelivery after a message without a numeric id is folded": {
			in:         []message{msg("1", false), msg("x", false), msg("1", true)},
			wantFolded: []string{"msg-1", "msg-x", "msg-1"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := state{skipRedeliveries: !tc.noSkip}
			for _, m := range tc.in {
				s.apply(m, time.Now())
			}
			var want hashchain.Chain
			for _, b := range tc.wantFolded {
				want.Fold([]byte(b))
			}
			wantState := stateJSON{
				Count:   len(tc.wantFolded),
				Hash:    want.Hex(),
				Last:    tc.wantFolded[len(tc.wantFolded)-1],
				Skipped: tc.wantSkipped,
			}
			if diff := cmp.Diff(wantState, s.snapshot()); diff != "" {
				t.Errorf("state (-want +got):\n%s", diff)
			}
		})
	}
}

func TestApplyLatency(t *testing.T) {
	var s state
	now := time.Unix(100, 0)
	s.apply(message{body: []byte("a"), messageID: "1", sentAt: now.Add(-30 * time.Millisecond)}, now)
	s.apply(message{body: []byte("b"), messageID: "2", sentAt: now.Add(-10 * time.Millisecond)}, now)
	s.apply(message{body: []byte("c"), messageID: "3"}, now)
	if got := s.snapshot().MaxLatencyMS; got != 30 {
		t.Errorf("max_latency_ms = %v, want 30", got)
	}
}

func TestFolds(t *testing.T) {
	s := state{skipRedeliveries: true}
	now := time.Unix(100, 0)
	s.apply(message{body: []byte("msg-1"), messageID: "1", sentAt: now.Add(-30 * time.Millisecond)}, now)
	s.apply(message{body: []byte("msg-2"), messageID: "2"}, now)
	s.apply(message{body: []byte("msg-2"), messageID: "2", redelivered: true}, now) // skipped: not folded
	s.apply(message{body: []byte("x"), messageID: "x", sentAt: now.Add(-5 * time.Millisecond)}, now.Add(time.Millisecond))
	at, later := now.UnixNano(), now.Add(time.Millisecond).UnixNano()
	want := journal.Folds{Folds: []journal.Fold{
		{ID: 1, LatencyMS: 30, AtNS: at, SentNS: now.Add(-30 * time.Millisecond).UnixNano()},
		{ID: 2, LatencyMS: -1, AtNS: at},
		{ID: -1, LatencyMS: 6, AtNS: later, SentNS: now.Add(-5 * time.Millisecond).UnixNano()},
	}}
	if diff := cmp.Diff(want, s.folds()); diff != "" {
		t.Errorf("folds (-want +got):\n%s", diff)
	}
	for i := range journal.Max {
		s.apply(message{body: []byte("m"), messageID: strconv.Itoa(i + 3)}, now)
	}
	got := s.folds()
	if got.Dropped != journal.Max/2 || len(got.Folds) != journal.Max-journal.Max/2+3 || got.Folds[len(got.Folds)-1].ID != journal.Max+2 {
		t.Errorf("after %d more folds: %d in the journal, %d dropped, last %v", journal.Max, len(got.Folds), got.Dropped, got.Folds[len(got.Folds)-1])
	}
}

// TestExtraState: STATE_MB's state is that many MiB, written (not the
// zero pages a fresh allocation reads as), and none for 0.
func TestExtraState(t *testing.T) {
	if b := extraState(0); b != nil {
		t.Errorf("extraState(0) = %d bytes, want none", len(b))
	}
	b := extraState(2)
	if len(b) != 2<<20 {
		t.Fatalf("extraState(2) = %d bytes, want 2 MiB", len(b))
	}
	for page := 0; page < len(b); page += 4096 {
		if !slices.ContainsFunc(b[page:page+4096], func(c byte) bool { return c != 0 }) {
			t.Fatalf("page %d of the extra state was never written", page/4096)
		}
	}
}

func TestLoadConfig(t *testing.T) {
	env := map[string]string{"PREFETCH": "10", "WORK_MS": "0", "DECLARE": "false", "QUEUE": "q"}
	cfg, err := loadConfig(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.prefetch != 10 || cfg.work != 0 || cfg.declare || cfg.queue != "q" || cfg.httpAddr != "127.0.0.1:8080" || cfg.skipRedeliveries {
		t.Errorf("loadConfig = %+v", cfg)
	}
	cfg, err = loadConfig(func(k string) (string, bool) { return "", true })
	if err != nil || cfg.prefetch != 1 || cfg.queue != "orders" || cfg.skipRedeliveries {
		t.Errorf("with every variable set but empty: loadConfig = %+v, %v; want the defaults", cfg, err)
	}
	cfg, err = loadConfig(func(k string) (string, bool) { return "true", k == "SKIP_REDELIVERIES" })
	if err != nil || !cfg.skipRedeliveries {
		t.Errorf("with SKIP_REDELIVERIES=true: loadConfig = %+v, %v; want the skip on", cfg, err)
	}
	cfg, err = loadConfig(func(k string) (string, bool) { return "100", k == "STATE_MB" })
	if err != nil || cfg.stateMiB != 100 {
		t.Errorf("with STATE_MB=100: loadConfig = %+v, %v; want 100 MiB of extra state", cfg, err)
	}
	for _, bad := range []map[string]string{{"PREFETCH": "-1"}, {"WORK_MS": "x"}, {"DECLARE": "maybe"}, {"SKIP_REDELIVERIES": "sometimes"},
		{"STATE_MB": "-1"}, {"STATE_MB": "1.5"}, {"STATE_MB": "99999999"}} {
		if _, err := loadConfig(func(k string) (string, bool) { v, ok := bad[k]; return v, ok }); err == nil {
			t.Errorf("loadConfig(%v): want an error", bad)
		}
	}
}
