package main

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/ms2m/ms2m/hack/bench/paperplot"
	"github.com/ms2m/ms2m/internal/contract"
)

// paperStat is one strategy at one rate, over the migrations that
// succeeded with the producer's hash.
type paperStat struct {
	Strategy contract.Strategy `json:"strategy"`
	Rate     float64           `json:"rateMsgsPerSec"`
	OK       int               `json:"ok"`
	Failed   int               `json:"failed"`
	Total    spread            `json:"totalMs"`
	// Switch is the migrator's switch time (Report.Downtime; its JSON name
	// is the earlier files'), Gap the processing gap, the downtime as the
	// consumer sees it, over the runs that have it (GapRuns of OK: runs
	// from before the journals had times have none).
	Switch  spread `json:"downtimeMs"`
	Gap     spread `json:"processingGapMs"`
	GapRuns int    `json:"processingGapRuns"`
	// WorstLatencyMs is the worst first-processing latency of any message
	// in any of the runs; Lost and Duplicated are summed over them.
	WorstLatencyMs    float64 `json:"worstLatencyMs"`
	Lost              int     `json:"lost"`
	Duplicated        int     `json:"duplicated"`
	ReplayAfterStopMs float64 `json:"replayAfterStopMaxMs"`
	// ReplayAfterStopMeanMs is the mean of the replay after the stop.
	ReplayAfterStopMeanMs float64            `json:"replayAfterStopMeanMs"`
	Groups                map[string]float64 `json:"phaseGroupMeansMs"`
	// ReplayShare is the replay group's share of the mean total.
	ReplayShare float64 `json:"replayShare"`
}

type spread struct {
	Mean   float64 `json:"mean"`
	Median float64 `json:"median"`
	P95    float64 `json:"p95"` // nearest rank
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func spreadOf(vs []float64) spread {
	if len(vs) == 0 {
		return spread{}
	}
	s := 0.0
	for _, v := range vs {
		s += v
	}
	return spread{Mean: s / float64(len(vs)), Median: median(vs), P95: nearestRank(vs, 0.95), Min: slices.Min(vs), Max: slices.Max(vs)}
}

// nearestRank is the q-quantile of vs by nearest rank: the smallest value
// with at least q of them at or below it.
func nearestRank(vs []float64, q float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	i := int(math.Ceil(float64(len(s))*q)) - 1
	return s[max(0, min(i, len(s)-1))]
}

// summarise makes one paperStat per strategy and rate that ran.
func summarise(runs []paperRun, strategies []contract.Strategy) []paperStat {
	var rates []float64
	for _, r := range runs {
		if !slices.Contains(rates, r.Rate) {
			rates = append(rates, r.Rate)
		}
	}
	slices.Sort(rates)
	var out []paperStat
	for _, s := range strategies {
		for _, rate := range rates {
			st := paperStat{Strategy: s, Rate: rate, Groups: map[string]float64{}}
			var totals, downs, gaps, afterStop []float64
			n := 0
			for _, r := range runs {
				if r.Strategy != s || r.Rate != rate {
					continue
				}
				n++
				if !r.ok() {
					st.Failed++
					continue
				}
				st.OK++
				totals, downs = append(totals, r.TotalMs), append(downs, r.SwitchMs)
				if r.ProcessingGapMs != nil {
					gaps = append(gaps, *r.ProcessingGapMs)
				}
				if r.WorstLatencyMs != nil {
					st.WorstLatencyMs = max(st.WorstLatencyMs, *r.WorstLatencyMs)
					st.Lost += *r.Lost
					st.Duplicated += *r.Duplicated
				}
				afterStop = append(afterStop, r.ReplayAfterStopMs)
				for g, v := range r.Groups {
					st.Groups[g] += v
				}
			}
			if n == 0 {
				continue
			}
			for g := range st.Groups {
				st.Groups[g] /= float64(max(st.OK, 1))
			}
			st.Total, st.Switch, st.Gap, st.GapRuns = spreadOf(totals), spreadOf(downs), spreadOf(gaps), len(gaps)
			as := spreadOf(afterStop)
			st.ReplayAfterStopMs, st.ReplayAfterStopMeanMs = as.Max, as.Mean
			if st.Total.Mean > 0 {
				st.ReplayShare = st.Groups["replay"] / st.Total.Mean
			}
			out = append(out, st)
		}
	}
	return out
}

func statOf(stats []paperStat, s contract.Strategy, rate float64) (paperStat, bool) {
	for _, st := range stats {
		if st.Strategy == s && st.Rate == rate && st.OK > 0 {
			return st, true
		}
	}
	return paperStat{}, false
}

// paperGoal is one goal of the paper subcommand: PASS, MISS, or SKIP when
// what it needs did not run.
type paperGoal struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Verdict  string `json:"verdict"`
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

const (
	goalPaperDowntimeCut = 0.99 // ms2m and ms2m-cutoff (both rules): switch time ≥ 99% below stop-and-copy's
	goalGapCut           = 0.95 // ms2m: processing gap (medians) ≥ 95% below stop-and-copy's (issue 27)
	goalGapOverCRIUMs    = 30.0 // ms2m: processing gap (median) ≤ CRIU's own dump of the same container (median) + 30 ms (issue 27)
	goalShadowVsMS2M     = 2.0  // statefulset-shadow: switch time within 2× ms2m's
	goalShadowVsSts      = 0.95 // and ≥ 95% below statefulset's
	goalReplaySlack      = 1.10 // ms2m-cutoff (both rules): replay after the stop ≤ T_replay_max + 10%
)

// paperGoalRatesCutoff are the rates at which the cutoff's bound is
// checked.
var paperGoalRatesCutoff = []float64{16, 19}

// paperGoals checks the goals against the means of this run; every ratio
// is against stop-and-copy at the same rate in the same run. The
// ms2m-cutoff goals hold for ms2m-cutoff-adaptive too, checked when it
// ran.
func paperGoals(res paperResults, o paperOptions) []paperGoal {
	stats := res.Summary
	var gs []paperGoal
	skip := func(name, target, why string) {
		gs = append(gs, paperGoal{Name: name, Target: target, Measured: why, Verdict: "SKIP"})
	}
	cutoffs := []contract.Strategy{contract.StrategyMS2MCutoff}
	if ran(res.Runs, ms2mCutoffAdaptive) {
		cutoffs = append(cutoffs, ms2mCutoffAdaptive)
	}
	for _, rate := range paperBarRates {
		name := fmt.Sprintf("ms2m processing gap against stop-and-copy at %g msg/s (medians)", rate)
		target := fmt.Sprintf("≥ %g%% below", goalGapCut*100)
		st, ok1 := statOf(stats, contract.StrategyMS2M, rate)
		sc, ok2 := statOf(stats, contract.StrategyStopAndCopy, rate)
		if !ok1 || !ok2 || st.GapRuns == 0 || sc.GapRuns == 0 || sc.Gap.Median <= 0 {
			skip(name, target, "not run, or run before the journals had times")
			continue
		}
		cut := 1 - st.Gap.Median/sc.Gap.Median
		gs = append(gs, paperGoal{Name: name, Target: target,
			Measured: fmt.Sprintf("%s below (%s ms against %s ms; p95 %s ms against %s ms; %d and %d runs)", pct1(cut),
				fmtMs1(st.Gap.Median), fmtMs1(sc.Gap.Median), fmtMs1(st.Gap.P95), fmtMs1(sc.Gap.P95), st.GapRuns, sc.GapRuns),
			Verdict: verdict(cut >= goalGapCut)})
	}
	for _, rate := range paperBarRates {
		name := fmt.Sprintf("ms2m processing gap against CRIU's own dump of the same container at %g msg/s (medians)", rate)
		target := fmt.Sprintf("≤ CRIU's dump + %g ms", goalGapOverCRIUMs)
		gap, dump := gapAndCRIU(res.Runs, rate)
		if len(gap) == 0 || len(dump) == 0 {
			skip(name, target, "no run with both a processing gap and CRIU's hold seen by the node agent (it is seen when the agent thaws at the dump: containerd nodes, --thaw-after-dump auto or always)")
			continue
		}
		g, d := median(gap), median(dump)
		gs = append(gs, paperGoal{Name: name, Target: target,
			Measured: fmt.Sprintf("gap %s ms against CRIU's dump %s ms: %s ms over (p95 %s and %s ms; %d and %d runs)", fmtMs1(g), fmtMs1(d), fmtMs1(g-d),
				fmtMs1(nearestRank(gap, 0.95)), fmtMs1(nearestRank(dump, 0.95)), len(gap), len(dump)),
			Verdict: verdict(g <= d+goalGapOverCRIUMs)})
	}
	for _, s := range append([]contract.Strategy{contract.StrategyMS2M}, cutoffs...) {
		for _, rate := range paperBarRates {
			name := fmt.Sprintf("%s switch time against stop-and-copy at %g msg/s", s, rate)
			target := fmt.Sprintf("≥ %g%% below", goalPaperDowntimeCut*100)
			st, ok1 := statOf(stats, s, rate)
			sc, ok2 := statOf(stats, contract.StrategyStopAndCopy, rate)
			if !ok1 || !ok2 || sc.Switch.Mean <= 0 {
				skip(name, target, "not run")
				continue
			}
			cut := 1 - st.Switch.Mean/sc.Switch.Mean
			gs = append(gs, paperGoal{Name: name, Target: target,
				Measured: fmt.Sprintf("%s below (%s ms against %s ms, means of %d and %d)", pct1(cut), fmtMs1(st.Switch.Mean), fmtMs1(sc.Switch.Mean), st.OK, sc.OK),
				Verdict:  verdict(cut >= goalPaperDowntimeCut)})
		}
	}
	for _, s := range cutoffs {
		for _, rate := range paperGoalRatesCutoff {
			name := fmt.Sprintf("%s replay after the source's stop at %g msg/s (worst run)", s, rate)
			target := fmt.Sprintf("≤ T_replay_max + 10%% = %s ms", fmtMs0(ms(o.replayMax)*goalReplaySlack))
			st, ok := statOf(stats, s, rate)
			if !ok {
				skip(name, target, "not run")
				continue
			}
			gs = append(gs, paperGoal{Name: name, Target: target,
				Measured: fmt.Sprintf("%s ms (switch time mean %s ms, %d runs)", fmtMs1(st.ReplayAfterStopMs), fmtMs1(st.Switch.Mean), st.OK),
				Verdict:  verdict(st.ReplayAfterStopMs <= ms(o.replayMax)*goalReplaySlack)})
		}
	}
	for _, rate := range paperBarRates {
		name := fmt.Sprintf("statefulset-shadow switch time at %g msg/s", rate)
		target := fmt.Sprintf("≤ %g× ms2m's and ≥ %g%% below statefulset's", goalShadowVsMS2M, goalShadowVsSts*100)
		sh, ok1 := statOf(stats, contract.StrategyStatefulSetShadow, rate)
		m2, ok2 := statOf(stats, contract.StrategyMS2M, rate)
		ss, ok3 := statOf(stats, contract.StrategyStatefulSet, rate)
		if !ok1 || !ok2 || !ok3 || m2.Switch.Mean <= 0 || ss.Switch.Mean <= 0 {
			skip(name, target, "not run")
			continue
		}
		vsM2, cut := sh.Switch.Mean/m2.Switch.Mean, 1-sh.Switch.Mean/ss.Switch.Mean
		gs = append(gs, paperGoal{Name: name, Target: target,
			Measured: fmt.Sprintf("%s ms: %.2f× ms2m's %s ms, %s below statefulset's %s ms", fmtMs1(sh.Switch.Mean), vsM2, fmtMs1(m2.Switch.Mean), pct1(cut), fmtMs1(ss.Switch.Mean)),
			Verdict:  verdict(vsM2 <= goalShadowVsMS2M && cut >= goalShadowVsSts)})
	}
	failed, lost, dup, judged := 0, 0, 0, 0
	for _, r := range res.Runs {
		if !r.ok() {
			failed++
		}
		if r.Lost != nil {
			judged++
			lost += *r.Lost
			dup += *r.Duplicated
		}
	}
	gs = append(gs, paperGoal{Name: "every migration exact: lost and duplicated messages", Target: "0 and 0, every hash the producer's",
		Measured: fmt.Sprintf("lost %d, duplicated %d over %d judged migrations; %d of %d failed or had a wrong hash", lost, dup, judged, failed, len(res.Runs)),
		Verdict:  verdict(failed == 0 && lost == 0 && dup == 0 && judged == len(res.Runs))})
	return gs
}

// adaptiveVsFormula compares ms2m-cutoff-adaptive with ms2m-cutoff (the
// formula) at every rate where both ran in this run: one line per rate,
// none when the adaptive rule did not run.
func adaptiveVsFormula(stats []paperStat) []string {
	// vs says adaptive's a against the formula's b: the ratio, and how
	// much below or above.
	vs := func(a, b float64) string {
		if b <= 0 {
			return "no ratio: the formula's is 0"
		}
		return fmt.Sprintf("%.2f×, %s", a/b, belowAbove(1-a/b))
	}
	var lines []string
	for _, a := range stats {
		if a.Strategy != ms2mCutoffAdaptive || a.OK == 0 {
			continue
		}
		f, ok := statOf(stats, contract.StrategyMS2MCutoff, a.Rate)
		if !ok {
			continue
		}
		lines = append(lines, fmt.Sprintf("at %g msg/s: total %s s against %s s (%s); replay after the stop %s ms against %s ms (%s; worst %s ms against %s ms); means of %d and %d runs",
			a.Rate, fmtS(a.Total.Mean), fmtS(f.Total.Mean), vs(a.Total.Mean, f.Total.Mean),
			fmtMs1(a.ReplayAfterStopMeanMs), fmtMs1(f.ReplayAfterStopMeanMs), vs(a.ReplayAfterStopMeanMs, f.ReplayAfterStopMeanMs),
			fmtMs1(a.ReplayAfterStopMs), fmtMs1(f.ReplayAfterStopMs), a.OK, f.OK))
	}
	return lines
}

// spreadCell is a spread of milliseconds as the report's tables show it:
// mean / median / p95.
func spreadCell(sp spread) string {
	return fmtMs1(sp.Mean) + " / " + fmtMs1(sp.Median) + " / " + fmtMs1(sp.P95)
}

// belowAbove says a reduction r as "x% below", or "x% above" when it is
// negative.
func belowAbove(r float64) string {
	if r < 0 {
		return pct1(-r) + " above"
	}
	return pct1(r) + " below"
}

func pct1(r float64) string { return strconv.FormatFloat(r*100, 'f', 1, 64) + "%" }

// gapAndCRIU are the processing gaps of ms2m's good runs at rate, and
// CRIU's own hold of the app in them (Report.Hold.CRIU: from the node
// agent's first sight of CRIU tracing the app until it let it go), where
// the agent saw it: the floor a live checkpoint cannot go below.
func gapAndCRIU(runs []paperRun, rate float64) (gap, dump []float64) {
	for _, r := range runs {
		if r.Strategy != contract.StrategyMS2M || r.Rate != rate || !r.ok() {
			continue
		}
		if r.ProcessingGapMs != nil {
			gap = append(gap, *r.ProcessingGapMs)
		}
		if h := r.Report.Hold; h != nil && h.CRIU > 0 {
			dump = append(dump, ms(h.CRIU))
		}
	}
	return gap, dump
}

// paperCSV is one row per migration.
func paperCSV(runs []paperRun) []byte {
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	head := []string{"run", "rate_msgs_per_s", "strategy", "ok", "total_ms", "processing_gap_ms", "switch_ms", "processing_gap_start_ms", "worst_latency_ms", "lost", "duplicated",
		"replay_after_stop_ms", "t_cutoff_ms", "cutoff_rule", "lambda", "mu"}
	for _, g := range phaseGroupNames {
		head = append(head, g+"_ms")
	}
	// The live checkpoint's hold (ms2m, ms2m-cutoff): how long the source
	// held deliveries, CRIU's dump as the node saw it, and whether the
	// agent thawed the app at the dump's end.
	head = append(head, "held_ms", "hold_to_freeze_ms", "hold_dump_ms", "hold_criu_ms", "hold_after_dump_ms", "resumed_at_freeze", "thawed_at_dump")
	head = append(head, "produced", "count", "hash_ok", "producer_outlasted", "wall_ms", "error")
	_ = w.Write(head) // into a bytes.Buffer, which cannot fail
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	opt := func(p *float64) string {
		if p == nil {
			return ""
		}
		return f(*p)
	}
	opti := func(p *int) string {
		if p == nil {
			return ""
		}
		return strconv.Itoa(*p)
	}
	for _, r := range runs {
		row := []string{strconv.Itoa(r.Round), strconv.FormatFloat(r.Rate, 'g', -1, 64), string(r.Strategy), strconv.FormatBool(r.ok()),
			f(r.TotalMs), opt(r.ProcessingGapMs), f(r.SwitchMs), opt(r.ProcessingGapStartMs), opt(r.WorstLatencyMs), opti(r.Lost), opti(r.Duplicated),
			f(r.ReplayAfterStopMs), f(ms(r.Report.TCutoff)), string(r.Report.Cutoff), f(r.Report.Lambda), f(r.Report.Mu)}
		for _, g := range phaseGroupNames {
			row = append(row, f(r.Groups[g]))
		}
		if h := r.Report.Hold; h != nil {
			row = append(row, f(ms(h.Held)), f(ms(h.ToFreeze)), f(ms(h.Dump)), f(ms(h.CRIU)), f(ms(h.AfterDump)), strconv.FormatBool(h.AtFreeze), strconv.FormatBool(h.ThawedAtDump))
		} else {
			row = append(row, "", "", "", "", "", "", "")
		}
		row = append(row, strconv.Itoa(r.Produced), strconv.Itoa(r.Count), strconv.FormatBool(r.HashOK),
			strconv.FormatBool(r.ProducerOutlasted), f(r.WallMs), r.Error)
		_ = w.Write(row) // into a bytes.Buffer, which cannot fail
	}
	w.Flush()
	return buf.Bytes()
}

// plotRuns are the successful runs in seconds, for paperplot. Their
// downtime is the processing gap, or the switch time for a run from
// before the journals had times.
func plotRuns(runs []paperRun) []paperplot.Run {
	var out []paperplot.Run
	for _, r := range runs {
		if !r.ok() {
			continue
		}
		ph := map[string]float64{}
		for g, v := range r.Groups {
			ph[g] = v / 1000
		}
		down := r.SwitchMs
		if r.ProcessingGapMs != nil {
			down = *r.ProcessingGapMs
		}
		out = append(out, paperplot.Run{Strategy: string(r.Strategy), Rate: r.Rate, TotalS: r.TotalMs / 1000, DowntimeS: down / 1000, Phases: ph})
	}
	return out
}

func writeFigures(dir string, res *paperResults) ([]string, error) {
	var strategies []string
	for _, s := range ranStrategies(res.Runs) {
		strategies = append(strategies, string(s))
	}
	return paperplot.Write(dir, plotRuns(res.Runs), paperplot.Options{
		Strategies: strategies, BarRates: paperBarRates, Groups: phaseGroupNames,
	})
}

// The markers of the section that a paper run writes into BENCHMARKS.md.
const (
	paperBegin = "<!-- bench-paper:begin: written by `go -C hack/bench run . paper` (make bench-paper); a rerun replaces everything down to the end marker -->"
	paperEnd   = "<!-- bench-paper:end -->"
)

// replaceSection puts section between the markers in file, or appends the
// markers and section if the file has none.
func replaceSection(file, section string) error {
	b, err := os.ReadFile(file)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("read %s: %w", file, err)
	}
	out, err := spliceSection(string(b), section)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return os.WriteFile(file, []byte(out), 0o644)
}

func spliceSection(doc, section string) (string, error) {
	block := paperBegin + "\n" + strings.TrimRight(section, "\n") + "\n" + paperEnd
	i := strings.Index(doc, paperBegin)
	j := strings.Index(doc, paperEnd)
	switch {
	case i < 0 && j < 0:
		return strings.TrimRight(doc, "\n") + "\n\n" + block + "\n", nil
	case i < 0 || j < i:
		return "", fmt.Errorf("the bench-paper markers are broken (begin at %d, end at %d): fix them by hand", i, j)
	}
	return doc[:i] + block + doc[j+len(paperEnd):], nil
}

// paperMarkdown is the BENCHMARKS.md section of a run.
func paperMarkdown(res paperResults) string {
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	kind := "Run"
	if res.Quick {
		kind = "**Quick run** (a smoke run: one migration per strategy and rate; not the paper's 10, and no figure here is a mean of more than one migration)"
	}
	w("\n%s of %s, %s in all. Command: `%s`. Raw results: `out/bench-paper/results.csv` and `results.json`; figures: `out/bench-paper/*.png`. ",
		kind, res.Date.Format("2006-01-02T15:04Z"), fmtDur(res.ElapsedSeconds), res.Command)
	w("Machine: %d CPUs (%s), Linux %s, RabbitMQ %s, %s; kubelet %s, containerd %s, runc %s, CRIU %s; 2 real nodes of e2e/cluster on this one machine.\n\n",
		res.Machine.CPUs, res.Machine.CPUModel, res.Machine.Kernel, res.Machine.RabbitMQ, res.Machine.Go,
		lastWord(res.Env.Kubelet), lastWord(res.Env.Containerd), lastWord(firstLine(res.Env.Runc)), lastWord(res.Env.CRIU))
	w("Cases: %s (rate: runs × strategies). Consumer: examples/consumer, prefetch %d, %d ms per message (μ = %d msg/s); warm-up %gs; T_replay_max %s ms.\n\n",
		describeCases(res.Cases), res.Prefetch, res.WorkMs, strategyServiceRate, res.WarmupSeconds, fmtMs0(res.ReplayMaxMs))

	w("Goals, each against stop-and-copy at the same rate in this run:\n\n")
	for _, g := range res.Goals {
		w("- %s %s: %s (target %s)\n", g.Verdict, g.Name, g.Measured, g.Target)
	}
	if lines := adaptiveVsFormula(res.Summary); len(lines) > 0 {
		w("\nThe adaptive cutoff against the paper's formula (%s against ms2m-cutoff at the same rate in this run; the ratios are adaptive / formula):\n\n", ms2mCutoffAdaptive)
		for _, l := range lines {
			w("- %s\n", l)
		}
	}

	w("\nPer strategy and rate, over the exact runs. **Downtime is the processing gap**: the longest interval overlapping the migration in which no consumer (source, shadow or target) finished a message while one was waiting, from the consumers' journals; it includes the checkpoint's freeze and the work on the one message in hand. The switch time is the migrator's figure, the source's stop to the target's consume of the primary queue, which leaves the freeze out. Both as mean / median / p95 (nearest rank); total as mean (min–max); worst latency: the worst time from a message's send to its first processing, over all runs; the plots' downtime is the processing gap (the switch time for runs without it).\n\n")
	w("| strategy | λ (msg/s) | runs ok | total (s) | downtime: processing gap (ms) | gap vs stop-and-copy (medians) | switch time (ms) | switch vs stop-and-copy (means) | worst latency (ms) | lost / duplicated | replay share of total |\n")
	w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, st := range res.Summary {
		sc, scOK := statOf(res.Summary, contract.StrategyStopAndCopy, st.Rate)
		vs, gapVs, gap := "–", "–", "–"
		if scOK && st.Strategy != contract.StrategyStopAndCopy && sc.Switch.Mean > 0 && st.OK > 0 {
			vs = belowAbove(1 - st.Switch.Mean/sc.Switch.Mean)
		}
		if st.GapRuns > 0 {
			gap = spreadCell(st.Gap)
			if st.GapRuns < st.OK {
				gap += fmt.Sprintf(" (%d runs)", st.GapRuns)
			}
			if scOK && st.Strategy != contract.StrategyStopAndCopy && sc.GapRuns > 0 && sc.Gap.Median > 0 {
				gapVs = belowAbove(1 - st.Gap.Median/sc.Gap.Median)
			}
		}
		w("| %s | %g | %d of %d | %s (%s–%s) | %s | %s | %s | %s | %s | %d / %d | %s |\n", st.Strategy, st.Rate, st.OK, st.OK+st.Failed,
			fmtS(st.Total.Mean), fmtS(st.Total.Min), fmtS(st.Total.Max),
			gap, gapVs, spreadCell(st.Switch), vs, fmtMs1(st.WorstLatencyMs), st.Lost, st.Duplicated, pct1(st.ReplayShare))
	}

	w("\nPhases, means (s): prepare is the preconditions and the app image's pull on the target; checkpoint includes the quiesce and resume; replay is the target's catch-up, up to its last replayed message (or the source's stop if nothing was left); handover the stop and the switch to the primary queue.\n\n")
	w("| strategy | λ |")
	for _, g := range phaseGroupNames {
		w(" %s |", g)
	}
	w("\n|---|---:|%s\n", strings.Repeat("---:|", len(phaseGroupNames)))
	for _, st := range res.Summary {
		if st.OK == 0 {
			continue
		}
		w("| %s | %g |", st.Strategy, st.Rate)
		for _, g := range phaseGroupNames {
			w(" %s |", fmtS(st.Groups[g]))
		}
		w("\n")
	}

	w("\nBeside the published figures. **The paper's and SHADOW's numbers come from other hardware and software** (the paper: three GCE e2-medium VMs, 2 vCPUs and 4 GB each, Kubernetes 1.30, CRI-O 1.28, Buildah, rsync over SSH, a cloud registry, a Java Spring consumer; SHADOW: its authors' own cluster). Ours are from this run on one 2-core machine; compare only ratios against our own stop-and-copy in the same run, not the absolute seconds.\n\n")
	w("| figure | published | ours (this run) | reproduce with |\n|---|---|---|---|\n")
	for _, row := range comparisons(res.Summary) {
		w("| %s | %s | %s | `%s` |\n", row[0], row[1], row[2], row[3])
	}
	return sb.String()
}

// comparisons are the rows of the table beside the published figures:
// figure, published, ours, command.
func comparisons(stats []paperStat) [][4]string {
	na := "not run"
	get := func(s contract.Strategy, rate float64) (paperStat, bool) { return statOf(stats, s, rate) }
	cut := func(s contract.Strategy, rate float64) string {
		st, ok1 := get(s, rate)
		sc, ok2 := get(contract.StrategyStopAndCopy, rate)
		if !ok1 || !ok2 || sc.Switch.Mean <= 0 {
			return na
		}
		return belowAbove(1 - st.Switch.Mean/sc.Switch.Mean)
	}
	// downCut is the reduction of the downtime: the processing gap's
	// (medians) when both have it, and the switch time's (means).
	downCut := func(s contract.Strategy, rate float64) string {
		st, ok1 := get(s, rate)
		sc, ok2 := get(contract.StrategyStopAndCopy, rate)
		if !ok1 || !ok2 || sc.Switch.Mean <= 0 {
			return na
		}
		sw := "switch time " + belowAbove(1-st.Switch.Mean/sc.Switch.Mean)
		if st.GapRuns > 0 && sc.GapRuns > 0 && sc.Gap.Median > 0 {
			return "processing gap " + belowAbove(1-st.Gap.Median/sc.Gap.Median) + "; " + sw
		}
		return sw
	}
	var rows [][4]string
	// stop-and-copy's migration time, the mean over every rate.
	var scT []float64
	for _, st := range stats {
		if st.Strategy == contract.StrategyStopAndCopy && st.OK > 0 {
			scT = append(scT, st.Total.Mean)
		}
	}
	ours := na
	if len(scT) > 0 {
		ours = fmtS(spreadOf(scT).Mean) + " s (mean of the rates' means; switch time ≈ total)"
	}
	rows = append(rows, [4]string{"stop-and-copy migration time (= downtime)", "49.055 s mean (paper)", ours, "make bench-paper"})

	var m2d []string
	for _, rate := range paperBarRates {
		if st, ok := get(contract.StrategyMS2M, rate); ok {
			line := fmt.Sprintf("%g: switch time %s ms, %s", rate, fmtMs1(st.Switch.Mean), cut(contract.StrategyMS2M, rate))
			if sc, ok := get(contract.StrategyStopAndCopy, rate); ok && st.GapRuns > 0 && sc.GapRuns > 0 && sc.Gap.Median > 0 {
				line = fmt.Sprintf("%g: processing gap %s ms median, %s; switch time %s ms mean, %s", rate, fmtMs1(st.Gap.Median),
					belowAbove(1-st.Gap.Median/sc.Gap.Median), fmtMs1(st.Switch.Mean), cut(contract.StrategyMS2M, rate))
			}
			m2d = append(m2d, line)
		}
	}
	rows = append(rows, [4]string{"ms2m downtime, and its reduction against stop-and-copy", "1.547 s mean; 96.8–97.2% below (paper, at 4/10/16)", orNA(strings.Join(m2d, "; ")), "go -C hack/bench run . paper -strategies ms2m"})
	rows = append(rows, [4]string{"ms2m-cutoff downtime reduction at 16 msg/s", "36.1% below (paper)", downCut(contract.StrategyMS2MCutoff, 16), "go -C hack/bench run . paper -rates 16 -strategies ms2m-cutoff"})

	stsRow := na
	if st, ok := get(contract.StrategyStatefulSet, 16); ok {
		if sc, ok := get(contract.StrategyStopAndCopy, 16); ok && sc.Total.Mean > 0 {
			stsRow = fmt.Sprintf("%s; %+.1f%% migration time", downCut(contract.StrategyStatefulSet, 16), (st.Total.Mean/sc.Total.Mean-1)*100)
		}
	}
	rows = append(rows, [4]string{"statefulset at 16 msg/s: downtime reduction; extra migration time", "0.24% below; +41.5% (paper)", stsRow, "go -C hack/bench run . paper -rates 16 -strategies statefulset"})

	share := na
	a, ok1 := get(contract.StrategyMS2M, 16)
	c, ok2 := get(contract.StrategyMS2MCutoff, 16)
	if ok1 && ok2 {
		share = pct1(a.ReplayShare) + " → " + pct1(c.ReplayShare)
	}
	rows = append(rows, [4]string{"replay's share of the migration time at 16 msg/s: ms2m → ms2m-cutoff", "80.3% → 56.2% (paper, Figs 12-13)", share, "go -C hack/bench run . paper -rates 16 -strategies ms2m,ms2m-cutoff"})

	shDown, shTotal := na, na
	if st, ok := get(contract.StrategyStatefulSetShadow, 10); ok {
		shDown = "switch time " + fmtMs1(st.Switch.Mean) + " ms (both handoffs)"
		if st.GapRuns > 0 {
			shDown = "processing gap " + fmtMs1(st.Gap.Median) + " ms median; " + shDown
		}
		shTotal = fmtS(st.Total.Mean) + " s"
	}
	rows = append(rows, [4]string{"statefulset-shadow downtime at 10 msg/s", "zero measured downtime for its shadow-pod modes (SHADOW, another system)", shDown, "go -C hack/bench run . paper -rates 10 -strategies statefulset-shadow"})
	rows = append(rows, [4]string{"statefulset-shadow total migration time at 10 msg/s", "12.4–13.8 s (SHADOW)", shTotal, "go -C hack/bench run . paper -rates 10 -strategies statefulset-shadow"})
	restore := na
	if st, ok := get(contract.StrategyMS2M, 10); ok {
		restore = fmtS(st.Groups["restore"]) + " s (ms2m, target create → running)"
	}
	rows = append(rows, [4]string{"restore", "about 2.9 s (SHADOW)", restore, "go -C hack/bench run . paper -rates 10 -strategies ms2m"})
	return rows
}

func orNA(s string) string {
	if s == "" {
		return "not run"
	}
	return s
}

func firstLine(s string) string { l, _, _ := strings.Cut(s, "\n"); return l }

func fmtDur(sec float64) string {
	if sec >= 120 {
		return strconv.FormatFloat(sec/60, 'f', 1, 64) + " min"
	}
	return strconv.FormatFloat(sec, 'f', 0, 64) + " s"
}
