package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/hack/bench/paperplot"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/migrate"
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
			want:     journalVerdict{worstMs: 1, lost: 1, duplicated: 2, missing: map[int64]string{3: "none"}},
		},
		"a message the source processed and the target lacks": {
			journals: [][]lab.Fold{
				{f(1, 1), f(2, 1)},
				{f(1, 1), f(3, 1)},
			},
			produced: 3,
			want:     journalVerdict{worstMs: 1, lost: 1, missing: map[int64]string{2: "journal 0"}},
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
		Strategy: contract.StrategyMS2M,
		Phases: []migrate.Phase{
			{Name: "preconditions", Took: sec(0.01)}, {Name: "prepare target", Took: sec(0.03)},
			{Name: "quiesce", Took: sec(0.002)}, {Name: "checkpoint", Took: sec(0.3)}, {Name: "resume", Took: sec(0.001)},
			{Name: "image", Took: sec(0.02)}, {Name: "restore", Took: sec(2.5)},
			{Name: "replay and handover", Took: sec(10)}, {Name: "finalise", Took: sec(0.01)},
		},
		// The phase ran from t0 to t0+10s: the source stopped at 9.9 s,
		// the target replayed its last message at 9.95 s.
		Handover: &control.Timings{StopStarted: t0.Add(sec(9.9)), LastReplayed: t0.Add(sec(9.95)), Downtime: sec(0.08)},
	}
	got := phaseGroups(ms2m, map[string]time.Time{"replay and handover": t0.Add(sec(10))})
	want := map[string]float64{"prepare": 40, "checkpoint": 303, "image": 20, "restore": 2500, "replay": 9950, "handover": 50, "finalise": 10}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 })); diff != "" {
		t.Errorf("ms2m (-want +got):\n%s", diff)
	}

	sc := migrate.Report{Strategy: contract.StrategyStopAndCopy, Phases: []migrate.Phase{
		{Name: "stop", Took: sec(0.004)}, {Name: "checkpoint", Took: sec(0.3)}, {Name: "image", Took: sec(0.01)},
		{Name: "restore", Took: sec(2.6)}, {Name: "switch", Took: sec(0.002)}, {Name: "something new", Took: sec(1)},
	}}
	got = phaseGroups(sc, nil)
	want = map[string]float64{"handover": 6, "checkpoint": 300, "image": 10, "restore": 2600, "other": 1000}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 })); diff != "" {
		t.Errorf("stop-and-copy (-want +got):\n%s", diff)
	}
	sts := migrate.Report{Strategy: contract.StrategyStatefulSet, Phases: []migrate.Phase{{Name: "switch", Took: sec(2)}}}
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
		{Rate: 19, Runs: 10, Strategies: []contract.Strategy{contract.StrategyStopAndCopy, contract.StrategyMS2MCutoff}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("default cases (-want +got):\n%s", diff)
	}
	o, err = parsePaperFlags([]string{"-quick", "-strategies", "ms2m"})
	if err != nil {
		t.Fatal(err)
	}
	want = []paperCase{{Rate: 16, Runs: 1, Strategies: []contract.Strategy{contract.StrategyStopAndCopy, contract.StrategyMS2M}}}
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
	for _, bad := range [][]string{{"-rates", "20"}, {"-strategies", "criu-alone"}, {"-strategies", "ms2m-cutoff-formula"}, {"-runs", "0"}, {"x"}} {
		if _, err := parsePaperFlags(bad); err == nil {
			t.Errorf("parsePaperFlags(%q): want an error", bad)
		}
	}
}

// TestPaperCasesAdaptive: the adaptive variant runs only when asked for,
// beside ms2m-cutoff and stop-and-copy in the same cases, at -rates and
// -cutoff-rates alike.
func TestPaperCasesAdaptive(t *testing.T) {
	sc, cut, ad := contract.StrategyStopAndCopy, contract.StrategyMS2MCutoff, ms2mCutoffAdaptive
	tests := map[string]struct {
		args []string
		want []paperCase
	}{
		"alone, it brings ms2m-cutoff": {
			args: []string{"-strategies", "ms2m-cutoff-adaptive"},
			want: []paperCase{
				{Rate: 4, Runs: 10, Strategies: []contract.Strategy{sc, cut, ad}}, {Rate: 10, Runs: 10, Strategies: []contract.Strategy{sc, cut, ad}},
				{Rate: 16, Runs: 10, Strategies: []contract.Strategy{sc, cut, ad}}, {Rate: 19, Runs: 10, Strategies: []contract.Strategy{sc, cut, ad}},
			},
		},
		"with every default strategy, in the tables' order": {
			args: []string{"-rates", "16", "-runs", "2", "-strategies", "statefulset-shadow,ms2m-cutoff-adaptive,statefulset,ms2m-cutoff,ms2m"},
			want: []paperCase{
				{Rate: 16, Runs: 2, Strategies: paperAll},
				{Rate: 19, Runs: 2, Strategies: []contract.Strategy{sc, cut, ad}},
			},
		},
		"without cutoff rates": {
			args: []string{"-quick", "-strategies", "ms2m-cutoff-adaptive"},
			want: []paperCase{{Rate: 16, Runs: 1, Strategies: []contract.Strategy{sc, cut, ad}}},
		},
		"not by default": {
			args: []string{"-rates", "16", "-cutoff-rates", "19"},
			want: []paperCase{
				{Rate: 16, Runs: 10, Strategies: paperStrategies},
				{Rate: 19, Runs: 10, Strategies: []contract.Strategy{sc, cut}},
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o, err := parsePaperFlags(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, o.cases()); diff != "" {
				t.Errorf("cases (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPlanOf(t *testing.T) {
	tests := map[contract.Strategy]struct {
		wantStrategy contract.Strategy
		wantCutoff   contract.CutoffRule
	}{
		ms2mCutoffAdaptive:           {contract.StrategyMS2MCutoff, contract.CutoffAdaptive},
		contract.StrategyMS2MCutoff:  {contract.StrategyMS2MCutoff, ""},
		contract.StrategyStopAndCopy: {contract.StrategyStopAndCopy, ""},
		contract.StrategyStatefulSet: {contract.StrategyStatefulSet, ""},
	}
	for s, tc := range tests {
		t.Run(string(s), func(t *testing.T) {
			st, cutoff := planOf(s)
			if st != tc.wantStrategy || cutoff != tc.wantCutoff {
				t.Errorf("planOf(%s) = %s, %q; want %s, %q", s, st, cutoff, tc.wantStrategy, tc.wantCutoff)
			}
			if !slices.Contains(contract.Strategies, st) {
				t.Errorf("planOf(%s) = %s: not a strategy of the migrator", s, st)
			}
		})
	}
}

func TestExpectedMigration(t *testing.T) {
	// At 16 msg/s the target gains 4 msg/s on the source: 16 s of
	// catch-up after a 4 s restore.
	if got := expectedMigration(contract.StrategyMS2M, 16, 5*time.Second); got != 20*time.Second {
		t.Errorf("ms2m at 16: %s, want 20s", got)
	}
	// ms2m-cutoff stops after T_cutoff = 5 s × 20 / 16 and replays at most
	// T_replay_max after.
	if got := expectedMigration(contract.StrategyMS2MCutoff, 16, 5*time.Second); got != 15250*time.Millisecond {
		t.Errorf("ms2m-cutoff at 16: %s, want 15.25s", got)
	}
	// The adaptive rule stops the source no later than the formula.
	if got := expectedMigration(ms2mCutoffAdaptive, 16, 5*time.Second); got != 15250*time.Millisecond {
		t.Errorf("ms2m-cutoff-adaptive at 16: %s, want ms2m-cutoff's 15.25s", got)
	}
	if got := expectedMigration(contract.StrategyStopAndCopy, 19, 5*time.Second); got != 4*time.Second {
		t.Errorf("stop-and-copy: %s, want 4s whatever the rate", got)
	}
}

// synthRun is a synthetic exact migration; its processing gap is its
// switch time and 100 ms of freeze.
func synthRun(s contract.Strategy, rate, totalMs, downMs, replayMs, afterStopMs float64) paperRun {
	zero := 0
	lat := 3100.0
	gap, gapStart := downMs+100, 500.0
	r := paperRun{Strategy: s, Rate: rate, migrationRound: migrationRound{
		Round: 1, TotalMs: totalMs, SwitchMs: downMs, ProcessingGapMs: &gap, ProcessingGapStartMs: &gapStart, HashOK: true, Produced: 100, Count: 100,
		ReplayAfterStopMs: afterStopMs, WorstLatencyMs: &lat, Lost: &zero, Duplicated: &zero,
		Groups: map[string]float64{"restore": 2500, "replay": replayMs},
	}}
	st, cutoff := planOf(s)
	r.Report.Strategy = st
	if st == contract.StrategyMS2MCutoff {
		r.Report.Cutoff = contract.CutoffFormula
		if cutoff != "" {
			r.Report.Cutoff = cutoff
		}
	}
	return r
}

func TestSpreadOf(t *testing.T) {
	for name, tc := range map[string]struct {
		in   []float64
		want spread
	}{
		"none":   {},
		"one":    {in: []float64{7}, want: spread{Mean: 7, Median: 7, P95: 7, Min: 7, Max: 7}},
		"even":   {in: []float64{4, 1, 3, 2}, want: spread{Mean: 2.5, Median: 2.5, P95: 4, Min: 1, Max: 4}},
		"twenty": {in: []float64{20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, want: spread{Mean: 10.5, Median: 10.5, P95: 19, Min: 1, Max: 20}},
	} {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, spreadOf(tc.in)); diff != "" {
				t.Errorf("spreadOf(%v) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

// TestPaperReport runs the whole report on a synthetic run: goals, CSV,
// figures and the section.
func TestPaperReport(t *testing.T) {
	var runs []paperRun
	for _, rate := range paperBarRates {
		runs = append(runs,
			synthRun(contract.StrategyStopAndCopy, rate, 3100, 3000, 0, 0),
			synthRun(contract.StrategyMS2M, rate, 3000+1000*rate, 4, 800*rate, 0),
			synthRun(contract.StrategyMS2MCutoff, rate, 3000+500*rate, 5, 400*rate, 1200),
			synthRun(contract.StrategyStatefulSet, rate, 3500, 3100, 300, 0),
			synthRun(contract.StrategyStatefulSetShadow, rate, 9000, 7, 1000, 0),
		)
	}
	// CRIU's own hold, as the node agent saw it, beside ms2m's 104 ms
	// gaps: 90 ms at 4 msg/s (within 30 ms), 50 ms at 10 (not), none at 16.
	for i := range runs {
		if runs[i].Strategy != contract.StrategyMS2M {
			continue
		}
		switch runs[i].Rate {
		case 4:
			runs[i].Report.Hold = &migrate.HoldTimings{CRIU: 90 * time.Millisecond}
		case 10:
			runs[i].Report.Hold = &migrate.HoldTimings{CRIU: 50 * time.Millisecond}
		}
	}
	bad := synthRun(contract.StrategyMS2M, 16, 1, 1, 0, 0)
	bad.HashOK, bad.Error = false, "hash mismatch"
	runs = append(runs, bad)
	dir := t.TempDir()
	if d := os.Getenv("KEEP_DIR"); d != "" {
		dir = d
	}
	o := paperOptions{out: filepath.Join(dir, "out"), benchmarks: filepath.Join(dir, "BENCHMARKS.md"), replayMax: 5 * time.Second}
	res := paperResults{Quick: true, Command: "go -C hack/bench run . paper -quick", Runs: runs}
	res.Summary = summarise(runs, paperStrategies)
	res.Goals = paperGoals(res, o)
	checkVerdicts(t, res.Goals, map[string]string{
		"ms2m switch time against stop-and-copy at 16 msg/s":                                      "PASS",
		"ms2m processing gap against stop-and-copy at 16 msg/s (medians)":                         "PASS",
		"ms2m-cutoff replay after the source's stop at 16 msg/s (worst run)":                      "PASS",
		"ms2m-cutoff replay after the source's stop at 19 msg/s (worst run)":                      "SKIP",
		"statefulset-shadow switch time at 10 msg/s":                                              "PASS",
		"every migration exact: lost and duplicated messages":                                     "MISS", // the bad run
		"ms2m processing gap against CRIU's own dump of the same container at 4 msg/s (medians)":  "PASS",
		"ms2m processing gap against CRIU's own dump of the same container at 10 msg/s (medians)": "MISS",
		"ms2m processing gap against CRIU's own dump of the same container at 16 msg/s (medians)": "SKIP",
	})
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
	if !strings.HasPrefix(string(csv), "run,rate_msgs_per_s,strategy,ok,total_ms,processing_gap_ms,switch_ms,processing_gap_start_ms,") ||
		!strings.Contains(string(csv), ",ms2m,true,19000.000,104.000,4.000,500.000,") {
		t.Errorf("results.csv lacks the processing gap and switch time columns:\n%s", csv)
	}
	md, err := os.ReadFile(o.benchmarks)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"**Quick run**", "49.055 s", "80.3% → 56.2%", "| ms2m | 16 | 1 of 2 |", "other hardware",
		"| ms2m | 4 | 1 of 1 | 7.00 (7.00–7.00) | 104.0 / 104.0 / 104.0 | 96.6% below | 4.0 / 4.0 / 4.0 | 99.9% below |",
		"4: processing gap 104.0 ms median, 96.6% below; switch time 4.0 ms mean, 99.9% below"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("the section lacks %q:\n%s", want, md)
		}
	}
	// Without the adaptive variant, nothing of it: no goals, no
	// comparison, no series.
	if strings.Contains(string(md), string(ms2mCutoffAdaptive)) {
		t.Errorf("a run without %s mentions it:\n%s", ms2mCutoffAdaptive, md)
	}
}

// checkVerdicts checks the verdicts of the goals named in want.
func checkVerdicts(t *testing.T, goals []paperGoal, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, g := range goals {
		got[g.Name] = g.Verdict
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("goal %q: %q, want %q", name, got[name], w)
		}
	}
}

// TestPaperReportAdaptive: the adaptive variant is a series of its own in
// the CSV, the JSON, the figures and the section, with ms2m-cutoff's goals
// and a comparison with the formula; -from writes the same section again.
func TestPaperReportAdaptive(t *testing.T) {
	var runs []paperRun
	for _, rate := range []float64{16, 19} {
		runs = append(runs,
			synthRun(contract.StrategyStopAndCopy, rate, 3100, 3000, 0, 0),
			synthRun(contract.StrategyMS2MCutoff, rate, 11000, 1300, 6000, 1200),
			synthRun(ms2mCutoffAdaptive, rate, 9000, 1000, 4000, 900),
		)
	}
	slow := synthRun(ms2mCutoffAdaptive, 19, 9400, 6000, 4000, 6000) // over T_replay_max + 10%
	runs = append(runs, slow)
	dir := t.TempDir()
	o := paperOptions{out: filepath.Join(dir, "out"), benchmarks: filepath.Join(dir, "BENCHMARKS.md"), replayMax: 5 * time.Second}
	res := paperResults{Command: "go -C hack/bench run . paper -strategies ms2m-cutoff-adaptive", Runs: runs, ReplayMaxMs: 5000}
	res.Summary = summarise(runs, ranStrategies(runs))
	res.Goals = paperGoals(res, o)

	checkVerdicts(t, res.Goals, map[string]string{
		"ms2m-cutoff-adaptive switch time against stop-and-copy at 16 msg/s":          "MISS",
		"ms2m-cutoff-adaptive switch time against stop-and-copy at 4 msg/s":           "SKIP",
		"ms2m-cutoff-adaptive replay after the source's stop at 16 msg/s (worst run)": "PASS",
		"ms2m-cutoff-adaptive replay after the source's stop at 19 msg/s (worst run)": "MISS", // the slow run
		"ms2m-cutoff replay after the source's stop at 19 msg/s (worst run)":          "PASS",
	})

	wantLines := []string{
		"at 16 msg/s: total 9.00 s against 11.00 s (0.82×, 18.2% below); replay after the stop 900.0 ms against 1200.0 ms (0.75×, 25.0% below; worst 900.0 ms against 1200.0 ms); means of 1 and 1 runs",
		"at 19 msg/s: total 9.20 s against 11.00 s (0.84×, 16.4% below); replay after the stop 3450.0 ms against 1200.0 ms (2.88×, 187.5% above; worst 6000.0 ms against 1200.0 ms); means of 2 and 1 runs",
	}
	if diff := cmp.Diff(wantLines, adaptiveVsFormula(res.Summary)); diff != "" {
		t.Errorf("adaptive against the formula (-want +got):\n%s", diff)
	}

	if err := writePaper(o, &res); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, s := range []contract.Strategy{contract.StrategyStopAndCopy, contract.StrategyMS2MCutoff, ms2mCutoffAdaptive} {
		want = append(want, filepath.Join(o.out, paperplot.TimeFile(string(s))))
	}
	want = append(want, filepath.Join(o.out, paperplot.RateFile(16)))
	for _, s := range []contract.Strategy{contract.StrategyStopAndCopy, contract.StrategyMS2MCutoff, ms2mCutoffAdaptive} {
		want = append(want, filepath.Join(o.out, paperplot.PhaseFile(string(s))))
	}
	if diff := cmp.Diff(want, res.Files); diff != "" {
		t.Errorf("figures (-want +got):\n%s", diff)
	}
	csv, err := os.ReadFile(filepath.Join(o.out, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(csv), ",ms2m-cutoff-adaptive,"); got != 3 {
		t.Errorf("results.csv has %d rows of ms2m-cutoff-adaptive, want 3:\n%s", got, csv)
	}
	if got := strings.Count(string(csv), ",adaptive,"); got != 3 {
		t.Errorf("results.csv names the adaptive rule in %d rows, want 3:\n%s", got, csv)
	}
	md, err := os.ReadFile(o.benchmarks)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range append([]string{"| ms2m-cutoff-adaptive | 19 | 2 of 2 |", "The adaptive cutoff against the paper's formula"}, wantLines...) {
		if !strings.Contains(string(md), want) {
			t.Errorf("the section lacks %q:\n%s", want, md)
		}
	}

	// -from writes the same section from results.json.
	again := o
	again.from, again.out, again.benchmarks = filepath.Join(o.out, "results.json"), filepath.Join(dir, "again"), filepath.Join(dir, "AGAIN.md")
	if err := reportAgain(again); err != nil {
		t.Fatal(err)
	}
	md2, err := os.ReadFile(again.benchmarks)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(md), string(md2)); diff != "" {
		t.Errorf("-from (-first +again):\n%s", diff)
	}
}

// TestReportAgainOldResults: a results.json written before the adaptive
// variant (no cutoff rule in its reports, no replayAfterStopMeanMs) is
// reported again as it was.
func TestReportAgainOldResults(t *testing.T) {
	dir := t.TempDir()
	old := `{"command": "go run ./hack/bench paper -quick", "quick": true, "replayMaxMs": 5000,
  "runs": [
    {"strategy": "stop-and-copy", "rateMsgsPerSec": 16, "round": 1, "totalMs": 4700, "downtimeMs": 4298.6, "hashOk": true,
     "report": {"strategy": "stop-and-copy"}, "phaseGroupsMs": {"restore": 3900}},
    {"strategy": "ms2m-cutoff", "rateMsgsPerSec": 16, "round": 1, "totalMs": 11250, "downtimeMs": 879, "hashOk": true,
     "replayAfterStopMs": 826.3, "report": {"strategy": "ms2m-cutoff", "tCutoff": 7400000000}, "phaseGroupsMs": {"replay": 8210}}
  ],
  "summary": [{"strategy": "ms2m-cutoff", "rateMsgsPerSec": 16, "replayAfterStopMaxMs": 826.3}]}`
	from := filepath.Join(dir, "results.json")
	if err := os.WriteFile(from, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	o := paperOptions{from: from, out: filepath.Join(dir, "out"), benchmarks: filepath.Join(dir, "BENCHMARKS.md")}
	if err := reportAgain(o); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(o.benchmarks)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		// No processing gap in an old run: its cells are empty.
		"| ms2m-cutoff | 16 | 1 of 1 | 11.25 (11.25–11.25) | – | – | 879.0 / 879.0 / 879.0 | 79.6% below |",
		"SKIP ms2m processing gap against stop-and-copy at 16 msg/s (medians)",
		"PASS ms2m-cutoff replay after the source's stop at 16 msg/s (worst run): 826.3 ms",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("the section lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(string(md), string(ms2mCutoffAdaptive)) {
		t.Errorf("an old run mentions %s:\n%s", ms2mCutoffAdaptive, md)
	}
}

// The bench started in its module's folder (go -C hack/bench run .)
// recognises it by its go.mod; in the root's it stays where it is.
func TestModfile(t *testing.T) {
	for gomod, want := range map[string]string{
		"module github.com/ms2m/ms2m/hack/bench\n\ngo 1.26.0\n": benchModule,
		"// c\nmodule github.com/ms2m/ms2m\n":                   "github.com/ms2m/ms2m",
		"go 1.26.0\n":                                           "",
	} {
		if got := modfile([]byte(gomod)); got != want {
			t.Errorf("modfile(%q) = %q, want %q", gomod, got, want)
		}
	}
	b, err := os.ReadFile("go.mod")
	if err != nil || modfile(b) != benchModule {
		t.Errorf("hack/bench/go.mod declares %q (%v), want %s: enterRepo would not find the root", modfile(b), err, benchModule)
	}
}
