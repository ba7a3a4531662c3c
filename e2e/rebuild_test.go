package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestRestoredAppKilledIsRebuilt: a consumer (prefetch 10) migrated by
// ms2m-cutoff (through the controller) serves on node 2 while the
// producer goes on faster than it consumes (25/s against μ = 20/s, so its
// prefetch window stays full); then its app container's process is
// SIGKILLed on the node, holding 10 deliveries it has not acked. The kubelet restarts it from the checkpoint image,
// without what it processed since. The controller sees the restart,
// stops the pod's sidecar and restores the same checkpoint again on node
// 2, replaying the log to the stop's cutoff without the deliveries the
// broker requeued; that pod serves on, and when the producer is done its
// consumer's count and hash are the producer's, with no redelivery
// skipped. Before, the restarted app went on consuming on the
// checkpoint's state.
func TestRestoredAppKilledIsRebuilt(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	l := needMS2M(t, ctx, withController)
	if l.External {
		t.Skip("kills a container through its node's containerd, which only the suite's own cluster gives the test")
	}
	name := testenv.UniqueName("rb")
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: l.NodeName(1), WorkMS: 50, Mutate: func(p *corev1.Pod) {
		p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "PREFETCH", Value: "10"})
	}})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
		defer cancel()
		pods, _ := l.Client.CoreV1().Pods(lab.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		var names []string
		for _, p := range pods.Items {
			names = append(names, p.Name)
		}
		logCleanup(t, "delete pods", l.DeletePods(ctx, names...))
		if src != nil {
			logCleanup(t, "delete the stream", shadowqueue.DeleteStream(ctx, testenv.RequireBroker(t).StreamURI, inject.LogName(src)))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	prod := produce(t, src, name, 25, 600, 20)
	annotate(t, ctx, l, name, map[string]any{contract.AnnotationMigrateTo: l.NodeName(2), contract.AnnotationStrategy: string(contract.StrategyMS2MCutoff)})
	served, status := waitOutcome(t, ctx, l, name, src)
	if status.Phase != contract.PhaseSucceeded {
		t.Fatalf("the migration ended %s: %s", status.Phase, status.Message)
	}
	testenv.Eventually(t, time.Minute, served.Name+" records what it was restored from", func() bool {
		p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, served.Name, metav1.GetOptions{})
		if err == nil && p.Annotations[contract.AnnotationRestoredFrom] != "" {
			served = p
			return true
		}
		return false
	})
	before, err := lab.GetAppState(served)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, served.Name+" consumes live", func() bool {
		st, err := lab.GetAppState(served)
		return err == nil && st.Count >= before.Count+30
	})
	killTarget(t, ctx, l, served, killApp)
	t.Logf("killed the app of %s on %s after %d messages", served.Name, served.Spec.NodeName, before.Count+30)
	waitEvent(t, ctx, l, served, contract.ReasonAppRestarted)

	copyName := migrate.RebuildPodName(served)
	var rebuilt *corev1.Pod
	testenv.Eventually(t, 4*time.Minute, "the rebuilt pod "+copyName+" alone serves", func() bool {
		pods, err := l.Client.CoreV1().Pods(lab.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].Name != copyName || pods.Items[0].Status.Phase != corev1.PodRunning {
			return false
		}
		rebuilt = &pods.Items[0]
		return rebuilt.Annotations[contract.AnnotationRestoredFrom] != ""
	})
	if rebuilt.Spec.NodeName != l.NodeName(2) {
		t.Errorf("the rebuilt pod runs on %s, want %s", rebuilt.Spec.NodeName, l.NodeName(2))
	}
	waitEventSaying(t, ctx, l, served, contract.ReasonStateRebuilt, "the state was rebuilt")
	t.Logf("rebuilt as %s, restored from %s", rebuilt.Name, rebuilt.Annotations[contract.AnnotationRestoredFrom])
	var from inject.RestoredFrom
	if err := json.Unmarshal([]byte(rebuilt.Annotations[contract.AnnotationRestoredFrom]), &from); err != nil || from.ReplaySkip == "" {
		t.Errorf("the rebuild left nothing out of its replay (%v): the killed app held no unacked delivery, so the fault did not fire", err)
	}
	expectExact(t, ctx, prod, rebuilt)
}
