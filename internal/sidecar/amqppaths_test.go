package sidecar_test

import (
	"context"
	"net"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/amqpwire"
	"github.com/ms2m/ms2m/internal/sidecar"
)

// nextDelivery waits for one delivery.
func nextDelivery(t *testing.T, msgs <-chan amqp.Delivery) amqp.Delivery {
	t.Helper()
	select {
	case m, ok := <-msgs:
		if !ok {
			t.Fatal("the delivery channel closed")
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery within 10 s")
	}
	return amqp.Delivery{}
}

// TestTransactedConsumer is Spring's channelTransacted=true through the
// sidecar: acks inside tx.select are settled by tx.commit and undone by
// tx.rollback, exactly as without the sidecar, and every delivery is in
// the log. The ack the sidecar holds for the log must reach the broker
// before the commit that follows it.
func TestTransactedConsumer(t *testing.T) {
	e := newEnv(t)
	e.start(sidecar.Options{})
	q := e.queue()
	e.publish(q, "m1", "m2", "m3")
	c := e.dial(amqp.Config{})
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Tx(); err != nil {
		t.Fatalf("tx.select through the sidecar: %v", err)
	}
	if err := ch.Qos(250, 0, false); err != nil { // Spring's default prefetch
		t.Fatal(err)
	}
	msgs, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		body   string
		commit bool
	}{{"m1", true}, {"m2", false}, {"m3", true}} {
		m := nextDelivery(t, msgs)
		if string(m.Body) != tc.body {
			t.Fatalf("got %q, want %q", m.Body, tc.body)
		}
		if err := m.Ack(false); err != nil {
			t.Fatal(err)
		}
		if tc.commit {
			err = ch.TxCommit()
		} else {
			err = ch.TxRollback()
		}
		if err != nil {
			t.Fatalf("tx commit=%v after %s: %v", tc.commit, tc.body, err)
		}
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	// The rolled-back ack left m2 unacked: closing the channel requeues it.
	if got := e.drainQueue(q); len(got) != 1 || got[0] != "m2" {
		t.Fatalf("the queue holds %q after commit, rollback, commit; want [m2] (the rolled-back one)", got)
	}
	if got := deliveries(t, e.records(), 1); len(got) != 3 {
		t.Fatalf("the log holds %d deliveries, want 3", len(got))
	}
}

// TestBrokerCancel: the broker cancels the app's consumer because its
// queue was deleted. The app is told (basic.cancel passes through), the
// sidecar forgets the consumer, and a quiesce and a stop do not wait for
// it.
func TestBrokerCancel(t *testing.T) {
	e := newEnv(t)
	e.start(sidecar.Options{})
	q := e.queue()
	e.publish(q, "m1")
	c := e.dial(amqp.Config{})
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	cancels := ch.NotifyCancel(make(chan string, 1))
	msgs, err := ch.Consume(q, "app-consumer", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := nextDelivery(t, msgs).Ack(false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.direct().QueueDelete(q, false, false, false); err != nil {
		t.Fatal(err)
	}
	select {
	case tag := <-cancels:
		if tag != "app-consumer" {
			t.Fatalf("cancelled consumer %q, want app-consumer", tag)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the app was not told that the broker cancelled its consumer")
	}
	var cut struct {
		ID uint64 `json:"checkpointId"`
	}
	if code := e.call("POST", "/quiesce", &cut); code != 200 || cut.ID != 1 {
		t.Fatalf("quiesce after the broker's cancel = %d, checkpoint ID %d; want 200 and 1", code, cut.ID)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := e.sc.Proxy().Stop(ctx); err != nil {
		t.Fatalf("stop after the broker's cancel: %v", err)
	}
}

// blockingConn injects connection.blocked and connection.unblocked into
// what the broker sends, right after the first channel.open-ok (the app
// has registered for them by then): RabbitMQ sends
// them when a resource alarm goes off and clears, which a test cannot
// raise on a shared broker without blocking everyone's publishers.
type blockingConn struct {
	net.Conn
	p       *amqpwire.Parser
	pending []byte
	done    bool
}

func (c *blockingConn) Read(b []byte) (int, error) {
	for len(c.pending) == 0 {
		buf := make([]byte, 32<<10)
		n, err := c.Conn.Read(buf)
		if n > 0 {
			data := buf[:n]
			if c.done {
				c.pending = append(c.pending, data...)
			} else if perr := c.p.Parse(data, func(f amqpwire.Frame) error {
				c.pending = append(c.pending, f.Raw...)
				if class, method, _ := amqpwire.MethodID(f.Payload); f.Type == amqpwire.FrameMethod && class == 20 && method == 11 && !c.done {
					c.done = true
					c.pending = amqpwire.AppendMethodFrame(c.pending, 0, &amqpwire.ConnectionBlocked{Reason: "low on memory"})
					c.pending = amqpwire.AppendMethodFrame(c.pending, 0, &amqpwire.ConnectionUnblocked{})
				}
				return nil
			}); perr != nil {
				return 0, perr
			}
		}
		if err != nil {
			if len(c.pending) > 0 {
				break
			}
			return 0, err
		}
	}
	n := copy(b, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// TestConnectionBlocked: the broker's connection.blocked and unblocked
// reach the app (a publisher that honours them waits), and the connection
// goes on serving.
func TestConnectionBlocked(t *testing.T) {
	e := newEnv(t)
	e.start(sidecar.Options{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &blockingConn{Conn: nc, p: amqpwire.NewParser(0)}, nil
	}})
	q := e.queue()
	c, err := amqp.DialConfig("amqp://guest:guest@"+e.sc.AMQPAddr()+"/", amqp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	blocked := c.NotifyBlocked(make(chan amqp.Blocking, 2))
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []amqp.Blocking{{Active: true, Reason: "low on memory"}, {Active: false}} {
		select {
		case got := <-blocked:
			if got != want {
				t.Fatalf("the app got %+v, want %+v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the app was not told %+v", want)
		}
	}
	e.publish(q, "m1")
	msgs, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m := nextDelivery(t, msgs); string(m.Body) != "m1" {
		t.Fatalf("got %q after unblocked, want m1", m.Body)
	}
}
