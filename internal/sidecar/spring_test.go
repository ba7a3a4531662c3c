package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// springStart is how long a Spring consumer may take to start consuming:
// a JVM and a Spring context on a loaded 2-core machine take 10-40 s.
const springStart = 3 * time.Minute

// springConsumer runs the unmodified Spring Boot sample consumer
// (examples/consumer-spring) against the AMQP listener at amqpAddr, with
// Spring's own settings for the broker and its listener container's
// defaults (prefetch 250, AUTO acks, its own consumer restart), and env
// added. It returns the address of its state server once it consumes.
func springConsumer(t *testing.T, amqpAddr, q string, env map[string]string) string {
	t.Helper()
	java, jar := testenv.RequireSpringJar(t)
	addr := testenv.FreeAddr(t)
	vars := map[string]string{
		"SPRING_RABBITMQ_ADDRESSES": amqpAddr, "SPRING_RABBITMQ_USERNAME": "guest", "SPRING_RABBITMQ_PASSWORD": "guest",
		"QUEUE": q, "WORK_MS": "2", "HTTP_ADDR": addr, "DECLARE": "false",
		"CONNECTION_NAME": testenv.UniqueName("ms2m-test-spring"),
	}
	for k, v := range env {
		vars[k] = v
	}
	runApp(t, exec.Command(java, append(testenv.SpringJVMFlags, "-jar", jar)...), vars)
	return addr
}

// waitConsuming waits until the Spring consumer at addr has a consumer.
func waitConsuming(t *testing.T, addr string) {
	t.Helper()
	testenv.Eventually(t, springStart, "the Spring consumer at "+addr+" to consume", func() bool {
		s, err := appStateAt(addr)
		return err == nil && s.Connected
	})
}

// TestSpringConsumerHandoff is TestHandoff with the Spring Boot consumer on
// both sides, with Spring's default prefetch of 250 and multiple-acks: the
// source serves behind its sidecar, which tees every delivery into the log,
// while the target replays the log from ID 0; at a point while the producer
// runs, the source stops at a cutoff and the target replays up to it,
// switches to the queue and ends with the producer's hash, nothing skipped.
// The target's listener container is transacted (CHANNEL_TRANSACTED: tx.select,
// then each ack in a transaction committed when the listener returns), so
// its replayed deliveries are acked inside transactions that the sidecar
// settles, and its live ones after the handover in transactions the broker
// commits.
func TestSpringConsumerHandoff(t *testing.T) {
	const n = 600
	e := newEnv(t)
	q := e.queue()
	source := e.start(sidecar.Options{})
	target := e.startConfig(targetConfig(e), sidecar.Options{})
	dst := &env{t: t, broker: e.broker, log: e.log, sc: target}
	srcApp := springConsumer(t, source.AMQPAddr(), q, nil)
	dstApp := springConsumer(t, target.AMQPAddr(), q, map[string]string{"CHANNEL_TRANSACTED": "true"})
	waitConsuming(t, srcApp)
	waitConsuming(t, dstApp)

	producer := testenv.Build(t, "examples/producer")
	want := make(chan string, 1)
	go func() { want <- produceHash(t, producer, e, q, n, "150") }()
	testenv.Eventually(t, 30*time.Second, "the source to process a part", func() bool {
		s, _ := appStateAt(srcApp)
		return s.Count >= n/4
	})
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	stop, err := control.Handover(ctx,
		control.Client{URL: "http://" + source.ControlAddr(), Token: token},
		control.Client{URL: "http://" + target.ControlAddr(), Token: token},
		control.HandoverOptions{MaxLag: 5})
	if err != nil {
		t.Fatalf("handover: %v", err)
	}
	hash := <-want
	if hash == "" {
		t.FailNow() // produceHash reported why
	}
	srcState, _ := appStateAt(srcApp)
	if uint64(srcState.Count) != stop.CutoffID || srcState.Skipped != 0 {
		t.Errorf("source app %+v at the stop, want count = the cutoff ID %d and nothing skipped", srcState, stop.CutoffID)
	}
	var got appState
	testenv.Eventually(t, 60*time.Second, "the target to process every message", func() bool {
		got, _ = appStateAt(dstApp)
		return got.Count >= n
	})
	if got.Count != n || got.Hash != hash || got.Skipped != 0 {
		t.Fatalf("target app %+v, want count %d, the producer's hash %s and nothing skipped (cutoff %d)", got, n, hash, stop.CutoffID)
	}
	testenv.ExpectTransacted(t, q)
	testenv.Eventually(t, 10*time.Second, "the target's log writes", func() bool {
		return dst.state().Log.ConfirmedID == n
	})
	if recs := deliveries(t, e.records(), 1); len(recs) != n {
		t.Errorf("log holds %d deliveries, want %d", len(recs), n)
	}
	t.Logf("handover at cutoff %d of %d, lag at stop %d, downtime %s", stop.CutoffID, n, stop.LagAtStop, stop.Downtime)
}

// TestSpringConsumerRecoversMidReplay cuts a replaying target's app
// connection: Spring's listener container (the client's own automatic
// recovery is off, as Spring sets it) opens a new connection and channel,
// sets its prefetch again and consumes with a new consumer tag; the target
// sidecar replays the rest and the app ends with the producer's hash. As in
// TestTargetAppReconnectsMidReplay, the app keeps its memory across the
// cut, so what it folded but whose ack died with the connection comes again
// as a redelivery: the one Spring test with SKIP_REDELIVERIES on, bounded by
// what can be in flight between a fold and its ack.
func TestSpringConsumerRecoversMidReplay(t *testing.T) {
	const n = 300
	e := newEnv(t)
	q := e.queue()
	_, want := sourceThenStop(t, e, q, n)
	target := e.startConfig(targetConfig(e), sidecar.Options{})
	cut := newCutter(t, target.AMQPAddr())
	addr := springConsumer(t, cut.addr(), q, map[string]string{"WORK_MS": "10", "SKIP_REDELIVERIES": "true"})
	testenv.Eventually(t, springStart, "the target to replay a part", func() bool {
		s, _ := appStateAt(addr)
		return s.Count >= 30
	})
	cut.cut()
	var got appState
	testenv.Eventually(t, 60*time.Second, "the target to process everything after its consumer restarted", func() bool {
		got, _ = appStateAt(addr)
		return got.Count >= n
	})
	if got.Count != n || got.Hash != want || got.Skipped > 2 || got.Reconnects < 1 {
		t.Fatalf("target after a consumer restart: %+v, want %d messages, the producer's hash %s, a reconnect and at most 2 skipped (Spring acks each message after its fold)", got, n, want)
	}
	t.Logf("the Spring consumer restarted %d time(s) and skipped %d redelivered message(s)", got.Reconnects, got.Skipped)
}

// produceHash runs the sample producer binary to the end and returns its
// hash, or "" after reporting the failure; it may run on another goroutine.
func produceHash(t *testing.T, producer string, e *env, q string, n int, rate string) string {
	out, err := exec.Command(producer,
		"-url", e.broker.AMQPURL, "-queue", q, "-count", fmt.Sprint(n), "-rate", rate, "-declare=false").Output()
	if err != nil {
		t.Errorf("producer: %v", err)
		return ""
	}
	var p struct {
		Hash string `json:"hash"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &p); err != nil {
		t.Errorf("producer printed %q: %v", out, err)
		return ""
	}
	return p.Hash
}
