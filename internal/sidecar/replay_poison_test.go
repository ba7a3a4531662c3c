package sidecar_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// syncBuffer is a bytes.Buffer that a logger may write from any goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReplayOfPoisonedLog is issue 20's attack on the replay log: a client
// with the stream's credentials appends a record whose routing key is 300
// bytes to a log that a target sidecar replays. On 58fa1c0 the target
// decoded it and panicked in amqpwire.AppendShortstr when it built the
// basic.deliver, taking the sidecar (and its pod's app) down. Now the
// target refuses the record: it stays up, feeds the app nothing from the
// bad record on, consumes nothing upstream, and reports the failure in
// /state (source.error, which the migrator's handover reads and rolls back
// on) and in its logs.
func TestReplayOfPoisonedLog(t *testing.T) {
	e := newEnv(t)
	q := e.queue()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	l, err := shadowqueue.OpenStream(ctx, shadowqueue.StreamOptions{URI: e.broker.StreamURI, Name: e.log})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	recs := []shadowqueue.Record{
		{Kind: shadowqueue.KindDelivery, ID: 1, Queue: q, RoutingKey: q, Body: []byte("m1"), Time: now},
		{Kind: shadowqueue.KindDelivery, ID: 2, Queue: q, RoutingKey: strings.Repeat("k", 300), Body: []byte("m2"), Time: now},
		{Kind: shadowqueue.KindDelivery, ID: 3, Queue: q, RoutingKey: q, Body: []byte("m3"), Time: now},
	}
	for _, r := range recs { // one message each, as separate writers would
		if err := l.Write(ctx, []shadowqueue.Record{r}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()

	var logs syncBuffer
	cfg := e.config()
	cfg.ReplayStart, cfg.ReplayCutoff = "0", "3"
	e.startConfig(cfg, sidecar.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ch, err := e.dial(amqp.Config{}).Channel()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}

	var st targetState
	testenv.Eventually(t, 10*time.Second, "the bad record's error in /state", func() bool {
		st = targetState{}
		e.call("GET", "/state", &st)
		return st.Source != nil && strings.Contains(st.Source.Error, "RoutingKey")
	})
	for _, want := range []string{"offset", "length 300 exceeds the 255 bytes of an AMQP short string"} {
		if !strings.Contains(st.Source.Error, want) {
			t.Errorf("/state source.error = %q, want it to say %q", st.Source.Error, want)
		}
	}
	// Record 1 may have reached the app before the reader met record 2;
	// nothing from record 2 on may.
	deadline := time.After(500 * time.Millisecond)
	for done := false; !done; {
		select {
		case d, ok := <-ds:
			if !ok {
				t.Fatal("the app's delivery channel closed: the sidecar dropped the app's connection")
			}
			if string(d.Body) != "m1" {
				t.Fatalf("the app got %q, want nothing from the bad record on", d.Body)
			}
		case <-deadline:
			done = true
		}
	}
	if n := e.consumers(q); n != 0 {
		t.Errorf("the broker has %d consumers on %s, want 0: a failed replay must consume nothing upstream", n, q)
	}
	// Still up: the control API answers, the app's connection works.
	if code := e.call("GET", "/state", &st); code != 200 {
		t.Errorf("GET /state = %d after the bad record, want 200", code)
	}
	if _, err := ch.QueueDeclarePassive(q, false, false, false, false, nil); err != nil {
		t.Errorf("the app's channel fails after the bad record: %v", err)
	}
	testenv.Eventually(t, 5*time.Second, "the failure in the sidecar's logs", func() bool {
		return strings.Contains(logs.String(), "replay stopped") && strings.Contains(logs.String(), "RoutingKey")
	})
}
