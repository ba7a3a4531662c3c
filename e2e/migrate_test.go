package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
)

// scenario is one migration of a consumer while the producer sends.
type scenario struct {
	strategy contract.Strategy
	image    string  // "consumer" (Go), "consumer-python" or "consumer-spring"
	n        int     // messages
	rate     float64 // λ, msg/s
	workMS   int     // per message
	// holdWholeCall: the source holds deliveries for the kubelet's whole
	// checkpoint call, not only until its app is frozen.
	holdWholeCall bool
	// mutate changes the consumer's pod before admission (lab.Consumer.Mutate).
	mutate func(*corev1.Pod)
	// thaw is the plan's ThawAfterDump; readOnlyRoot runs the app with
	// a read-only root filesystem.
	thaw         migrate.ThawPolicy
	readOnlyRoot bool
	// check, if set, checks more of the target once its state is the
	// producer's; queue is the consumer's queue.
	check func(t *testing.T, target *corev1.Pod, queue string)
	// from and to are the source's and the target's node: node 1 and
	// node 2 if not set.
	from, to string
}

// TestFirstRealMigration moves unmodified consumers, in Go and in Python,
// from node 1 to node 2 while the producer sends, with ms2m and with
// stop-and-copy: the restored consumer's hash equals the producer's. CRIU
// alone, with no replay, loses what the source handled after its
// checkpoint.
func TestFirstRealMigration(t *testing.T) {
	l := needLab(t, "it runs migrate.Run in the test process, admitting targets itself, CRIU alone among them")
	for _, image := range []string{"consumer", "consumer-python"} {
		strategies := []contract.Strategy{contract.StrategyMS2M, contract.StrategyStopAndCopy, contract.StrategyCRIUAlone}
		if image == "consumer" {
			strategies = append(strategies, contract.StrategyMS2MCutoff)
		}
		for _, strategy := range strategies {
			sc := scenario{strategy: strategy, image: image, n: 120, rate: 10, workMS: 50}
			t.Run(image+"/"+string(strategy), func(t *testing.T) {
				if _, ok := l.Images[image]; !ok {
					testenv.Missing(t, "the "+image+" image (Debian's python3-pika on this host)", "run `make setup`, which installs python3-pika")
				}
				migrateWhileProducing(t, l, sc)
			})
		}
	}
}

// migrateWhileProducing returns the migration's report and its
// processing gap (0: none measured).
func migrateWhileProducing(t *testing.T, l *lab.Lab, sc scenario) (migrate.Report, time.Duration) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	name := testenv.UniqueName("c-" + string(sc.strategy))
	if sc.from == "" {
		sc.from, sc.to = cluster.NodeName(1), cluster.NodeName(2)
	}
	plan := migrate.Plan{
		Name: fmt.Sprintf("m%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
		TargetNode: sc.to, TargetPod: name + "-target", Strategy: sc.strategy,
		HoldWholeCall: sc.holdWholeCall, ThawAfterDump: sc.thaw,
	}
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: sc.from, WorkMS: sc.workMS, Image: sc.image, ReadOnlyRoot: sc.readOnlyRoot, Mutate: sc.mutate})
	if err != nil {
		t.Fatal(err)
	}
	if sc.image == "consumer-spring" { // a JVM and a Spring context take a while
		waitAppConnected(t, src, 3*time.Minute)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
		defer cancel()
		if !(t.Failed() && os.Getenv("MS2M_E2E_KEEP") != "") {
			logCleanup(t, "delete pods", l.DeletePods(ctx, plan.Pod, plan.TargetPod))
		}
		b := testenv.RequireBroker(t)
		logCleanup(t, "delete the stream", shadowqueue.DeleteStream(ctx, b.StreamURI, inject.LogName(src)))
		logCleanup(t, "delete the stream", shadowqueue.DeleteStream(ctx, b.StreamURI, inject.OwnLogName(inject.LogName(src), plan.Name)))
	})

	prod := produce(t, src, name, sc.rate, sc.n, 20)

	journals := l.NewJournals(src, plan)
	began := time.Now()
	rep, err := migrate.Run(ctx, l.Env(func(phase string, took time.Duration) {
		t.Logf("phase %-20s %v", phase, took.Round(time.Millisecond))
		journals.AfterPhase(ctx, phase)
	}), plan)
	ended := time.Now()
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Logf("%s: total %v, switch %v, checkpoint ID %d, cutoff %d", sc.strategy, rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond), rep.Start, rep.CutoffID)
	if h := rep.Hold; h != nil {
		t.Logf("%s: hold %v = quiesce %v + kubelet call to the freeze %v + CRIU's dump %v (of a call of %v; %v after the dump); resumed at the freeze %v %s; thawed at the dump %v %s",
			sc.strategy, h.Held.Round(time.Millisecond), h.Quiesce.Round(time.Millisecond), h.ToFreeze.Round(time.Millisecond), h.Dump.Round(time.Millisecond),
			h.Call.Round(time.Millisecond), h.AfterDump.Round(time.Millisecond), h.AtFreeze, h.Fallback, h.ThawedAtDump, h.ThawFallback)
	}
	if sc.strategy == contract.StrategyMS2MCutoff {
		t.Logf("ms2m-cutoff: λ %.2f/s, μ %.2f/s, T_cutoff %v", rep.Lambda, rep.Mu, rep.TCutoff)
		if rep.TCutoff <= 0 || rep.Lambda <= 0 {
			t.Errorf("ms2m-cutoff sized T_cutoff %v from λ %v μ %v: want measured rates", rep.TCutoff, rep.Lambda, rep.Mu)
		}
	}

	target, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, plan.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if target.Spec.NodeName != sc.to {
		t.Errorf("target runs on %s, want %s", target.Spec.NodeName, sc.to)
	}
	if _, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, name, metav1.GetOptions{}); err == nil {
		t.Errorf("the source pod %s is still there", name)
	}

	want, err := prod.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	settle := 30 * time.Second
	if sc.strategy == contract.StrategyCRIUAlone {
		settle = 10 * time.Second // it never gets there: it lost messages
	}
	got := lab.WaitFor(target, want, settle)
	t.Logf("%s: producer count %d hash %.12s; restored consumer count %d hash %.12s (reconnects %d, skipped redeliveries %d)",
		sc.strategy, want.Count, want.Hash, got.Count, got.Hash, got.Reconnects, got.Skipped)
	gap := logGap(t, string(sc.strategy), journals, target, began, ended)
	if sc.strategy == contract.StrategyCRIUAlone {
		if got.Hash == want.Hash {
			t.Errorf("CRIU alone ended with the producer's hash: the source handled nothing after its checkpoint, so the test shows nothing")
		} else {
			t.Logf("CRIU alone: %d of %d messages are missing from the restored state", want.Count-got.Count, want.Count)
		}
		return rep, gap
	}
	if got.Count != want.Count || got.Hash != want.Hash || got.Skipped != 0 {
		t.Errorf("restored consumer: count %d hash %s, %d redeliveries skipped; producer: count %d hash %s", got.Count, got.Hash, got.Skipped, want.Count, want.Hash)
	}
	if sc.check != nil {
		sc.check(t, target, name)
	}
	return rep, gap
}
