package sidecar_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// chain folds SHA-256 over bodies, as the sample apps do.
type chain struct {
	h     [32]byte
	count int
}

func (c *chain) add(body []byte) {
	c.h = sha256.Sum256(append(c.h[:], body...))
	c.count++
}

func (c *chain) hex() string { return hex.EncodeToString(c.h[:]) }

// multiApp is a stateful amqp091-go consumer of several queues, one channel
// each, that folds one hash chain per queue.
type multiApp struct {
	mu     sync.Mutex
	chains map[string]*chain
}

func startMultiApp(t *testing.T, addr string, queues []string, prefetch int, work time.Duration) *multiApp {
	t.Helper()
	a := &multiApp{chains: map[string]*chain{}}
	conn, err := amqp.Dial("amqp://guest:guest@" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	for _, q := range queues {
		a.chains[q] = &chain{}
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Qos(prefetch, 0, false); err != nil {
			t.Fatalf("qos: %v", err)
		}
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for d := range ds {
				time.Sleep(work)
				a.mu.Lock()
				a.chains[q].add(d.Body)
				a.mu.Unlock()
				d.Ack(false)
			}
		}()
	}
	return a
}

func (a *multiApp) state(q string) (int, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.chains[q].count, a.chains[q].hex()
}

// publishPaced publishes n bodies "<q>-i" to q at rate per second, and
// returns their hash chain.
func publishPaced(t *testing.T, e *env, q string, n int, rate float64, done *sync.WaitGroup) *chain {
	want := &chain{}
	for i := 1; i <= n; i++ {
		want.add([]byte(fmt.Sprintf("%s-%d", q, i)))
	}
	done.Add(1)
	go func() {
		defer done.Done()
		ch := e.direct()
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		for i := 1; i <= n; i++ {
			<-tick.C
			if err := ch.Publish("", q, false, false, amqp.Publishing{Body: []byte(fmt.Sprintf("%s-%d", q, i))}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	return want
}

func handover(t *testing.T, source, target *sidecar.Sidecar, o control.HandoverOptions) control.Timings {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	tm, err := control.Handover(ctx,
		control.Client{URL: "http://" + source.ControlAddr(), Token: token},
		control.Client{URL: "http://" + target.ControlAddr(), Token: token}, o)
	if err != nil {
		t.Fatalf("handover: %v", err)
	}
	return tm
}

func targetConfig(e *env) sidecar.Config {
	cfg := e.config()
	cfg.ReplayStart, cfg.ReplayCutoff = "0", "marker"
	return cfg
}

// TestHandoffTwoQueues: two queues on two channels, handed over together.
func TestHandoffTwoQueues(t *testing.T) { handoffTwoQueues(t, false) }

// TestHandoffTwoAppConnections: two apps on one sidecar, each its own
// connection consuming a queue of its own, as the two app containers of
// one pod: the target's replay hands each its own queue's records, and
// both are exact.
func TestHandoffTwoAppConnections(t *testing.T) { handoffTwoQueues(t, true) }

// handoffTwoQueues hands over two queues consumed by one app on two
// channels, or (apart) by two apps, one connection each.
func handoffTwoQueues(t *testing.T, apart bool) {
	const n = 200
	e := newEnv(t)
	qs := []string{e.queue(), e.queue()}
	source := e.start(sidecar.Options{})
	target := e.startConfig(targetConfig(e), sidecar.Options{})
	dst := map[string]*multiApp{}
	if apart {
		for _, q := range qs {
			startMultiApp(t, source.AMQPAddr(), []string{q}, 5, time.Millisecond)
			dst[q] = startMultiApp(t, target.AMQPAddr(), []string{q}, 5, time.Millisecond)
		}
	} else {
		startMultiApp(t, source.AMQPAddr(), qs, 5, time.Millisecond)
		app := startMultiApp(t, target.AMQPAddr(), qs, 5, time.Millisecond)
		dst[qs[0]], dst[qs[1]] = app, app
	}
	var producers sync.WaitGroup
	want := map[string]*chain{}
	for _, q := range qs {
		want[q] = publishPaced(t, e, q, n, 150, &producers)
	}
	time.Sleep(500 * time.Millisecond)
	tm := handover(t, source, target, control.HandoverOptions{MaxLag: 5})
	producers.Wait()
	for _, q := range qs {
		testenv.Eventually(t, 30*time.Second, "the target to finish "+q, func() bool {
			c, _ := dst[q].state(q)
			return c >= n
		})
		if c, h := dst[q].state(q); c != n || h != want[q].hex() {
			t.Errorf("queue %s: target processed %d with hash %s, want %d and %s (cutoff %d)", q, c, h, n, want[q].hex(), tm.CutoffID)
		}
	}
}

// TestHandoffNearSaturation: λ close to μ (18/s against 20/s), so the
// target has a backlog to replay after the stop.
func TestHandoffNearSaturation(t *testing.T) {
	const n = 120
	e := newEnv(t)
	q := e.queue()
	source := e.start(sidecar.Options{})
	target := e.startConfig(targetConfig(e), sidecar.Options{})
	startMultiApp(t, source.AMQPAddr(), []string{q}, 10, 50*time.Millisecond)
	dst := startMultiApp(t, target.AMQPAddr(), []string{q}, 10, 50*time.Millisecond)
	var producers sync.WaitGroup
	want := publishPaced(t, e, q, n, 18, &producers)
	time.Sleep(2 * time.Second)
	tm := handover(t, source, target, control.HandoverOptions{MaxLag: 3})
	producers.Wait()
	testenv.Eventually(t, 60*time.Second, "the target to finish", func() bool {
		c, _ := dst.state(q)
		return c >= n
	})
	if c, h := dst.state(q); c != n || h != want.hex() {
		t.Fatalf("target processed %d with hash %s, want %d and %s", c, h, n, want.hex())
	}
	t.Logf("cutoff %d, lag at stop %d, downtime %s", tm.CutoffID, tm.LagAtStop, tm.Downtime)
}

// TestHandoffHeldDeliveries: deliveries the source held back since its
// quiesce go to its app before the cutoff (or, with MS2M_STOP_HELD=requeue,
// back to the queue), and the target's app ends with exactly the
// producer's state.
func TestHandoffHeldDeliveries(t *testing.T) {
	for _, mode := range []string{"deliver", "requeue"} {
		t.Run(mode, func(t *testing.T) { handoffHeld(t, mode) })
	}
}

func handoffHeld(t *testing.T, mode string) {
	const n = 100
	e := newEnv(t)
	q := e.queue()
	cfg := e.config()
	cfg.StopHeld = mode
	source := e.startConfig(cfg, sidecar.Options{})
	src := &env{t: t, broker: e.broker, log: e.log, sc: source}
	target := e.startConfig(targetConfig(e), sidecar.Options{})
	startMultiApp(t, source.AMQPAddr(), []string{q}, 20, 5*time.Millisecond)
	dst := startMultiApp(t, target.AMQPAddr(), []string{q}, 20, time.Millisecond)
	want := &chain{}
	var bodies []string
	for i := 1; i <= n; i++ {
		b := fmt.Sprintf("%s-%d", q, i)
		want.add([]byte(b))
		bodies = append(bodies, b)
	}
	e.publish(q, bodies...)
	if code := src.call("POST", "/quiesce?timeout=10s", nil); code != 200 {
		t.Fatalf("quiesce = %d", code)
	}
	testenv.Eventually(t, 10*time.Second, "held deliveries", func() bool { return src.state().Held > 0 })
	tm := handover(t, source, target, control.HandoverOptions{MaxLag: 0})
	if released := map[string]int{"deliver": tm.Held, "requeue": tm.Requeued}[mode]; released == 0 || tm.Held+tm.Requeued != released {
		t.Fatalf("the stop gave the app %d held deliveries and requeued %d; want some, all by %s", tm.Held, tm.Requeued, mode)
	}
	testenv.Eventually(t, 30*time.Second, "the target to finish", func() bool {
		c, _ := dst.state(q)
		return c >= n
	})
	if c, h := dst.state(q); c != n || h != want.hex() {
		t.Fatalf("target processed %d with hash %s, want %d and %s (held %d, requeued %d)", c, h, n, want.hex(), tm.Held, tm.Requeued)
	}
}

// TestHandoffPollingConsumer: the target's app polls with basic.get; it is
// served the log's records first, then the primary queue.
func TestHandoffPollingConsumer(t *testing.T) {
	const n = 150
	e := newEnv(t)
	q := e.queue()
	source := e.start(sidecar.Options{})
	target := e.startConfig(targetConfig(e), sidecar.Options{})
	startMultiApp(t, source.AMQPAddr(), []string{q}, 5, 2*time.Millisecond)

	conn, err := amqp.Dial("amqp://guest:guest@" + target.AMQPAddr() + "/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := &chain{}
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			d, ok, err := ch.Get(q, false)
			if err != nil {
				t.Error(err)
				return
			}
			if !ok {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			mu.Lock()
			got.add(d.Body)
			mu.Unlock()
			d.Ack(false)
		}
	}()
	t.Cleanup(func() { close(stop); <-polled })

	var producers sync.WaitGroup
	want := publishPaced(t, e, q, n, 150, &producers)
	time.Sleep(400 * time.Millisecond)
	tm := handover(t, source, target, control.HandoverOptions{MaxLag: 3})
	producers.Wait()
	testenv.Eventually(t, 30*time.Second, "the polling target to finish", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got.count >= n
	})
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if got.count != n || got.hex() != want.hex() {
		t.Fatalf("polling target processed %d with hash %s, want %d and %s (cutoff %d)", got.count, got.hex(), n, want.hex(), tm.CutoffID)
	}
}

// TestHandoffIdleConsumer: a consumer idle since its checkpoint leaves the
// target nothing to replay, so its app acks no replayed delivery; the
// handover still stops the source at once (the lag counts from the
// checkpoint ID, not from 0), and the target then serves what follows.
// Before, the target's lag stayed at the checkpoint ID and the handover
// waited until its context ended.
func TestHandoffIdleConsumer(t *testing.T) {
	const before, after = 30, 20
	e := newEnv(t)
	q := e.queue()
	source := e.start(sidecar.Options{})
	src := startMultiApp(t, source.AMQPAddr(), []string{q}, 5, time.Millisecond)
	var producers sync.WaitGroup
	publishPaced(t, e, q, before, 300, &producers)
	producers.Wait()
	testenv.Eventually(t, 30*time.Second, "the source's app to process the first messages", func() bool {
		n, _ := src.state(q)
		return n == before && e.state().Log.ConfirmedID == before
	})
	// The target stands for a restore of a checkpoint taken now: its range
	// starts at the last delivery the source logged.
	cfg := e.config()
	cfg.ReplayStart, cfg.ReplayCutoff = fmt.Sprint(e.state().Log.LastID), "marker"
	target := e.startConfig(cfg, sidecar.Options{})
	dst := startMultiApp(t, target.AMQPAddr(), []string{q}, 5, time.Millisecond)
	tm := handover(t, source, target, control.HandoverOptions{})
	if tm.CutoffID != before || tm.LagAtStop != 0 {
		t.Fatalf("handover %+v; want cutoff %d, lag 0", tm, before)
	}
	// The next messages go to the target, whose app starts empty here.
	want := &chain{}
	for i := 1; i <= after; i++ {
		want.add([]byte(fmt.Sprintf("%s-%d", q, i)))
	}
	publishPaced(t, e, q, after, 300, &producers)
	producers.Wait()
	testenv.Eventually(t, 30*time.Second, "the target's app to process the next messages", func() bool {
		n, _ := dst.state(q)
		return n >= after
	})
	if n, h := dst.state(q); n != after || h != want.hex() {
		t.Errorf("target app: %d messages, hash %s; want %d, %s", n, h, after, want.hex())
	}
	if n, _ := src.state(q); n != before {
		t.Errorf("source app: %d messages, want %d", n, before)
	}
}

// TestHandoffNeverFedConsumer: a consumer that has had no delivery since
// its log was made (a new app on an empty queue) can be handed over. The
// log holds no record of its queue, only the cutoff marker; before, the
// target refused the queue as one that "never appears in the replay log"
// and the migration rolled back.
func TestHandoffNeverFedConsumer(t *testing.T) {
	e, q, source, src := startNeverFed(t)
	cfg := e.config()
	cfg.ReplayStart, cfg.ReplayCutoff = "0", "marker"
	target := e.startConfig(cfg, sidecar.Options{})
	dst := startMultiApp(t, target.AMQPAddr(), []string{q}, 5, time.Millisecond)
	tm := handover(t, source, target, control.HandoverOptions{})
	if tm.CutoffID != 0 {
		t.Fatalf("handover %+v; want cutoff 0", tm)
	}
	feedTheTarget(t, e, q, src, dst)
}

// TestStopAndCopyNeverFedConsumer: the range stop-and-copy and the
// statefulset strategy give a target (migrate.Restore.atStop) when the
// source's app had no delivery since its log was made: the stop's cutoff
// is 0, which a target learns from the stop's marker. Before, the target
// ignored that marker (its epoch was the range's own) and never switched.
func TestStopAndCopyNeverFedConsumer(t *testing.T) {
	e, q, source, src := startNeverFed(t)
	stop, err := control.Client{URL: "http://" + source.ControlAddr(), Token: token}.Stop(t.Context(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if stop.CutoffID != 0 {
		t.Fatalf("stop: cutoff %d, want 0", stop.CutoffID)
	}
	// As migrate.Restore.atStop gives it (TestRestoreAtStop): a stop at
	// ID 0 is learnt from its own marker, the first above the epoch
	// before it. Before, the range said "marker" with the stop's own
	// epoch, whose marker the target ignored.
	cfg := e.config()
	cfg.ReplayStart, cfg.ReplayCutoff, cfg.ReplayEpoch = "0", "marker", fmt.Sprint(stop.Epoch-1)
	target := e.startConfig(cfg, sidecar.Options{})
	dst := startMultiApp(t, target.AMQPAddr(), []string{q}, 5, time.Millisecond)
	if _, err := (control.Client{URL: "http://" + target.ControlAddr(), Token: token}).WaitSwitched(t.Context(), 20*time.Second); err != nil {
		t.Fatalf("the target did not switch: %v", err)
	}
	feedTheTarget(t, e, q, src, dst)
}

// startNeverFed starts a source sidecar and an app consuming a new, empty
// queue q through it.
func startNeverFed(t *testing.T) (*env, string, *sidecar.Sidecar, *multiApp) {
	e := newEnv(t)
	q := e.queue()
	source := e.start(sidecar.Options{})
	src := startMultiApp(t, source.AMQPAddr(), []string{q}, 5, time.Millisecond)
	testenv.Eventually(t, 30*time.Second, "the source's app to consume", func() bool {
		return e.consumers(q) > 0
	})
	return e, q, source, src
}

// feedTheTarget publishes 20 messages to q after a handover of a source
// whose app had none: the target's app folds them all, the source's none.
func feedTheTarget(t *testing.T, e *env, q string, src, dst *multiApp) {
	const after = 20
	want := &chain{}
	for i := 1; i <= after; i++ {
		want.add([]byte(fmt.Sprintf("%s-%d", q, i)))
	}
	var producers sync.WaitGroup
	publishPaced(t, e, q, after, 300, &producers)
	producers.Wait()
	testenv.Eventually(t, 30*time.Second, "the target's app to process the messages", func() bool {
		n, _ := dst.state(q)
		return n >= after
	})
	if n, h := dst.state(q); n != after || h != want.hex() {
		t.Errorf("target app: %d messages, hash %s; want %d, %s", n, h, after, want.hex())
	}
	if n, _ := src.state(q); n != 0 {
		t.Errorf("source app: %d messages, want 0", n)
	}
}
