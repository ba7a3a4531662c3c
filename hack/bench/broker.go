package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
)

// path is the way the consumer reaches the broker.
type path string

const (
	direct     path = "direct"
	viaSidecar path = "sidecar"
)

// paths is the order of the runs in a round: direct, then sidecar, so the
// rounds go ABAB...
var paths = []path{direct, viaSidecar}

const (
	// queueExpiry makes the broker drop a bench queue that nobody used for
	// this long, should the bench be killed before it can delete it.
	queueExpiry = 10 * time.Minute
	// stallTimeout fails a run in which no delivery arrives for this long.
	stallTimeout = 30 * time.Second
	// cleanupTimeout bounds the clean-up at the end.
	cleanupTimeout = 20 * time.Second
)

// bench holds the sidecar that the overhead runs go through, and remembers
// every queue and replay log it creates so that close can delete them.
type bench struct {
	o             options
	directURL     string
	sidecarURL    string                  // the overhead sidecar's; empty unless the overhead part runs
	sc            *sidecar.Sidecar        // the overhead sidecar
	stopSidecar   context.CancelCauseFunc // ends the overhead sidecar's context
	token         string                  // every sidecar's control API token
	serverVersion string                  // from the AMQP handshake

	mu     sync.Mutex
	queues map[string]bool // created and not yet deleted
	logs   map[string]bool // replay logs named and not yet deleted
}

// newBench checks the broker and, if the overhead part runs, starts the
// sidecar that its runs go through, with a fresh replay log.
func newBench(ctx context.Context, o options) (*bench, error) {
	uri, err := amqp.ParseURI(o.amqpURL)
	if err != nil {
		return nil, fmt.Errorf("-amqp=%q: %w", o.amqpURL, err)
	}
	b := &bench{o: o, directURL: o.amqpURL, token: uniqueName("bench-token"), queues: map[string]bool{}, logs: map[string]bool{}}

	conn, err := dial(b.directURL, "ms2m-bench-check")
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ at %s: %w (is it running? `bash hack/setup.sh` starts it)", uri.Host, err)
	}
	b.serverVersion, _ = conn.Properties["version"].(string)
	conn.Close()
	if !o.runs(partOverhead) {
		return b, nil
	}

	logName := b.newLogName()
	progress("starting the sidecar", "log", logName)
	rs, err := b.startSidecar(ctx, b.sidecarConfig(logName), sidecar.Options{WrapLog: diagnosticLog})
	if err != nil {
		return nil, errors.Join(err, b.deleteLog(logName))
	}
	b.sc, b.stopSidecar, b.sidecarURL = rs.Sidecar, rs.stop, rs.url
	return b, nil
}

// runningSidecar is an in-process sidecar that the bench started.
type runningSidecar struct {
	*sidecar.Sidecar
	url   string // where an app connects, with the broker's credentials
	token string
	stop  context.CancelCauseFunc
}

// sidecarConfig is the configuration of a bench sidecar on the replay log
// logName: both listeners on free loopback ports, warnings only.
func (b *bench) sidecarConfig(logName string) sidecar.Config {
	uri, _ := amqp.ParseURI(b.o.amqpURL) // parsed by newBench already
	return sidecar.Config{
		Listen:                 "127.0.0.1:0",
		Upstream:               net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port)),
		UpstreamConnectTimeout: 5 * time.Second,
		StreamURI:              b.o.streamURI,
		LogName:                logName,
		LogMaxAge:              time.Hour,
		LogMaxBytes:            256 << 20,
		ControlListen:          "127.0.0.1:0",
		ControlToken:           b.token,
		DrainTimeout:           5 * time.Second,
		LogLevel:               "warn",
	}
}

// startSidecar starts a sidecar with cfg. It lives on ctx until its close;
// Start retries the replay log until its context ends, so the start gives
// up after 30 s.
func (b *bench) startSidecar(ctx context.Context, cfg sidecar.Config, opts sidecar.Options) (*runningSidecar, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	startCtx, cancel := context.WithCancelCause(ctx)
	timer := time.AfterFunc(30*time.Second, func() {
		cancel(fmt.Errorf("the replay log at %s did not open within 30s (check the stream plugin: `bash hack/setup.sh`)", cfg.StreamURI))
	})
	sc, err := sidecar.Start(startCtx, cfg, opts)
	if !timer.Stop() {
		err = errors.Join(err, context.Cause(startCtx))
	}
	if err != nil {
		cancel(nil)
		if sc != nil { // started just as the timer fired
			sc.Close()
		}
		return nil, fmt.Errorf("start a sidecar on replay log %s: %w", cfg.LogName, err)
	}
	uri, _ := amqp.ParseURI(b.o.amqpURL)
	uri.Host, uri.Port = splitHostPort(sc.AMQPAddr())
	return &runningSidecar{Sidecar: sc, url: uri.String(), token: cfg.ControlToken, stop: cancel}, nil
}

// close stops the sidecar and waits for it.
func (s *runningSidecar) close() error {
	err := s.Close()
	s.stop(nil)
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("stop the sidecar: %w", err)
	}
	return nil
}

// endpoint is the sidecar's control API, for control.Handover.
func (s *runningSidecar) endpoint() control.Client {
	return control.Client{URL: "http://" + s.ControlAddr(), Token: s.token}
}

// close stops the overhead sidecar and deletes every queue and replay log
// left, on a context of its own so that it also runs after Ctrl-C.
// closeWith deletes what b created when a run ends, joining the error
// into *errp; an interrupted run says so first.
func (b *bench) closeWith(ctx context.Context, errp *error) {
	if ctx.Err() != nil {
		progress("interrupted: deleting what the bench created (Ctrl-C again to skip)")
	}
	*errp = errors.Join(*errp, b.close())
}

func (b *bench) close() error {
	var errs []error
	if b.sc != nil {
		if err := b.sc.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("stop the sidecar: %w", err))
		}
		b.stopSidecar(nil)
	}
	b.mu.Lock()
	queues := make([]string, 0, len(b.queues))
	for q := range b.queues {
		queues = append(queues, q)
	}
	logs := make([]string, 0, len(b.logs))
	for l := range b.logs {
		logs = append(logs, l)
	}
	b.mu.Unlock()
	for _, q := range queues {
		if err := b.deleteQueue(q); err != nil {
			errs = append(errs, err)
		}
	}
	for _, l := range logs {
		if err := b.deleteLog(l); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// newLogName returns a fresh replay log name, shaped as the webhook names
// logs (in a namespace of the bench's own); close deletes the log if the
// run does not.
func (b *bench) newLogName() string {
	name := inject.DefaultLogName("ms2m-bench", uniqueName("log"))
	b.mu.Lock()
	b.logs[name] = true
	b.mu.Unlock()
	return name
}

// deleteLog deletes a replay log that newLogName named, on a context of its
// own. A log that was never created is not an error.
func (b *bench) deleteLog(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := shadowqueue.DeleteStream(ctx, b.o.streamURI, name); err != nil {
		return fmt.Errorf("delete the replay log; delete it by hand with `rabbitmqctl delete_queue %s`: %w", name, err)
	}
	b.mu.Lock()
	delete(b.logs, name)
	b.mu.Unlock()
	return nil
}

// url is where a consumer on path p connects.
func (b *bench) url(p path) string {
	if p == viaSidecar {
		return b.sidecarURL
	}
	return b.directURL
}

// teedIDs returns the last delivery ID that the sidecar has assigned, that
// is, how many deliveries it has teed so far.
func (b *bench) teedIDs() uint64 {
	return b.sc.Proxy().State().Log.LastID
}

// gateWaits reads the sidecar's ms2m_sidecar_ack_gate_wait_seconds
// histogram from its control API: how many app acks have had to wait for
// their deliveries to be durable in the replay log, and for how long in all;
// how many writes the log has had, with how many records; and how many acks
// went upstream inside a later cumulative ack.
func (b *bench) gateWaits(ctx context.Context) (gateWait, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+b.sc.ControlAddr()+"/metrics", nil)
	if err != nil {
		return gateWait{}, err
	}
	req.Header.Set("Authorization", "Bearer "+b.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return gateWait{}, fmt.Errorf("read the sidecar's metrics: %w", err)
	}
	defer resp.Body.Close()
	var g gateWait
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, _ := strings.Cut(sc.Text(), " ")
		v, _ := strconv.ParseFloat(value, 64)
		switch name {
		case "ms2m_sidecar_ack_gate_wait_seconds_count":
			g.AcksWaited = uint64(v)
		case "ms2m_sidecar_ack_gate_wait_seconds_sum":
			g.WaitSeconds = v
		case "ms2m_sidecar_log_writes_total":
			g.LogWrites = uint64(v)
		case "ms2m_sidecar_log_records_written_total":
			g.LogRecords = uint64(v)
		case "ms2m_sidecar_acks_coalesced_total":
			g.AcksCoalesced = uint64(v)
		}
	}
	return g, sc.Err()
}

// newQueue declares a fresh classic queue; close deletes it if the run
// does not.
func (b *bench) newQueue() (string, error) {
	name := uniqueName("ms2m-bench-q")
	b.mu.Lock()
	b.queues[name] = true
	b.mu.Unlock()
	err := b.withChannel(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(name, false, false, false, false, amqp.Table{
			"x-queue-type": "classic",
			"x-expires":    int32(queueExpiry / time.Millisecond),
		})
		return err
	})
	if err != nil {
		return "", fmt.Errorf("declare queue %s: %w", name, err)
	}
	return name, nil
}

// deleteQueue deletes a queue that newQueue declared.
func (b *bench) deleteQueue(name string) error {
	err := b.withChannel(func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(name, false, false, false)
		return err
	})
	if err != nil {
		return fmt.Errorf("delete queue %s; delete it by hand with `rabbitmqctl delete_queue %s`: %w", name, name, err)
	}
	b.mu.Lock()
	delete(b.queues, name)
	b.mu.Unlock()
	return nil
}

// inspect returns a queue's ready messages and consumers.
func (b *bench) inspect(name string) (amqp.Queue, error) {
	var q amqp.Queue
	err := b.withChannel(func(ch *amqp.Channel) error {
		var err error
		q, err = ch.QueueDeclarePassive(name, false, false, false, false, nil)
		return err
	})
	return q, err
}

// withChannel runs f on a channel of a fresh direct connection. Queue
// management is rare, and a fresh connection cannot have been broken by an
// earlier error.
func (b *bench) withChannel(f func(*amqp.Channel) error) error {
	conn, err := dial(b.directURL, "ms2m-bench-admin")
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return f(ch)
}

// fill publishes n messages of body to queue straight to the broker, with
// publisher confirms, and checks that the queue then holds n messages.
func (b *bench) fill(ctx context.Context, queue string, n int, body []byte) error {
	conn, err := dial(b.directURL, "ms2m-bench-filler")
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("enable publisher confirms: %w", err)
	}
	const window = 500
	pending := make([]*amqp.DeferredConfirmation, 0, window)
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: body})
		if err != nil {
			return fmt.Errorf("pre-fill queue %s, message %d of %d: %w", queue, i+1, n, err)
		}
		pending = append(pending, dc)
		if len(pending) < window && i < n-1 {
			continue
		}
		for _, dc := range pending {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				return fmt.Errorf("pre-fill queue %s: the broker did not confirm message %d (ok=%v): %w", queue, dc.DeliveryTag, ok, err)
			}
		}
		pending = pending[:0]
	}
	q, err := b.inspect(queue)
	if err != nil {
		return fmt.Errorf("inspect queue %s: %w", queue, err)
	}
	if q.Messages != n {
		return fmt.Errorf("queue %s holds %d messages after the pre-fill, want %d", queue, q.Messages, n)
	}
	return nil
}

// waitDrained waits until a queue has neither consumers nor ready
// messages. A consumer whose acks were lost leaves messages requeued.
func (b *bench) waitDrained(ctx context.Context, queue string) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		q, err := b.inspect(queue)
		if err != nil {
			return fmt.Errorf("inspect queue %s: %w", queue, err)
		}
		if q.Consumers == 0 && q.Messages == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("queue %s still has %d consumers and %d messages 15s after the consumer closed: acks were lost", queue, q.Consumers, q.Messages)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func dial(url, name string) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	return amqp.DialConfig(url, amqp.Config{Properties: props, Dial: amqp.DefaultDial(5 * time.Second)})
}

// uniqueName returns prefix with a random suffix.
func uniqueName(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

func splitHostPort(addr string) (string, int) {
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	return host, p
}

// diagnosticLog leaves the replay log as it is, unless
// MS2M_BENCH_SKIP_LOG_WRITES=1: then writes are acknowledged without being
// made, which breaks invariant I1 and exists only to tell the cost of the
// proxy hop from the cost of the log write. Never report such a run as the
// sidecar's figure.
func diagnosticLog(l shadowqueue.Log) shadowqueue.Log {
	if os.Getenv("MS2M_BENCH_SKIP_LOG_WRITES") == "1" {
		fmt.Fprintln(os.Stderr, "bench: MS2M_BENCH_SKIP_LOG_WRITES=1: replay log writes are SKIPPED (diagnostic run, not the sidecar's figure)")
		return skipWrites{l}
	}
	return l
}

type skipWrites struct{ shadowqueue.Log }

func (skipWrites) Write(context.Context, []shadowqueue.Record) error { return nil }
