package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
)

// The paper subcommand (`go -C hack/bench run . paper`, `make bench-paper`)
// reproduces the paper's evaluation (section IV-B, Figs 5-14) on the
// local cluster of real nodes: every strategy against stop-and-copy in
// the same run, at the paper's rates, with the consumer at μ = 20 msg/s.

// paperStrategies are the strategies of the paper subcommand by default,
// the baseline first.
var paperStrategies = []contract.Strategy{contract.StrategyStopAndCopy, contract.StrategyMS2M, contract.StrategyMS2MCutoff, contract.StrategyStatefulSet, contract.StrategyStatefulSetShadow}

// ms2mCutoffAdaptive is the bench's name for ms2m-cutoff with the
// adaptive cutoff rule (contract.CutoffAdaptive): a series of its own,
// measured against the formula's in the same run. It is opt-in
// (-strategies), and brings ms2m-cutoff with it. migrate has no strategy
// of that name: planOf maps it.
const ms2mCutoffAdaptive contract.Strategy = "ms2m-cutoff-adaptive"

// paperAll are the strategies -strategies accepts, in the order of every
// table and figure.
var paperAll = []contract.Strategy{contract.StrategyStopAndCopy, contract.StrategyMS2M, contract.StrategyMS2MCutoff, ms2mCutoffAdaptive, contract.StrategyStatefulSet, contract.StrategyStatefulSetShadow}

// paperCutoffs are the strategies that also run at -cutoff-rates.
var paperCutoffs = []contract.Strategy{contract.StrategyMS2MCutoff, ms2mCutoffAdaptive}

// planOf is what the migrator runs for a strategy of the paper
// subcommand: its strategy and, for ms2m-cutoff, its cutoff rule ("" is
// the default, the formula).
func planOf(s contract.Strategy) (contract.Strategy, contract.CutoffRule) {
	if s == ms2mCutoffAdaptive {
		return contract.StrategyMS2MCutoff, contract.CutoffAdaptive
	}
	return s, ""
}

// paperBarRates are the rates of the paper's side-by-side figures (Figs
// 9-11) and of its downtime claims.
var paperBarRates = []float64{4, 10, 16}

const (
	// paperCheckpointToRestored is about how long a migration of the
	// sample consumer takes from its checkpoint until the target runs, on
	// this machine (BENCHMARKS.md: 0.3 s checkpoint, 2.7 s restore, plus
	// slack). It sizes the producer's run, not any figure.
	paperCheckpointToRestored = 4 * time.Second
	// paperSweepMax is the top of the sweep: λ below μ = 20.
	paperSweepMax = 19
)

// paperOptions are the paper subcommand's command line.
type paperOptions struct {
	runs        int
	rates       []float64
	cutoffRates []float64 // extra rates for ms2m-cutoff and its baseline only
	sweep       bool
	sweepRuns   int
	strategies  []contract.Strategy
	warmup      time.Duration
	replayMax   time.Duration
	quick       bool
	out         string
	benchmarks  string // BENCHMARKS.md to update; "" for none
	stateDir    string
	amqpURL     string
	streamURI   string
	command     string
	from        string // results.json to report again, without a cluster
}

func parsePaperFlags(args []string) (paperOptions, error) {
	var o paperOptions
	fs := flag.NewFlagSet("bench paper", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go -C hack/bench run . paper [flags]\n\nThe paper's evaluation on a local cluster of real nodes: stop-and-copy, ms2m, ms2m-cutoff, statefulset and statefulset-shadow (and, if asked for, ms2m-cutoff-adaptive) migrating a consumer (50 ms per message, μ = 20 msg/s) from node 1 to node 2 under a producer at each rate; raw results as CSV and JSON, PNG figures, PASS/MISS goals, and a BENCHMARKS.md section. Flags:")
		fs.PrintDefaults()
	}
	fs.IntVar(&o.runs, "runs", 10, "migrations per strategy and rate (the paper's 10)")
	rates := fs.String("rates", "4,10,16", "comma-separated producer rates, msg/s, each below μ = 20")
	cutoffRates := fs.String("cutoff-rates", "19", "extra rates at which only ms2m-cutoff (and ms2m-cutoff-adaptive if asked for) and its stop-and-copy run (its replay bound is checked at 16 and 19); empty for none")
	fs.BoolVar(&o.sweep, "sweep", false, fmt.Sprintf("also sweep λ = 1..%d msg/s (the rates not in -rates get -sweep-runs runs each)", paperSweepMax))
	fs.IntVar(&o.sweepRuns, "sweep-runs", 1, "runs per strategy at the sweep's extra rates")
	strategies := fs.String("strategies", joinStrategies(paperStrategies), "comma-separated strategies, of "+joinStrategies(paperAll)+"; stop-and-copy, the baseline, always runs, and "+string(ms2mCutoffAdaptive)+" (ms2m-cutoff by the adaptive rule, not run by default) brings ms2m-cutoff, the formula, with it")
	fs.DurationVar(&o.warmup, "warmup", 5*time.Second, "how long the consumer consumes before each migration")
	fs.DurationVar(&o.replayMax, "replay-max", 5*time.Second, "T_replay_max of ms2m-cutoff (T_cutoff = T_replay_max × μ / λ)")
	fs.BoolVar(&o.quick, "quick", false, "smoke run: one run per strategy at 16 msg/s and none at -cutoff-rates (flags set explicitly still win)")
	fs.StringVar(&o.out, "out", filepath.Join("out", "bench-paper"), "folder for results.csv, results.json and the PNG figures")
	fs.StringVar(&o.benchmarks, "benchmarks", "BENCHMARKS.md", "file whose bench-paper section (between its markers) is replaced with this run's; empty to leave it")
	fs.StringVar(&o.stateDir, "cluster-state", "/var/tmp/ms2m-bench", "state folder of the local cluster, brought up and taken down")
	fs.StringVar(&o.amqpURL, "amqp", "amqp://guest:guest@127.0.0.1:5672/", "the broker's AMQP URL, to delete the queues")
	fs.StringVar(&o.streamURI, "stream-uri", "rabbitmq-stream://guest:guest@127.0.0.1:5552/", "the broker's stream URI, to delete the replay logs")
	fs.StringVar(&o.from, "from", "", "a results.json of an earlier run: write its CSV, figures, goals and section again, without a cluster (-out and -benchmarks apply)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q: every setting is a flag (see -h)", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.quick {
		if !set["runs"] {
			o.runs = 1
		}
		if !set["rates"] {
			*rates = "16"
		}
		if !set["cutoff-rates"] {
			*cutoffRates = ""
		}
	}
	if o.runs < 1 || o.sweepRuns < 1 {
		return o, errors.New("-runs and -sweep-runs must be at least 1")
	}
	if o.warmup < time.Second || o.warmup > 10*time.Minute {
		return o, fmt.Errorf("-warmup=%s: want 1s to 10m", o.warmup)
	}
	if o.replayMax < 100*time.Millisecond || o.replayMax > 5*time.Minute {
		return o, fmt.Errorf("-replay-max=%s: want 100ms to 5m", o.replayMax)
	}
	var err error
	if o.rates, err = parsePaperRates("-rates", *rates); err != nil {
		return o, err
	}
	if len(o.rates) == 0 {
		return o, errors.New("-rates: want at least one rate")
	}
	if o.cutoffRates, err = parsePaperRates("-cutoff-rates", *cutoffRates); err != nil {
		return o, err
	}
	asked := map[contract.Strategy]bool{contract.StrategyStopAndCopy: true}
	for s := range strings.SplitSeq(*strategies, ",") {
		st := contract.Strategy(strings.TrimSpace(s))
		if !slices.Contains(paperAll, st) {
			return o, fmt.Errorf("-strategies=%q: unknown strategy %q; want a comma-separated list of %s", *strategies, st, joinStrategies(paperAll))
		}
		asked[st] = true
	}
	if asked[ms2mCutoffAdaptive] {
		asked[contract.StrategyMS2MCutoff] = true // what the adaptive rule is measured against
	}
	for _, st := range paperAll {
		if asked[st] {
			o.strategies = append(o.strategies, st)
		}
	}
	if abs, err := filepath.Abs(o.stateDir); err == nil {
		o.stateDir = abs
	}
	o.command = strings.TrimSpace("go -C hack/bench run . paper " + strings.Join(args, " "))
	return o, nil
}

func parsePaperRates(flagName, s string) ([]float64, error) {
	var rates []float64
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for f := range strings.SplitSeq(s, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r <= 0 || r >= strategyServiceRate {
			return nil, fmt.Errorf("%s=%q: %q is not a rate above 0 and below %d msg/s, what the consumer processes", flagName, s, f, strategyServiceRate)
		}
		if !slices.Contains(rates, r) {
			rates = append(rates, r)
		}
	}
	return rates, nil
}

func joinStrategies(ss []contract.Strategy) string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = string(s)
	}
	return strings.Join(names, ",")
}

// paperCase is one rate with the strategies that run at it and how often.
type paperCase struct {
	Rate       float64             `json:"rateMsgsPerSec"`
	Runs       int                 `json:"runs"`
	Strategies []contract.Strategy `json:"strategies"`
}

// cases lays out the run: every strategy at -rates; ms2m-cutoff (and
// ms2m-cutoff-adaptive if asked for) and stop-and-copy at -cutoff-rates;
// with -sweep, every strategy at the other rates of 1..19.
func (o paperOptions) cases() []paperCase {
	var cs []paperCase
	seen := map[float64]bool{}
	for _, r := range o.rates {
		cs = append(cs, paperCase{Rate: r, Runs: o.runs, Strategies: o.strategies})
		seen[r] = true
	}
	if o.sweep {
		for r := 1.0; r <= paperSweepMax; r++ {
			if !seen[r] {
				cs = append(cs, paperCase{Rate: r, Runs: o.sweepRuns, Strategies: o.strategies})
				seen[r] = true
			}
		}
	}
	cutoffs := []contract.Strategy{contract.StrategyStopAndCopy}
	for _, s := range paperCutoffs {
		if slices.Contains(o.strategies, s) {
			cutoffs = append(cutoffs, s)
		}
	}
	if len(cutoffs) > 1 {
		for _, r := range o.cutoffRates {
			if !seen[r] {
				cs = append(cs, paperCase{Rate: r, Runs: o.runs, Strategies: cutoffs})
				seen[r] = true
			}
		}
	}
	slices.SortStableFunc(cs, func(a, b paperCase) int { return int(a.Rate*1000 - b.Rate*1000) })
	return cs
}

// expectedMigration is about how long strategy s takes at rate on this
// machine: a checkpoint-to-restore of about 4 s, and then the catch-up,
// in which the target gains on the source at μ - λ. It sizes the
// producer's run so that it still sends when the migration ends; the
// bench records whether it did.
func expectedMigration(s contract.Strategy, rate float64, replayMax time.Duration) time.Duration {
	base := paperCheckpointToRestored.Seconds()
	mu := float64(strategyServiceRate)
	catchUp := base * rate / (mu - rate)
	var t float64
	switch s {
	case contract.StrategyMS2M:
		t = base + catchUp
	case contract.StrategyMS2MCutoff, ms2mCutoffAdaptive: // the adaptive rule stops no later
		tCutoff := migrate.CutoffAfter(replayMax, rate, mu, 0).Seconds()
		t = base + min(catchUp, tCutoff+replayMax.Seconds())
	case contract.StrategyStatefulSet:
		t = base + base*rate/mu
	case contract.StrategyStatefulSetShadow:
		t = 2*(base+catchUp) + 1
	default:
		t = base
	}
	return time.Duration(t * float64(time.Second))
}

// producerFor is how long the producer sends for one migration: the
// warm-up, the expected migration with 30% to spare, and 3 s after.
func (o paperOptions) producerFor(s contract.Strategy, rate float64) time.Duration {
	return o.warmup + expectedMigration(s, rate, o.replayMax)*13/10 + 3*time.Second
}

// paperRun is one migration of the paper subcommand.
type paperRun struct {
	Strategy contract.Strategy `json:"strategy"`
	Rate     float64           `json:"rateMsgsPerSec"`
	migrationRound
}

// paperResults is everything a paper run measured; results.json.
type paperResults struct {
	Date           time.Time   `json:"date"`
	Command        string      `json:"command"`
	Quick          bool        `json:"quick"`
	ElapsedSeconds float64     `json:"elapsedSeconds"`
	Machine        machine     `json:"machine"`
	Env            nodeEnv     `json:"env"`
	WorkMs         int         `json:"workMsPerMessage"`
	Prefetch       int         `json:"prefetch"`
	WarmupSeconds  float64     `json:"warmupSeconds"`
	ReplayMaxMs    float64     `json:"replayMaxMs"`
	Order          string      `json:"order"`
	Cases          []paperCase `json:"cases"`
	Runs           []paperRun  `json:"runs"`
	Summary        []paperStat `json:"summary"`
	Goals          []paperGoal `json:"goals"`
	Files          []string    `json:"files"`
}

// runPaper is the paper subcommand.
func runPaper(ctx context.Context, o paperOptions) (err error) {
	if o.from != "" {
		return reportAgain(o)
	}
	start := time.Now()
	res := paperResults{
		Date: start.UTC(), Command: o.command, Quick: o.quick, WorkMs: strategyWorkMS, Prefetch: 1,
		WarmupSeconds: o.warmup.Seconds(), ReplayMaxMs: ms(o.replayMax), Cases: o.cases(),
		Order: "per run, each rate in turn; at each rate every strategy once, the first one rotating run by run",
	}
	total := 0
	for _, c := range res.Cases {
		total += c.Runs * len(c.Strategies)
	}
	progress("paper: plan", "migrations", total, "cases", describeCases(res.Cases))

	b, err := newBench(ctx, options{parts: []string{partStrategies}, amqpURL: o.amqpURL, streamURI: o.streamURI})
	if err != nil {
		return err
	}
	defer b.closeWith(ctx, &err)
	nodes := newNodeLab(nodeOptions{stateDir: o.stateDir})
	defer func() { err = errors.Join(err, nodes.down()) }()
	l, err := nodes.get(ctx)
	if err != nil {
		return err
	}
	if slices.Contains(o.strategies, contract.StrategyStatefulSet) || slices.Contains(o.strategies, contract.StrategyStatefulSetShadow) {
		progress("paper: starting the admission webhook (the StatefulSet strategies need it)")
		if _, err := l.StartWebhook(ctx); err != nil {
			return fmt.Errorf("start the lab's webhook: %w", err)
		}
		defer func() { err = errors.Join(err, l.StopWebhook()) }()
	}
	producer, err := nodes.binary("examples/producer")
	if err != nil {
		return err
	}
	res.Env = *nodes.env

	maxRuns := 0
	for _, c := range res.Cases {
		maxRuns = max(maxRuns, c.Runs)
	}
	done, t0 := 0, time.Now()
	for run := 1; run <= maxRuns; run++ {
		for _, c := range res.Cases {
			if run > c.Runs {
				continue
			}
			order := slices.Clone(c.Strategies)
			k := (run - 1) % len(order)
			order = append(order[k:], order[:k]...)
			for _, s := range order {
				done++
				eta := ""
				if done > 1 {
					eta = (time.Since(t0) / time.Duration(done-1) * time.Duration(total-done+1)).Round(time.Second).String()
				}
				progress("paper: migrate", "n", fmt.Sprintf("%d/%d", done, total), "strategy", s, "rate_msgs_per_s", c.Rate,
					"run", fmt.Sprintf("%d/%d", run, c.Runs), "eta", eta)
				strategy, cutoff := planOf(s)
				m, err := nodes.migrate(ctx, b, l, producer, migrationSpec{
					strategy: strategy, cutoff: cutoff, rate: c.Rate, warmup: o.warmup, producerFor: o.producerFor(s, c.Rate),
					statefulSet: s == contract.StrategyStatefulSet || s == contract.StrategyStatefulSetShadow,
					replayMax:   o.replayMax,
				})
				if err != nil {
					return err // the bench itself failed, not the migration
				}
				m.Round, m.First = run, s == order[0]
				res.Runs = append(res.Runs, paperRun{Strategy: s, Rate: c.Rate, migrationRound: m})
				reportRun(res.Runs[len(res.Runs)-1])
			}
		}
	}
	res.Machine = machineInfo(ctx, b.serverVersion)
	res.Summary = summarise(res.Runs, o.strategies)
	res.Goals = paperGoals(res, o)
	res.ElapsedSeconds = time.Since(start).Seconds()
	return writePaper(o, &res)
}

func describeCases(cs []paperCase) string {
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%g:%dx%d", c.Rate, c.Runs, len(c.Strategies)))
	}
	return strings.Join(parts, ",")
}

// reportRun prints one migration's figures as a progress line.
func reportRun(r paperRun) {
	if !r.ok() {
		progress("  ERROR", "strategy", r.Strategy, "rate_msgs_per_s", r.Rate, "error", r.Error)
		return
	}
	kv := []any{"strategy", r.Strategy, "rate_msgs_per_s", r.Rate, "total_s", fmtS(r.TotalMs)}
	if r.ProcessingGapMs != nil {
		kv = append(kv, "processing_gap_ms", fmtMs1(*r.ProcessingGapMs))
	}
	kv = append(kv, "switch_ms", fmtMs1(r.SwitchMs))
	if r.WorstLatencyMs != nil {
		kv = append(kv, "worst_latency_ms", fmtMs1(*r.WorstLatencyMs), "lost", *r.Lost, "duplicated", *r.Duplicated)
	}
	if r.ReplayAfterStopMs > 0 {
		kv = append(kv, "replay_after_stop_ms", fmtMs1(r.ReplayAfterStopMs))
	}
	kv = append(kv, "wall_s", fmtS(r.WallMs))
	if !r.ProducerOutlasted {
		kv = append(kv, "note", "the producer ended before the migration did")
	}
	progress("  done", kv...)
}

func fmtS(msv float64) string { return strconv.FormatFloat(msv/1000, 'f', 2, 64) }

// writePaper writes results.csv, results.json, the figures and the
// BENCHMARKS.md section, and prints the goals.
func writePaper(o paperOptions, res *paperResults) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", o.out, err)
	}
	files, err := writeFigures(o.out, res)
	if err != nil {
		return err
	}
	res.Files = files
	csvPath := filepath.Join(o.out, "results.csv")
	if err := os.WriteFile(csvPath, paperCSV(res.Runs), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", csvPath, err)
	}
	jsonPath := filepath.Join(o.out, "results.json")
	if err := writeJSON(jsonPath, *res); err != nil {
		return err
	}
	progress("paper: raw results written", "csv", csvPath, "json", jsonPath, "figures", len(files))
	for _, g := range res.Goals {
		fmt.Printf("%s %s: %s (target %s)\n", g.Verdict, g.Name, g.Measured, g.Target)
	}
	for _, l := range adaptiveVsFormula(res.Summary) {
		fmt.Printf("%s against ms2m-cutoff %s\n", ms2mCutoffAdaptive, l)
	}
	if o.benchmarks != "" {
		if err := replaceSection(o.benchmarks, paperMarkdown(*res)); err != nil {
			return err
		}
		progress("paper: section written", "file", o.benchmarks)
	}
	return nil
}

// reportAgain writes the outputs of an earlier run from its results.json.
func reportAgain(o paperOptions) error {
	b, err := os.ReadFile(o.from)
	if err != nil {
		return fmt.Errorf("-from: %w", err)
	}
	var res paperResults
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("-from=%s: %w", o.from, err)
	}
	o.replayMax = time.Duration(res.ReplayMaxMs * float64(time.Millisecond))
	res.Summary = summarise(res.Runs, ranStrategies(res.Runs))
	res.Goals = paperGoals(res, o)
	return writePaper(o, &res)
}

// ranStrategies are the strategies of paperAll that runs has, in order.
func ranStrategies(runs []paperRun) []contract.Strategy {
	var ss []contract.Strategy
	for _, s := range paperAll {
		if ran(runs, s) {
			ss = append(ss, s)
		}
	}
	return ss
}

// ran reports whether runs has a migration by s, failed or not.
func ran(runs []paperRun, s contract.Strategy) bool {
	return slices.ContainsFunc(runs, func(r paperRun) bool { return r.Strategy == s })
}
