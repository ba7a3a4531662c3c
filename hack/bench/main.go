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
	"strings"
	"syscall"
	"time"
)

// options are the command line.
type options struct {
	quick      bool
	rounds     int
	msgs       int           // messages per throughput run at prefetch 100
	msgsP1     int           // messages per throughput run at prefetch 1
	duration   time.Duration // measured time per latency round
	out        string
	cpuProfile string
	amqpURL    string
	streamURI  string
	command    string // the command as typed, for the report
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go run ./hack/bench [flags]\n\nDirect-to-broker against through-the-sidecar, side by side. Flags:")
		fs.PrintDefaults()
	}
	fs.BoolVar(&o.quick, "quick", false, "smoke run: 2000/500 messages, 2s latency rounds, 1 round (flags set explicitly still win)")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds per case; each round runs direct, then through the sidecar")
	fs.IntVar(&o.msgs, "msgs", 20000, "messages per throughput run at prefetch 100")
	fs.IntVar(&o.msgsP1, "msgs-p1", 5000, "messages per throughput run at prefetch 1")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured time per latency round, after a 0.5s warm-up")
	fs.StringVar(&o.out, "out", filepath.Join("out", "bench", "sidecar.json"), "where to write the raw results as JSON")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run (clients and sidecar) to this file")
	fs.StringVar(&o.amqpURL, "amqp", "amqp://guest:guest@127.0.0.1:5672/", "the broker's AMQP URL")
	fs.StringVar(&o.streamURI, "stream-uri", "rabbitmq-stream://guest:guest@127.0.0.1:5552/", "the broker's stream URI, for the sidecar's replay log")
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
	}
	if o.rounds < 1 || o.msgs < 1 || o.msgsP1 < 1 || o.duration < latencyRateInterval {
		return o, errors.New("-rounds, -msgs and -msgs-p1 must be at least 1, and -duration at least 1ms")
	}
	o.command = strings.TrimSpace("go run ./hack/bench " + strings.Join(args, " "))
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills at once, skipping the clean-up
	}()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
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
	defer func() {
		if ctx.Err() != nil {
			progress("interrupted: deleting what the bench created (Ctrl-C again to skip)")
		}
		err = errors.Join(err, b.close())
	}()

	for _, tc := range []struct{ prefetch, msgs int }{{100, o.msgs}, {1, o.msgsP1}} {
		t, err := b.throughput(ctx, tc.prefetch, tc.msgs)
		if err != nil {
			return err
		}
		res.Throughput = append(res.Throughput, t)
	}
	lat, err := b.latency(ctx, o.duration)
	if err != nil {
		return err
	}
	res.Latency = lat
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

func writeJSON(path string, res results) error {
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
