package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/ms2m/ms2m/internal/natsproxy"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

type options struct {
	server   string
	messages int
	size     int
	rounds   int
	windows  []int
	out      string
	maxBatch int
	work     time.Duration
}

// result is one round of one path.
type result struct {
	Path     string  `json:"path"` // direct or sidecar
	Window   int     `json:"window"`
	Round    int     `json:"round"`
	Messages int     `json:"messages"`
	Seconds  float64 `json:"seconds"`
	MsgPerS  float64 `json:"msgPerSecond"`
	// Sidecar rounds only.
	AcksWaited uint64 `json:"acksWaited,omitempty"`
	LogWrites  uint64 `json:"logWrites,omitempty"`
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
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "natsbench:", err)
		stop()
		os.Exit(1) // the deferred profile stop is skipped: a failed run needs no profile
	}
}

// parseFlags reads the command line: the options, and where to write a
// CPU profile of the whole run ("": none).
func parseFlags(args []string) (options, string, error) {
	var o options
	var windows string
	fs := flag.NewFlagSet("natsbench", flag.ContinueOnError)
	fs.StringVar(&o.server, "server", "127.0.0.1:4222", "the NATS server (host:port), with JetStream")
	fs.IntVar(&o.messages, "messages", 30000, "messages per drain")
	fs.IntVar(&o.size, "size", 100, "message body size in bytes")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds per path and window")
	fs.StringVar(&windows, "windows", "100,1000", "ack windows (the consumer's max_ack_pending and the pull batch), comma-separated")
	fs.StringVar(&o.out, "out", "", "write the raw results as JSON here")
	fs.DurationVar(&o.work, "work", 0, "time the consumer spends on each message before its ack (a sleep; 0: ack at once, the worst case for the sidecar)")
	fs.IntVar(&o.maxBatch, "max-batch", 0, "records per replay log write (the Tee's MaxBatch; 0: its default)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run here")
	if err := fs.Parse(args); err != nil {
		return o, "", err
	}
	for _, w := range splitInts(windows) {
		if w <= 0 {
			return o, "", fmt.Errorf("-windows=%q: want positive numbers", windows)
		}
		o.windows = append(o.windows, w)
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

func splitInts(s string) []int {
	var out []int
	var n int
	have := false
	for _, c := range s + "," {
		switch {
		case c >= '0' && c <= '9':
			n, have = n*10+int(c-'0'), true
		case c == ',':
			if have {
				out = append(out, n)
			} else {
				out = append(out, 0)
			}
			n, have = 0, false
		default:
			return []int{0}
		}
	}
	return out
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
	var results []result
	fmt.Printf("%d messages of %d bytes per drain, %d rounds, %s of work per message, server %s\n", o.messages, o.size, o.rounds, o.work, o.server)
	for _, w := range o.windows {
		for round := 1; round <= o.rounds; round++ {
			for _, path := range []string{"direct", "sidecar"} {
				r, err := drain(ctx, js, url, o, path, w)
				if err != nil {
					return fmt.Errorf("window %d round %d, %s: %w", w, round, path, err)
				}
				r.Round = round
				fmt.Printf("window %5d round %d %-8s %9.0f msg/s  (acks that waited on the log %d, log writes %d)\n", w, round, path, r.MsgPerS, r.AcksWaited, r.LogWrites)
				results = append(results, r)
			}
		}
	}
	fmt.Println()
	fmt.Println("| ack window | direct (msg/s) | sidecar (msg/s) | ratio of the medians | median of the round ratios | round ratios |")
	fmt.Println("|---:|---:|---:|---:|---:|---|")
	for _, w := range o.windows {
		var d, s, ratios []float64
		var per string
		for i := 0; i+1 < len(results); i += 2 {
			if results[i].Window == w {
				d = append(d, results[i].MsgPerS)
				s = append(s, results[i+1].MsgPerS)
				ratios = append(ratios, results[i+1].MsgPerS/results[i].MsgPerS)
				per += fmt.Sprintf("%.1f%% ", 100*results[i+1].MsgPerS/results[i].MsgPerS)
			}
		}
		md, ms := median(d), median(s)
		fmt.Printf("| %d | %.0f | %.0f | %.1f%% | %.1f%% | %s|\n", w, md, ms, 100*ms/md, 100*median(ratios), per)
	}
	if o.out != "" {
		b, err := json.MarshalIndent(results, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.out, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// drain fills a fresh stream and drains it once through path.
func drain(ctx context.Context, js jetstream.JetStream, url string, o options, path string, window int) (res result, err error) {
	name := fmt.Sprintf("natsbench-%d", time.Now().UnixNano())
	subject := name + ".in"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.FileStorage}); err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, js.DeleteStream(context.WithoutCancel(ctx), name)) }()
	body := make([]byte, o.size)
	for range o.messages {
		if _, err := js.PublishAsync(subject, body, jetstream.WithStallWait(time.Minute)); err != nil {
			return res, err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return res, ctx.Err()
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
		Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: window, AckWait: time.Minute,
	}); err != nil {
		return res, err
	}

	appURL := url
	var proxy *natsproxy.Proxy
	var tee *shadowqueue.Tee
	if path == "sidecar" {
		logName := name + "-log"
		jl, err := shadowqueue.OpenJetStream(ctx, shadowqueue.JetStreamOptions{URL: url, Name: logName, MaxAge: time.Hour})
		if err != nil {
			return res, err
		}
		defer func() {
			err = errors.Join(err, jl.Close(), shadowqueue.DeleteJetStream(context.WithoutCancel(ctx), url, logName))
		}()
		tee = shadowqueue.NewTee(jl, shadowqueue.Record{}, shadowqueue.TeeOptions{MaxBatch: o.maxBatch})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return res, err
		}
		proxy = natsproxy.New(tee, natsproxy.Options{Upstream: o.server, Logger: slog.New(slog.DiscardHandler)})
		runCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }()
		wg.Go(func() { _ = tee.Run(runCtx) })
		wg.Go(func() { _ = proxy.Serve(runCtx, ln) })
		appURL = "nats://" + ln.Addr().String()
	}

	nc, err := nats.Connect(appURL, nats.Name("natsbench-app"))
	if err != nil {
		return res, err
	}
	defer nc.Close()
	ajs, err := jetstream.New(nc)
	if err != nil {
		return res, err
	}
	cons, err := ajs.Consumer(ctx, name, "bench")
	if err != nil {
		return res, err
	}
	done := make(chan struct{})
	var count int
	start := time.Now()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if o.work > 0 {
			time.Sleep(o.work)
		}
		if err := m.Ack(); err != nil {
			return
		}
		count++
		if count == o.messages {
			close(done)
		}
	}, jetstream.PullMaxMessages(window))
	if err != nil {
		return res, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		cc.Stop()
		return res, ctx.Err()
	case <-time.After(5 * time.Minute):
		cc.Stop()
		return res, fmt.Errorf("drained %d of %d messages in 5 minutes", count, o.messages)
	}
	elapsed := time.Since(start)
	cc.Stop()
	res = result{Path: path, Window: window, Messages: o.messages, Seconds: elapsed.Seconds(), MsgPerS: float64(o.messages) / elapsed.Seconds()}
	if proxy != nil {
		res.AcksWaited = proxy.Stats().AcksWaited
		res.LogWrites = tee.Status().Writes
	}
	return res, nil
}
