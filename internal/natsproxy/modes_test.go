package natsproxy

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/natswire"
	"github.com/ms2m/ms2m/internal/proxy"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestQuiesceStopResume runs a pull consumer through quiesce, stop and
// resume against the real server: the quiesce returns the last delivery
// the app got, with everything before it acked upstream; the stop writes a
// cutoff marker at the last delivery the app got; after the resume the app
// gets every remaining message, each stream sequence is in the log once,
// and every message ends up acked.
func TestQuiesceStopResume(t *testing.T) {
	h := newHarness(t)
	stream, subject := h.stream(t)
	ctx := t.Context()
	const n = 60
	for i := range n {
		if _, err := h.js.Publish(ctx, subject, fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: "proc", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxAckPending: 5,
	}); err != nil {
		t.Fatal(err)
	}
	_, js := h.app(t)
	cons, err := js.Consumer(ctx, stream, "proc")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	release := make(chan struct{}) // the app stalls at its 10th message until the quiesce has begun
	cc, err := cons.Consume(func(m jetstream.Msg) {
		mu.Lock()
		seen[string(m.Data())]++
		k := len(seen)
		mu.Unlock()
		if k == 10 {
			<-release
		}
		_ = m.Ack()
	}, jetstream.PullMaxMessages(5), jetstream.PullExpiry(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	distinct := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	testenv.Eventually(t, 10*time.Second, "the app gets its first messages", func() bool { return distinct() >= 10 })

	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	type cut struct {
		id  uint64
		err error
	}
	quiesced := make(chan cut, 1)
	go func() {
		id, _, err := h.proxy.Quiesce(qctx)
		quiesced <- cut{id, err}
	}()
	testenv.Eventually(t, 10*time.Second, "the quiesce begins", func() bool { return h.proxy.Mode() == proxy.Quiesced })
	close(release)
	q := <-quiesced
	if q.err != nil {
		t.Fatal(q.err)
	}
	id := q.id
	if got := h.proxy.Stats().JSDeliveries; id != got {
		t.Errorf("quiesce returned ID %d, but the app was handed %d deliveries", id, got)
	}
	if h.proxy.Mode() != proxy.Quiesced {
		t.Fatalf("mode %v", h.proxy.Mode())
	}
	res, err := h.proxy.Stop(qctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.proxy.Stats().JSDeliveries; res.CutoffID != got || res.CutoffID < id {
		t.Errorf("cutoff %d, quiesce %d, deliveries handed out %d", res.CutoffID, id, got)
	}
	last, ok, err := h.log.Last(ctx)
	if err != nil || !ok || last.Kind != shadowqueue.KindCutoff || last.ID != res.CutoffID {
		t.Fatalf("the log's last record %+v (ok %v, err %v), want the cutoff marker at %d", last, ok, err, res.CutoffID)
	}
	if err := h.proxy.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the app gets every message after the resume", func() bool { return distinct() == n })
	testenv.Eventually(t, 10*time.Second, "every message is acked upstream", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumAckPending == 0 && ci.AckFloor.Stream == n
	})
	recs, err := h.log.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seqs := map[uint64]int{}
	var kinds []shadowqueue.Kind
	for _, r := range recs {
		if r.Kind != shadowqueue.KindDelivery {
			kinds = append(kinds, r.Kind)
			continue
		}
		a, ok := natswire.ParseJSAck([]byte(r.Exchange))
		if !ok {
			t.Fatalf("record %d: ack subject %q", r.ID, r.Exchange)
		}
		seqs[a.StreamSeq]++
	}
	if len(seqs) != n {
		t.Errorf("the log holds %d distinct stream sequences, want %d", len(seqs), n)
	}
	if len(kinds) != 2 || kinds[0] != shadowqueue.KindCutoff || kinds[1] != shadowqueue.KindResume {
		t.Errorf("markers %v, want a cutoff then a resume", kinds)
	}
	t.Logf("quiesce at %d, cutoff at %d, held %d, stats %+v", id, res.CutoffID, res.Held, h.proxy.Stats())
}

// TestPushQuiesceHoldsAndStopHandsOver: with a push consumer the server
// keeps pushing during a quiesce; those deliveries are held (not teed, not
// given to the app), the stop gives them to the app before its cutoff, and
// what the server pushes after the stop is dropped and comes back, after
// the ack wait, once the proxy serves again.
func TestPushQuiesceHoldsAndStopHandsOver(t *testing.T) {
	h := newHarness(t)
	_, subject := h.stream(t)
	ctx := t.Context()
	const n = 40
	for i := range n {
		if _, err := h.js.Publish(ctx, subject, fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	nc, _ := h.app(t)
	legacy, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	release := make(chan struct{})
	sub, err := legacy.Subscribe(subject, func(m *nats.Msg) {
		mu.Lock()
		seen[string(m.Data)]++
		k := len(seen)
		mu.Unlock()
		if k == 10 {
			<-release
		}
		_ = m.Ack()
	}, nats.Durable("pusher"), nats.ManualAck(), nats.AckExplicit(), nats.DeliverAll(), nats.MaxAckPending(5), nats.AckWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	distinct := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	testenv.Eventually(t, 10*time.Second, "the app stalls at its 10th message", func() bool { return distinct() >= 10 })
	qctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	quiesced := make(chan error, 1)
	var id uint64
	go func() {
		var err error
		id, _, err = h.proxy.Quiesce(qctx)
		quiesced <- err
	}()
	testenv.Eventually(t, 10*time.Second, "the quiesce begins", func() bool { return h.proxy.Mode() == proxy.Quiesced })
	close(release)
	if err := <-quiesced; err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the server's next pushes are held", func() bool { return h.proxy.State().Held > 0 })
	if got := h.proxy.Stats().JSDeliveries; got != id {
		t.Fatalf("teed %d deliveries, quiesce at %d: a held delivery was teed", got, id)
	}
	res, err := h.proxy.Stop(qctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Held == 0 || res.CutoffID != id+uint64(res.Held) {
		t.Errorf("stop %+v after a quiesce at %d: want the held deliveries handed over before the cutoff", res, id)
	}
	if err := h.proxy.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the app gets every message", func() bool { return distinct() == n })
	recs, err := h.log.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seqs := map[uint64]bool{}
	for _, r := range recs {
		if r.Kind == shadowqueue.KindCutoff && r.ID != res.CutoffID {
			t.Errorf("cutoff marker at %d, stop said %d", r.ID, res.CutoffID)
		}
		if a, ok := natswire.ParseJSAck([]byte(r.Exchange)); ok {
			seqs[a.StreamSeq] = true
		}
	}
	if len(seqs) != n {
		t.Errorf("the log holds %d distinct stream sequences, want %d", len(seqs), n)
	}
	if d := h.proxy.Stats().Dropped; d != 0 {
		t.Errorf("%d deliveries dropped after the stop; want none (the stop unsubscribes the app upstream first)", d)
	}
	t.Logf("quiesce at %d, stop %+v, stats %+v", id, res, h.proxy.Stats())
}
