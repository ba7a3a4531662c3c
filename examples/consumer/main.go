package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const usage = `Usage: consumer

Consumes a RabbitMQ queue with manual acks, folds a SHA-256 hash chain over the
message bodies, and serves the state at GET /state (and GET /healthz). It
reconnects by itself, keeping its state, until SIGTERM or SIGINT.

Environment:
  AMQP_URL         broker URL (default amqp://guest:guest@127.0.0.1:5672/)
  QUEUE            queue to consume (default orders)
  PREFETCH         basic.qos prefetch count; 0 means no limit (default 1)
  WORK_MS          milliseconds of work per message (default 50)
  HTTP_ADDR        address of the state server (default 127.0.0.1:8080)
  DECLARE          declare the queue as durable before consuming (default true)
  CONNECTION_NAME  client-provided connection name (default ms2m-example-consumer)
  STATE_MB         MiB of extra state the consumer holds in memory, every page
                   written with pseudo-random bytes, so that a checkpoint of it
                   has that much more to dump, move and restore (default 0;
                   the benchmarks' memory sweep sets it)
  SKIP_REDELIVERIES  skip a redelivered message whose numeric message-id is
                   not above the last folded one's (default false: fold
                   everything, so that the hash shows every duplicate)
  EXCHANGE         subscribe to this fanout exchange instead of consuming
                   QUEUE: declare it (durable), and consume a queue of its
                   own that the broker names (amq.gen-*), exclusive and
                   auto-delete, bound to it; a new one on every reconnect
                   (default unset). ms2m refuses to migrate such a consumer
`

const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 2 * time.Second
)

type config struct {
	url      string
	queue    string
	prefetch int
	work     time.Duration
	httpAddr string
	declare  bool
	connName string
	// skipRedeliveries turns on the redelivery skip (see state.apply).
	// It is off by default, so that a duplicate shows in the hash.
	skipRedeliveries bool
	// stateMiB is the extra state held in memory (STATE_MB).
	stateMiB int
	// exchange, if set, makes the consumer a subscriber: a server-named
	// queue bound to this fanout exchange instead of queue (EXCHANGE).
	exchange string
}

// maxStateMiB bounds STATE_MB (64 GiB).
const maxStateMiB = 64 << 10

func main() {
	flag.Usage = func() { fmt.Fprint(flag.CommandLine.Output(), usage) }
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	cfg, err := loadConfig(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("consumer failed", "err", err)
		os.Exit(1)
	}
}

func loadConfig(lookup func(string) (string, bool)) (config, error) {
	cfg := config{
		url:      "amqp://guest:guest@127.0.0.1:5672/",
		queue:    "orders",
		prefetch: 1,
		work:     50 * time.Millisecond,
		httpAddr: "127.0.0.1:8080",
		declare:  true,
		connName: "ms2m-example-consumer",
	}
	// An empty variable counts as unset.
	env := func(name string) (string, bool) {
		v, ok := lookup(name)
		return v, ok && v != ""
	}
	str := func(name string, dst *string) {
		if v, ok := env(name); ok {
			*dst = v
		}
	}
	str("AMQP_URL", &cfg.url)
	str("QUEUE", &cfg.queue)
	str("HTTP_ADDR", &cfg.httpAddr)
	str("CONNECTION_NAME", &cfg.connName)
	str("EXCHANGE", &cfg.exchange)
	if v, ok := env("PREFETCH"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 65535 {
			return cfg, fmt.Errorf("PREFETCH=%q: want an integer from 0 to 65535", v)
		}
		cfg.prefetch = n
	}
	if v, ok := env("WORK_MS"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return cfg, fmt.Errorf("WORK_MS=%q: want an integer >= 0", v)
		}
		cfg.work = time.Duration(n) * time.Millisecond
	}
	if v, ok := env("DECLARE"); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return cfg, fmt.Errorf("DECLARE=%q: want true or false", v)
		}
		cfg.declare = b
	}
	if v, ok := env("STATE_MB"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxStateMiB {
			return cfg, fmt.Errorf("STATE_MB=%q: want a whole number of MiB from 0 to %d", v, maxStateMiB)
		}
		cfg.stateMiB = n
	}
	if v, ok := env("SKIP_REDELIVERIES"); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return cfg, fmt.Errorf("SKIP_REDELIVERIES=%q: want true or false", v)
		}
		cfg.skipRedeliveries = b
	}
	return cfg, nil
}

func run(ctx context.Context, cfg config, log *slog.Logger) error {
	st := &state{skipRedeliveries: cfg.skipRedeliveries, extra: extraState(cfg.stateMiB)}
	ln, err := net.Listen("tcp", cfg.httpAddr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR %s: %w", cfg.httpAddr, err)
	}
	srv := &http.Server{Handler: st.handler(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer func() {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(shutdownCtx) != nil {
			srv.Close() // the grace is over: drop the connections still open
		}
	}()
	log.Info("listening", "http", "http://"+ln.Addr().String(), "broker", redact(cfg.url),
		"queue", cfg.queue, "prefetch", cfg.prefetch, "work", cfg.work, "connection_name", cfg.connName,
		"skip_redeliveries", cfg.skipRedeliveries, "state_mib", cfg.stateMiB)

	backoff := minBackoff
	for {
		consumed, err := session(ctx, cfg, st, log)
		if ctx.Err() != nil {
			log.Info("stopping", "count", st.snapshot().Count)
			return nil
		}
		if consumed {
			backoff = minBackoff
		}
		log.Warn("disconnected, will reconnect", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			log.Info("stopping", "count", st.snapshot().Count)
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// session connects and consumes until the connection or channel drops, or
// ctx ends. It reports whether it got as far as consuming. Unacked messages go
// back to the queue when the connection closes.
func session(ctx context.Context, cfg config, st *state, log *slog.Logger) (consumed bool, err error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(cfg.connName)
	conn, err := amqp.DialConfig(cfg.url, amqp.Config{Properties: props, Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return false, fmt.Errorf("connect to %s: %w", redact(cfg.url), err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("open channel: %w", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(cfg.prefetch, 0, false); err != nil {
		return false, fmt.Errorf("set prefetch %d: %w", cfg.prefetch, err)
	}
	queue := cfg.queue
	switch {
	case cfg.exchange != "":
		if queue, err = subscribe(ch, cfg.exchange); err != nil {
			return false, err
		}
	case cfg.declare:
		if _, err := ch.QueueDeclare(cfg.queue, true, false, false, false, nil); err != nil {
			return false, fmt.Errorf("declare queue %q: %w", cfg.queue, err)
		}
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("consume queue %q (does it exist? set DECLARE=true): %w", queue, err)
	}
	st.setConnected(true)
	defer st.setConnected(false)
	log.Info("consuming", "queue", queue)

	for {
		var d amqp.Delivery
		var ok bool
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case d, ok = <-deliveries:
		}
		if !ok {
			select {
			case e := <-closed:
				return true, fmt.Errorf("channel closed: %w", e)
			default:
				return true, errors.New("consumer cancelled by the broker")
			}
		}
		select {
		case <-ctx.Done():
			return true, ctx.Err() // not processed; redelivered to the next consumer
		case <-time.After(cfg.work):
		}
		st.apply(message{
			body:        d.Body,
			messageID:   d.MessageId,
			redelivered: d.Redelivered,
			sentAt:      sentAt(d.Headers),
		}, time.Now())
		if err := d.Ack(false); err != nil {
			return true, fmt.Errorf("ack message %q: %w", d.MessageId, err)
		}
	}
}

// sentAt reads the producer's x-sent-at header (unix nanoseconds).
func sentAt(h amqp.Table) time.Time {
	switch v := h["x-sent-at"].(type) {
	case int64:
		return time.Unix(0, v)
	case int32:
		return time.Unix(0, int64(v))
	case int:
		return time.Unix(0, int64(v))
	}
	return time.Time{}
}

// redact hides the password in a broker URL, for logs.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparsable URL>"
	}
	return u.Redacted()
}

// subscribe declares the fanout exchange and a queue of the session's own
// that the broker names, exclusive and auto-delete, bound to it, and
// returns that queue's name (amq.gen-...).
func subscribe(ch *amqp.Channel, exchange string) (string, error) {
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return "", fmt.Errorf("declare exchange %q: %w", exchange, err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return "", fmt.Errorf("declare a server-named queue: %w", err)
	}
	if err := ch.QueueBind(q.Name, "", exchange, false, nil); err != nil {
		return "", fmt.Errorf("bind queue %q to exchange %q: %w", q.Name, exchange, err)
	}
	return q.Name, nil
}
