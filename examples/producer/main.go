package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/examples/internal/hashchain"
)

type config struct {
	url      string
	queue    string
	rate     float64 // messages per second; 0 means as fast as possible
	count    int
	start    int
	declare  bool
	bodySize int
}

// result is the one JSON line printed to stdout at the end.
type result struct {
	Count int    `json:"count"`
	First int    `json:"first"`
	Last  int    `json:"last"`
	Hash  string `json:"hash"`
}

func main() {
	cfg, err := parseConfig(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, log); err != nil {
		log.Error("producer failed", "err", err)
		os.Exit(1)
	}
}

// parseConfig reads flags; a flag that is not on the command line takes its
// value from its environment variable, if that is set and not empty.
func parseConfig(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("producer", flag.ContinueOnError)
	fs.StringVar(&cfg.url, "url", "amqp://guest:guest@127.0.0.1:5672/", "broker URL (env AMQP_URL)")
	fs.StringVar(&cfg.queue, "queue", "orders", "queue to publish to, via the default exchange (env QUEUE)")
	fs.Float64Var(&cfg.rate, "rate", 10, "messages per second; 0 publishes as fast as possible (env RATE)")
	fs.IntVar(&cfg.count, "count", 100, "number of messages (env COUNT)")
	fs.IntVar(&cfg.start, "start", 1, "number of the first message (env START)")
	fs.BoolVar(&cfg.declare, "declare", true, "declare the queue as durable before publishing (env DECLARE)")
	fs.IntVar(&cfg.bodySize, "body-size", 0, "bytes of padding appended to each body (env BODY_SIZE)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: producer [flags]\n\n"+
			"Publishes -count persistent messages with bodies msg-<n>, waits for publisher\n"+
			"confirms, and prints {\"count\",\"first\",\"last\",\"hash\"} as one JSON line.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	for _, fe := range []struct{ flag, env string }{
		{"url", "AMQP_URL"}, {"queue", "QUEUE"}, {"rate", "RATE"}, {"count", "COUNT"},
		{"start", "START"}, {"declare", "DECLARE"}, {"body-size", "BODY_SIZE"},
	} {
		v, ok := os.LookupEnv(fe.env)
		if !ok || v == "" || onCommandLine[fe.flag] {
			continue
		}
		if err := fs.Set(fe.flag, v); err != nil {
			return cfg, fmt.Errorf("environment variable %s=%q: %w", fe.env, v, err)
		}
	}
	switch {
	case cfg.rate < 0 || math.IsNaN(cfg.rate) || math.IsInf(cfg.rate, 0):
		return cfg, fmt.Errorf("-rate %v: want a finite number >= 0", cfg.rate)
	case cfg.count < 0:
		return cfg, fmt.Errorf("-count %d: want >= 0", cfg.count)
	case cfg.bodySize < 0:
		return cfg, fmt.Errorf("-body-size %d: want >= 0", cfg.bodySize)
	}
	return cfg, nil
}

// confirmBatch is how many publishes may await their confirms before the
// producer stops to wait for them: about 100 ms worth of messages at the
// configured rate, so confirms never hold back the pace.
func confirmBatch(rate float64) int {
	if rate == 0 {
		return 100
	}
	return int(min(100, max(1, math.Ceil(rate/10))))
}

func run(ctx context.Context, cfg config, stdout io.Writer, log *slog.Logger) error {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("ms2m-example-producer")
	conn, err := amqp.DialConfig(cfg.url, amqp.Config{Properties: props})
	if err != nil {
		return fmt.Errorf("connect to %s: %w (is RabbitMQ running?)", redact(cfg.url), err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel on %s: %w", redact(cfg.url), err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	// A message that no queue takes comes back as basic.return before its
	// confirm. The buffer holds a whole batch: the client delivers returns
	// synchronously, so a full buffer would stall it.
	returns := ch.NotifyReturn(make(chan amqp.Return, 100))
	if cfg.declare {
		if _, err := ch.QueueDeclare(cfg.queue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare queue %q: %w", cfg.queue, err)
		}
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("enable publisher confirms: %w", err)
	}

	var tick <-chan time.Time
	if cfg.rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / cfg.rate))
		defer t.Stop()
		tick = t.C
	}
	batch := confirmBatch(cfg.rate)
	pending := make([]*amqp.DeferredConfirmation, 0, batch)
	pendingFrom := cfg.start // message number of pending[0]
	waitConfirms := func() error {
		for i, dc := range pending {
			ok, err := dc.WaitContext(ctx)
			if err != nil {
				return fmt.Errorf("wait for confirm of message %d: %w", pendingFrom+i, err)
			}
			if !ok {
				select {
				case e := <-closed:
					return fmt.Errorf("channel closed before message %d was confirmed: %v", pendingFrom+i, e)
				default:
					return fmt.Errorf("broker nacked message %d on queue %q", pendingFrom+i, cfg.queue)
				}
			}
		}
		select {
		case r := <-returns:
			return fmt.Errorf("message %s was returned (%d %s): does queue %q exist? Declare it, or run with -declare=true",
				r.MessageId, r.ReplyCode, r.ReplyText, cfg.queue)
		default:
		}
		pendingFrom += len(pending)
		pending = pending[:0]
		return nil
	}

	var chain hashchain.Chain
	padding := strings.Repeat(".", cfg.bodySize)
	lastProgress := time.Now()
	for i := range cfg.count {
		if tick != nil {
			select {
			case <-ctx.Done():
				return fmt.Errorf("interrupted after %d of %d messages: %w", i, cfg.count, ctx.Err())
			case <-tick:
			}
		}
		n := cfg.start + i
		body := []byte("msg-" + strconv.Itoa(n) + padding)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", cfg.queue, true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			MessageId:    strconv.Itoa(n),
			Headers:      amqp.Table{"x-sent-at": time.Now().UnixNano()},
			Body:         body,
		})
		if err != nil {
			return fmt.Errorf("publish message %d to queue %q: %w", n, cfg.queue, err)
		}
		chain.Fold(body)
		pending = append(pending, dc)
		if len(pending) == batch {
			if err := waitConfirms(); err != nil {
				return err
			}
		}
		if time.Since(lastProgress) >= time.Second {
			lastProgress = time.Now()
			log.Info("progress", "queue", cfg.queue, "published", i+1, "total", cfg.count)
		}
	}
	if err := waitConfirms(); err != nil {
		return err
	}
	log.Info("done", "queue", cfg.queue, "published", cfg.count)

	out, err := json.Marshal(result{Count: cfg.count, First: cfg.start, Last: cfg.start + cfg.count - 1, Hash: chain.Hex()})
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(stdout, "%s\n", out); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	return conn.Close()
}

// redact hides the password in a broker URL, for messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparsable URL>"
	}
	return u.Redacted()
}
