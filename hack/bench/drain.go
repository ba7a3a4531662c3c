package main

import (
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/hack/bench/paperplot"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/inject"
)

// The drain subcommand (issue 24): the real `kubectl drain` of node 1 of a
// local cluster of three real nodes, with N Go consumers on it opted in to
// migrate on eviction, against N and the controller's per-node limit of
// evacuations under way (MS2M_EVACUATE_PER_NODE). ms2m runs as a user
// runs it (lab.InstallWith: the webhook, an agent per node and `migrator
// controller`), re-installed when the limit changes.

// drainBenchOptions are the drain subcommand's flags.
type drainBenchOptions struct {
	consumers []int // the consumer sweep, at limit consumersAt
	limits    []int // the limit sweep, at limitsAt consumers
	atLimit   int
	atCount   int
	runs      int
	rate      float64
	warmup    int // messages every consumer folds before the drain
	timeout   time.Duration
	out       string
	stateDir  string
	amqpURL   string
	streamURI string
	from      string
	command   string
}

func parseDrainFlags(args []string) (drainBenchOptions, error) {
	var o drainBenchOptions
	fs := flag.NewFlagSet("bench drain", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go -C hack/bench run . drain [flags]\n\nkubectl drain by migration on a local cluster of three real nodes: N Go consumers (Deployments, 50 ms per message, opted in with ms2m.io/on-evict: migrate) on node 1 under a producer each, drained by the real kubectl drain; the drain's time, each pod's processing gap (from the consumers' journals) and its migration, against N (at one per-node limit) and against the limit (at one N); every hash checked. Results as CSV and JSON, PNG figures and a Markdown section (section.md). Flags:")
		fs.PrintDefaults()
	}
	consumers := fs.String("consumers", "1,4,8,16", "comma-separated consumer counts for the consumer sweep")
	limits := fs.String("limits", "1,2,4", "comma-separated per-node limits (MS2M_EVACUATE_PER_NODE, and MS2M_EVACUATE_MAX the same) for the limit sweep")
	fs.IntVar(&o.atLimit, "consumers-at-limit", 2, "the per-node limit of the consumer sweep (the chart's default)")
	fs.IntVar(&o.atCount, "limits-at-consumers", 8, "the consumer count of the limit sweep")
	fs.IntVar(&o.runs, "runs", 1, "drains per point")
	fs.Float64Var(&o.rate, "rate", 10, "each producer's rate, msg/s, below μ = 20")
	fs.IntVar(&o.warmup, "warmup", 30, "messages every consumer folds before the drain starts")
	fs.DurationVar(&o.timeout, "timeout", 20*time.Minute, "kubectl drain's --timeout")
	fs.StringVar(&o.out, "out", filepath.Join("out", "bench-drain"), "folder for results.csv, results.json, section.md and the PNG figures")
	fs.StringVar(&o.stateDir, "cluster-state", "/var/tmp/ms2m-bench", "state folder of the local cluster, brought up and taken down")
	fs.StringVar(&o.amqpURL, "amqp", "amqp://guest:guest@127.0.0.1:5672/", "the broker's AMQP URL, to delete the queues")
	fs.StringVar(&o.streamURI, "stream-uri", "rabbitmq-stream://guest:guest@127.0.0.1:5552/", "the broker's stream URI, to delete the replay logs")
	fs.StringVar(&o.from, "from", "", "a results.json of an earlier run: write its CSV, figures and section again, without a cluster")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q: every setting is a flag (see -h)", fs.Args())
	}
	var err error
	if o.consumers, err = positiveInts("-consumers", *consumers, 64); err != nil {
		return o, err
	}
	if o.limits, err = positiveInts("-limits", *limits, 16); err != nil {
		return o, err
	}
	if o.atLimit < 1 || o.atLimit > 16 || o.atCount < 1 || o.atCount > 64 {
		return o, errors.New("-consumers-at-limit wants 1 to 16, -limits-at-consumers 1 to 64")
	}
	if o.runs < 1 || o.warmup < 1 {
		return o, errors.New("-runs and -warmup must be at least 1")
	}
	if o.rate <= 0 || o.rate >= strategyServiceRate {
		return o, fmt.Errorf("-rate=%g: want a rate above 0 and below μ = %d msg/s", o.rate, strategyServiceRate)
	}
	if abs, err := filepath.Abs(o.stateDir); err == nil {
		o.stateDir = abs
	}
	o.command = strings.TrimSpace("go -C hack/bench run . drain " + strings.Join(args, " "))
	return o, nil
}

// positiveInts parses a comma-separated list of distinct integers from 1
// to max, sorted.
func positiveInts(flagName, list string, max int) ([]int, error) {
	var out []int
	for s := range strings.SplitSeq(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > max {
			return nil, fmt.Errorf("%s=%q: %q is not a number from 1 to %d", flagName, list, s, max)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// drainPoint is one setting of the sweep.
type drainPoint struct {
	Consumers int `json:"consumers"`
	Limit     int `json:"limit"`
}

// points are the sweep's settings, in the order they run: the limit
// sweep, then the rest of the consumer sweep (each limit once, so that
// the controller is re-installed as seldom as can be).
func (o drainBenchOptions) points() []drainPoint {
	var ps []drainPoint
	add := func(p drainPoint) {
		if !slices.Contains(ps, p) {
			ps = append(ps, p)
		}
	}
	for _, l := range o.limits {
		if l == o.atLimit {
			for _, n := range o.consumers {
				add(drainPoint{n, l})
			}
		}
		add(drainPoint{o.atCount, l})
	}
	for _, n := range o.consumers {
		add(drainPoint{n, o.atLimit})
	}
	return ps
}

// drainPod is one consumer of a drain.
type drainPod struct {
	App      string `json:"app"`
	Node     string `json:"node"` // where it went
	Strategy string `json:"strategy"`
	// TotalMs and DowntimeMs are its migration's, from the controller's
	// report; EndedMs is when its migration ended, from the drain's start.
	TotalMs    float64 `json:"totalMs"`
	DowntimeMs float64 `json:"downtimeMs"`
	EndedMs    float64 `json:"endedMs"`
	// ProcessingGapMs is the longest time over the drain in which the
	// consumer (source, then target) finished no message while one
	// waited, from the journals (nil when they could not be read).
	ProcessingGapMs *float64 `json:"processingGapMs,omitempty"`
	Produced        int      `json:"produced"`
	Count           int      `json:"count"`
	HashOK          bool     `json:"hashOk"`
	Skipped         int      `json:"skippedRedeliveries"`
	Error           string   `json:"error,omitempty"`
}

func (p drainPod) ok() bool { return p.Error == "" && p.HashOK && p.Skipped == 0 }

// drainResult is one drain.
type drainResult struct {
	drainPoint
	Round int `json:"round"`
	// DrainMs is kubectl drain's own time, start to exit.
	DrainMs  float64 `json:"drainMs"`
	ExitCode int     `json:"exitCode"`
	// ProducerOutlasted says the producers still sent when the drain
	// ended: every consumer migrated under load.
	ProducerOutlasted bool `json:"producerOutlasted"`
	// JournalEveryMs is how often the journals were read: the processing
	// gap is an upper bound by at most this much.
	JournalEveryMs float64    `json:"journalEveryMs"`
	Pods           []drainPod `json:"pods"`
	Error          string     `json:"error,omitempty"`
}

func (r drainResult) ok() bool {
	if r.Error != "" || r.ExitCode != 0 || len(r.Pods) != r.Consumers {
		return false
	}
	for _, p := range r.Pods {
		if !p.ok() {
			return false
		}
	}
	return true
}

// drainStat is one point over its drains.
type drainStat struct {
	drainPoint
	Drains int `json:"drains"`
	OK     int `json:"ok"`
	// UnderLoad counts the good drains that ended while the producers
	// still sent.
	UnderLoad int    `json:"underLoad"`
	Drain     spread `json:"drainMs"`
	Gap       spread `json:"processingGapMs"` // over every pod of the good drains
	GapPods   int    `json:"gapPods"`
	Total     spread `json:"migrationTotalMs"` // per pod
	Down      spread `json:"migrationDowntimeMs"`
}

// drainResults is everything a drain run measured; results.json.
type drainResults struct {
	Date           time.Time     `json:"date"`
	Command        string        `json:"command"`
	ElapsedSeconds float64       `json:"elapsedSeconds"`
	Machine        machine       `json:"machine"`
	Env            nodeEnv       `json:"env"`
	WorkMs         int           `json:"workMsPerMessage"`
	Rate           float64       `json:"rateMsgsPerSec"`
	Warmup         int           `json:"warmupMessages"`
	AtLimit        int           `json:"consumerSweepLimit"`
	AtCount        int           `json:"limitSweepConsumers"`
	Drains         []drainResult `json:"drains"`
	Summary        []drainStat   `json:"summary"`
	Goals          []paperGoal   `json:"goals"`
	Files          []string      `json:"files"`
}

// drainProducerFor is how long each producer sends for a drain of n
// consumers at limit: the warm-up, 30 s per wave of migrations (ms2m
// takes 10-20 s here under this load) and 20 s to spare, so that every
// consumer migrates under load.
func drainProducerFor(o drainBenchOptions, p drainPoint) time.Duration {
	waves := (p.Consumers + p.Limit - 1) / p.Limit
	return time.Duration(float64(o.warmup)/o.rate*float64(time.Second)) + time.Duration(waves)*30*time.Second + 20*time.Second
}

func runDrainBench(ctx context.Context, o drainBenchOptions) (err error) {
	if o.from != "" {
		return drainAgain(o)
	}
	start := time.Now()
	res := drainResults{Date: start.UTC(), Command: o.command, WorkMs: strategyWorkMS, Rate: o.rate, Warmup: o.warmup, AtLimit: o.atLimit, AtCount: o.atCount}
	points := o.points()
	progress("drain: plan", "drains", len(points)*o.runs, "points", fmt.Sprint(points))

	b, err := newBench(ctx, options{parts: []string{partStrategies}, amqpURL: o.amqpURL, streamURI: o.streamURI})
	if err != nil {
		return err
	}
	defer b.closeWith(ctx, &err)
	nodes := newNodeLab(nodeOptions{stateDir: o.stateDir, nodes: 3})
	defer func() { err = errors.Join(err, nodes.down()) }()
	l, err := nodes.get(ctx)
	if err != nil {
		return err
	}
	producer, err := nodes.binary("examples/producer")
	if err != nil {
		return err
	}
	kubectl := filepath.Join(nodes.opts.BinDir, "k8s", "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		return fmt.Errorf("kubectl: %w (`make node-bin` builds it)", err)
	}
	res.Env = *nodes.env
	installed := 0
	for run := 1; run <= o.runs; run++ {
		for i, p := range points {
			if p.Limit != installed {
				progress("drain: installing ms2m", "per_node_limit", p.Limit)
				lim := strconv.Itoa(p.Limit)
				if _, err := l.InstallWith(ctx, lab.InstallOptions{ControllerEnv: []string{"MS2M_EVACUATE_PER_NODE=" + lim, "MS2M_EVACUATE_MAX=" + lim}}); err != nil {
					return fmt.Errorf("install ms2m with the limit %d: %w", p.Limit, err)
				}
				installed = p.Limit
			}
			progress("drain: drain", "n", fmt.Sprintf("%d/%d", (run-1)*len(points)+i+1, len(points)*o.runs), "consumers", p.Consumers, "limit", p.Limit, "run", run)
			r, err := drainOnce(ctx, b, l, kubectl, producer, o, p)
			if err != nil {
				return err
			}
			r.Round = run
			res.Drains = append(res.Drains, r)
			// What ran so far, for -from should the run stop early.
			if err := writeJSON(filepath.Join(o.out, "results.json"), res); err != nil {
				return err
			}
			var gaps []float64
			for _, pd := range r.Pods {
				if pd.ProcessingGapMs != nil {
					gaps = append(gaps, *pd.ProcessingGapMs)
				}
			}
			progress("  result", "ok", r.ok(), "drain_s", fmtS(r.DrainMs), "exit", r.ExitCode, "gap_median_ms", fmtMs0(median(gaps)),
				"producer_outlasted", r.ProducerOutlasted, "error", r.Error)
		}
	}
	res.Machine = machineInfo(ctx, b.serverVersion)
	res.Summary = drainSummary(res.Drains)
	res.Goals = drainGoals(res)
	res.ElapsedSeconds = time.Since(start).Seconds()
	return writeDrain(o, &res)
}

// drainOnce starts p.Consumers consumers on node 1, each under its
// producer, drains node 1 with kubectl once each has folded o.warmup
// messages, and judges every pod. An error is returned only when the
// bench could not run the drain at all.
func drainOnce(ctx context.Context, b *bench, l *lab.Lab, kubectl, producerBin string, o drainBenchOptions, p drainPoint) (r drainResult, err error) {
	r.drainPoint = p
	node1 := cluster.NodeName(1)
	tag := fmt.Sprintf("dr%d-%d-%d", p.Consumers, p.Limit, time.Now().UnixNano()%1e6)
	apps := make([]string, p.Consumers)
	for i := range apps {
		apps[i] = fmt.Sprintf("%s-%d", tag, i)
	}
	var logs []string
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if _, err := l.Client.CoreV1().Nodes().Patch(cctx, node1, types.MergePatchType, []byte(`{"spec":{"unschedulable":false}}`), metav1.PatchOptions{}); err != nil {
			progress("  could not uncordon node 1", "err", err)
		}
		for _, a := range apps {
			if err := l.DeleteWorkload(cctx, lab.Deployment, a); err != nil {
				progress("  could not delete the consumer", "app", a, "err", err)
			}
			_ = b.deleteQueue(a)
		}
		for _, log := range logs {
			_ = b.deleteLog(log)
		}
		for i := 1; i <= l.Cluster.Nodes(); i++ {
			removeNodeImages(cctx, l, i, "/ms2m/checkpoints")
		}
	}()

	// The consumers, started side by side.
	srcs := make([]*corev1.Pod, len(apps))
	errs := make([]error, len(apps))
	var wg sync.WaitGroup
	for i, a := range apps {
		b.mu.Lock()
		b.queues[a] = true
		b.mu.Unlock()
		wg.Go(func() {
			srcs[i], errs[i] = l.StartWorkload(ctx, lab.Deployment, lab.Consumer{Name: a, Queue: a, Node: node1, WorkMS: strategyWorkMS, Image: "consumer", ReadOnlyRoot: true,
				Mutate: func(pod *corev1.Pod) { pod.Annotations[contract.AnnotationOnEvict] = contract.OnEvictMigrate }})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return r, fmt.Errorf("start the consumers: %w", err)
	}
	for _, src := range srcs {
		if log := inject.LogName(src); log != "" {
			b.mu.Lock()
			b.logs[log] = true
			b.mu.Unlock()
			logs = append(logs, log)
		}
	}
	producerFor := drainProducerFor(o, p)
	count := int(math.Ceil(o.rate * producerFor.Seconds()))
	producersEnd := time.Now().Add(producerFor)
	prods := make([]*lab.Producer, len(apps))
	for i, a := range apps {
		if prods[i], err = lab.StartProducer(producerBin, a, o.rate, count); err != nil {
			return r, fmt.Errorf("start the producer of %s: %w", a, err)
		}
		defer prods[i].Stop()
	}
	for _, src := range srcs {
		if _, err := waitConsumed(ctx, src, o.warmup, 2*time.Minute); err != nil {
			return r, err
		}
	}
	// Each read is the whole journal: fewer reads per pod the more pods
	// there are, so that the reads do not load the two cores.
	every := min(max(time.Duration(p.Consumers)*50*time.Millisecond, 200*time.Millisecond), 500*time.Millisecond)
	r.JournalEveryMs = ms(every)
	watches := make([]*lab.JournalWatch, len(apps))
	for i, a := range apps {
		watches[i] = l.WatchJournals(ctx, a, every)
		defer watches[i].Close()
	}

	// The drain, as an operator runs it.
	cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", l.Kubeconfig, "drain", node1, "--ignore-daemonsets", "--delete-emptydir-data",
		"--pod-selector", "app in ("+strings.Join(apps, ",")+")", "--timeout", o.timeout.String())
	began := time.Now()
	out, runErr := cmd.CombinedOutput()
	ended := time.Now()
	r.DrainMs = ms(ended.Sub(began))
	r.ProducerOutlasted = producersEnd.After(ended)
	var ee *exec.ExitError
	switch {
	case runErr == nil:
	case errors.As(runErr, &ee):
		r.ExitCode = ee.ExitCode()
		r.Error = "kubectl drain: " + lastLines(string(out), 5)
	default:
		return r, fmt.Errorf("kubectl drain: %w", runErr)
	}

	// Every pod: where it went, its migration, its gap and its hash.
	for i, a := range apps {
		pd := drainPod{App: a}
		target, st, err := movedPod(ctx, l, a, srcs[i], node1)
		if err != nil {
			pd.Error = err.Error()
			watches[i].Close()
			r.Pods = append(r.Pods, pd)
			continue
		}
		pd.Node, pd.Strategy = target.Spec.NodeName, st.Strategy
		if rep := st.Report; rep != nil {
			pd.TotalMs, pd.DowntimeMs = ms(rep.Total), ms(rep.Downtime)
			pd.EndedMs = ms(st.Started.Add(rep.Total).Sub(began))
		}
		if g, err := watches[i].Stop(target, began, ended); err == nil {
			v := ms(g.Duration())
			pd.ProcessingGapMs = &v
		} else {
			progress("  no processing gap", "app", a, "err", err)
		}
		want, err := prods[i].Wait(ctx)
		if err != nil {
			pd.Error = err.Error()
			r.Pods = append(r.Pods, pd)
			continue
		}
		got := lab.WaitFor(target, want, time.Minute)
		pd.Produced, pd.Count, pd.HashOK, pd.Skipped = want.Count, got.Count, got.Count == want.Count && got.Hash == want.Hash, got.Skipped
		if !pd.HashOK {
			pd.Error = fmt.Sprintf("count %d hash %s, the producer's %d %s", got.Count, got.Hash, want.Count, want.Hash)
		}
		r.Pods = append(r.Pods, pd)
	}
	return r, nil
}

// movedPod is the one pod of app, restored off node by an evacuation of
// src, and its migration status.
func movedPod(ctx context.Context, l *lab.Lab, app string, src *corev1.Pod, node string) (*corev1.Pod, controller.Status, error) {
	list, err := l.Client.CoreV1().Pods(lab.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		return nil, controller.Status{}, err
	}
	if len(list.Items) != 1 {
		return nil, controller.Status{}, fmt.Errorf("%d pods of %s, want 1", len(list.Items), app)
	}
	p := &list.Items[0]
	st, err := controller.DecodeStatus(p.Annotations[contract.AnnotationMigrationStatus])
	if err != nil {
		return nil, controller.Status{}, fmt.Errorf("pod %s: its migration status: %w", p.Name, err)
	}
	if p.UID == src.UID || p.Spec.NodeName == node || st.Phase != contract.PhaseSucceeded || st.Evacuation != node {
		return nil, st, fmt.Errorf("pod %s on %s, migration %s (evacuation %q): not moved off %s by its migration: %s", p.Name, p.Spec.NodeName, st.Phase, st.Evacuation, node, st.Message)
	}
	return p, st, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// drainSummary is one drainStat per point, by limit then consumers.
func drainSummary(drains []drainResult) []drainStat {
	var keys []drainPoint
	by := map[drainPoint][]drainResult{}
	for _, d := range drains {
		if _, ok := by[d.drainPoint]; !ok {
			keys = append(keys, d.drainPoint)
		}
		by[d.drainPoint] = append(by[d.drainPoint], d)
	}
	slices.SortFunc(keys, func(a, b drainPoint) int {
		if a.Limit != b.Limit {
			return a.Limit - b.Limit
		}
		return a.Consumers - b.Consumers
	})
	var out []drainStat
	for _, k := range keys {
		st := drainStat{drainPoint: k, Drains: len(by[k])}
		var drain, gap, total, down []float64
		for _, d := range by[k] {
			if !d.ok() {
				continue
			}
			st.OK++
			if d.ProducerOutlasted {
				st.UnderLoad++
			}
			drain = append(drain, d.DrainMs)
			for _, p := range d.Pods {
				if p.ProcessingGapMs != nil {
					gap = append(gap, *p.ProcessingGapMs)
				}
				total = append(total, p.TotalMs)
				down = append(down, p.DowntimeMs)
			}
		}
		st.Drain, st.Gap, st.GapPods, st.Total, st.Down = spreadOf(drain), spreadOf(gap), len(gap), spreadOf(total), spreadOf(down)
		out = append(out, st)
	}
	return out
}

// drainGoals: every drain ended by itself (exit 0) with every pod moved
// and exact.
func drainGoals(res drainResults) []paperGoal {
	drains, bad, pods, badPods := len(res.Drains), 0, 0, 0
	for _, d := range res.Drains {
		if !d.ok() {
			bad++
		}
		for _, p := range d.Pods {
			pods++
			if !p.ok() {
				badPods++
			}
		}
	}
	return []paperGoal{{Name: "every drain ends by itself with every consumer moved and exact",
		Target:   "kubectl drain exits 0; every pod off node 1 by its migration, its hash the producer's, no redelivery skipped",
		Measured: fmt.Sprintf("%d of %d drains failed; %d of %d pods not moved or not exact", bad, drains, badPods, pods),
		Verdict:  verdict(bad == 0 && drains > 0)}}
}

// drainCSV is one row per pod.
func drainCSV(drains []drainResult) []byte {
	var sb strings.Builder
	w := csv.NewWriter(&sb)
	_ = w.Write([]string{"round", "consumers", "limit", "drain_ms", "exit_code", "producer_outlasted", "app", "node", "strategy", "migration_total_ms", "migration_downtime_ms", "ended_ms",
		"processing_gap_ms", "produced", "count", "hash_ok", "skipped", "error"}) // into a strings.Builder, which cannot fail
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
	for _, d := range drains {
		if len(d.Pods) == 0 {
			_ = w.Write([]string{strconv.Itoa(d.Round), strconv.Itoa(d.Consumers), strconv.Itoa(d.Limit), f(d.DrainMs), strconv.Itoa(d.ExitCode), strconv.FormatBool(d.ProducerOutlasted), "", "", "", "", "", "", "", "", "", "", "", d.Error})
		}
		for _, p := range d.Pods {
			gap := ""
			if p.ProcessingGapMs != nil {
				gap = f(*p.ProcessingGapMs)
			}
			_ = w.Write([]string{strconv.Itoa(d.Round), strconv.Itoa(d.Consumers), strconv.Itoa(d.Limit), f(d.DrainMs), strconv.Itoa(d.ExitCode), strconv.FormatBool(d.ProducerOutlasted), p.App, p.Node, p.Strategy,
				f(p.TotalMs), f(p.DowntimeMs), f(p.EndedMs), gap, strconv.Itoa(p.Produced), strconv.Itoa(p.Count), strconv.FormatBool(p.HashOK), strconv.Itoa(p.Skipped), p.Error})
		}
	}
	w.Flush()
	return []byte(sb.String())
}

// drainMarkdown is the section for BENCHMARKS.md.
func drainMarkdown(res drainResults) string {
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	w("### Draining a node by migration, %s\n\n", res.Date.Format("2006-01-02"))
	w("- Command: `%s`; results: `results.csv` (one row per pod), `results.json` beside this section\n", res.Command)
	w("- Machine: %d CPUs, Linux %s, RabbitMQ %s, %s; %d nodes; %s\n", res.Machine.CPUs, res.Machine.Kernel, res.Machine.RabbitMQ, res.Machine.Go,
		res.Env.Nodes, (time.Duration(res.ElapsedSeconds) * time.Second).Round(time.Second))
	w("- N Go consumers (Deployments of one replica, %d ms per message, read-only root), each under a producer at %g msg/s, on node 1; once each has folded %d messages, `kubectl drain` of node 1 (`--ignore-daemonsets --delete-emptydir-data`, the consumers' pods by `--pod-selector`). ms2m runs as installed (webhook, agents, `migrator controller` with `MS2M_EVACUATE_PER_NODE` = `MS2M_EVACUATE_MAX` = the limit).\n",
		res.WorkMs, res.Rate, res.Warmup)
	w("- Drain: kubectl's own time, start to exit (it retries a refused eviction every 5 s). Processing gap: per pod, the longest time during the drain in which its consumer (source, then target) finished no message while one waited, from the consumers' journals. Migration: the controller's report of the pod's migration. Medians and p95 (nearest rank): the drain over its runs, the rest over every pod of the good drains. Under load: the producers still sent when the drain ended, so every consumer migrated with messages arriving.\n\n")
	w("| consumers | limit per node | good drains (under load) | drain (s) | drain p95 (s) | gap median (ms) | gap p95 (ms) | migration median (s) | migration p95 (s) | switch median (ms) |\n")
	w("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, st := range res.Summary {
		gap, gapP95 := "-", "-"
		if st.GapPods > 0 {
			gap, gapP95 = fmtMs0(st.Gap.Median), fmtMs0(st.Gap.P95)
		}
		w("| %d | %d | %d of %d (%d) | %s | %s | %s | %s | %s | %s | %s |\n", st.Consumers, st.Limit, st.OK, st.Drains, st.UnderLoad, fmtS(st.Drain.Median), fmtS(st.Drain.P95),
			gap, gapP95, fmtS(st.Total.Median), fmtS(st.Total.P95), fmtMs0(st.Down.Median))
	}
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

func writeDrain(o drainBenchOptions, res *drainResults) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", o.out, err)
	}
	// Two figures: against the consumers at the sweep's limit, and
	// against the limit at the sweep's count; the upper panel is the
	// drain's time, the lower one the median of its pods' gaps.
	var byCount, byLimit []paperplot.Run
	for _, d := range res.Drains {
		if !d.ok() {
			continue
		}
		var gaps []float64
		for _, p := range d.Pods {
			if p.ProcessingGapMs != nil {
				gaps = append(gaps, *p.ProcessingGapMs)
			}
		}
		pr := paperplot.Run{TotalS: d.DrainMs / 1000, DowntimeS: median(gaps) / 1000}
		if d.Limit == res.AtLimit {
			pr.Strategy, pr.Rate = fmt.Sprintf("limit-%d", d.Limit), float64(d.Consumers)
			byCount = append(byCount, pr)
		}
		if d.Consumers == res.AtCount {
			pr.Strategy, pr.Rate = fmt.Sprintf("%d-consumers", d.Consumers), float64(d.Limit)
			byLimit = append(byLimit, pr)
		}
	}
	y := paperplot.YLabels{Total: "kubectl drain (s)", Downtime: "processing gap per pod, median (ms)", Title: "drain time and processing gap"}
	res.Files = nil
	for _, fig := range []struct {
		runs []paperplot.Run
		name string
		x    paperplot.Axis
	}{
		{byCount, fmt.Sprintf("limit-%d", res.AtLimit), paperplot.Axis{Name: "consumers", Label: "consumers on the drained node"}},
		{byLimit, fmt.Sprintf("%d-consumers", res.AtCount), paperplot.Axis{Name: "limit", Label: "evacuations under way per node (MS2M_EVACUATE_PER_NODE)"}},
	} {
		files, err := paperplot.Write(o.out, fig.runs, paperplot.Options{Strategies: []string{fig.name}, X: fig.x, Y: y, Stacked: []string{}})
		if err != nil {
			return err
		}
		res.Files = append(res.Files, files...)
	}
	return writeResults(o.out, "drain", drainCSV(res.Drains), *res, drainMarkdown(*res), res.Goals, len(res.Files))
}

// drainAgain writes the outputs of an earlier run from its results.json.
func drainAgain(o drainBenchOptions) error {
	var res drainResults
	if err := readResults(o.from, &res); err != nil {
		return err
	}
	res.Summary = drainSummary(res.Drains)
	res.Goals = drainGoals(res)
	return writeDrain(o, &res)
}

// mainDrain runs the drain subcommand.
func mainDrain(args []string) { runSubcommand("drain", args, parseDrainFlags, runDrainBench) }
