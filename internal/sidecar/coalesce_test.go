package sidecar_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestAcksCoalesceExactly: acks that pile up behind a slow replay log go
// upstream as one cumulative ack, but only where that acks exactly what the
// app acked. The app acks 1-7 in order, leaves 8 and 15 unsettled, acks the
// rest one by one out of that order and rejects 13 without requeue. When its
// channel closes, the broker must give back exactly 8 and 15: a cumulative
// ack over 8 would have lost it.
func TestAcksCoalesceExactly(t *testing.T) {
	e := newEnv(t)
	tp, _ := e.startTapped(100 * time.Millisecond)
	q := e.queue()
	const n = 20
	e.publish(q, bodies("c", n)...)
	conn := e.dial(amqp.Config{})
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(n, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	ds, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint64]amqp.Delivery{}
	for range n {
		d := recv(t, ds)
		got[d.DeliveryTag] = d
	}
	for tag := uint64(1); tag <= n; tag++ {
		switch tag {
		case 8, 15:
		case 13:
			if err := got[tag].Reject(false); err != nil {
				t.Fatal(err)
			}
		default:
			if err := got[tag].Ack(false); err != nil {
				t.Fatal(err)
			}
		}
	}
	testenvEventually(t, func() bool {
		acks := tp.snapshot()
		return len(acks) > 0 && acks[len(acks)-1].tag == n
	})

	var upstream []string
	coalesced := false
	for _, a := range tp.snapshot() {
		s := strconv.FormatUint(a.tag, 10)
		if a.multiple {
			s += "+"
			coalesced = true
			if a.tag >= 8 {
				t.Errorf("cumulative ack of tag %d went upstream while delivery 8 was unsettled", a.tag)
			}
		}
		upstream = append(upstream, s)
	}
	t.Logf("acks upstream: %v", upstream)
	if !coalesced {
		t.Errorf("no cumulative ack went upstream for the acks of 1-7 that waited on the log: %v", upstream)
	}
	if v := metricValue(t, "http://"+e.sc.ControlAddr(), "ms2m_sidecar_acks_coalesced_total"); v < 1 {
		t.Errorf("ms2m_sidecar_acks_coalesced_total = %v, want at least 1", v)
	}

	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	var back []string
	testenvEventually(t, func() bool {
		back = append(back, e.drainQueue(q)...)
		return len(back) >= 2
	})
	time.Sleep(200 * time.Millisecond) // nothing more may come back
	back = append(back, e.drainQueue(q)...)
	if diff := cmp.Diff([]string{"c-8", "c-15"}, back); diff != "" {
		t.Errorf("messages the broker gave back when the channel closed (-want +got):\n%s", diff)
	}
}
