package shadowqueue

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/ms2m/ms2m/internal/testenv"
)

func openTestJetStream(t *testing.T) (*JetStreamLog, string) {
	t.Helper()
	n := testenv.RequireNATS(t)
	// As the webhook names logs: namespace.pod, which a JetStream stream
	// name cannot be as it is (JetStreamName).
	name := "ms2m-test." + testenv.UniqueName("ms2m-jslog")
	l, err := OpenJetStream(t.Context(), JetStreamOptions{URL: n.URL, Name: name, MaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Logf("close: %v", err)
		}
		if err := DeleteJetStream(context.WithoutCancel(t.Context()), n.URL, name); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	return l, n.URL
}

func jsDelivery(id uint64, body []byte) Record {
	return Record{Kind: KindDelivery, ID: id, Time: time.Unix(0, int64(id)*1000),
		Queue: "ORDERS", ConsumerTag: "proc", RoutingKey: "orders.new",
		Exchange:   fmt.Sprintf("$JS.ACK.ORDERS.proc.1.%d.%d.1700000000000000000.0", id, id),
		Properties: []byte("NATS/1.0\r\nA: b\r\n\r\n"), Body: body}
}

// TestJetStreamLogRoundTrip writes small records (one batch message), a
// record too large for one message (fragments) and markers, and reads them
// back with ReadAll, Last and FollowFrom against the real server.
func TestJetStreamLogRoundTrip(t *testing.T) {
	l, url := openTestJetStream(t)
	ctx := t.Context()
	if _, ok, err := l.Last(ctx); err != nil || ok {
		t.Fatalf("Last of an empty log = ok %v, err %v", ok, err)
	}
	var want []Record
	for i := uint64(1); i <= 100; i++ {
		want = append(want, jsDelivery(i, []byte(fmt.Sprintf("body %d", i))))
	}
	if err := l.Write(ctx, want); err != nil {
		t.Fatal(err)
	}
	big := jsDelivery(101, bytes.Repeat([]byte("x"), 3<<20)) // over max_payload: fragments
	cut := Record{Kind: KindCutoff, ID: 101, Epoch: 1, Time: time.Unix(5, 0)}
	if err := l.Write(ctx, []Record{big, cut}); err != nil {
		t.Fatal(err)
	}
	want = append(want, big, cut)

	got, err := l.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, bytesEqual); diff != "" {
		t.Fatalf("ReadAll (-want +got):\n%s", diff)
	}
	last, ok, err := l.Last(ctx)
	if err != nil || !ok {
		t.Fatalf("Last: ok %v, err %v", ok, err)
	}
	if diff := cmp.Diff(cut, last, bytesEqual); diff != "" {
		t.Errorf("Last (-want +got):\n%s", diff)
	}

	// FollowFrom sees the records, then one written while it follows, and
	// says where to go on from.
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var followed []Record
	done := make(chan int64)
	go func() {
		next, _ := l.FollowFrom(fctx, FollowOptions{}, func(_ int64, r Record) error {
			followed = append(followed, r)
			if r.ID == 102 {
				cancel()
			}
			return nil
		})
		done <- next
	}()
	more := jsDelivery(102, []byte("late"))
	more.Epoch = 1
	if err := l.Write(ctx, []Record{more}); err != nil {
		t.Fatal(err)
	}
	next := <-done
	if diff := cmp.Diff(append(want, more), followed, bytesEqual); diff != "" {
		t.Errorf("FollowFrom (-want +got):\n%s", diff)
	}
	// From next on there is nothing left to see.
	if _, ok, _ := l.Last(ctx); !ok {
		t.Fatal("Last after the follow: empty")
	}
	exists, err := JetStreamExists(ctx, url, l.opts.Name)
	if err != nil || !exists {
		t.Errorf("JetStreamExists = %v, %v", exists, err)
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	defer wcancel()
	var after []Record
	_, err = l.FollowFrom(wctx, FollowOptions{From: next}, func(_ int64, r Record) error { after = append(after, r); return nil })
	if len(after) != 0 {
		t.Errorf("FollowFrom(next=%d) gave %d records already seen", next, len(after))
	}
	if err == nil {
		t.Error("FollowFrom ended without an error")
	}
}

// TestJetStreamLogWithTee runs the Tee on the JetStream log: Wait returns
// once a record is durable, and a new Tee numbers on after the last record.
func TestJetStreamLogWithTee(t *testing.T) {
	l, _ := openTestJetStream(t)
	ctx := t.Context()
	tee := NewTee(l, Record{}, TeeOptions{})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- tee.Run(rctx) }()
	var tk Ticket
	for i := range 50 {
		_, tk = tee.Append(jsDelivery(0, []byte{byte(i)}))
	}
	if err := tee.Wait(ctx, tk); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	last, ok, err := l.Last(ctx)
	if err != nil || !ok || last.ID != 50 {
		t.Fatalf("Last = ID %d ok %v err %v, want ID 50", last.ID, ok, err)
	}
}
