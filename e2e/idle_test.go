package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestIdleConsumerMigrates moves a consumer that has had no message yet (a
// new app on an empty queue, the common case of a node drained at night)
// with ms2m and with stop-and-copy, then sends it messages: the restored
// consumer folds every one, with the producer's hash. Its log holds no
// delivery, only the stop's cutoff marker, which names the app's queue.
// Before, ms2m's target refused the queue as one that "never appears in
// the replay log" and the migration rolled back, and stop-and-copy's
// target never switched (cutoff 0 was asked for as "the marker" of the
// stop's own epoch, which a target ignores).
func TestIdleConsumerMigrates(t *testing.T) {
	l := needLab(t, "it runs migrate.Run in the test process")
	for _, strategy := range []contract.Strategy{contract.StrategyMS2M, contract.StrategyStopAndCopy} {
		t.Run(string(strategy), func(t *testing.T) { migrateIdle(t, l, strategy) })
	}
}

func migrateIdle(t *testing.T, l *lab.Lab, strategy contract.Strategy) {
	const n = 30
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	name := testenv.UniqueName("idle-" + string(strategy))
	plan := migrate.Plan{
		Name: fmt.Sprintf("m%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
		TargetNode: cluster.NodeName(2), TargetPod: name + "-target", Strategy: strategy,
	}
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 5, Image: "consumer"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
		defer cancel()
		logCleanup(t, "delete pods", l.DeletePods(ctx, plan.Pod, plan.TargetPod))
		b := testenv.RequireBroker(t)
		logCleanup(t, "delete the stream", shadowqueue.DeleteStream(ctx, b.StreamURI, inject.LogName(src)))
		logCleanup(t, "delete the stream", shadowqueue.DeleteStream(ctx, b.StreamURI, inject.OwnLogName(inject.LogName(src), plan.Name)))
	})
	waitAppConnected(t, src, time.Minute)
	rep, err := migrate.Run(ctx, l.Env(func(phase string, took time.Duration) {
		t.Logf("phase %-20s %v", phase, took.Round(time.Millisecond))
	}), plan)
	if err != nil {
		t.Fatalf("migrate an idle consumer: %v", err)
	}
	t.Logf("%s: total %v, switch %v, checkpoint ID %d, cutoff %d", strategy, rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond), rep.Start, rep.CutoffID)
	if rep.CutoffID != 0 {
		t.Errorf("cutoff %d: the consumer had no message, want 0", rep.CutoffID)
	}
	target, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, plan.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	prod, err := lab.StartProducer(testenv.Build(t, "examples/producer"), name, 50, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Stop)
	want, err := prod.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := lab.WaitFor(target, want, 30*time.Second)
	if got.Count != want.Count || got.Hash != want.Hash || got.Skipped != 0 {
		t.Errorf("restored consumer: count %d hash %s, %d redeliveries skipped; producer: count %d hash %s", got.Count, got.Hash, got.Skipped, want.Count, want.Hash)
	}
}
