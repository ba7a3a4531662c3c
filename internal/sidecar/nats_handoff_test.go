package sidecar_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestNATSHandoff is the message half of a migration of a NATS consumer,
// without CRIU, against the real nats-server: the unmodified sample
// consumer (examples/consumer-nats, nats.go, a durable JetStream consumer)
// serves behind a source sidecar while a second one starts empty behind a
// target sidecar that replays the log from ID 0. At a random point while
// the producer runs, the source is stopped at a cutoff; the target replays
// up to it, switches to the server, and ends with the producer's hash: no
// message lost, none twice, in order. For push (the app's subscription on
// the deliver subject fed from the log) and pull (the app's pull requests
// answered from the log).
func TestNATSHandoff(t *testing.T) {
	const n = 400
	for _, lang := range testenv.NATSClients {
		for _, mode := range []string{"push", "pull"} {
			t.Run(lang+"/"+mode, func(t *testing.T) { natsHandoff(t, lang, mode, n) })
		}
	}
}

// natsHandoff is one TestNATSHandoff with the sample consumer in lang on
// both sides, over a push or a pull consumer (mode), for n messages.
func natsHandoff(t *testing.T, lang, mode string, n int) {
	ctx := t.Context()
	cc := jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxAckPending: 50}
	pair := newNATSPair(t, cc, mode == "push")
	js, work, source, target := pair.js, pair.work, pair.source, pair.target

	startApp := func(sc *sidecar.Sidecar) string {
		addr := testenv.FreeAddr(t)
		argv := testenv.NATSConsumer(t, lang)
		runApp(t, exec.Command(argv[0], argv[1:]...), map[string]string{
			"NATS_URL": "nats://" + sc.AMQPAddr(), "STREAM": work, "CONSUMER": "worker", "MODE": mode,
			"PREFETCH": "10", "WORK_MS": "2", "HTTP_ADDR": addr,
		})
		return addr
	}
	srcApp := startApp(source)
	dstApp := startApp(target)

	// The producer: n messages at about 200/s, folding the chain.
	want := make(chan string, 1)
	go func() {
		var h [sha256.Size]byte
		for i := range n {
			body := fmt.Appendf(nil, "msg-%d", i)
			if _, err := js.Publish(ctx, work+".in", body); err != nil {
				t.Errorf("publish: %v", err)
				want <- ""
				return
			}
			d := sha256.New()
			d.Write(h[:])
			d.Write(body)
			d.Sum(h[:0])
			time.Sleep(5 * time.Millisecond) // the producer's pace, not a wait
		}
		want <- hex.EncodeToString(h[:])
	}()

	// Hand over at a random point while the producer is running.
	handoverPoint(t, srcApp)
	hctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	stop, err := control.Handover(hctx,
		control.Client{URL: "http://" + source.ControlAddr(), Token: token},
		control.Client{URL: "http://" + target.ControlAddr(), Token: token},
		control.HandoverOptions{MaxLag: 5})
	if err != nil {
		s, serr := appStateAt(srcApp)
		d, derr := appStateAt(dstApp)
		t.Fatalf("handover: %v (source app %+v %v, target app %+v %v)", err, s, serr, d, derr)
	}
	t.Logf("handover: cutoff %d, lag at stop %d, downtime %s, read back %d", stop.CutoffID, stop.LagAtStop, stop.Downtime, stop.Recovered)
	wantHash := <-want
	if wantHash == "" {
		t.FailNow()
	}

	srcState, _ := appStateAt(srcApp)
	// The deliveries the server made to no one during the stop are logged
	// before the cutoff; the source's app never had them.
	if uint64(srcState.Count+stop.Recovered) != stop.CutoffID {
		t.Errorf("source app processed %d messages and the stop read back %d, cutoff ID is %d", srcState.Count, stop.Recovered, stop.CutoffID)
	}
	var got appState
	testenv.Eventually(t, 60*time.Second, "the target to process every message", func() bool {
		got, _ = appStateAt(dstApp)
		return got.Count >= n
	})
	if got.Count != n || got.Hash != wantHash {
		t.Fatalf("target app %+v, want count %d and the producer's hash %s (cutoff %d)", got, n, wantHash, stop.CutoffID)
	}
	// The target took the log over: its deliveries follow the cutoff.
	ctl := control.Client{URL: "http://" + target.ControlAddr(), Token: token}
	testenv.Eventually(t, 10*time.Second, "the target's log writes", func() bool {
		st, err := ctl.State(ctx)
		return err == nil && st.Log.ConfirmedID == uint64(n)
	})
	recs := natsLogRecords(t, pair.url, pair.logName)
	var ids []uint64
	for _, r := range recs {
		if r.Kind == shadowqueue.KindDelivery {
			ids = append(ids, r.ID)
		}
	}
	for i, id := range ids {
		if id != uint64(i+1) {
			t.Fatalf("log delivery %d has ID %d: want IDs 1..%d once each", i, id, n)
		}
	}
	if len(ids) != n {
		t.Errorf("log holds %d deliveries, want %d", len(ids), n)
	}
	st, _ := ctl.State(ctx)
	if st.Replay == nil || st.Replay.Replayed < stop.CutoffID {
		t.Errorf("target replay state %+v: want every delivery up to the cutoff %d replayed", st.Replay, stop.CutoffID)
	}
}

// natsPair is a handoff's setting on the real server: a stream work
// (subjects work.>) with the durable consumer "worker", a source sidecar,
// and a target sidecar that replays the log from ID 0 to the source's
// cutoff marker.
type natsPair struct {
	js             jetstream.JetStream
	url, logName   string // the server's, and the replay log's name
	work           string
	cons           jetstream.Consumer
	source, target *sidecar.Sidecar
}

// newNATSPair makes a natsPair whose consumer is cc (named "worker"; a
// push consumer on deliver.<work> if push).
func newNATSPair(t *testing.T, cc jetstream.ConsumerConfig, push bool) natsPair {
	t.Helper()
	nt := testenv.RequireNATS(t)
	ctx := t.Context()
	logName := testenv.UniqueName("ms2m-test-natslog")
	p := natsPair{url: nt.URL, logName: logName, work: testenv.UniqueName("ms2m-test-natswork")}
	p.js = natsAdmin(t, nt, p.work, logName)
	if _, err := p.js.CreateStream(ctx, jetstream.StreamConfig{Name: p.work, Subjects: []string{p.work + ".>"}}); err != nil {
		t.Fatal(err)
	}
	cc.Durable = "worker"
	if push {
		cc.DeliverSubject = "deliver." + p.work
	}
	var err error
	if p.cons, err = p.js.CreateOrUpdateConsumer(ctx, p.work, cc); err != nil {
		t.Fatal(err)
	}
	if p.source, err = sidecar.Start(ctx, natsConfig(nt, logName, "127.0.0.1:0"), sidecar.Options{Logger: testLogger()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.source.Close() })
	cfg := natsConfig(nt, logName, "127.0.0.1:0")
	cfg.ReplayStart, cfg.ReplayCutoff = "0", "marker"
	if p.target, err = sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.target.Close() })
	return p
}

// natsAdmin connects to the server for the test's own use, and deletes
// the stream work and the replay log logName when the test ends.
func natsAdmin(t *testing.T, nt testenv.NATS, work, logName string) jetstream.JetStream {
	t.Helper()
	admin, err := nats.Connect(nt.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx := context.WithoutCancel(t.Context())
		if err := js.DeleteStream(cctx, work); err != nil {
			t.Logf("cleanup: %v", err)
		}
		if err := shadowqueue.DeleteJetStream(cctx, nt.URL, logName); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	return js
}

// natsChain is the sample consumers' hash chain over the producer's
// bodies, as the test publishes them.
type natsChain [sha256.Size]byte

// publish publishes msg-from .. msg-(to-1) to subject, folding each.
func (h *natsChain) publish(t *testing.T, ctx context.Context, js jetstream.JetStream, subject string, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		body := fmt.Appendf(nil, "msg-%d", i)
		if _, err := js.Publish(ctx, subject, body); err != nil {
			t.Fatal(err)
		}
		d := sha256.New()
		d.Write(h[:])
		d.Write(body)
		d.Sum(h[:0])
	}
}

// hex is the chain's hash as the consumers report it.
func (h *natsChain) hex() string { return hex.EncodeToString(h[:]) }
