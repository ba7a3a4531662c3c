package sidecar_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
)

func bodies(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i+1)
	}
	return out
}

// seen is what the app received, per queue, in order.
type seen struct {
	mu      sync.Mutex
	byQueue map[string][]string
	total   int
}

func (s *seen) add(queue string, d amqp.Delivery) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byQueue == nil {
		s.byQueue = map[string][]string{}
	}
	s.byQueue[queue] = append(s.byQueue[queue], string(d.Body))
	s.total++
}

// TestTransparency drives an unmodified amqp091-go client through the
// sidecar over most of what a client may do, then checks that the log holds
// exactly what the app received, in order, with gap-free IDs.
func TestTransparency(t *testing.T) {
	e := newEnv(t)
	e.start(sidecar.Options{})
	conn := e.dial(amqp.Config{Heartbeat: time.Second})
	var app seen

	t.Run("publish with confirms, consume with qos, ack", func(t *testing.T) {
		q := e.queue()
		ch, _ := conn.Channel()
		defer ch.Close()
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 50))
		for _, b := range bodies("a", 50) {
			if err := ch.Publish("", q, false, false, amqp.Publishing{Body: []byte(b), MessageId: b, Headers: amqp.Table{"k": int32(7)}}); err != nil {
				t.Fatal(err)
			}
		}
		for i := 1; i <= 50; i++ {
			c := <-confirms
			if !c.Ack || c.DeliveryTag != uint64(i) {
				t.Fatalf("confirm %d = %+v, want ack of tag %d", i, c, i)
			}
		}
		if err := ch.Qos(5, 0, false); err != nil {
			t.Fatal(err)
		}
		ds, err := ch.Consume(q, "c1", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range bodies("a", 50) {
			d := recv(t, ds)
			if string(d.Body) != want || d.MessageId != want || d.Headers["k"] != int32(7) {
				t.Fatalf("got %q (id %q, headers %v), want %q with its properties", d.Body, d.MessageId, d.Headers, want)
			}
			app.add(q, d)
			d.Ack(false)
		}
	})

	t.Run("get and get-empty", func(t *testing.T) {
		q := e.queue()
		e.publish(q, "g-1", "g-2")
		ch, _ := conn.Channel()
		defer ch.Close()
		for _, want := range []string{"g-1", "g-2"} {
			d, ok, err := ch.Get(q, false)
			if err != nil || !ok || string(d.Body) != want {
				t.Fatalf("get = %q, %v, %v; want %q", d.Body, ok, err, want)
			}
			app.add(q, d)
			d.Ack(false)
		}
		if _, ok, err := ch.Get(q, false); ok || err != nil {
			t.Fatalf("get on an empty queue = ok %v, err %v; want get-empty", ok, err)
		}
	})

	t.Run("recover redelivers", func(t *testing.T) {
		q := e.queue()
		e.publish(q, "r-1", "r-2")
		ch, _ := conn.Channel()
		defer ch.Close()
		ds, _ := ch.Consume(q, "", false, false, false, false, nil)
		for range 2 {
			app.add(q, recv(t, ds))
		}
		if err := ch.Recover(true); err != nil { //nolint:staticcheck // SA1019: apps still send basic.recover, and the sidecar must pass it through
			t.Fatal(err)
		}
		for _, want := range []string{"r-1", "r-2"} {
			d := recv(t, ds)
			if string(d.Body) != want || !d.Redelivered {
				t.Fatalf("after recover got %q redelivered=%v, want %q redelivered", d.Body, d.Redelivered, want)
			}
			app.add(q, d)
			d.Ack(false)
		}
	})

	t.Run("nack requeues, reject drops, multiple ack", func(t *testing.T) {
		q := e.queue()
		e.publish(q, bodies("n", 10)...)
		ch, _ := conn.Channel()
		defer ch.Close()
		if err := ch.Qos(10, 0, false); err != nil {
			t.Fatalf("qos: %v", err)
		}
		ds, _ := ch.Consume(q, "", false, false, false, false, nil)
		first := recv(t, ds)
		app.add(q, first)
		first.Nack(false, true) // back to the queue
		second := recv(t, ds)
		app.add(q, second)
		second.Reject(false) // dropped
		var last amqp.Delivery
		got := map[string]bool{}
		for len(got) < 9 { // n-1 comes back once; n-2 was dropped
			last = recv(t, ds)
			app.add(q, last)
			got[string(last.Body)] = true
		}
		if err := last.Ack(true); err != nil {
			t.Fatal(err)
		}
		if !got["n-1"] || got["n-2"] {
			t.Fatalf("after nack(requeue) and reject got %v, want n-1 back and n-2 gone", got)
		}
	})

	t.Run("cancel stops deliveries", func(t *testing.T) {
		q := e.queue()
		ch, _ := conn.Channel()
		defer ch.Close()
		ds, _ := ch.Consume(q, "to-cancel", false, false, false, false, nil)
		if err := ch.Cancel("to-cancel", false); err != nil {
			t.Fatal(err)
		}
		if _, ok := <-ds; ok {
			t.Fatal("deliveries kept coming after cancel")
		}
	})

	t.Run("several channels at once", func(t *testing.T) {
		var wg sync.WaitGroup
		for c := range 4 {
			q := e.queue()
			e.publish(q, bodies(fmt.Sprintf("c%d", c), 100)...)
			wg.Add(1)
			go func() {
				defer wg.Done()
				ch, err := conn.Channel()
				if err != nil {
					t.Error(err)
					return
				}
				defer ch.Close()
				if err := ch.Qos(20, 0, false); err != nil {
					t.Errorf("qos: %v", err)
					return
				}
				ds, _ := ch.Consume(q, "", false, false, false, false, nil)
				for i := range 100 {
					d := recv(t, ds)
					app.add(q, d)
					if i%10 == 9 {
						d.Ack(true)
					}
				}
			}()
		}
		wg.Wait()
	})

	t.Run("heartbeats keep an idle connection open", func(t *testing.T) {
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		time.Sleep(3500 * time.Millisecond) // three heartbeat intervals, idle
		select {
		case err := <-closed:
			t.Fatalf("idle connection closed: %v", err)
		default:
		}
		ch, err := conn.Channel()
		if err != nil {
			t.Fatalf("open a channel after idling: %v", err)
		}
		ch.Close()
	})

	// Every delivery the app received is in the log, in the order the app got
	// it (per queue), with gap-free IDs; the last is confirmed.
	testenvEventually(t, func() bool { return e.state().Log.ConfirmedID == uint64(app.total) })
	recs := deliveries(t, e.records(), 1)
	if len(recs) != app.total {
		t.Fatalf("log holds %d deliveries, app received %d", len(recs), app.total)
	}
	logged := map[string][]string{}
	for _, r := range recs {
		logged[r.Queue] = append(logged[r.Queue], string(r.Body))
	}
	if d := cmp.Diff(app.byQueue, logged); d != "" {
		t.Errorf("log per queue (-app received +logged):\n%s", d)
	}
}

func testenvEventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAckWaitsForLog slows the log down and watches the frames the sidecar
// writes to the broker: no ack may go upstream before the log confirmed the
// deliveries it covers.
func TestAckWaitsForLog(t *testing.T) {
	e := newEnv(t)
	tp, slow := e.startTapped(150 * time.Millisecond)
	q := e.queue()
	const n = 30
	e.publish(q, bodies("s", n)...)
	ch, _ := e.dial(amqp.Config{}).Channel()
	if err := ch.Qos(5, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	ds, _ := ch.Consume(q, "", false, false, false, false, nil)
	for i := range n {
		d := recv(t, ds)
		d.Ack(i%3 == 2) // a mix of single and multiple acks
	}
	testenvEventually(t, func() bool {
		acks := tp.snapshot()
		return len(acks) > 0 && acks[len(acks)-1].tag == n
	})
	// One channel on a fresh log: delivery tag k is delivery ID k.
	for _, a := range tp.snapshot() {
		conf, ok := slow.confirmedAt(a.tag)
		if !ok || a.at.Before(conf) {
			t.Errorf("ack of tag %d went upstream at %s, before its record was confirmed (%v, confirmed=%v)",
				a.tag, a.at.Format("15:04:05.000"), conf.Format("15:04:05.000"), ok)
		}
	}
}

// TestLogOutageHoldsAcks makes the log fail: acks are held (the broker
// still counts the message unacked), /state says degraded, and the ack goes
// through once the log is back.
func TestLogOutageHoldsAcks(t *testing.T) {
	e := newEnv(t)
	tp, slow := e.startTapped(0)
	q := e.queue()
	e.publish(q, "o-1")
	ch, _ := e.dial(amqp.Config{}).Channel()
	slow.setFailing(true)
	ds, _ := ch.Consume(q, "", false, false, false, false, nil)
	d := recv(t, ds)
	d.Ack(false)
	testenvEventually(t, func() bool { return e.state().Degraded })
	time.Sleep(300 * time.Millisecond) // the app's ack would be upstream by now
	if acks := tp.snapshot(); len(acks) != 0 {
		t.Fatalf("ack went upstream while the log was failing: %+v", acks)
	}
	if code := e.call("GET", "/metrics", nil); code != http.StatusOK {
		t.Fatalf("GET /metrics = %d", code)
	}
	slow.setFailing(false)
	testenvEventually(t, func() bool { return len(tp.snapshot()) == 1 })
	if s := e.state(); s.Degraded {
		t.Errorf("state still degraded after the log recovered: %+v", s)
	}
	if recs := deliveries(t, e.records(), 1); len(recs) != 1 || string(recs[0].Body) != "o-1" {
		t.Errorf("log = %+v, want the one delivery", recs)
	}
}

// TestQuiesceAndResume: quiesce holds new deliveries back, returns once the
// app acked what it has, with the last delivery's ID; resume hands over the
// held ones.
//
// The app takes a full prefetch window (5) and acks nothing until the
// sidecar is quiesced: the broker sends no sixth delivery before an ack, so
// the quiesce's ID is exactly 5. (Acking earlier would let the broker send
// more, which the sidecar forwards to the app before the quiesce begins and
// then rightly waits for.)
func TestQuiesceAndResume(t *testing.T) {
	e := newEnv(t)
	e.start(sidecar.Options{})
	q := e.queue()
	e.publish(q, bodies("q", 20)...)
	ch, _ := e.dial(amqp.Config{}).Channel()
	if err := ch.Qos(5, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	ds, _ := ch.Consume(q, "", false, false, false, false, nil)

	var held []amqp.Delivery
	for range 5 {
		held = append(held, recv(t, ds))
	}
	type result struct {
		code int
		body []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.code, r.body, r.err = e.callRaw("POST", "/quiesce?timeout=10s")
		done <- r
	}()
	testenvEventually(t, func() bool { return e.state().Mode == "quiesced" })
	select {
	case r := <-done:
		t.Fatalf("quiesce returned %d %s (%v) while the app still had unacked deliveries", r.code, r.body, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	var got []string
	for _, d := range held {
		got = append(got, string(d.Body))
		d.Ack(false)
	}
	r := <-done
	var cut control.Cut // the answer also carries the hold, a string
	if r.err != nil || r.code != 200 || json.Unmarshal(r.body, &cut) != nil || cut.ID != 5 {
		t.Fatalf("quiesce = %d %s (%v), want 200 with checkpointId 5", r.code, r.body, r.err)
	}
	noDelivery(t, ds, 300*time.Millisecond, "the sidecar is quiesced")
	if s := e.state(); s.Mode != "quiesced" || s.Held == 0 {
		t.Errorf("state = %+v, want quiesced with deliveries held", s)
	}
	if code := e.call("POST", "/resume", nil); code != 200 {
		t.Fatalf("resume = %d", code)
	}
	for len(got) < 20 {
		d := recv(t, ds)
		got = append(got, string(d.Body))
		d.Ack(false)
	}
	if d := cmp.Diff(bodies("q", 20), got); d != "" {
		t.Errorf("app received (-want +got):\n%s", d)
	}
	testenvEventually(t, func() bool { return e.state().Log.ConfirmedID == 20 })
	deliveries(t, e.records(), 1)
}

// TestStopReleasesHeldDeliveries: stop cancels the app's consumer, waits
// for its acks, releases the deliveries held back since the quiesce and
// writes a cutoff marker with the last delivery ID. By default the app
// takes the held deliveries before the cutoff, so it has taken exactly the
// broker's first messages, in order, and the broker holds the rest. With
// MS2M_STOP_HELD=requeue they go back to the broker instead. Either way
// nothing is lost or taken twice, and resume consumes again.
func TestStopReleasesHeldDeliveries(t *testing.T) {
	for _, mode := range []string{"deliver", "requeue"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config()
			cfg.StopHeld = mode
			tp := &tap{}
			e.startConfig(cfg, sidecar.Options{Dial: tp.dial})
			stopReleasesHeld(t, e, tp, mode)
		})
	}
}

func stopReleasesHeld(t *testing.T, e *env, tp *tap, mode string) {
	q := e.queue()
	const n = 60
	e.publish(q, bodies("x", n)...)
	ch, _ := e.dial(amqp.Config{}).Channel()
	if err := ch.Qos(10, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	ds, _ := ch.Consume(q, "app", false, false, false, false, nil)

	// The app works slowly, acking as it goes.
	var mu sync.Mutex
	var got []string
	stopApp := make(chan struct{})
	appDone := make(chan struct{})
	go func() {
		defer close(appDone)
		for {
			select {
			case d, ok := <-ds:
				if !ok {
					return
				}
				time.Sleep(5 * time.Millisecond)
				mu.Lock()
				got = append(got, string(d.Body))
				mu.Unlock()
				d.Ack(false)
			case <-stopApp:
				return
			}
		}
	}()
	testenvEventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= 15 })
	// Quiesce first, so that the broker refills the prefetch window while
	// the sidecar holds deliveries back: those are what stop releases.
	if code := e.call("POST", "/quiesce?timeout=10s", nil); code != 200 {
		t.Fatalf("quiesce = %d", code)
	}
	testenvEventually(t, func() bool { return e.state().Held == 10 })
	mu.Lock()
	sawAtQuiesce := len(got)
	mu.Unlock()

	var res struct {
		CutoffID uint64 `json:"cutoffId"`
		Epoch    uint64 `json:"epoch"`
		Held     int    `json:"held"`
		Requeued int    `json:"requeued"`
	}
	if code := e.call("POST", "/stop?timeout=10s", &res); code != 200 {
		t.Fatalf("stop = %d", code)
	}
	time.Sleep(200 * time.Millisecond) // nothing more may arrive
	mu.Lock()
	sawBeforeStop := append([]string(nil), got...)
	mu.Unlock()
	if uint64(len(sawBeforeStop)) != res.CutoffID {
		t.Fatalf("app processed %d messages, cutoff ID is %d: they must match", len(sawBeforeStop), res.CutoffID)
	}
	rest := e.drainQueue(q)
	switch mode {
	case "deliver":
		if res.Held != 10 || res.Requeued != 0 || tp.rejected() != 0 {
			t.Errorf("stop gave the app %d and requeued %d (%d rejects upstream), want the 10 held deliveries given to the app and none requeued",
				res.Held, res.Requeued, tp.rejected())
		}
		if len(sawBeforeStop) != sawAtQuiesce+10 {
			t.Errorf("app processed %d at the quiesce and %d at the stop, want the 10 held ones more", sawAtQuiesce, len(sawBeforeStop))
		}
		// In order, with nothing left out: the app has the first
		// messages, the broker the rest.
		if d := cmp.Diff(bodies("x", n), append(append([]string(nil), sawBeforeStop...), rest...)); d != "" {
			t.Errorf("seen by the app, then left in the queue (-want +got):\n%s", d)
		}
	case "requeue":
		if res.Held != 0 || res.Requeued != 10 || tp.rejected() != 10 {
			t.Errorf("stop gave the app %d and requeued %d (%d rejects upstream), want the 10 held deliveries requeued",
				res.Held, res.Requeued, tp.rejected())
		}
		all := append(append([]string(nil), sawBeforeStop...), rest...)
		sort.Slice(all, func(i, j int) bool { return num(all[i]) < num(all[j]) })
		if d := cmp.Diff(bodies("x", n), all); d != "" {
			t.Errorf("seen by the app + left in the queue (-want +got):\n%s", d)
		}
	}
	e.publish(q, rest...) // back where they were, for the resume

	recs := e.records()
	last := recs[len(recs)-1]
	if last.Kind != shadowqueue.KindCutoff || last.ID != res.CutoffID || last.Epoch != res.Epoch {
		t.Errorf("last log record = %+v, want a cutoff marker with ID %d epoch %d", last, res.CutoffID, res.Epoch)
	}
	if got := deliveries(t, recs, 1); uint64(len(got)) != res.CutoffID {
		t.Errorf("log holds %d deliveries, want %d", len(got), res.CutoffID)
	}

	// Resume: the app's consumer comes back by itself.
	e.publish(q, "after-resume")
	if code := e.call("POST", "/resume", nil); code != 200 {
		t.Fatalf("resume = %d", code)
	}
	testenvEventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0 && got[len(got)-1] == "after-resume"
	})
	close(stopApp)
	<-appDone
	mu.Lock()
	if len(got) != n+1 {
		t.Errorf("after the resume the app has %d messages, want %d", len(got), n+1)
	}
	mu.Unlock()
	recs = e.records()
	if r := recs[len(recs)-1]; !(r.Kind == shadowqueue.KindDelivery && r.ID == uint64(n+1)) {
		t.Errorf("after resume the log ends with %+v, want delivery %d", r, n+1)
	}
	var sawResume bool
	for _, r := range recs {
		sawResume = sawResume || (r.Kind == shadowqueue.KindResume && r.Epoch == res.Epoch)
	}
	if !sawResume {
		t.Error("no resume marker voids the cutoff")
	}
}

// TestStopWaitsForAConsumeInFlight: a basic.consume the broker has not
// confirmed when the stop comes is waited for and cancelled too, and what
// it delivered in between goes to the app before the cutoff, not back to
// the broker.
func TestStopWaitsForAConsumeInFlight(t *testing.T) {
	e := newEnv(t)
	tp := &tap{}
	e.start(sidecar.Options{Dial: tp.dial})
	q := e.queue()
	const n = 30
	e.publish(q, bodies("c", n)...)
	ch, err := e.dial(amqp.Config{}).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(5, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}

	// The app consumes and acks as it goes; the broker answers late.
	tp.readDelay.Store(int64(300 * time.Millisecond))
	var mu sync.Mutex
	var got []string
	go func() {
		ds, err := ch.Consume(q, "app", false, false, false, false, nil)
		if err != nil {
			t.Errorf("consume: %v", err)
			return
		}
		for d := range ds {
			mu.Lock()
			got = append(got, string(d.Body))
			mu.Unlock()
			d.Ack(false)
		}
	}()
	time.Sleep(50 * time.Millisecond) // the consume is out, its consume-ok not in
	var res struct {
		CutoffID uint64 `json:"cutoffId"`
		Held     int    `json:"held"`
		Requeued int    `json:"requeued"`
	}
	if code := e.call("POST", "/stop?timeout=30s", &res); code != 200 {
		t.Fatalf("stop = %d", code)
	}
	tp.readDelay.Store(0)
	time.Sleep(200 * time.Millisecond) // nothing more may arrive
	mu.Lock()
	saw := append([]string(nil), got...)
	mu.Unlock()
	if res.CutoffID == 0 || uint64(len(saw)) != res.CutoffID || tp.rejected() != 0 || res.Requeued != 0 {
		t.Errorf("stop: cutoff %d, app took %d, held %d, requeued %d, %d rejects upstream; want the late consume's deliveries given to the app, none back to the broker",
			res.CutoffID, len(saw), res.Held, res.Requeued, tp.rejected())
	}
	rest := e.drainQueue(q)
	if d := cmp.Diff(bodies("c", n), append(saw, rest...)); d != "" {
		t.Errorf("seen by the app, then left in the queue (-want +got):\n%s", d)
	}
}

func num(s string) int {
	n, _ := strconv.Atoi(s[strings.LastIndexByte(s, '-')+1:])
	return n
}

// TestIDsContinueAfterRestart: a new sidecar on the same log continues the
// IDs where the old one stopped.
func TestIDsContinueAfterRestart(t *testing.T) {
	e := newEnv(t)
	q := e.queue()
	e.publish(q, bodies("r", 20)...)
	for round := range 2 {
		sc := e.start(sidecar.Options{})
		ch, _ := e.dial(amqp.Config{}).Channel()
		for range 10 {
			d, ok, err := ch.Get(q, false)
			if !ok || err != nil {
				t.Fatalf("round %d: get = %v, %v", round, ok, err)
			}
			d.Ack(false)
		}
		testenvEventually(t, func() bool { return e.state().Log.ConfirmedID == uint64(10*(round+1)) })
		// The channel's close-ok comes after the broker took the acks
		// before it: a sidecar closed before that would have the last
		// ones redelivered, and tee them again under new IDs.
		if err := ch.Close(); err != nil {
			t.Fatalf("round %d: close the channel: %v", round, err)
		}
		sc.Close()
	}
	recs := deliveries(t, e.records(), 1)
	if len(recs) != 20 {
		t.Fatalf("log holds %d deliveries, want 20", len(recs))
	}
	for i, r := range recs {
		if want := fmt.Sprintf("r-%d", i+1); string(r.Body) != want || r.Queue != q {
			t.Errorf("record %d = %q on %q, want %q on %q", r.ID, r.Body, r.Queue, want, q)
		}
	}
}

// TestControlNeedsToken: the control API refuses calls without the token.
func TestControlNeedsToken(t *testing.T) {
	e := newEnv(t)
	e.start(sidecar.Options{})
	for _, path := range []string{"/state", "/quiesce", "/resume", "/stop"} {
		method := "POST"
		if path == "/state" {
			method = "GET"
		}
		req, _ := http.NewRequest(method, "http://"+e.sc.ControlAddr()+path, nil)
		req.Header.Set("Authorization", "Bearer wrong")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s %s with a wrong token = %d, want 401", method, path, resp.StatusCode)
		}
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get("http://" + e.sc.ControlAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d, want 200", path, resp.StatusCode)
		}
	}
}
