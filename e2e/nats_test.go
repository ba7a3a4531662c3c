package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
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

// TestNATSMigration moves the unmodified NATS sample consumer (nats.go, a
// durable JetStream consumer, push and pull) from node 1 to node 2 by ms2m
// while the producer publishes: CRIU checkpoints it behind its quiesced
// sidecar, the target's sidecar replays the JetStream replay log from the
// checkpoint ID to the source's cutoff into the restored app's
// subscription or pull requests, and switches to the server. The restored
// consumer ends with the producer's hash: nothing lost, nothing twice, in
// order. It logs the processing gap from the consumers' journals.
func TestNATSMigration(t *testing.T) {
	l := needLab(t, "it runs migrate.Run in the test process, admitting targets itself")
	nt := testenv.RequireNATS(t)
	if _, ok := l.Images["consumer-nats"]; !ok {
		t.Fatal("the lab built no consumer-nats image")
	}
	needNATSForward(t, l)
	for _, mode := range []string{"push", "pull"} {
		t.Run(mode, func(t *testing.T) { migrateNATS(t, l, nt, mode) })
	}
}

func migrateNATS(t *testing.T, l *lab.Lab, nt testenv.NATS, mode string) {
	const n, rate = 120, 10.0
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	name := testenv.UniqueName("c-nats-" + mode)
	js := natsStream(t, ctx, nt, name, mode)
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
		logCleanup(t, "delete the replay log", shadowqueue.DeleteJetStream(ctx, nt.URL, inject.LogName(src)))
	})

	produced := js.Produce(ctx, n, rate)
	defer produced.Stop()
	// Migrate once the consumer has work behind it.
	testenv.Eventually(t, time.Minute, "the source consumer folds its first messages", func() bool {
		st, err := lab.GetAppState(src)
		return err == nil && st.Count >= 10
	})

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
	expectNATSExact(t, ctx, produced, target)
	logGap(t, mode, journals, target, began, ended)
}

// needNATSForward makes sure pods reach the host's nats-server: through a
// forwarder on the bridge, which host services started before it was one
// of theirs lack.
func needNATSForward(t *testing.T, l *lab.Lab) {
	t.Helper()
	if c, err := net.DialTimeout("tcp", l.NATSAddr, time.Second); err == nil {
		_ = c.Close() // only a probe
	} else if err := cluster.ForwardToLoopback(t.Context(), cluster.NATSPort, slog.Default()); err != nil {
		t.Fatal(err)
	}
}

// expectNATSExact waits for the producer to finish and for the consumer in
// pod to settle, and fails the test unless its count and hash are the
// producer's.
func expectNATSExact(t *testing.T, ctx context.Context, produced *lab.NATSProducer, pod *corev1.Pod) {
	t.Helper()
	want, err := produced.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := lab.WaitFor(pod, want, 30*time.Second)
	t.Logf("producer count %d hash %.12s; the consumer in %s: count %d hash %.12s (reconnects %d)",
		want.Count, want.Hash, pod.Name, got.Count, got.Hash, got.Reconnects)
	if got.Count != want.Count || got.Hash != want.Hash || got.Skipped != 0 {
		t.Errorf("the consumer in %s: count %d hash %s, %d redeliveries skipped; producer: count %d hash %s", pod.Name, got.Count, got.Hash, got.Skipped, want.Count, want.Hash)
		logDisorder(t, pod)
	}
}

// logDisorder logs, from the journal of the consumer in pod, each fold
// whose message-id is not the one after the previous fold's: where a
// message was lost, repeated or came late, and when.
func logDisorder(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	folds, _, err := lab.GetFolds(pod)
	if err != nil {
		t.Logf("no journal of %s to tell where: %v", pod.Name, err)
		return
	}
	for i := 1; i < len(folds); i++ {
		if prev, f := folds[i-1], folds[i]; f.ID != prev.ID+1 {
			t.Logf("the consumer in %s folded message %d (sent %s) at %s after message %d",
				pod.Name, f.ID, time.Unix(0, f.SentNS).Format("15:04:05.000"), time.Unix(0, f.AtNS).Format("15:04:05.000"), prev.ID)
		}
	}
}

// natsStream makes stream name, on subject name.in, with the durable
// consumer "worker" the sample consumer uses (push on deliver.<name>, or
// pull), and deletes it when the test ends.
func natsStream(t *testing.T, ctx context.Context, nt testenv.NATS, name, mode string) *lab.NATSStream {
	t.Helper()
	s, err := lab.CreateNATSStream(ctx, nt.URL, name, mode)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
		defer cancel()
		logCleanup(t, "delete the stream", s.Delete(ctx))
	})
	return s
}

// TestNATSEveryStrategy moves the NATS sample consumer (nats.go, a pull
// consumer), the pod of a Deployment or a StatefulSet that the real
// webhook injected, from node 1 to node 2 by annotating it with
// ms2m.io/migrate-to, by every strategy besides ms2m (TestNATSMigration)
// that NATS pods may take, while the producer publishes: the restored
// consumer ends with the producer's hash, and the migration leaves what
// TestEveryStrategyByAnnotation checks (expectMigrated). It logs each
// migration's processing gap from the consumers' journals, read every
// 100 ms (logWatchedGap).
func TestNATSEveryStrategy(t *testing.T) {
	needLab(t, "its NATS server is the host's, which only the lab's pods reach")
	nt := testenv.RequireNATS(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	l := needMS2M(t, ctx, withController)
	if _, ok := l.Images["consumer-nats"]; !ok {
		t.Fatal("the lab built no consumer-nats image")
	}
	needNATSForward(t, l)
	for _, tc := range []struct {
		kind     lab.Kind
		strategy contract.Strategy // the ms2m.io/strategy annotation; "" leaves it to auto
		want     contract.Strategy
		phases   []string // besides copyPhases
		pods     int      // ever made: the first, the target, and the shadow if any
	}{
		{kind: lab.Deployment, strategy: contract.StrategyMS2MCutoff, want: contract.StrategyMS2MCutoff,
			phases: []string{"quiesce", "checkpoint", "resume", "image", "replay and handover"}, pods: 2},
		{kind: lab.Deployment, strategy: contract.StrategyStopAndCopy, want: contract.StrategyStopAndCopy,
			phases: []string{"stop", "checkpoint", "image", "switch"}, pods: 2},
		{kind: lab.StatefulSet, strategy: contract.StrategyStatefulSet, want: contract.StrategyStatefulSet,
			phases: []string{"quiesce", "checkpoint", "image", "stop", "switch"}, pods: 2},
		{kind: lab.StatefulSet, want: contract.StrategyStatefulSetShadow,
			phases: []string{"quiesce", "shadow restore", "shadow handover", "shadow checkpoint", "handover"}, pods: 3},
	} {
		t.Run(strings.ToLower(string(tc.kind))+"/"+string(tc.want), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			name := testenv.UniqueName("own-nats")
			js := natsStream(t, ctx, nt, name, "pull")
			pods := watchPods(t, ctx, l, name)
			src, err := l.StartWorkload(ctx, tc.kind, lab.Consumer{Name: name, Queue: name, Node: l.NodeName(1), WorkMS: 50, Image: "consumer-nats", NATSMode: "pull"})
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
				defer cancel()
				logCleanup(t, "delete the workload", l.DeleteWorkload(ctx, tc.kind, name))
				if src != nil {
					logCleanup(t, "delete the replay log", shadowqueue.DeleteJetStream(ctx, nt.URL, inject.LogName(src)))
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := src.Annotations[contract.AnnotationStatus]; !ok {
				t.Fatalf("the webhook did not inject %s", src.Name)
			}
			produced := js.Produce(ctx, 120, 10)
			defer produced.Stop()
			testenv.Eventually(t, time.Minute, "the source consumer folds its first messages", func() bool {
				st, err := lab.GetAppState(src)
				return err == nil && st.Count >= 10
			})
			req := map[string]any{contract.AnnotationMigrateTo: l.NodeName(2)}
			if tc.strategy != "" {
				req[contract.AnnotationStrategy] = string(tc.strategy)
			}
			// The controller deletes the source (and a shadow) after its
			// handover: their journals are read every 100 ms until then.
			journals := l.WatchJournals(ctx, name, 100*time.Millisecond)
			defer journals.Close()
			began := time.Now()
			annotate(t, ctx, l, src.Name, req)
			target, st := waitMigrated(t, ctx, l, name, src)
			ended := time.Now()
			expectMigrated(t, ctx, l, tc.kind, src, target, st, tc.want, tc.phases)
			if rep := st.Report; rep != nil && rep.Strategy == contract.StrategyMS2MCutoff {
				t.Logf("ms2m-cutoff: λ %.2f/s, μ %.2f/s, T_cutoff %v", rep.Lambda, rep.Mu, rep.TCutoff)
			}
			expectNATSExact(t, ctx, produced, target)
			logWatchedGap(t, string(tc.want), journals, target, began, ended)
			expectNoEmptyReplica(t, pods, src.UID, tc.pods)
		})
	}
}
