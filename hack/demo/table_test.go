package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/migrate"
)

func TestDowntimeShare(t *testing.T) {
	ok := func(s migrate.Strategy, down time.Duration) result {
		return result{strategy: s, report: migrate.Report{Downtime: down}, want: lab.ProducerResult{Count: 3, Hash: "h"}, got: lab.AppState{Count: 3, Hash: "h"}}
	}
	failed := ok(migrate.StopAndCopy, time.Second)
	failed.err = errors.New("restore failed")
	tests := map[string]struct {
		results []result
		want    string
	}{
		"both":          {results: []result{ok(migrate.MS2M, 50*time.Millisecond), ok(migrate.StopAndCopy, 2*time.Second)}, want: "ms2m's downtime is 2.5% of stop-and-copy's (50ms against 2s)"},
		"one failed":    {results: []result{ok(migrate.MS2M, 50*time.Millisecond), failed}},
		"only ms2m ran": {results: []result{ok(migrate.MS2M, 50*time.Millisecond)}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, downtimeShare(tc.results)); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestTableAndVerdict(t *testing.T) {
	sent := consumed(seq(1, 300)...)
	good := result{strategy: migrate.MS2M, report: migrate.Report{Total: 6123456 * time.Microsecond, Downtime: 140 * time.Millisecond, Start: 101, CutoffID: 160},
		want: lab.ProducerResult{Count: 300, Hash: sent.Hash}, got: sent}
	short := good
	short.strategy = migrate.StopAndCopy
	short.got = consumed(seq(1, 299)...)
	twice := good
	twice.strategy = migrate.StatefulSet
	twice.got = consumed(append(seq(1, 120), seq(101, 300)...)...)
	failed := result{strategy: migrate.StopAndCopy, err: errors.New("restore failed")}

	var b bytes.Buffer
	writeTable(&b, []result{good, short, twice, failed})
	wantRows := []string{
		"ms2m           6.123s  140ms     0     0           yes",
		"stop-and-copy  6.123s  140ms     1     0           NO",
		"statefulset    6.123s  140ms     0     20          NO",
		"stop-and-copy  0       -         -     -           FAILED",
	}
	rows := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")[1:]
	if diff := cmp.Diff(wantRows, trimRight(rows)); diff != "" {
		t.Errorf("table (-want +got)\n%s", diff)
	}

	if err := verdict([]result{good}); err != nil {
		t.Errorf("verdict of a good run: %v", err)
	}
	err := verdict([]result{good, short, failed})
	if err == nil || !strings.Contains(err.Error(), "stop-and-copy: MISMATCH") || !strings.Contains(err.Error(), "restore failed") {
		t.Errorf("verdict = %v, want the mismatch and the failure", err)
	}
}

func trimRight(lines []string) []string {
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	return lines
}
