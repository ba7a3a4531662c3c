package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The parts of the bench, in the order they run.
const (
	partOverhead = "overhead" // sidecar overhead: throughput and latency, direct against sidecar
	partReplay   = "replay"   // replay throughput against direct
	partHandover = "handover" // handover downtime and exactness
)

var allParts = []string{partOverhead, partReplay, partHandover, partCRIU, partStrategies}

// options are the command line.
type options struct {
	parts      []string // which parts run, in allParts order
	quick      bool
	rounds     int
	msgs       int           // messages per throughput run at prefetch 100
	msgsP1     int           // messages per throughput run at prefetch 1
	duration   time.Duration // measured time per latency round
	replayMsgs int           // records per replay throughput run
	// handover part
	handoverRounds int
	handoverRates  []float64 // msg/s
	handoverWarmup time.Duration
	handoverMaxLag uint64
	nodes          nodeOptions // the criu and strategies parts (nodes.go)
	out            string
	cpuProfile     string
	amqpURL        string
	streamURI      string
	command        string // the command as typed, for the report
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go -C hack/bench run . [flags]\n\nWhat the sidecar costs (direct against through the sidecar), how fast a target replays (against direct), and how long a handover stops the flow; on a local cluster of real nodes, checkpoint and restore against memory (beside raw CRIU) and ms2m against stop-and-copy. Flags:")
		fs.PrintDefaults()
	}
	only := fs.String("only", strings.Join(allParts, ","), "comma-separated parts to run: overhead (sidecar throughput and latency), replay (replay throughput), handover (handover downtime), criu (checkpoint and restore against memory, on a local cluster and with raw CRIU), strategies (ms2m against stop-and-copy on a local cluster)")
	fs.BoolVar(&o.quick, "quick", false, "smoke run: 2000/500/2000 messages, 2s latency rounds, 1 round, 1 handover round per rate after 3s (flags set explicitly still win)")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds per overhead and replay case; each round runs direct, then through the sidecar (or the replay)")
	fs.IntVar(&o.msgs, "msgs", 20000, "messages per throughput run at prefetch 100")
	fs.IntVar(&o.msgsP1, "msgs-p1", 5000, "messages per throughput run at prefetch 1")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured time per latency round, after a 0.5s warm-up")
	fs.IntVar(&o.replayMsgs, "replay-msgs", 20000, "records in the replay log, and messages in the direct queue, per replay throughput run")
	fs.IntVar(&o.handoverRounds, "handover-rounds", 5, "handovers per rate")
	rates := fs.String("handover-rates", "4,10,16", "comma-separated producer rates for the handover part, msg/s (the consumers process 20 msg/s)")
	fs.DurationVar(&o.handoverWarmup, "handover-warmup", 5*time.Second, "how long source and target run before each handover")
	fs.Uint64Var(&o.handoverMaxLag, "handover-max-lag", 0, "the target's replay lag at which the handover stops the source")
	fs.StringVar(&o.out, "out", "", "where to write the raw results as JSON (default out/bench/sidecar.json, or out/bench/sidecar-<parts>.json when -only leaves a part out)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run (clients and sidecar) to this file")
	fs.StringVar(&o.amqpURL, "amqp", "amqp://guest:guest@127.0.0.1:5672/", "the broker's AMQP URL")
	fs.StringVar(&o.streamURI, "stream-uri", "rabbitmq-stream://guest:guest@127.0.0.1:5552/", "the broker's stream URI, for the sidecar's replay log")
	nodeFlags := registerNodeFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q: every setting is a flag (see -h)", fs.Args())
	}
	if o.quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["rounds"] {
			o.rounds = 1
		}
		if !set["msgs"] {
			o.msgs = 2000
		}
		if !set["msgs-p1"] {
			o.msgsP1 = 500
		}
		if !set["duration"] {
			o.duration = 2 * time.Second
		}
		if !set["replay-msgs"] {
			o.replayMsgs = 2000
		}
		if !set["handover-rounds"] {
			o.handoverRounds = 1
		}
		if !set["handover-warmup"] {
			o.handoverWarmup = 3 * time.Second
		}
	}
	if o.rounds < 1 || o.msgs < 1 || o.msgsP1 < 1 || o.replayMsgs < 1 || o.handoverRounds < 1 || o.duration < latencyRateInterval {
		return o, errors.New("-rounds, -msgs, -msgs-p1, -replay-msgs and -handover-rounds must be at least 1, and -duration at least 1ms")
	}
	if o.handoverWarmup <= 0 || o.handoverWarmup > 10*time.Minute {
		return o, fmt.Errorf("-handover-warmup=%s: want more than 0 and at most 10m", o.handoverWarmup)
	}
	var err error
	if o.nodes, err = nodeFlags.options(fs, o.quick); err != nil {
		return o, err
	}
	if o.parts, err = parseParts(*only); err != nil {
		return o, err
	}
	if o.handoverRates, err = parseRates(*rates); err != nil {
		return o, err
	}
	if o.out == "" {
		name := "sidecar.json"
		if len(o.parts) < len(allParts) {
			name = "sidecar-" + strings.Join(o.parts, "-") + ".json"
		}
		o.out = filepath.Join("out", "bench", name)
	}
	o.command = strings.TrimSpace("go -C hack/bench run . " + strings.Join(args, " "))
	return o, nil
}

// parseParts reads -only.
func parseParts(s string) ([]string, error) {
	want := map[string]bool{}
	for p := range strings.SplitSeq(s, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(allParts, p) {
			return nil, fmt.Errorf("-only=%q: unknown part %q; want a comma-separated list of %s", s, p, strings.Join(allParts, ", "))
		}
		want[p] = true
	}
	var parts []string
	for _, p := range allParts {
		if want[p] {
			parts = append(parts, p)
		}
	}
	return parts, nil
}

// parseRates reads -handover-rates. A rate must stay below what the
// consumers process, else the queue and the replay lag only grow.
func parseRates(s string) ([]float64, error) {
	var rates []float64
	for f := range strings.SplitSeq(s, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r <= 0 || r >= float64(handoverServiceRate) {
			return nil, fmt.Errorf("-handover-rates=%q: %q is not a rate above 0 and below %g msg/s, what the consumers process", s, f, float64(handoverServiceRate))
		}
		rates = append(rates, r)
	}
	return rates, nil
}

// runs reports whether part is selected.
func (o options) runs(part string) bool { return slices.Contains(o.parts, part) }

func main() {
	if err := enterRepo(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(2)
	}
	if len(os.Args) > 1 && os.Args[1] == "drain" {
		mainDrain(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "memory" {
		mainMemory(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "paper" {
		mainPaper(os.Args[2:])
		return
	}
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signalContext()
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// benchModule is this module's path. The bench runs from the repository's
// root, as `make bench` and `go -C hack/bench run .` start it from this
// module's folder.
const benchModule = "github.com/ms2m/ms2m/hack/bench"

// enterRepo moves to the repository's root when the bench was started in
// its own module's folder (go -C hack/bench run .), so that relative paths
// (out/, BENCHMARKS.md, -from, -out) and the builds it runs mean what they
// mean from the root, where `make bench` and the docs start it.
func enterRepo() error {
	b, err := os.ReadFile("go.mod")
	if err != nil || modfile(b) != benchModule {
		return nil // started elsewhere: paths are the caller's
	}
	if err := os.Chdir(filepath.Join("..", "..")); err != nil {
		return fmt.Errorf("move to the repository's root from hack/bench: %w", err)
	}
	return nil
}

// modfile is the module path a go.mod declares, or "".
func modfile(gomod []byte) string {
	for line := range strings.Lines(string(gomod)) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return f[1]
		}
	}
	return ""
}

// signalContext is cancelled on the first Ctrl-C or SIGTERM; a second one
// kills at once, skipping the clean-up.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	return ctx, stop
}

// mainPaper runs the paper subcommand (paper.go).
func mainPaper(args []string) { runSubcommand("paper", args, parsePaperFlags, runPaper) }

// runSubcommand parses a subcommand's flags and runs it under
// signalContext: bad flags exit 2, a failed run 1, -h 0.
func runSubcommand[O any](name string, args []string, parse func([]string) (O, error), run func(context.Context, O) error) {
	o, err := parse(args)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", name, err)
		os.Exit(2)
	}
	ctx, stop := signalContext()
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", name, err)
		os.Exit(1)
	}
}

// readResults reads an earlier run's results.json (-from) into res.
func readResults(from string, res any) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return fmt.Errorf("-from: %w", err)
	}
	if err := json.Unmarshal(b, res); err != nil {
		return fmt.Errorf("-from=%s: %w", from, err)
	}
	return nil
}

// writeResults writes a run's files into out (results.csv, results.json
// and the section as the bench wrote it, section.md) and prints its goals.
func writeResults(out, name string, csv []byte, res any, section string, goals []paperGoal, figures int) error {
	if err := os.WriteFile(filepath.Join(out, "results.csv"), csv, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Join(out, "results.csv"), err)
	}
	if err := writeJSON(filepath.Join(out, "results.json"), res); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "section.md"), []byte(section), 0o644); err != nil {
		return err
	}
	progress(name+": results written", "out", out, "figures", figures)
	for _, g := range goals {
		fmt.Printf("%s %s: %s (target %s)\n", g.Verdict, g.Name, g.Measured, g.Target)
	}
	return nil
}

func run(ctx context.Context, o options) (err error) {
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("create the CPU profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("start the CPU profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	start := time.Now()
	res := results{Date: start.UTC(), Command: o.command, Settings: settingsOf(o)}
	b, err := newBench(ctx, o)
	if err != nil {
		return err
	}
	defer b.closeWith(ctx, &err)

	nodes := newNodeLab(o.nodes)
	defer func() { err = errors.Join(err, nodes.down()) }()

	res.PartSeconds = map[string]float64{}
	timed := func(part string, f func() error) error {
		if !o.runs(part) {
			return nil
		}
		t0 := time.Now()
		err := f()
		res.PartSeconds[part] = time.Since(t0).Seconds()
		progress("part done", "part", part, "took", time.Since(t0).Round(100*time.Millisecond))
		return err
	}
	err = timed(partOverhead, func() error {
		for _, tc := range []struct{ prefetch, msgs int }{{100, o.msgs}, {1, o.msgsP1}} {
			t, err := b.throughput(ctx, tc.prefetch, tc.msgs)
			if err != nil {
				return err
			}
			res.Throughput = append(res.Throughput, t)
		}
		lat, err := b.latency(ctx, o.duration)
		res.Latency = lat
		return err
	})
	if err != nil {
		return err
	}
	err = timed(partReplay, func() error {
		var err error
		res.Replay, err = b.replayThroughput(ctx, o.replayMsgs)
		return err
	})
	if err != nil {
		return err
	}
	err = timed(partHandover, func() error {
		var err error
		res.Handover, err = b.handover(ctx)
		return err
	})
	if err != nil {
		return err
	}
	err = timed(partCRIU, func() error {
		var err error
		res.CRIU, err = nodes.criu(ctx)
		return err
	})
	if err != nil {
		return err
	}
	err = timed(partStrategies, func() error {
		var err error
		res.Strategies, err = nodes.strategies(ctx, b)
		return err
	})
	if err != nil {
		return err
	}
	res.Machine = machineInfo(ctx, b.serverVersion)
	res.ElapsedSeconds = time.Since(start).Seconds()
	res.Goals = goals(res)

	if err := writeJSON(o.out, res); err != nil {
		return err
	}
	progress("raw results written", "file", o.out)
	fmt.Print(markdown(res))
	return nil
}

func writeJSON(path string, res any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create the folder for %s: %w", path, err)
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write the raw results: %w", err)
	}
	return nil
}

// progress prints one line of progress to stderr: a message, then key=value
// pairs.
func progress(msg string, kv ...any) {
	var sb strings.Builder
	sb.WriteString("bench: ")
	sb.WriteString(msg)
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&sb, " %v=%v", kv[i], kv[i+1])
	}
	fmt.Fprintln(os.Stderr, sb.String())
}
