package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/replay"
)

func TestJudgeJournals(t *testing.T) {
	f := func(id int64, lat float64) lab.Fold { return lab.Fold{ID: id, LatencyMS: lat} }
	tests := map[string]struct {
		journals [][]lab.Fold
		produced int
		want     journalVerdict
	}{
		"a replayed message counts at its first processing": {
			// The source processed 1-3; the target was restored at 1
			// and replayed 2-3 late, then took 4 from the queue.
			journals: [][]lab.Fold{
				{f(1, 5), f(2, 6), f(3, 7)},
				{f(1, 5), f(2, 900), f(3, 800), f(4, 40)},
			},
			produced: 4,
			want:     journalVerdict{worstMs: 40},
		},
		"lost and duplicated in the final state": {
			journals: [][]lab.Fold{{f(1, 1), f(2, 1), f(2, 1), f(4, 1), f(9, 1)}},
			produced: 4,
			want:     journalVerdict{worstMs: 1, lost: 1, duplicated: 2},
		},
		"three instances in turn": {
			journals: [][]lab.Fold{
				{f(1, 3)},
				{f(1, 3), f(2, 70)},
				{f(1, 3), f(2, 500), f(3, 9)},
			},
			produced: 3,
			want:     journalVerdict{worstMs: 70},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := judgeJournals(tc.journals, tc.produced)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(journalVerdict{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestPhaseGroups(t *testing.T) {
	t0 := time.Unix(1000, 0)
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	ms2m := migrate.Report{
		Strategy: migrate.MS2M,
		Phases: []migrate.Phase{
			{Name: "preconditions", Took: sec(0.01)}, {Name: "prepare target", Took: sec(0.03)},
			{Name: "quiesce", Took: sec(0.002)}, {Name: "checkpoint", Took: sec(0.3)}, {Name: "resume", Took: sec(0.001)},
			{Name: "image", Took: sec(0.02)}, {Name: "restore", Took: sec(2.5)},
			{Name: "replay and handover", Took: sec(10)}, {Name: "finalise", Took: sec(0.01)},
		},
		// The phase ran from t0 to t0+10s: the source stopped at 9.9 s,
		// the target replayed its last message at 9.95 s.
		Handover: &replay.Timings{StopStarted: t0.Add(sec(9.9)), LastReplayed: t0.Add(sec(9.95)), Downtime: sec(0.08)},
	}
	got := phaseGroups(ms2m, map[string]time.Time{"replay and handover": t0.Add(sec(10))})
	want := map[string]float64{"prepare": 40, "checkpoint": 303, "image": 20, "restore": 2500, "replay": 9950, "handover": 50, "finalise": 10}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 })); diff != "" {
		t.Errorf("ms2m (-want +got):\n%s", diff)
	}

	sc := migrate.Report{Strategy: migrate.StopAndCopy, Phases: []migrate.Phase{
		{Name: "stop", Took: sec(0.004)}, {Name: "checkpoint", Took: sec(0.3)}, {Name: "image", Took: sec(0.01)},
		{Name: "restore", Took: sec(2.6)}, {Name: "switch", Took: sec(0.002)}, {Name: "something new", Took: sec(1)},
	}}
	got = phaseGroups(sc, nil)
	want = map[string]float64{"handover": 6, "checkpoint": 300, "image": 10, "restore": 2600, "other": 1000}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 })); diff != "" {
		t.Errorf("stop-and-copy (-want +got):\n%s", diff)
	}
	sts := migrate.Report{Strategy: migrate.StatefulSet, Phases: []migrate.Phase{{Name: "switch", Took: sec(2)}}}
	if got := phaseGroups(sts, nil); got["replay"] != 2000 {
		t.Errorf("statefulset's switch is its replay: got %v", got)
	}
}

func TestSpliceSection(t *testing.T) {
	doc := "# Benchmarks\n\nintro\n"
	once, err := spliceSection(doc, "first\n")
	if err != nil {
		t.Fatal(err)
	}
	twice, err := spliceSection(once+"\n## after\n", "second")
	if err != nil {
		t.Fatal(err)
	}
	want := "# Benchmarks\n\nintro\n\n" + paperBegin + "\nsecond\n" + paperEnd + "\n\n## after\n"
	if twice != want {
		t.Errorf("after two runs:\n%s\nwant:\n%s", twice, want)
	}
	if _, err := spliceSection(paperEnd+"\n"+paperBegin, "x"); err == nil {
		t.Error("markers in the wrong order: want an error")
	}
}

func TestPaperCases(t *testing.T) {
	o, err := parsePaperFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	got := o.cases()
	all := paperStrategies
	want := []paperCase{
		{Rate: 4, Runs: 10, Strategies: all}, {Rate: 10, Runs: 10, Strategies: all}, {Rate: 16, Runs: 10, Strategies: all},
		{Rate: 19, Runs: 10, Strategies: []migrate.Strategy{migrate.StopAndCopy, migrate.MS2MCutoff}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("default cases (-want +got):\n%s", diff)
	}
	o, err = parsePaperFlags([]string{"-quick", "-strategies", "ms2m"})
	if err != nil {
		t.Fatal(err)
	}
	want = []paperCase{{Rate: 16, Runs: 1, Strategies: []migrate.Strategy{migrate.StopAndCopy, migrate.MS2M}}}
	if diff := cmp.Diff(want, o.cases()); diff != "" {
		t.Errorf("-quick (-want +got):\n%s", diff)
	}
	o, err = parsePaperFlags([]string{"-sweep", "-rates", "10", "-runs", "3", "-cutoff-rates", ""})
	if err != nil {
		t.Fatal(err)
	}
	cs := o.cases()
	if len(cs) != 19 || cs[9].Rate != 10 || cs[9].Runs != 3 || cs[0].Runs != 1 {
		t.Errorf("-sweep: %d cases, want 1..19 with 3 runs at 10 and 1 elsewhere: %+v", len(cs), cs)
	}
	for _, bad := range [][]string{{"-rates", "20"}, {"-strategies", "criu-alone"}, {"-runs", "0"}, {"x"}} {
		if _, err := parsePaperFlags(bad); err == nil {
			t.Errorf("parsePaperFlags(%q): want an error", bad)
		}
	}
}

func TestExpectedMigration(t *testing.T) {
	// At 16 msg/s the target gains 4 msg/s on the source: 16 s of
	// catch-up after a 4 s restore.
	if got := expectedMigration(migrate.MS2M, 16, 5*time.Second); got != 20*time.Second {
		t.Errorf("ms2m at 16: %s, want 20s", got)
	}
	// ms2m-cutoff stops after T_cutoff = 5 s × 20 / 16 and replays at most
	// T_replay_max after.
	if got := expectedMigration(migrate.MS2MCutoff, 16, 5*time.Second); got != 15250*time.Millisecond {
		t.Errorf("ms2m-cutoff at 16: %s, want 15.25s", got)
	}
	if got := expectedMigration(migrate.StopAndCopy, 19, 5*time.Second); got != 4*time.Second {
		t.Errorf("stop-and-copy: %s, want 4s whatever the rate", got)
	}
}

// TestPaperReport runs the whole report on a synthetic run: goals, CSV,
// figures and the section.
func TestPaperReport(t *testing.T) {
	zero := 0
	lat := 3100.0
	run := func(s migrate.Strategy, rate, totalMs, downMs, replayMs, afterStopMs float64) paperRun {
		return paperRun{Strategy: s, Rate: rate, migrationRound: migrationRound{
			Round: 1, TotalMs: totalMs, Downtime: downMs, HashOK: true, Produced: 100, Count: 100,
			ReplayAfterStopMs: afterStopMs, WorstLatencyMs: &lat, Lost: &zero, Duplicated: &zero,
			Groups: map[string]float64{"restore": 2500, "replay": replayMs},
		}}
	}
	var runs []paperRun
	for _, rate := range paperBarRates {
		runs = append(runs,
			run(migrate.StopAndCopy, rate, 3100, 3000, 0, 0),
			run(migrate.MS2M, rate, 3000+1000*rate, 4, 800*rate, 0),
			run(migrate.MS2MCutoff, rate, 3000+500*rate, 5, 400*rate, 1200),
			run(migrate.StatefulSet, rate, 3500, 3100, 300, 0),
			run(migrate.StatefulSetShadow, rate, 9000, 7, 1000, 0),
		)
	}
	bad := run(migrate.MS2M, 16, 1, 1, 0, 0)
	bad.HashOK, bad.Error = false, "hash mismatch"
	runs = append(runs, bad)
	dir := t.TempDir()
	if d := os.Getenv("KEEP_DIR"); d != "" {
		dir = d
	}
	o := paperOptions{out: filepath.Join(dir, "out"), benchmarks: filepath.Join(dir, "BENCHMARKS.md"), replayMax: 5 * time.Second}
	res := paperResults{Quick: true, Command: "go run ./hack/bench paper -quick", Runs: runs}
	res.Summary = summarise(runs, paperStrategies)
	res.Goals = paperGoals(res, o)
	verdicts := map[string]string{}
	for _, g := range res.Goals {
		verdicts[g.Name] = g.Verdict
	}
	wantVerdicts := map[string]string{
		"ms2m downtime against stop-and-copy at 16 msg/s":                    "PASS",
		"ms2m-cutoff replay after the source's stop at 16 msg/s (worst run)": "PASS",
		"ms2m-cutoff replay after the source's stop at 19 msg/s (worst run)": "SKIP",
		"statefulset-shadow downtime at 10 msg/s":                            "PASS",
		"every migration exact: lost and duplicated messages":                "MISS", // the bad run
	}
	for name, want := range wantVerdicts {
		if verdicts[name] != want {
			t.Errorf("goal %q: %q, want %q", name, verdicts[name], want)
		}
	}
	if err := writePaper(o, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Files) != 5+3+5 {
		t.Errorf("figures: %v, want 5 time-vs-rate, 3 per-rate and 5 phase figures", res.Files)
	}
	csv, err := os.ReadFile(filepath.Join(o.out, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(csv), "\n"); lines != len(runs)+1 {
		t.Errorf("results.csv has %d lines, want a header and %d runs", lines, len(runs))
	}
	md, err := os.ReadFile(o.benchmarks)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"**Quick run**", "49.055 s", "80.3% → 56.2%", "| ms2m | 16 | 1 of 2 |", "other hardware"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("the section lacks %q:\n%s", want, md)
		}
	}
}
