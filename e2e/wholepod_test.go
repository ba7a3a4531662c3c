package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
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

// secondPort is where the pod's second Go consumer serves its state: the
// two share the pod's network.
const secondPort = lab.AppPort + 1

// TestTwoContainerPod moves a whole pod on real nodes: two unmodified Go
// consumers in one pod, each on a queue of its own through the one
// sidecar, migrated by ms2m while both producers send. Each container is
// checkpointed and restored from a checkpoint image of its own, and both
// end with their producer's hash.
func TestTwoContainerPod(t *testing.T) {
	l := needLab(t, "it runs migrate.Run in the test process, admitting targets itself")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	name := testenv.UniqueName("c-pod2")
	second := name + "-b"
	plan := migrate.Plan{
		Name: fmt.Sprintf("m%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
		TargetNode: cluster.NodeName(2), TargetPod: name + "-target", Strategy: contract.StrategyMS2M,
	}
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50, Mutate: withSecondConsumer(second)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
		defer cancel()
		if !(t.Failed() && os.Getenv("MS2M_E2E_KEEP") != "") {
			logCleanup(t, "delete pods", l.DeletePods(ctx, plan.Pod, plan.TargetPod))
		}
		b := testenv.RequireBroker(t)
		logCleanup(t, "delete the stream", shadowqueue.DeleteStream(ctx, b.StreamURI, inject.LogName(src)))
	})
	prodA, prodB := produceToBoth(t, src, name, second)

	rep, err := migrate.Run(ctx, l.Env(func(phase string, took time.Duration) {
		t.Logf("phase %-20s %v", phase, took.Round(time.Millisecond))
	}), plan)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Logf("ms2m of a whole pod: total %v, switch %v, checkpoint ID %d, cutoff %d, images %s and %v",
		rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond), rep.Start, rep.CutoffID, rep.Image, rep.Images)
	target, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, plan.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if target.Spec.NodeName != cluster.NodeName(2) {
		t.Errorf("target runs on %s, want %s", target.Spec.NodeName, cluster.NodeName(2))
	}
	expectCheckpointImages(t, target, &rep)
	expectBothExact(t, ctx, target, prodA, prodB)
}

// TestTwoContainerStatefulSet moves a whole StatefulSet pod on real nodes
// by the statefulset strategy: the pod of two unmodified Go consumers,
// each on a queue of its own through the one sidecar, that the webhook
// injected, migrated by the controller after the ms2m.io/migrate-to
// annotation while both producers send. Both containers are checkpointed,
// the StatefulSet's recreated pod restores each from its own checkpoint
// image on the target node, and both end with their producer's hash.
func TestTwoContainerStatefulSet(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	l := needMS2M(t, ctx, withController)
	name := testenv.UniqueName("c-sts2")
	second := name + "-b"
	pods := watchPods(t, ctx, l, name)
	src := startWorkload(t, ctx, l, lab.StatefulSet, lab.Consumer{Name: name, Queue: name, Node: l.NodeName(1), WorkMS: 50, Mutate: withSecondConsumer(second)})
	if _, ok := src.Annotations[contract.AnnotationStatus]; !ok {
		t.Fatalf("the webhook did not inject %s", src.Name)
	}
	prodA, prodB := produceToBoth(t, src, name, second)

	annotate(t, ctx, l, src.Name, map[string]any{contract.AnnotationMigrateTo: l.NodeName(2), contract.AnnotationStrategy: string(contract.StrategyStatefulSet)})
	target, st := waitMigrated(t, ctx, l, name, src)
	expectMigrated(t, ctx, l, lab.StatefulSet, src, target, st, contract.StrategyStatefulSet, []string{"quiesce", "checkpoint", "image", "stop", "switch"})
	t.Logf("statefulset of a whole pod: images %s and %v", st.Report.Image, st.Report.Images)
	expectCheckpointImages(t, target, st.Report)
	expectBothExact(t, ctx, target, prodA, prodB)
	expectNoEmptyReplica(t, pods, src.UID, 2)
}

// withSecondConsumer adds to a consumer's pod a second Go consumer,
// "audit", a copy of the first on the queue second that serves its state
// on secondPort.
func withSecondConsumer(second string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		c := *p.Spec.Containers[0].DeepCopy()
		c.Name = "audit"
		for i, e := range c.Env {
			switch e.Name {
			case "QUEUE":
				c.Env[i].Value = second
			case "HTTP_ADDR":
				c.Env[i].Value = "0.0.0.0:" + strconv.Itoa(secondPort)
			}
		}
		p.Spec.Containers = append(p.Spec.Containers, c)
	}
}

// produceToBoth starts a producer for each consumer of a two-container
// pod (queue and second, 120 messages each at 10 msg/s) once the second
// serves its state, and returns once both have folded their first
// messages.
func produceToBoth(t *testing.T, src *corev1.Pod, queue, second string) (*lab.Producer, *lab.Producer) {
	t.Helper()
	testenv.Eventually(t, time.Minute, "the second consumer serves its state", func() bool {
		_, err := lab.GetAppStateOn(src, secondPort)
		return err == nil
	})
	prodA := produce(t, src, queue, 10, 120, 20)
	prodB := produce(t, src, second, 10, 120, 0)
	testenv.Eventually(t, time.Minute, "the second consumer folds its first messages", func() bool {
		st, err := lab.GetAppStateOn(src, secondPort)
		return err == nil && st.Count >= 20
	})
	return prodA, prodB
}

// expectBothExact fails the test unless each consumer of the migrated
// two-container pod target ends with its producer's count and hash and
// skipped no redelivery.
func expectBothExact(t *testing.T, ctx context.Context, target *corev1.Pod, prodA, prodB *lab.Producer) {
	t.Helper()
	for _, tc := range []struct {
		what string
		prod *lab.Producer
		port int
	}{{"app", prodA, lab.AppPort}, {"audit", prodB, secondPort}} {
		want, err := tc.prod.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := lab.WaitForOn(target, tc.port, want, 30*time.Second)
		t.Logf("%s: producer count %d hash %.12s; restored consumer count %d hash %.12s", tc.what, want.Count, want.Hash, got.Count, got.Hash)
		if got.Count != want.Count || got.Hash != want.Hash || got.Skipped != 0 {
			t.Errorf("restored consumer %s: count %d hash %s, %d redeliveries skipped; producer: count %d hash %s", tc.what, got.Count, got.Hash, got.Skipped, want.Count, want.Hash)
		}
	}
}

// expectCheckpointImages fails the test unless each app container of the
// migrated two-container pod target runs a checkpoint image of its own,
// the one rep names for it.
func expectCheckpointImages(t *testing.T, target *corev1.Pod, rep *migrate.Report) {
	t.Helper()
	if rep.Images["audit"] == "" || rep.Images["audit"] == rep.Image {
		t.Errorf("the second container's checkpoint image: %v (the first's %s)", rep.Images, rep.Image)
	}
	want := map[string]string{"app": rep.Image, "audit": rep.Images["audit"]}
	for _, c := range target.Spec.Containers {
		if img, ok := want[c.Name]; ok {
			if c.Image != img {
				t.Errorf("the target's container %s runs %s, want its checkpoint image %s", c.Name, c.Image, img)
			}
			delete(want, c.Name)
		}
	}
	if len(want) > 0 {
		t.Errorf("the target %s lacks the app containers %v", target.Name, want)
	}
}
