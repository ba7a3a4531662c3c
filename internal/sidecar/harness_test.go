package sidecar_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/amqpwire"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

const token = "test-token"

// env is one test's broker, replay log name and sidecar.
type env struct {
	t      *testing.T
	broker testenv.Broker
	log    string
	sc     *sidecar.Sidecar
}

func newEnv(t *testing.T) *env {
	t.Helper()
	b := testenv.RequireBroker(t)
	e := &env{t: t, broker: b, log: testenv.UniqueName("ms2m-test-log")}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 10*time.Second)
		defer cancel()
		if err := shadowqueue.DeleteStream(ctx, b.StreamURI, e.log); err != nil {
			t.Logf("delete the test's stream %s: %v", e.log, err)
		}
	})
	return e
}

func (e *env) config() sidecar.Config {
	return sidecar.Config{
		Listen:                 "127.0.0.1:0",
		Upstream:               e.broker.AMQPAddr,
		UpstreamConnectTimeout: 3 * time.Second,
		StreamURI:              e.broker.StreamURI,
		LogName:                e.log,
		LogMaxAge:              time.Hour,
		LogMaxBytes:            64 << 20,
		ControlListen:          "127.0.0.1:0",
		ControlToken:           token,
		DrainTimeout:           5 * time.Second,
		LogLevel:               "info",
		// The pod's emptyDir, as the webhook mounts it: one per config, so
		// that a restart with the same config is one of the same pod.
		StateDir: e.t.TempDir(),
	}
}

// start starts a sidecar for e with opts; it is closed when the test ends.
func (e *env) start(opts sidecar.Options) *sidecar.Sidecar {
	return e.startConfig(e.config(), opts)
}

func (e *env) startConfig(cfg sidecar.Config, opts sidecar.Options) *sidecar.Sidecar {
	e.t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger()
	}
	// The sidecar lives on its context until Close (the test's cleanup):
	// the test's own context would end it before, and differently.
	sc, err := sidecar.Start(context.Background(), cfg, opts)
	if err != nil {
		e.t.Fatalf("start sidecar: %v", err)
	}
	e.t.Cleanup(func() { sc.Close() })
	e.sc = sc
	return sc
}

func testLogger() *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("MS2M_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// dial connects an amqp091-go client to the sidecar.
func (e *env) dial(cfg amqp.Config) *amqp.Connection {
	e.t.Helper()
	c, err := amqp.DialConfig("amqp://guest:guest@"+e.sc.AMQPAddr()+"/", cfg)
	if err != nil {
		e.t.Fatalf("dial through the sidecar: %v", err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// direct connects straight to the broker, for setup and checks.
func (e *env) direct() *amqp.Channel {
	e.t.Helper()
	c, err := amqp.Dial(e.broker.AMQPURL)
	if err != nil {
		e.t.Fatalf("dial broker: %v", err)
	}
	e.t.Cleanup(func() { c.Close() })
	ch, err := c.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	return ch
}

// queue declares a fresh queue, deleted when the test ends.
func (e *env) queue() string {
	e.t.Helper()
	name := testenv.UniqueName("ms2m-test-q")
	ch := e.direct()
	if _, err := ch.QueueDeclare(name, false, false, false, false, nil); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		c, err := amqp.Dial(e.broker.AMQPURL)
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			if _, err := ch.QueueDelete(name, false, false, false); err != nil {
				e.t.Logf("delete the test's queue %s: %v", name, err)
			}
		}
	})
	return name
}

// publish sends bodies to queue directly, with confirms.
func (e *env) publish(queue string, bodies ...string) {
	e.t.Helper()
	ch := e.direct()
	if err := ch.Confirm(false); err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	for _, b := range bodies {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: []byte(b)})
		if err != nil {
			e.t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			e.t.Fatalf("publish %q not confirmed: %v", b, err)
		}
	}
}

// records reads every record of the replay log.
func (e *env) records() []shadowqueue.Record {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 20*time.Second)
	defer cancel()
	l, err := shadowqueue.OpenStream(ctx, shadowqueue.StreamOptions{URI: e.broker.StreamURI, Name: e.log})
	if err != nil {
		e.t.Fatalf("open the replay log: %v", err)
	}
	defer l.Close()
	recs, err := l.ReadAll(ctx)
	if err != nil {
		e.t.Fatalf("read the replay log: %v", err)
	}
	return recs
}

// deliveries returns the delivery records, checking that their IDs run
// first, first+1, ... without a gap.
func deliveries(t *testing.T, recs []shadowqueue.Record, first uint64) []shadowqueue.Record {
	t.Helper()
	var out []shadowqueue.Record
	want := first
	for _, r := range recs {
		if r.Kind != shadowqueue.KindDelivery {
			continue
		}
		if r.ID != want {
			t.Fatalf("log record %d has ID %d, want %d: IDs must run without gaps, in order", len(out), r.ID, want)
		}
		want++
		out = append(out, r)
	}
	return out
}

// call makes a control API call and decodes the JSON answer into v.
func (e *env) call(method, path string, v any) int {
	e.t.Helper()
	code, b, err := e.callRaw(method, path)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			e.t.Fatalf("%s %s: decode %q: %v", method, path, b, err)
		}
	}
	return code
}

// callRaw is call without failing the test: for a goroutine of a test,
// where t.Fatal would end only that goroutine.
func (e *env) callRaw(method, path string) (int, []byte, error) {
	req, _ := http.NewRequest(method, "http://"+e.sc.ControlAddr()+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

type state struct {
	Mode     string `json:"mode"`
	Degraded bool   `json:"degraded"`
	Held     int    `json:"held"`
	CutoffID uint64 `json:"cutoffId"`
	Log      struct {
		LastID       uint64 `json:"lastId"`
		ConfirmedID  uint64 `json:"confirmedId"`
		Degraded     bool   `json:"degraded"`
		Pending      int    `json:"pending"`
		PendingBytes int64  `json:"pendingBytes"`
		Backpressure bool   `json:"backpressure"`
	} `json:"log"`
	Queues []struct {
		Queue           string  `json:"queue"`
		LastDeliveredID uint64  `json:"lastDeliveredId"`
		LastAckedID     uint64  `json:"lastAckedId"`
		InFlight        int     `json:"inFlight"`
		Lambda          float64 `json:"lambda"`
		Mu              float64 `json:"mu"`
	} `json:"queues"`
}

func (e *env) state() state {
	e.t.Helper()
	var s state
	if code := e.call("GET", "/state", &s); code != 200 {
		e.t.Fatalf("GET /state = %d", code)
	}
	return s
}

// tap records the basic.ack frames that the sidecar writes to the broker,
// counts its rejects and nacks, and can delay what the broker sends.
type tap struct {
	mu      sync.Mutex
	acks    []tappedAck
	rejects int // basic.reject and basic.nack
	// readDelay, when set, delays what each read from the broker returns.
	readDelay atomic.Int64
}

type tappedAck struct {
	tag      uint64
	multiple bool
	at       time.Time
}

func (tp *tap) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &tapConn{Conn: c, tap: tp, p: amqpwire.NewParser(0)}, nil
}

func (tp *tap) snapshot() []tappedAck {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]tappedAck(nil), tp.acks...)
}

type tapConn struct {
	net.Conn
	tap    *tap
	p      *amqpwire.Parser
	header bool
}

func (c *tapConn) Write(b []byte) (int, error) {
	now := time.Now()
	data := b
	if !c.header && len(data) >= 8 {
		c.header, data = true, data[8:]
	}
	// The tap only watches: what it cannot parse it does not record.
	_ = c.p.Parse(data, func(f amqpwire.Frame) error {
		if f.Type != amqpwire.FrameMethod {
			return nil
		}
		if m, err := amqpwire.DecodeMethod(f.Payload); err == nil {
			c.tap.mu.Lock()
			switch a := m.(type) {
			case *amqpwire.BasicAck:
				c.tap.acks = append(c.tap.acks, tappedAck{a.DeliveryTag, a.Multiple, now})
			case *amqpwire.BasicReject, *amqpwire.BasicNack:
				c.tap.rejects++
			}
			c.tap.mu.Unlock()
		}
		return nil
	})
	return c.Conn.Write(b)
}

func (c *tapConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if d := time.Duration(c.tap.readDelay.Load()); d > 0 {
		time.Sleep(d)
	}
	return n, err
}

func (tp *tap) rejected() int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.rejects
}

// drainQueue takes every message ready in queue, straight from the broker,
// and returns their bodies in order.
func (e *env) drainQueue(queue string) []string {
	e.t.Helper()
	ch := e.direct()
	var out []string
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			e.t.Fatalf("get from %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		out = append(out, string(d.Body))
	}
}

// startTapped starts a sidecar whose broker connections are tapped for the
// acks that go upstream, and whose log is a slowLog that delays each write
// by delay.
func (e *env) startTapped(delay time.Duration) (*tap, *slowLog) {
	tp := &tap{}
	slow := &slowLog{delay: delay, confirmed: map[uint64]time.Time{}}
	e.start(sidecar.Options{
		Dial:    tp.dial,
		WrapLog: func(l shadowqueue.Log) shadowqueue.Log { slow.Log = l; return slow },
	})
	return tp, slow
}

// slowLog delays each write, can be made to fail, and remembers when each
// delivery ID was confirmed.
type slowLog struct {
	shadowqueue.Log
	delay time.Duration

	mu        sync.Mutex
	failing   bool
	writes    int
	confirmed map[uint64]time.Time
}

func (l *slowLog) Write(ctx context.Context, recs []shadowqueue.Record) error {
	l.mu.Lock()
	failing := l.failing
	l.writes++
	l.mu.Unlock()
	if failing {
		return errInjected
	}
	select {
	case <-time.After(l.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := l.Log.Write(ctx, recs); err != nil {
		return err
	}
	now := time.Now()
	l.mu.Lock()
	for _, r := range recs {
		l.confirmed[r.ID] = now
	}
	l.mu.Unlock()
	return nil
}

func (l *slowLog) setFailing(f bool) {
	l.mu.Lock()
	l.failing = f
	l.mu.Unlock()
}

func (l *slowLog) confirmedAt(id uint64) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.confirmed[id]
	return t, ok
}

type injectedError struct{}

func (injectedError) Error() string { return "injected replay log failure" }

var errInjected error = injectedError{}

// recv waits for the next delivery.
func recv(t *testing.T, ch <-chan amqp.Delivery) amqp.Delivery {
	t.Helper()
	select {
	case d, ok := <-ch:
		if !ok {
			t.Fatal("delivery channel closed")
		}
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery within 10s")
	}
	return amqp.Delivery{}
}

// noDelivery checks that nothing arrives for d.
func noDelivery(t *testing.T, ch <-chan amqp.Delivery, d time.Duration, why string) {
	t.Helper()
	select {
	case m := <-ch:
		t.Fatalf("got delivery %q, want none: %s", m.Body, why)
	case <-time.After(d):
	}
}

// metricValue reads one unlabelled metric from the control API at base.
func metricValue(t *testing.T, base, name string) float64 {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %q: %v", name, v, err)
			}
			return f
		}
	}
	t.Fatalf("metric %s not in /metrics", name)
	return 0
}
