package sidecar_test

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
)

// TestAutoAckLogOutageIsBounded (issue 21): an auto-ack consumer has no
// prefetch, so while the log is down nothing but the sidecar's own bound
// keeps the broker's deliveries from piling up in its memory. With the log
// failing and far more published than the bound, the pending records stay
// within the bound plus one read from the broker (backpressure); once the
// log is back, every delivery the app got is in the log, in the app's
// order, without a gap.
func TestAutoAckLogOutageIsBounded(t *testing.T) {
	e := newEnv(t)
	const (
		n          = 1500
		maxRecords = 40
		bodySize   = 1000
	)
	slow := &slowLog{confirmed: map[uint64]time.Time{}}
	cfg := e.config()
	cfg.LogPendingMaxRecords = maxRecords
	cfg.LogPendingMaxBytes = 8 << 20 // the record count is the bound here
	e.startConfig(cfg, sidecar.Options{
		WrapLog: func(l shadowqueue.Log) shadowqueue.Log { slow.Log = l; return slow },
	})
	q := e.queue()
	slow.setFailing(true)
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("m-%05d-%s", i, strings.Repeat("x", bodySize-8))
	}
	e.publish(q, want...)

	ch, err := e.dial(amqp.Config{}).Channel()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(q, "", true, false, false, false, nil) // auto-ack
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	go func() {
		for d := range ds {
			mu.Lock()
			got = append(got, string(d.Body))
			mu.Unlock()
		}
	}()
	received := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got)
	}

	testenvEventually(t, func() bool { s := e.state(); return s.Degraded && s.Log.Backpressure })
	if v := metricValue(t, "http://"+e.sc.ControlAddr(), "ms2m_sidecar_log_backpressure"); v != 1 {
		t.Errorf("ms2m_sidecar_log_backpressure = %v while at the bound, want 1", v)
	}
	// The bound may be passed by what one read from the broker holds (the
	// proxy reads 64 KiB at a time), no more.
	limit := maxRecords + (64<<10)/bodySize + 1
	maxPending := 0
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		s := e.state()
		maxPending = max(maxPending, s.Log.Pending)
		if s.Log.Pending > limit {
			t.Fatalf("pending records = %d (%d bytes) with the log down, want at most %d: the sidecar kept reading from the broker", s.Log.Pending, s.Log.PendingBytes, limit)
		}
	}
	if r := received(); r > limit || r >= n {
		t.Fatalf("the app got %d of %d deliveries with the log down, want at most %d", r, n, limit)
	}
	t.Logf("log down: pending records at most %d (limit %d), app received %d of %d", maxPending, limit, received(), n)

	slow.setFailing(false)
	deadline := time.Now().Add(60 * time.Second)
	for received() < n || e.state().Log.ConfirmedID < n {
		if time.Now().After(deadline) {
			t.Fatalf("after the log came back: the app got %d of %d, log confirmed up to ID %d", received(), n, e.state().Log.ConfirmedID)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if s := e.state(); s.Log.Backpressure || s.Degraded {
		t.Errorf("state after recovery = %+v, want no backpressure and not degraded", s)
	}
	mu.Lock()
	app := append([]string(nil), got...)
	mu.Unlock()
	if diff := cmp.Diff(want, app); diff != "" {
		t.Errorf("the app's deliveries (-want +got):\n%s", diff)
	}
	var logged []string
	for _, r := range deliveries(t, e.records(), 1) { // fails on a gap in the IDs
		logged = append(logged, string(r.Body))
	}
	if diff := cmp.Diff(app, logged); diff != "" {
		t.Errorf("the log against what the app got (-app +log):\n%s", diff)
	}
}

// TestBackpressureKeepsConnectionsAlive: while reads from the broker are
// paused, the broker's heartbeats stay unread, so the sidecar sends the app
// its own: an app with a 1 s heartbeat keeps its connection through a
// pause of several intervals (amqp091-go gives up after three silent
// ones), and the broker, which gets the sidecar's heartbeats, keeps its
// side. Afterwards every message arrives, in order.
func TestBackpressureKeepsConnectionsAlive(t *testing.T) {
	e := newEnv(t)
	const n = 400
	slow := &slowLog{confirmed: map[uint64]time.Time{}}
	cfg := e.config()
	cfg.LogPendingMaxRecords = 20
	cfg.LogPendingMaxBytes = 8 << 20
	e.startConfig(cfg, sidecar.Options{
		WrapLog: func(l shadowqueue.Log) shadowqueue.Log { slow.Log = l; return slow },
	})
	q := e.queue()
	slow.setFailing(true)
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("h-%04d-%s", i, strings.Repeat("y", 500))
	}
	e.publish(q, want...)
	conn := e.dial(amqp.Config{Heartbeat: time.Second})
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	go func() {
		for d := range ds {
			mu.Lock()
			got = append(got, string(d.Body))
			mu.Unlock()
		}
	}()
	testenvEventually(t, func() bool { return e.state().Log.Backpressure })
	pause := 5 * time.Second
	if s := os.Getenv("MS2M_TEST_BACKPRESSURE_PAUSE"); s != "" {
		if pause, err = time.ParseDuration(s); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-closed:
		t.Fatalf("the app's connection closed during backpressure: %v", err)
	case <-time.After(pause): // several heartbeat intervals without a broker frame
	}
	if !e.state().Log.Backpressure {
		t.Fatal("backpressure ended while the log was still down")
	}
	slow.setFailing(false)
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		k := len(got)
		mu.Unlock()
		if k == n {
			break
		}
		select {
		case err := <-closed:
			t.Fatalf("the app's connection closed after %d of %d deliveries: %v", k, n, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the app got %d of %d after the log came back", k, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the app's deliveries (-want +got):\n%s", diff)
	}
}
