package main

import (
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ms2m/ms2m/hack/bench/paperplot"
	"github.com/ms2m/ms2m/internal/contract"
)

// The memory subcommand (issue 27): full migrations of a consumer holding
// more and more state, to see how the total time, the processing gap and
// each phase grow with it.

// memoryOptions are the memory subcommand's flags.
type memoryOptions struct {
	sizes      []int // extra state, MiB (the consumer's STATE_MB)
	strategies []contract.Strategy
	rate       float64
	runs       int
	warmup     time.Duration
	out        string
	stateDir   string
	amqpURL    string
	streamURI  string
	from       string
	command    string
	// pullAhead are the Plan.PullAhead settings each migration runs with,
	// in turn (-pull-ahead: off, on, or both side by side).
	pullAhead []bool
}

// memoryStrategies are what the sweep may run: the live strategy and its
// baseline.
var memoryStrategies = []contract.Strategy{contract.StrategyStopAndCopy, contract.StrategyMS2M}

func parseMemoryFlags(args []string) (memoryOptions, error) {
	var o memoryOptions
	fs := flag.NewFlagSet("bench memory", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go -C hack/bench run . memory [flags]\n\nMigration time against memory on a local cluster of real nodes: stop-and-copy and ms2m migrating the Go consumer (50 ms per message) from node 1 to node 2 under a producer, with STATE_MB MiB of extra state in its memory (pseudo-random, every page written); raw results as CSV and JSON, PNG figures of total time, processing gap and each phase against size, PASS/MISS goals, and a Markdown section (section.md). Flags:")
		fs.PrintDefaults()
	}
	sizes := fs.String("sizes", "10,100,1000", "comma-separated extra state sizes, MiB")
	strategies := fs.String("strategies", joinStrategies(memoryStrategies), "comma-separated strategies, of "+joinStrategies(memoryStrategies))
	fs.Float64Var(&o.rate, "rate", 10, "the producer's rate, msg/s, below μ = 20")
	fs.IntVar(&o.runs, "runs", 3, "migrations per strategy and size")
	fs.DurationVar(&o.warmup, "warmup", 5*time.Second, "how long the consumer consumes before each migration")
	fs.StringVar(&o.out, "out", filepath.Join("out", "bench-memory"), "folder for results.csv, results.json, section.md and the PNG figures")
	fs.StringVar(&o.stateDir, "cluster-state", "/var/tmp/ms2m-bench", "state folder of the local cluster, brought up and taken down")
	fs.StringVar(&o.amqpURL, "amqp", "amqp://guest:guest@127.0.0.1:5672/", "the broker's AMQP URL, to delete the queues")
	fs.StringVar(&o.streamURI, "stream-uri", "rabbitmq-stream://guest:guest@127.0.0.1:5552/", "the broker's stream URI, to delete the replay logs")
	pullAhead := fs.String("pull-ahead", "off", "whether the target node's agent pulls the checkpoint image while the kubelet sets the target pod up (migrate.Plan.PullAhead): off, on, or both (each migration once without and once with, side by side)")
	fs.StringVar(&o.from, "from", "", "a results.json of an earlier run: write its CSV, figures, goals and section again, without a cluster")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q: every setting is a flag (see -h)", fs.Args())
	}
	for s := range strings.SplitSeq(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 || n > 16<<10 {
			return o, fmt.Errorf("-sizes=%q: %q is not a size in MiB from 0 to 16384", *sizes, s)
		}
		if !slices.Contains(o.sizes, n) {
			o.sizes = append(o.sizes, n)
		}
	}
	slices.Sort(o.sizes)
	for s := range strings.SplitSeq(*strategies, ",") {
		st := contract.Strategy(strings.TrimSpace(s))
		if !slices.Contains(memoryStrategies, st) {
			return o, fmt.Errorf("-strategies=%q: %q is not one of %s", *strategies, st, joinStrategies(memoryStrategies))
		}
		if !slices.Contains(o.strategies, st) {
			o.strategies = append(o.strategies, st)
		}
	}
	switch *pullAhead {
	case "off":
		o.pullAhead = []bool{false}
	case "on":
		o.pullAhead = []bool{true}
	case "both":
		o.pullAhead = []bool{false, true}
	default:
		return o, fmt.Errorf("-pull-ahead=%q: want off, on or both", *pullAhead)
	}
	if o.runs < 1 {
		return o, errors.New("-runs must be at least 1")
	}
	if o.rate <= 0 || o.rate >= strategyServiceRate {
		return o, fmt.Errorf("-rate=%g: want a rate above 0 and below μ = %d msg/s", o.rate, strategyServiceRate)
	}
	if o.warmup < time.Second || o.warmup > 10*time.Minute {
		return o, fmt.Errorf("-warmup=%s: want 1s to 10m", o.warmup)
	}
	if abs, err := filepath.Abs(o.stateDir); err == nil {
		o.stateDir = abs
	}
	o.command = strings.TrimSpace("go -C hack/bench run . memory " + strings.Join(args, " "))
	return o, nil
}

// memoryRun is one migration of the sweep.
type memoryRun struct {
	Strategy contract.Strategy `json:"strategy"`
	StateMiB int               `json:"stateMiB"`
	Rate     float64           `json:"rateMsgsPerSec"`
	// PullAhead: the migration ran with migrate.Plan.PullAhead.
	PullAhead bool `json:"pullAhead,omitempty"`
	migrationRound
}

// memoryStat is one strategy at one size, over its good runs: the total
// and the processing gap (mean, median, p95), the median of each phase
// group, and the median of CRIU's own dump as the node agent saw it.
type memoryStat struct {
	Strategy  contract.Strategy  `json:"strategy"`
	PullAhead bool               `json:"pullAhead,omitempty"`
	StateMiB  int                `json:"stateMiB"`
	Runs      int                `json:"runs"`
	OK        int                `json:"ok"`
	Total     spread             `json:"totalMs"`
	Gap       spread             `json:"processingGapMs"`
	Groups    map[string]float64 `json:"phaseMediansMs"`
	CRIUDump  *float64           `json:"criuDumpMedianMs,omitempty"`
	Moved     float64            `json:"checkpointImageRestoreMedianMs"` // checkpoint + image + restore
	GapRuns   int                `json:"gapRuns"`
	CRIURuns  int                `json:"criuRuns"`
	// Parts are the medians of the checkpoint's and the restore's parts
	// (partNames) over the good runs that measured them, with how many
	// did (PartRuns); Steps the medians of the restore's steps by node 2's
	// containerd log (stepNames), over StepRuns runs.
	Parts    map[string]float64 `json:"partMediansMs,omitempty"`
	PartP95  map[string]float64 `json:"partP95Ms,omitempty"`
	PartRuns map[string]int     `json:"partRuns,omitempty"`
	Steps    map[string]float64 `json:"restoreStepMediansMs,omitempty"`
	StepRuns int                `json:"restoreStepRuns,omitempty"`
}

// memoryResults is everything a memory run measured; results.json.
type memoryResults struct {
	Date           time.Time           `json:"date"`
	Command        string              `json:"command"`
	ElapsedSeconds float64             `json:"elapsedSeconds"`
	Machine        machine             `json:"machine"`
	Env            nodeEnv             `json:"env"`
	WorkMs         int                 `json:"workMsPerMessage"`
	Rate           float64             `json:"rateMsgsPerSec"`
	WarmupSeconds  float64             `json:"warmupSeconds"`
	Order          string              `json:"order"`
	Runs           []memoryRun         `json:"runs"`
	Summary        []memoryStat        `json:"summary"`
	Goals          []paperGoal         `json:"goals"`
	Files          []string            `json:"files"`
	Sizes          []int               `json:"sizesMiB"`
	Strategies     []contract.Strategy `json:"strategies"`
}

// memoryProducerFor is how long the producer sends for one migration at
// size MiB: the warm-up, the paper's expected migration with 30% to
// spare, 3 s after, and 4 s per 100 MiB for the dump, push, pull and
// restore of the extra state (about 40 MB/s, this machine's slowest
// seen).
func memoryProducerFor(o memoryOptions, s contract.Strategy, mib int) time.Duration {
	return o.warmup + expectedMigration(s, o.rate, 0)*13/10 + 3*time.Second + time.Duration(mib)*40*time.Millisecond
}

func runMemory(ctx context.Context, o memoryOptions) (err error) {
	if o.from != "" {
		return memoryAgain(o)
	}
	start := time.Now()
	res := memoryResults{Date: start.UTC(), Command: o.command, WorkMs: strategyWorkMS, Rate: o.rate, WarmupSeconds: o.warmup.Seconds(),
		Sizes: o.sizes, Strategies: o.strategies,
		Order: "per run, each size in turn (smallest first); at each size every strategy once, the first one rotating run by run"}
	total := o.runs * len(o.sizes) * len(o.strategies) * len(o.pullAhead)
	progress("memory: plan", "migrations", total, "sizes_mib", fmt.Sprint(o.sizes), "strategies", joinStrategies(o.strategies), "rate_msgs_per_s", o.rate)

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
	producer, err := nodes.binary("examples/producer")
	if err != nil {
		return err
	}
	res.Env = *nodes.env
	done := 0
	for run := 1; run <= o.runs; run++ {
		for _, mib := range o.sizes {
			order := slices.Clone(o.strategies)
			k := (run - 1) % len(order)
			order = append(order[k:], order[:k]...)
			for _, s := range order {
				for _, ahead := range o.pullAhead {
					done++
					progress("memory: migrate", "n", fmt.Sprintf("%d/%d", done, total), "strategy", s, "pull_ahead", ahead, "state_mib", mib, "run", fmt.Sprintf("%d/%d", run, o.runs))
					m, err := nodes.migrate(ctx, b, l, producer, migrationSpec{strategy: s, rate: o.rate, warmup: o.warmup,
						producerFor: memoryProducerFor(o, s, mib), stateMiB: mib, pullAhead: ahead})
					if err != nil {
						return err // the bench itself failed, not the migration
					}
					m.Round, m.First = run, s == order[0] && ahead == o.pullAhead[0]
					res.Runs = append(res.Runs, memoryRun{Strategy: s, StateMiB: mib, Rate: o.rate, PullAhead: ahead, migrationRound: m})
					r := res.Runs[len(res.Runs)-1]
					progress("  result", "ok", r.ok(), "total_ms", fmtMs0(r.TotalMs), "gap_ms", optMs(r.ProcessingGapMs), "checkpoint_ms", fmtMs0(r.Groups["checkpoint"]),
						"image_ms", fmtMs0(r.Groups["image"]), "restore_ms", fmtMs0(r.Groups["restore"]), "error", r.Error)
				}
			}
		}
	}
	res.Machine = machineInfo(ctx, b.serverVersion)
	res.Summary = memorySummary(res.Runs)
	res.Goals = memoryGoals(res)
	res.ElapsedSeconds = time.Since(start).Seconds()
	return writeMemory(o, &res)
}

func optMs(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmtMs0(*p)
}

// memorySummary is one memoryStat per strategy and size that ran, by
// strategy then size.
func memorySummary(runs []memoryRun) []memoryStat {
	type key struct {
		s     contract.Strategy
		ahead bool
		mib   int
	}
	var keys []key
	by := map[key][]memoryRun{}
	for _, r := range runs {
		k := key{r.Strategy, r.PullAhead, r.StateMiB}
		if _, ok := by[k]; !ok {
			keys = append(keys, k)
		}
		by[k] = append(by[k], r)
	}
	slices.SortFunc(keys, func(a, b key) int {
		if c := slices.Index(memoryStrategies, a.s) - slices.Index(memoryStrategies, b.s); c != 0 {
			return c
		}
		if a.ahead != b.ahead {
			return map[bool]int{false: -1, true: 1}[a.ahead]
		}
		return a.mib - b.mib
	})
	var out []memoryStat
	for _, k := range keys {
		st := memoryStat{Strategy: k.s, PullAhead: k.ahead, StateMiB: k.mib, Runs: len(by[k]), Groups: map[string]float64{}}
		var total, gap, dump, moved []float64
		groups, parts, steps := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
		for _, r := range by[k] {
			if !r.ok() {
				continue
			}
			st.OK++
			total = append(total, r.TotalMs)
			if r.ProcessingGapMs != nil {
				gap = append(gap, *r.ProcessingGapMs)
			}
			if h := r.Report.Hold; h != nil && h.CRIU > 0 {
				dump = append(dump, ms(h.CRIU))
			}
			for _, g := range phaseGroupNames {
				groups[g] = append(groups[g], r.Groups[g])
			}
			moved = append(moved, r.Groups["checkpoint"]+r.Groups["image"]+r.Groups["restore"])
			for name, v := range runParts(r) {
				parts[name] = append(parts[name], v)
			}
			if s := r.RestoreSteps; s != nil {
				for name, v := range stepValues(*s) {
					steps[name] = append(steps[name], v)
				}
			}
		}
		st.Parts, st.PartP95, st.PartRuns = map[string]float64{}, map[string]float64{}, map[string]int{}
		for name, vs := range parts {
			sp := spreadOf(vs)
			st.Parts[name], st.PartP95[name], st.PartRuns[name] = sp.Median, sp.P95, len(vs)
		}
		st.Steps = map[string]float64{}
		for name, vs := range steps {
			st.Steps[name], st.StepRuns = median(vs), len(vs)
		}
		st.Total, st.Gap, st.GapRuns, st.CRIURuns = spreadOf(total), spreadOf(gap), len(gap), len(dump)
		for g, vs := range groups {
			st.Groups[g] = median(vs)
		}
		if len(dump) > 0 {
			d := median(dump)
			st.CRIUDump = &d
		}
		if len(moved) > 0 {
			st.Moved = median(moved)
		}
		out = append(out, st)
	}
	return out
}

func memoryStatOf(stats []memoryStat, s contract.Strategy, mib int) (memoryStat, bool) {
	for _, st := range stats {
		if st.Strategy == s && !st.PullAhead && st.StateMiB == mib && st.OK > 0 {
			return st, true
		}
	}
	return memoryStat{}, false
}

const (
	// goalLinearSlack: the checkpoint, image and restore phases grow
	// linearly in size when their time per MiB between the two largest
	// sizes is at most this many times that between the two smallest.
	goalLinearSlack = 1.5
	// goalMovedOverCRIU: the checkpoint phase is at most this many times
	// CRIU's own dump of the same container (issue 27 asks for 3× of dump
	// and restore together; no raw restore runs beside it).
	goalMovedOverCRIU = 3.0
)

// memoryGoals judges the sweep: linear growth, the checkpoint against
// CRIU's own dump at each size, and every migration exact.
func memoryGoals(res memoryResults) []paperGoal {
	var gs []paperGoal
	sizes := slices.Clone(res.Sizes)
	slices.Sort(sizes)
	for _, s := range res.Strategies {
		name := fmt.Sprintf("%s checkpoint + image + restore linear in state size (medians)", s)
		target := fmt.Sprintf("ms per MiB between the two largest sizes ≤ %g× that between the two smallest", goalLinearSlack)
		var pts []memoryStat
		for _, mib := range sizes {
			if st, ok := memoryStatOf(res.Summary, s, mib); ok {
				pts = append(pts, st)
			}
		}
		if len(pts) < 3 {
			gs = append(gs, paperGoal{Name: name, Target: target, Measured: "fewer than three sizes ran", Verdict: "SKIP"})
			continue
		}
		slope := func(a, b memoryStat) float64 { return (b.Moved - a.Moved) / float64(b.StateMiB-a.StateMiB) }
		lo, hi := slope(pts[0], pts[1]), slope(pts[len(pts)-2], pts[len(pts)-1])
		var desc []string
		for _, p := range pts {
			desc = append(desc, fmt.Sprintf("%d MiB %s ms", p.StateMiB, fmtMs0(p.Moved)))
		}
		gs = append(gs, paperGoal{Name: name, Target: target,
			Measured: fmt.Sprintf("%.2f ms/MiB against %.2f ms/MiB (%s)", hi, lo, strings.Join(desc, ", ")),
			Verdict:  verdict(lo > 0 && hi <= lo*goalLinearSlack || lo <= 0 && hi <= 0)})
	}
	for _, mib := range sizes {
		name := fmt.Sprintf("ms2m checkpoint phase against CRIU's own dump at %d MiB (medians)", mib)
		target := fmt.Sprintf("≤ %g× CRIU's dump", goalMovedOverCRIU)
		st, ok := memoryStatOf(res.Summary, contract.StrategyMS2M, mib)
		if !ok || st.CRIUDump == nil || *st.CRIUDump <= 0 {
			gs = append(gs, paperGoal{Name: name, Target: target, Measured: "no ms2m run at this size in which the node agent saw CRIU's dump", Verdict: "SKIP"})
			continue
		}
		c := st.Groups["checkpoint"]
		gs = append(gs, paperGoal{Name: name, Target: target,
			Measured: fmt.Sprintf("%.1f× (checkpoint %s ms, CRIU's dump %s ms; %d runs)", c / *st.CRIUDump, fmtMs0(c), fmtMs0(*st.CRIUDump), st.CRIURuns),
			Verdict:  verdict(c <= goalMovedOverCRIU**st.CRIUDump)})
	}
	rounds := make([]migrationRound, len(res.Runs))
	for i, r := range res.Runs {
		rounds[i] = r.migrationRound
	}
	return append(gs, exactGoal(rounds))
}

// memoryCSV is one row per migration.
func memoryCSV(runs []memoryRun) []byte {
	var sb strings.Builder
	w := csv.NewWriter(&sb)
	head := []string{"run", "state_mib", "strategy", "pull_ahead", "rate_msgs_per_s", "ok", "total_ms", "processing_gap_ms", "switch_ms"}
	for _, g := range phaseGroupNames {
		head = append(head, g+"_ms")
	}
	head = append(head, "hold_criu_ms", "thawed_at_dump")
	for _, p := range partNames {
		head = append(head, p.col+"_ms")
	}
	for _, p := range stepNames {
		head = append(head, "restore_"+p.col+"_ms")
	}
	head = append(head, "produced", "count", "hash_ok", "producer_outlasted", "error")
	_ = w.Write(head) // into a strings.Builder, which cannot fail
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	for _, r := range runs {
		row := []string{strconv.Itoa(r.Round), strconv.Itoa(r.StateMiB), string(r.Strategy), strconv.FormatBool(r.PullAhead), strconv.FormatFloat(r.Rate, 'g', -1, 64), strconv.FormatBool(r.ok()),
			f(r.TotalMs), "", f(r.SwitchMs)}
		if r.ProcessingGapMs != nil {
			row[7] = f(*r.ProcessingGapMs)
		}
		for _, g := range phaseGroupNames {
			row = append(row, f(r.Groups[g]))
		}
		if h := r.Report.Hold; h != nil {
			row = append(row, f(ms(h.CRIU)), strconv.FormatBool(h.ThawedAtDump))
		} else {
			row = append(row, "", "")
		}
		pv := runParts(r)
		for _, p := range partNames {
			if v, ok := pv[p.col]; ok {
				row = append(row, f(v))
			} else {
				row = append(row, "")
			}
		}
		var sv map[string]float64
		if r.RestoreSteps != nil {
			sv = stepValues(*r.RestoreSteps)
		}
		for _, p := range stepNames {
			if v, ok := sv[p.col]; ok {
				row = append(row, f(v))
			} else {
				row = append(row, "")
			}
		}
		row = append(row, strconv.Itoa(r.Produced), strconv.Itoa(r.Count), strconv.FormatBool(r.HashOK), strconv.FormatBool(r.ProducerOutlasted), r.Error)
		_ = w.Write(row)
	}
	w.Flush()
	return []byte(sb.String())
}

// memoryMarkdown is the section for BENCHMARKS.md.
func memoryMarkdown(res memoryResults) string {
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	w("### Migration time against memory, %s\n\n", res.Date.Format("2006-01-02"))
	w("- Command: `%s`; results: `results.csv`, `results.json` beside this section\n", res.Command)
	w("- Machine: %d CPUs, Linux %s, RabbitMQ %s, %s; %s\n", res.Machine.CPUs, res.Machine.Kernel, res.Machine.RabbitMQ, res.Machine.Go,
		(time.Duration(res.ElapsedSeconds) * time.Second).Round(time.Second))
	w("- The Go consumer (%d ms per message) holding STATE_MB MiB of extra pseudo-random state, under a producer at %g msg/s, migrated from node 1 to node 2; %s.\n\n",
		res.WorkMs, res.Rate, res.Order)
	w("Medians over the good runs (total and processing gap also as p95); phases are the bench's groups; `CRIU dump` is CRIU's own hold of the app as the node agent saw it.\n\n")
	w("| strategy | state (MiB) | good runs | total (s) | total p95 (s) | processing gap (ms) | gap p95 (ms) | checkpoint (ms) | image (ms) | restore (ms) | replay + handover (ms) | CRIU dump (ms) |\n")
	w("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, st := range res.Summary {
		gap, gapP95, dump := "-", "-", "-"
		if st.GapRuns > 0 {
			gap, gapP95 = fmtMs0(st.Gap.Median), fmtMs0(st.Gap.P95)
		}
		if st.CRIUDump != nil {
			dump = fmtMs0(*st.CRIUDump)
		}
		w("| %s | %d | %d of %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", st.name(), st.StateMiB, st.OK, st.Runs,
			fmtS(st.Total.Median), fmtS(st.Total.P95), gap, gapP95, fmtMs0(st.Groups["checkpoint"]), fmtMs0(st.Groups["image"]),
			fmtMs0(st.Groups["restore"]), fmtMs0(st.Groups["replay"]+st.Groups["handover"]), dump)
	}
	markdownParts(w, res.Summary)
	markdownPullAhead(w, res.Summary)
	w("\nGoals:\n\n")
	for _, g := range res.Goals {
		w("- **%s** %s: %s (target %s)\n", g.Verdict, g.Name, g.Measured, g.Target)
	}
	if len(res.Files) > 0 {
		var names []string
		for _, f := range res.Files {
			names = append(names, "`"+filepath.Base(f)+"`")
		}
		w("\nFigures: %s.\n", strings.Join(names, ", "))
	}
	return sb.String()
}

func writeMemory(o memoryOptions, res *memoryResults) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", o.out, err)
	}
	var pruns []paperplot.Run
	for _, r := range res.Runs {
		if !r.ok() {
			continue
		}
		pr := paperplot.Run{Strategy: string(r.Strategy), Rate: float64(r.StateMiB), TotalS: r.TotalMs / 1000, Phases: map[string]float64{}}
		if r.ProcessingGapMs != nil {
			pr.DowntimeS = *r.ProcessingGapMs / 1000
		}
		for g, v := range r.Groups {
			pr.Phases[g] = v / 1000
		}
		pruns = append(pruns, pr)
	}
	var strategies []string
	for _, s := range res.Strategies {
		strategies = append(strategies, string(s))
	}
	files, err := paperplot.Write(o.out, pruns, paperplot.Options{Strategies: strategies, Groups: phaseGroupNames,
		X: paperplot.Axis{Name: "state", Label: "extra state in the consumer's memory (MiB)"}})
	if err != nil {
		return err
	}
	res.Files = files
	return writeResults(o.out, "memory", memoryCSV(res.Runs), *res, memoryMarkdown(*res), res.Goals, len(files))
}

// memoryAgain writes the outputs of an earlier run from its results.json.
func memoryAgain(o memoryOptions) error {
	var res memoryResults
	if err := readResults(o.from, &res); err != nil {
		return err
	}
	res.Summary = memorySummary(res.Runs)
	res.Goals = memoryGoals(res)
	return writeMemory(o, &res)
}

// mainMemory runs the memory subcommand.
func mainMemory(args []string) { runSubcommand("memory", args, parseMemoryFlags, runMemory) }
