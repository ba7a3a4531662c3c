package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/e2e/lab/journal"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
)

func TestDowntimeShare(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ok := func(s contract.Strategy, gap, down time.Duration) result {
		return result{strategy: s, report: migrate.Report{Downtime: down}, gap: journal.Gap{Start: t0, End: t0.Add(gap)},
			want: lab.ProducerResult{Count: 3, Hash: "h"}, got: lab.AppState{Count: 3, Hash: "h"}}
	}
	failed := ok(contract.StrategyStopAndCopy, 2*time.Second, time.Second)
	failed.err = errors.New("restore failed")
	noJournal := ok(contract.StrategyStopAndCopy, 0, time.Second)
	noJournal.gapErr = errors.New("no journal was read")
	natsMS2M := ok(contract.StrategyMS2M, 300*time.Millisecond, 5*time.Millisecond)
	natsMS2M.nats = true
	tests := map[string]struct {
		results []result
		want    string
	}{
		"both": {results: []result{ok(contract.StrategyMS2M, 400*time.Millisecond, 10*time.Millisecond), ok(contract.StrategyStopAndCopy, 8*time.Second, 2*time.Second)},
			want: "ms2m's downtime (processing gap) is 5.0% of stop-and-copy's (400ms against 8s); its switch time 10ms against 2s"},
		"one failed":     {results: []result{ok(contract.StrategyMS2M, 400*time.Millisecond, 50*time.Millisecond), failed}},
		"one has no gap": {results: []result{ok(contract.StrategyMS2M, 400*time.Millisecond, 50*time.Millisecond), noJournal}},
		"only ms2m ran":  {results: []result{ok(contract.StrategyMS2M, 400*time.Millisecond, 50*time.Millisecond)}},
		// The NATS row is not the AMQP ms2m row, before or after it.
		"nats after": {results: []result{ok(contract.StrategyMS2M, 400*time.Millisecond, 10*time.Millisecond), ok(contract.StrategyStopAndCopy, 8*time.Second, 2*time.Second), natsMS2M},
			want: "ms2m's downtime (processing gap) is 5.0% of stop-and-copy's (400ms against 8s); its switch time 10ms against 2s"},
		"only nats ms2m": {results: []result{natsMS2M, ok(contract.StrategyStopAndCopy, 8*time.Second, 2*time.Second)}},
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
	t0 := time.Unix(1000, 0)
	good := result{strategy: contract.StrategyMS2M, report: migrate.Report{Total: 6123456 * time.Microsecond, Downtime: 140 * time.Millisecond, Start: 101, CutoffID: 160},
		gap:  journal.Gap{Start: t0, End: t0.Add(412345 * time.Microsecond)},
		want: lab.ProducerResult{Count: 300, Hash: sent.Hash}, got: sent}
	short := good
	short.strategy = contract.StrategyStopAndCopy
	short.got = consumed(seq(1, 299)...)
	twice := good
	twice.strategy = contract.StrategyStatefulSet
	twice.got = consumed(append(seq(1, 120), seq(101, 300)...)...)
	skipped := good
	skipped.strategy = contract.StrategyMS2MCutoff
	skipped.got.Skipped = 1
	skipped.gapErr = errors.New("no journal was read")
	failed := result{strategy: contract.StrategyStopAndCopy, err: errors.New("restore failed")}
	natsGood := good
	natsGood.nats = true
	natsFailed := result{strategy: contract.StrategyMS2M, nats: true, err: errors.New("no NATS server")}

	var b bytes.Buffer
	writeTable(&b, []result{good, short, twice, skipped, failed, natsGood, natsFailed})
	wantRows := []string{
		"ms2m           6.123s  412ms     140ms   0     0           yes",
		"stop-and-copy  6.123s  412ms     140ms   1     0           NO",
		"statefulset    6.123s  412ms     140ms   0     20          NO",
		"ms2m-cutoff    6.123s  ?         140ms   0     0           NO",
		"stop-and-copy  0       -         -       -     -           FAILED",
		"ms2m (NATS)    6.123s  412ms     140ms   0     0           yes",
		"ms2m (NATS)    0       -         -       -     -           FAILED",
	}
	rows := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")[1:]
	if diff := cmp.Diff(wantRows, trimRight(rows)); diff != "" {
		t.Errorf("table (-want +got)\n%s", diff)
	}

	if err := verdict([]result{good}); err != nil {
		t.Errorf("verdict of a good run: %v", err)
	}
	err := verdict([]result{good, short, failed, natsFailed})
	if err == nil || !strings.Contains(err.Error(), "stop-and-copy: MISMATCH") || !strings.Contains(err.Error(), "restore failed") || !strings.Contains(err.Error(), "ms2m (NATS): no NATS server") {
		t.Errorf("verdict = %v, want the mismatch and both failures", err)
	}
	if err := verdict([]result{skipped}); err == nil || !strings.Contains(err.Error(), "ms2m-cutoff: MISMATCH") || !strings.Contains(err.Error(), "skipping 1 redeliveries") {
		t.Errorf("verdict of a run that skipped a redelivery = %v, want a mismatch", err)
	}
}

func trimRight(lines []string) []string {
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	return lines
}
