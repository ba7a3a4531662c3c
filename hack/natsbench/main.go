package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The paths a consumer drains by.
const (
	pathDirect  = "direct"  // straight from the server
	pathRelay   = "relay"   // through a plain TCP relay (relay.go): the floor of any proxy
	pathSidecar = "sidecar" // through a serving (source) sidecar
	pathReplay  = "replay"  // replayed by a target sidecar from the log
)

type options struct {
	server    string
	serverPID int
	// logServer, when set, holds the sidecars' replay logs instead of
	// server: it tells the server's cost of the log from the rest.
	logServer    string
	logServerPID int
	messages     int
	size         int
	rounds       int
	windows      []int
	batch        int
	paths        []string
	work         time.Duration
	spin         time.Duration
	chunk        int
	out          string
	report       string
	// pubCost runs -pubcost instead of the drains.
	pubCost      bool
	pubCostSizes string
	pubCostBytes int
	argv         []string
}

// result is one round of one path.
type result struct {
	Path     string `json:"path"`
	Window   int    `json:"window"` // the consumer's max_ack_pending
	Batch    int    `json:"batch"`  // the pull batch; 0: nats.go's default (500)
	Work     string `json:"work"`   // sleep per message before its ack
	Spin     string `json:"spin"`   // CPU work (a busy loop) per message before its ack
	Round    int    `json:"round"`
	Messages int    `json:"messages"`
	// Seconds runs from the consumer's Consume call to its last ack.
	Seconds float64 `json:"seconds"`
	MsgPerS float64 `json:"msgPerSecond"`
	// ChunkMs is how long each chunk of messages took, in order.
	ChunkMs []float64 `json:"chunkMs"`
	// Load1 is the machine's 1-minute load average as the round began.
	Load1 float64 `json:"load1"`
	// CPU time per message over the drain, in µs: the bench process (the
	// consumer and, on the sidecar paths, the sidecar) and the nats-server
	// (0: not found; /proc's 10 ms steps).
	BenchCPUUs  float64 `json:"benchCpuUsPerMsg"`
	ServerCPUUs float64 `json:"serverCpuUsPerMsg"`
	// LogServerCPUUs is the -log-server's, when the log is on one of its
	// own (0: none, or not found).
	LogServerCPUUs float64 `json:"logServerCpuUsPerMsg,omitempty"`
	// Sidecar rounds: acks that waited for the log, log writes and records.
	AcksWaited uint64 `json:"acksWaited,omitempty"`
	LogWrites  uint64 `json:"logWrites,omitempty"`
	LogRecords uint64 `json:"logRecords,omitempty"`
	// Replay rounds: the rate counted from the call that starts the target
	// sidecar (which opens the log and reads it) to the last ack.
	SecondsFromStart float64 `json:"secondsFromStart,omitempty"`
	MsgPerSFromStart float64 `json:"msgPerSecondFromStart,omitempty"`
}

// key names the setting a result belongs to.
func (r result) key() string {
	b := "nats.go's default (500)"
	if r.Batch > 0 {
		b = fmt.Sprint(r.Batch)
	}
	return fmt.Sprintf("max_ack_pending %d, pull batch %s, per message: sleep %s, CPU work %s", r.Window, b, r.Work, r.Spin)
}

// report is what -out writes.
type report struct {
	Command   string    `json:"command"`
	Started   time.Time `json:"started"`
	Finished  time.Time `json:"finished"`
	Server    string    `json:"server"`
	LogServer string    `json:"logServer,omitempty"`
	Body      int       `json:"bodyBytes"`
	LoadStart float64   `json:"load1AtStart"`
	LoadEnd   float64   `json:"load1AtEnd"`
	Results   []result  `json:"results"`
}

func main() {
	o, cpuprofile, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "natsbench:", err)
		os.Exit(2)
	}
	stopProfile, err := startProfile(cpuprofile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "natsbench:", err)
		os.Exit(2)
	}
	defer stopProfile()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch {
	case o.report != "":
		err = printReport(o.report)
	case o.pubCost:
		err = pubCost(ctx, o)
	default:
		err = run(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "natsbench:", err)
		stop()
		os.Exit(1) // the deferred profile stop is skipped: a failed run needs no profile
	}
}

// parseFlags reads the command line: the options, and where to write a
// CPU profile of the whole run ("": none).
func parseFlags(args []string) (options, string, error) {
	o := options{argv: args}
	var windows, paths string
	fs := flag.NewFlagSet("natsbench", flag.ContinueOnError)
	fs.StringVar(&o.server, "server", "127.0.0.1:4222", "the NATS server (host:port), with JetStream")
	fs.IntVar(&o.serverPID, "server-pid", 0, "the NATS server's PID, for its CPU time; 0: the one process named nats-server (none measured if there are several)")
	fs.StringVar(&o.logServer, "log-server", "", "another NATS server (host:port), with JetStream, for the sidecars' replay logs; empty: -server. With it, -server's CPU leaves out what the log costs a server")
	fs.IntVar(&o.logServerPID, "log-server-pid", 0, "the -log-server's PID, for its CPU time (0: none measured)")
	fs.IntVar(&o.messages, "messages", 30000, "messages per drain")
	fs.IntVar(&o.size, "size", 100, "message body size in bytes")
	fs.IntVar(&o.rounds, "rounds", 5, "rounds per window")
	fs.StringVar(&windows, "windows", "1000", "ack windows (the consumer's max_ack_pending; 1000 is the server's default), comma-separated")
	fs.IntVar(&o.batch, "batch", 0, "the pull batch (Consume's PullMaxMessages); 0: nats.go's default, 500")
	fs.StringVar(&paths, "paths", "direct,sidecar,replay", "the paths each round drains by, in this order: direct, relay (a plain TCP relay, no parsing or log: the floor of any proxy), sidecar (a source sidecar that writes the replay log), replay (a target sidecar replaying that log)")
	fs.DurationVar(&o.work, "work", 0, "time the consumer sleeps on each message before its ack (0: ack at once, the worst case for the sidecar); Go sleeps at least about 1 ms when the process is otherwise idle")
	fs.DurationVar(&o.spin, "spin", 0, "CPU time the consumer spends on each message (a busy loop) before its ack")
	fs.IntVar(&o.chunk, "chunk", 1000, "messages per chunk for the p95 time per chunk")
	fs.StringVar(&o.out, "out", "", "write the raw results as JSON here")
	fs.StringVar(&o.report, "report", "", "run nothing: print the tables of the results in this JSON file (one that -out wrote)")
	fs.BoolVar(&o.pubCost, "pubcost", false, "run no drains: measure the -server's CPU for storing -pubcost-bytes in JetStream messages of each of -pubcost-sizes, pipelined and one at a time (needs -server-pid)")
	fs.StringVar(&o.pubCostSizes, "pubcost-sizes", "270,2700,24000,100000", "-pubcost's message sizes in bytes, comma-separated")
	fs.IntVar(&o.pubCostBytes, "pubcost-bytes", 27<<20, "-pubcost's bytes per size and mode")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run here")
	if err := fs.Parse(args); err != nil {
		return o, "", err
	}
	var err error
	if o.windows, err = parseWindows(windows); err != nil {
		return o, "", fmt.Errorf("-windows=%w", err)
	}
	if o.paths, err = parsePaths(paths); err != nil {
		return o, "", err
	}
	if o.messages <= 0 || o.rounds <= 0 || o.chunk <= 0 || o.size < 0 || o.batch < 0 || o.work < 0 || o.spin < 0 {
		return o, "", errors.New("-messages, -rounds and -chunk must be positive, -size, -batch, -work and -spin not negative")
	}
	return o, *cpuprofile, nil
}

// startProfile starts a CPU profile into the file path (none for ""),
// and returns what stops it.
func startProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close() // a profile cut short is still worth reading
	}, nil
}

// load1 is the machine's 1-minute load average (0 if unreadable).
func load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	l, err := parseLoad(string(b))
	if err != nil {
		return 0
	}
	return l
}

func run(ctx context.Context, o options) error {
	url := "nats://" + o.server
	admin, err := nats.Connect(url, nats.Name("natsbench-admin"))
	if err != nil {
		return fmt.Errorf("connect to %s (make setup starts nats-server): %w", url, err)
	}
	defer admin.Close()
	js, err := jetstream.New(admin)
	if err != nil {
		return err
	}
	b := &bench{o: o, url: url, logURL: url, js: js, serverPID: o.serverPID}
	if b.serverPID == 0 {
		b.serverPID = findProcess("nats-server")
	}
	if o.logServer != "" {
		b.logURL = "nats://" + o.logServer
	}
	rep := report{
		Command: "go run ./hack/natsbench " + strings.Join(o.argv, " "), Started: time.Now().UTC(),
		Server: o.server, LogServer: o.logServer, Body: o.size, LoadStart: load1(),
	}
	fmt.Printf("%d messages of %d bytes per drain, %d rounds, paths %s, per message a sleep of %s and CPU work of %s, server %s (PID %d), load %.2f\n",
		o.messages, o.size, o.rounds, strings.Join(o.paths, ","), o.work, o.spin, o.server, b.serverPID, rep.LoadStart)
	for _, w := range o.windows {
		for round := 1; round <= o.rounds; round++ {
			rs, err := b.round(ctx, w, round)
			if err != nil {
				return fmt.Errorf("max_ack_pending %d, round %d: %w", w, round, err)
			}
			rep.Results = append(rep.Results, rs...)
		}
	}
	rep.Finished, rep.LoadEnd = time.Now().UTC(), load1()
	printTables(rep, o.paths)
	if o.out == "" {
		return nil
	}
	out, err := json.MarshalIndent(rep, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(o.out, append(out, '\n'), 0o644)
}

// printReport prints the tables of the results in the JSON file path.
func printReport(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	fmt.Printf("%s\n%s to %s\n", rep.Command, rep.Started.Format(time.RFC3339), rep.Finished.Format(time.RFC3339))
	printTables(rep, []string{pathDirect, pathRelay, pathSidecar, pathReplay})
	return nil
}

// printTables prints the load averages of rep and a table per setting.
func printTables(rep report, paths []string) {
	lo, hi := rep.LoadStart, rep.LoadStart
	for _, r := range rep.Results {
		lo, hi = min(lo, r.Load1), max(hi, r.Load1)
	}
	fmt.Printf("\nload average (1 min) %.2f at the start, %.2f at the end, %.2f–%.2f at the rounds' starts\n", rep.LoadStart, rep.LoadEnd, lo, hi)
	seen := map[string]bool{}
	for _, r := range rep.Results {
		if k := r.key(); !seen[k] {
			seen[k] = true
			fmt.Println()
			fmt.Print(markdownTable(k, summarize(rep.Results, k, paths)))
		}
	}
}
