package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestNATSMigration moves the unmodified NATS sample consumer (nats.go, a
// durable JetStream consumer, push and pull) from node 1 to node 2 by ms2m
// while the producer publishes: CRIU checkpoints it behind its quiesced
// sidecar, the target's sidecar replays the JetStream replay log from the
// checkpoint ID to the source's cutoff into the restored app's
// subscription or pull requests, and switches to the server. The restored
// consumer ends with the producer's hash: nothing lost, nothing twice, in
// order.
func TestNATSMigration(t *testing.T) {
	l := needLab(t, "it runs migrate.Run in the test process, admitting targets itself")
	nt := testenv.RequireNATS(t)
	if _, ok := l.Images["consumer-nats"]; !ok {
		t.Fatal("the lab built no consumer-nats image")
	}
	// Pods reach the host's nats-server through a forwarder on the bridge;
	// host services started before it was one of theirs lack it.
	if c, err := net.DialTimeout("tcp", l.NATSAddr, time.Second); err == nil {
		_ = c.Close() // only a probe
	} else if err := cluster.ForwardToLoopback(t.Context(), cluster.NATSPort, slog.Default()); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"push", "pull"} {
		t.Run(mode, func(t *testing.T) { migrateNATS(t, l, nt, mode) })
	}
}

func migrateNATS(t *testing.T, l *lab.Lab, nt testenv.NATS, mode string) {
	const n, rate = 120, 10.0
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	name := testenv.UniqueName("c-nats-" + mode)
	admin, err := nats.Connect(nt.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".in"}}); err != nil {
		t.Fatal(err)
	}
	cc := jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 50}
	if mode == "push" {
		cc.DeliverSubject = "deliver." + name
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, name, cc); err != nil {
		t.Fatal(err)
	}
	plan := migrate.Plan{
		Name: fmt.Sprintf("m%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
		TargetNode: cluster.NodeName(2), TargetPod: name + "-target", Strategy: contract.StrategyMS2M,
	}
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50, Image: "consumer-nats", NATSMode: mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
		defer cancel()
		if !(t.Failed() && os.Getenv("MS2M_E2E_KEEP") != "") {
			logCleanup(t, "delete pods", l.DeletePods(ctx, plan.Pod, plan.TargetPod))
		}
		logCleanup(t, "delete the stream", js.DeleteStream(ctx, name))
		logCleanup(t, "delete the replay log", shadowqueue.DeleteJetStream(ctx, nt.URL, inject.LogName(src)))
	})

	// The producer, on the host: msg-1..msg-n at rate, folding the chain.
	type result struct {
		want lab.ProducerResult
		err  error
	}
	produced := make(chan result, 1)
	go func() {
		var h [sha256.Size]byte
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		for i := 1; i <= n; i++ {
			body := fmt.Appendf(nil, "msg-%d", i)
			if _, err := js.Publish(ctx, name+".in", body); err != nil {
				produced <- result{err: fmt.Errorf("publish %d: %w", i, err)}
				return
			}
			d := sha256.New()
			d.Write(h[:])
			d.Write(body)
			d.Sum(h[:0])
			select {
			case <-tick.C: // the producer's pace
			case <-ctx.Done():
				produced <- result{err: ctx.Err()}
				return
			}
		}
		produced <- result{want: lab.ProducerResult{Count: n, Hash: hex.EncodeToString(h[:])}}
	}()
	// Migrate once the consumer has work behind it.
	testenv.Eventually(t, time.Minute, "the source consumer folds its first messages", func() bool {
		st, err := lab.GetAppState(src)
		return err == nil && st.Count >= 10
	})

	rep, err := migrate.Run(ctx, l.Env(func(phase string, took time.Duration) {
		t.Logf("phase %-20s %v", phase, took.Round(time.Millisecond))
	}), plan)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Logf("%s: total %v, switch %v, checkpoint ID %d, cutoff %d", mode, rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond), rep.Start, rep.CutoffID)
	if rep.CutoffID <= rep.Start {
		t.Errorf("cutoff %d is not after the checkpoint ID %d: the replay had nothing to do, so the test shows little", rep.CutoffID, rep.Start)
	}
	target, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, plan.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if target.Spec.NodeName != cluster.NodeName(2) {
		t.Errorf("target runs on %s, want %s", target.Spec.NodeName, cluster.NodeName(2))
	}
	r := <-produced
	if r.err != nil {
		t.Fatal(r.err)
	}
	got := lab.WaitFor(target, r.want, 30*time.Second)
	t.Logf("%s: producer count %d hash %.12s; restored consumer count %d hash %.12s (reconnects %d)",
		mode, r.want.Count, r.want.Hash, got.Count, got.Hash, got.Reconnects)
	if got.Count != r.want.Count || got.Hash != r.want.Hash {
		t.Errorf("restored consumer: count %d hash %s; producer: count %d hash %s", got.Count, got.Hash, r.want.Count, r.want.Hash)
	}
}
