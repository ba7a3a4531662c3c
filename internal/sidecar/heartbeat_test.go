package sidecar_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestLongReplayKeepsTheBrokerConnection: a target's app that is busy with
// a replay longer than a few heartbeat intervals keeps its connection. Its
// client sends no heartbeats while it writes acks, and the sidecar swallows
// those acks (they are for replayed messages), so without the sidecar's own
// heartbeats the broker hears nothing and closes the connection ("missed
// heartbeats from client"), which fails the migration.
func TestLongReplayKeepsTheBrokerConnection(t *testing.T) {
	const n = 80
	e := newEnv(t)
	q := e.queue()
	source := e.start(sidecar.Options{})
	target := e.startConfig(targetConfig(e), sidecar.Options{})
	src := startMultiApp(t, source.AMQPAddr(), []string{q}, 10, 0)
	want := &chain{}
	var bodies []string
	for i := 1; i <= n; i++ {
		b := fmt.Sprintf("%s-%d", q, i)
		want.add([]byte(b))
		bodies = append(bodies, b)
	}
	e.publish(q, bodies...)
	testenv.Eventually(t, 20*time.Second, "the source's app to process every message", func() bool {
		c, _ := src.state(q)
		return c == n
	})

	// The target's app: heartbeats every 3 s, 150 ms per message, so its
	// replay of n messages takes 4 heartbeat intervals, past the broker's
	// patience. amqp091-go sends a heartbeat only when it wrote nothing for
	// the interval less a second, and it acks every 150 ms.
	conn, err := amqp.DialConfig("amqp://guest:guest@"+target.AMQPAddr()+"/", amqp.Config{Heartbeat: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	ds, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := &chain{}
	go func() {
		for d := range ds {
			time.Sleep(150 * time.Millisecond)
			mu.Lock()
			got.add(d.Body)
			mu.Unlock()
			d.Ack(false)
		}
	}()
	handover(t, source, target, control.HandoverOptions{MaxLag: n})
	testenv.Eventually(t, 30*time.Second, "the target's app to replay every message", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got.count >= n
	})
	select {
	case err := <-closed:
		t.Fatalf("the target's app lost its connection during the replay: %v", err)
	default:
	}
	mu.Lock()
	defer mu.Unlock()
	if got.count != n || got.hex() != want.hex() {
		t.Fatalf("target processed %d with hash %s, want %d and %s", got.count, got.hex(), n, want.hex())
	}
}
