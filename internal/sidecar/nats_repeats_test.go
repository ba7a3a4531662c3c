package sidecar_test

import (
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestNATSReplayGivesAHeldMessageOnce: a NATS source's app (the Go sample
// consumer, pull, 10 at a time) is SIGKILLed holding messages it has not
// acked; a quiesce right after does not wait for their acks (the
// sidecar forgets the deliveries of a connection that ended), and the app
// that comes back gets them again from the server once the consumer's ack
// wait has passed (delivery count 2). The sidecar logs each
// redelivery as repeating the first delivery of the same stream sequence
// (Record.Repeats), and a target restored from checkpoint 0 replays to the
// stop's cutoff and gets each message once: the producer's hash. Without
// the mark it folded the held ones twice.
func TestNATSReplayGivesAHeldMessageOnce(t *testing.T) {
	r := natsAppKilledHolding(t)
	ctx, n, cons, src, source, startApp := t.Context(), r.n, r.cons, r.src, r.source, r.startApp
	nt, logName, want := r.nt, r.logName, r.want
	startApp(source)
	testenv.Eventually(t, 60*time.Second, "the app that came back to have every message acked", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
	})
	stop, err := src.Stop(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = source.Close()

	recs := natsLogRecords(t, nt.URL, logName)
	firstOf := map[string]uint64{}
	repeats := 0
	for _, r := range recs {
		if r.Kind != shadowqueue.KindDelivery {
			continue
		}
		switch f, seen := firstOf[string(r.Body)]; {
		case !seen:
			if r.Repeats != 0 {
				t.Errorf("record %d, the first delivery of %q, repeats %d", r.ID, r.Body, r.Repeats)
			}
			firstOf[string(r.Body)] = r.ID
		case r.Repeats != f:
			t.Errorf("record %d, a redelivery of %q (first %d), repeats %d", r.ID, r.Body, f, r.Repeats)
		default:
			repeats++
		}
	}
	if repeats == 0 {
		t.Fatalf("no redelivery in the log (%d records): the fault did not fire", len(recs))
	}
	t.Logf("%d redeliveries of what the killed app held, each marked", repeats)

	cfg := natsConfig(nt, logName, "127.0.0.1:0")
	cfg.ReplayStart, cfg.ReplayCutoff, cfg.ReplayEpoch = "0", fmt.Sprint(stop.CutoffID), fmt.Sprint(stop.Epoch)
	target, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	app, _ := startApp(target)
	var got appState
	testenv.Eventually(t, 60*time.Second, "the target to process every message", func() bool {
		got, _ = appStateAt(app)
		return got.Count >= n
	})
	time.Sleep(500 * time.Millisecond) // a doubled message would show as one more
	got, _ = appStateAt(app)
	if got.Count != n || got.Hash != want {
		t.Fatalf("the target: %+v, want %d messages and the producer's hash %s", got, n, want)
	}
}

// TestNATSTargetAbsorbsRedeliveriesOfReplayed: the source is stopped
// right after its app died holding messages, before the server redelivers
// them; the cutoff takes in their first deliveries, which the target
// replays. After the switch the server redelivers them to the target
// (delivery count 2); its sidecar acks them itself instead of handing
// them to the app, which has them from the replay: each message once, the
// producer's hash. Without the absorption the target folded them twice.
func TestNATSTargetAbsorbsRedeliveriesOfReplayed(t *testing.T) {
	r := natsAppKilledHolding(t)
	ctx := t.Context()
	stop, err := r.src.Stop(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = r.source.Close()
	cfg := natsConfig(r.nt, r.logName, "127.0.0.1:0")
	cfg.ReplayStart, cfg.ReplayCutoff, cfg.ReplayEpoch = "0", fmt.Sprint(stop.CutoffID), fmt.Sprint(stop.Epoch)
	target, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	start := time.Now()
	app, _ := r.startApp(target)
	testenv.Eventually(t, 60*time.Second, "every message acked at the server", func() bool {
		ci, err := r.cons.Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
	})
	took := time.Since(start)
	time.Sleep(500 * time.Millisecond) // a doubled message would show as one more
	got, _ := appStateAt(app)
	absorbed := metricValue(t, "http://"+target.ControlAddr(), "ms2m_sidecar_nats_redeliveries_absorbed_total")
	t.Logf("cutoff %d; the target's sidecar absorbed %v redeliveries; all acked %v after the app started", stop.CutoffID, absorbed, took.Round(time.Millisecond))
	if got.Count != r.n || got.Hash != r.want {
		t.Fatalf("the target: %+v, want %d messages and the producer's hash %s", got, r.n, r.want)
	}
	if absorbed == 0 {
		t.Fatal("no redelivery reached the target: the fault did not fire")
	}
	// The app's Consume pulls with a 30 s expiry: a pull request an
	// absorbed redelivery left unfilled kept it waiting that long, until
	// the sidecar answered for the absorbed message (releasePullSlot).
	if took > 20*time.Second {
		t.Errorf("the target's app took %v to have every message acked: it waited on a pull request's 30 s expiry", took)
	}
}

// natsHeld is a NATS source sidecar whose app was SIGKILLed holding
// messages it had not acked, quiesced and resumed once the sidecar saw
// the app's connection end.
type natsHeld struct {
	n        int
	want     string // the producer's hash
	nt       testenv.NATS
	logName  string
	cons     jetstream.Consumer
	source   *sidecar.Sidecar
	src      control.Client
	startApp func(sc *sidecar.Sidecar) (addr string, cmd *exec.Cmd)
}

// natsAppKilledHolding publishes 200 messages to a stream whose durable
// pull consumer has an ack wait of 2 s, runs the Go sample consumer (10 at
// a time) behind a source sidecar until it has folded a quarter, SIGKILLs
// it, and checks that a quiesce right after returns: the sidecar forgets
// the deliveries of a connection that ended.
func natsAppKilledHolding(t *testing.T) natsHeld {
	t.Helper()
	r := natsHeld{n: 200, nt: testenv.RequireNATS(t), logName: testenv.UniqueName("ms2m-test-natslog")}
	ctx := t.Context()
	work := testenv.UniqueName("ms2m-test-natswork")
	js := natsAdmin(t, r.nt, work, r.logName)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: work, Subjects: []string{work + ".>"}}); err != nil {
		t.Fatal(err)
	}
	var err error
	r.cons, err = js.CreateOrUpdateConsumer(ctx, work, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second, MaxAckPending: 50})
	if err != nil {
		t.Fatal(err)
	}
	var h natsChain
	h.publish(t, ctx, js, work+".in", 0, r.n)
	r.want = h.hex()
	r.source, err = sidecar.Start(ctx, natsConfig(r.nt, r.logName, "127.0.0.1:0"), sidecar.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.source.Close() })
	r.startApp = func(sc *sidecar.Sidecar) (string, *exec.Cmd) {
		addr := testenv.FreeAddr(t)
		argv := testenv.NATSConsumer(t, "go")
		cmd := exec.Command(argv[0], argv[1:]...)
		runApp(t, cmd, map[string]string{
			"NATS_URL": "nats://" + sc.AMQPAddr(), "STREAM": work, "CONSUMER": "worker", "MODE": "pull",
			"PREFETCH": "10", "WORK_MS": "20", "HTTP_ADDR": addr,
		})
		return addr, cmd
	}
	first, firstCmd := r.startApp(r.source)
	testenv.Eventually(t, 30*time.Second, "the app to process a part", func() bool {
		s, _ := appStateAt(first)
		return s.Count >= r.n/4
	})
	_ = firstCmd.Process.Kill() // SIGKILL: what it holds stays unacked
	// A quiesce does not wait for the dead app's deliveries: well before
	// the server redelivers them (the ack wait, 2 s), it returns.
	r.src = control.Client{URL: "http://" + r.source.ControlAddr(), Token: token}
	testenv.Eventually(t, 10*time.Second, "the sidecar to see the app's connection end", func() bool {
		st, err := r.src.State(ctx)
		return err == nil && st.Connections == 0
	})
	if _, err := r.src.Quiesce(ctx, time.Second); err != nil {
		t.Fatalf("quiesce with the dead app's deliveries unacked: %v", err)
	}
	if err := r.src.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}
