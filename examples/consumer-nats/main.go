package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/examples/internal/journal"
)

const usage = `Usage: consumer-nats

Consumes a NATS JetStream durable consumer with explicit acks, folds a
SHA-256 hash chain over the message bodies, and serves the state at GET
/state, its journal of folds at GET /folds (each message's Nats-Msg-Id
and the producer's x-sent-at stamp, Unix nanoseconds, when it has them),
and GET /healthz. nats.go reconnects by itself, keeping the state,
until SIGTERM or SIGINT.

Environment:
  NATS_URL   server URL (default nats://127.0.0.1:4222)
  STREAM     the stream (default ORDERS)
  CONSUMER   the durable consumer, which must exist (default worker)
  MODE       push or pull (default pull): a push consumer is consumed on its
             deliver subject, a pull consumer with Consume
  PREFETCH   pull: messages asked for per pull request (default 1)
  WORK_MS    milliseconds of work per message (default 50)
  HTTP_ADDR  address of the state server (default 127.0.0.1:8080)
  RESULT_SUBJECT  publish "result-" + body to this subject with a JetStream
             publish (waiting for the server's publish ack) before acking
             each message, a side effect (default unset: none)
`

type config struct {
	url, stream, consumer, mode, httpAddr string
	result                                string
	prefetch                              int
	work                                  time.Duration
}

func main() {
	flag.Usage = func() { fmt.Fprint(flag.CommandLine.Output(), usage) }
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	cfg, err := loadConfig(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer-nats:", err)
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
	cfg := config{url: "nats://127.0.0.1:4222", stream: "ORDERS", consumer: "worker", mode: "pull",
		httpAddr: "127.0.0.1:8080", prefetch: 1, work: 50 * time.Millisecond}
	env := func(name string, dst *string) {
		if v, ok := lookup(name); ok && v != "" {
			*dst = v
		}
	}
	env("NATS_URL", &cfg.url)
	env("STREAM", &cfg.stream)
	env("CONSUMER", &cfg.consumer)
	env("MODE", &cfg.mode)
	env("HTTP_ADDR", &cfg.httpAddr)
	env("RESULT_SUBJECT", &cfg.result)
	if cfg.mode != "push" && cfg.mode != "pull" {
		return cfg, fmt.Errorf("MODE=%q: want push or pull", cfg.mode)
	}
	num := func(name string, lo, hi int) (int, bool, error) {
		v, ok := lookup(name)
		if !ok || v == "" {
			return 0, false, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return 0, false, fmt.Errorf("%s=%q: want an integer from %d to %d", name, v, lo, hi)
		}
		return n, true, nil
	}
	if n, ok, err := num("PREFETCH", 1, 1<<20); err != nil {
		return cfg, err
	} else if ok {
		cfg.prefetch = n
	}
	if n, ok, err := num("WORK_MS", 0, 1<<30); err != nil {
		return cfg, err
	} else if ok {
		cfg.work = time.Duration(n) * time.Millisecond
	}
	return cfg, nil
}

// state is the consumer's in-memory state: the hash chain over the bodies
// folded so far, and the journal of those folds.
type state struct {
	mu        sync.Mutex
	h         [sha256.Size]byte
	count     int
	last      string
	connected bool
	sessions  int
	// journal is every folded message in fold order (the last
	// journal.Max), as the AMQP sample consumer keeps it: a benchmark
	// reads the journals of the instances that served across a migration
	// for its processing gap.
	journal journal.Journal
}

// sentAtHeader is the producer's send stamp, Unix nanoseconds in decimal,
// as the AMQP sample producer's x-sent-at header carries it.
const sentAtHeader = "x-sent-at"

// stamps reads a message's ID (its Nats-Msg-Id, the producer's sequence
// number) and the producer's send time (zero without a valid x-sent-at).
func stamps(h nats.Header) (id string, sent time.Time) {
	if ns, err := strconv.ParseInt(h.Get(sentAtHeader), 10, 64); err == nil && ns > 0 {
		sent = time.Unix(0, ns)
	}
	return h.Get(jetstream.MsgIDHeader), sent
}

// fold advances the chain by one body, h = SHA256(h || body), and
// journals it as folded at now, with the message's stamps (stamps).
func (s *state) fold(body []byte, h nats.Header, now time.Time) {
	id, sent := stamps(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	d := sha256.New()
	d.Write(s.h[:])
	d.Write(body)
	d.Sum(s.h[:0])
	s.count++
	s.last = string(body)
	s.journal.Add(journal.NewFold(id, sent, now))
}

func (s *state) setConnected(c bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c && !s.connected {
		s.sessions++
	}
	s.connected = c
}

func (s *state) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /state", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		v := map[string]any{"count": s.count, "hash": hex.EncodeToString(s.h[:]), "last": s.last,
			"skipped_redeliveries": 0, "connected": s.connected, "reconnects": max(s.sessions-1, 0)}
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v) // the client went away if this fails
	})
	mux.HandleFunc("GET /folds", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		v := s.journal.Snapshot()
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v) // as above
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n")) // as above
	})
	return mux
}

func run(ctx context.Context, cfg config, log *slog.Logger) error {
	st := &state{}
	ln, err := net.Listen("tcp", cfg.httpAddr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR %s: %w", cfg.httpAddr, err)
	}
	srv := &http.Server{Handler: st.handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }() // ends with Shutdown below
	defer func() { _ = srv.Shutdown(context.WithoutCancel(ctx)) }()

	nc, err := nats.Connect(cfg.url, nats.Name("ms2m-example-consumer-nats"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { st.setConnected(false) }),
		nats.ReconnectHandler(func(*nats.Conn) { st.setConnected(true) }))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", cfg.url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	handle := func(m jetstream.Msg) {
		time.Sleep(cfg.work)
		st.fold(m.Data(), m.Headers(), time.Now())
		if cfg.result != "" {
			if _, err := js.Publish(ctx, cfg.result, append([]byte("result-"), m.Data()...)); err != nil {
				log.Warn("result publish failed", "subject", cfg.result, "err", err)
			}
		}
		if err := m.Ack(); err != nil {
			log.Warn("ack failed; the message comes again", "err", err)
		}
	}
	var cc jetstream.ConsumeContext
	for {
		cc, err = consume(ctx, js, cfg, handle)
		if err == nil {
			break
		}
		log.Warn("cannot bind to the consumer yet; retrying", "stream", cfg.stream, "consumer", cfg.consumer, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
	defer cc.Stop()
	st.setConnected(true)
	log.Info("consuming", "stream", cfg.stream, "consumer", cfg.consumer, "mode", cfg.mode, "http", "http://"+ln.Addr().String())
	<-ctx.Done()
	return nil
}

func consume(ctx context.Context, js jetstream.JetStream, cfg config, handle jetstream.MessageHandler) (jetstream.ConsumeContext, error) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if cfg.mode == "push" {
		c, err := js.PushConsumer(lctx, cfg.stream, cfg.consumer)
		if err != nil {
			return nil, err
		}
		return c.Consume(handle)
	}
	c, err := js.Consumer(lctx, cfg.stream, cfg.consumer)
	if err != nil {
		return nil, err
	}
	if c.CachedInfo().Config.DeliverSubject != "" {
		return nil, errors.New("consumer " + cfg.consumer + " is a push consumer: set MODE=push")
	}
	return c.Consume(handle, jetstream.PullMaxMessages(cfg.prefetch))
}
