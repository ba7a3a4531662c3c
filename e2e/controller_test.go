package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/agent"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/replay"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestAnnotationTriggersMigration: with the controller running, annotating
// an injected pod with ms2m.io/migrate-to moves it. A request for a node
// that does not exist is refused first, with a Warning Event and a status
// that says why, and nothing touched.
func TestAnnotationTriggersMigration(t *testing.T) {
	l := needLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if _, err := l.StartWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.StopWebhook() })
	agents, err := l.StartAgents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agents.Stop)

	mgr, err := testManager(t, l)
	if err != nil {
		t.Fatal(err)
	}
	rec := controller.New(controller.Config{
		Client:    l.Client,
		Events:    mgr.GetEventRecorder(controller.EventSource),
		Agent:     agent.Client{Token: lab.AgentToken, Resolve: agent.ByNodeIP(l.Client, lab.AgentPort)},
		ImageRepo: l.Cluster.RegistryAddr() + "/ms2m/checkpoints",
	})
	if err := rec.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	mctx, stop := context.WithCancel(ctx)
	defer stop()
	go mgr.Start(mctx)

	name := testenv.UniqueName("ann")
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	prod := produce(t, src, name, 10, 150, 20)

	annotate := func(ann map[string]any) {
		t.Helper()
		b := `{"metadata":{"annotations":{`
		var parts []string
		for k, v := range ann {
			if v == nil {
				parts = append(parts, fmt.Sprintf("%q:null", k))
			} else {
				parts = append(parts, fmt.Sprintf("%q:%q", k, v))
			}
		}
		b += strings.Join(parts, ",") + "}}}"
		if _, err := l.Client.CoreV1().Pods(lab.Namespace).Patch(ctx, name, types.MergePatchType, []byte(b), metav1.PatchOptions{}); err != nil {
			t.Fatalf("annotate %s: %v", name, err)
		}
	}
	status := func(p *corev1.Pod) controller.Status {
		var st controller.Status
		if v, ok := p.Annotations[inject.AnnotationMigrationStatus]; ok {
			st = decodeStatus(t, v)
		}
		return st
	}

	// Bad input: a node that does not exist.
	annotate(map[string]any{inject.AnnotationMigrateTo: "no-such-node"})
	testenv.Eventually(t, 30*time.Second, "the request for a missing node is refused", func() bool {
		p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, name, metav1.GetOptions{})
		return err == nil && status(p).Phase == controller.PhaseFailed
	})
	p, _ := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, name, metav1.GetOptions{})
	if st := status(p); !strings.Contains(st.Message, "no-such-node") || !strings.Contains(st.Message, "nothing was touched") {
		t.Errorf("status of the refused request: %+v", st)
	}
	waitEvent(t, ctx, l, name, "MigrationRejected")

	// The real request.
	annotate(map[string]any{inject.AnnotationMigrationStatus: nil, inject.AnnotationMigrateTo: cluster.NodeName(2)})
	var target *corev1.Pod
	testenv.Eventually(t, 3*time.Minute, "a target pod whose status says Succeeded", func() bool {
		pods, err := l.Client.CoreV1().Pods(lab.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for i := range pods.Items {
			q := &pods.Items[i]
			if strings.HasPrefix(q.Name, name+"-") && status(q).Phase == controller.PhaseSucceeded {
				target = q
				return true
			}
		}
		return false
	})
	t.Cleanup(func() { l.DeletePods(context.Background(), name, target.Name) })
	st := status(target)
	t.Logf("migration %s: %s; phases %+v", st.Name, st.Message, st.Report.Phases)
	if target.Spec.NodeName != cluster.NodeName(2) || st.Report == nil || st.Report.Downtime <= 0 || len(st.Report.Phases) < 5 {
		t.Errorf("target %s on %s with status %+v", target.Name, target.Spec.NodeName, st)
	}
	if _, ok := target.Annotations[inject.AnnotationMigrateTo]; ok {
		t.Error("the target carries the migration request too")
	}
	waitEvent(t, ctx, l, target.Name, "MigrationSucceeded")
	want, err := prod.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := lab.WaitFor(target, want, 30*time.Second); got.Count != want.Count || got.Hash != want.Hash {
		t.Errorf("restored consumer: count %d hash %s; producer: count %d hash %s", got.Count, got.Hash, want.Count, want.Hash)
	}
}

func waitEvent(t *testing.T, ctx context.Context, l *lab.Lab, pod, reason string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "Event "+reason+" on "+pod, func() bool {
		evs, err := l.Client.EventsV1().Events(lab.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == pod && e.Reason == reason {
				return true
			}
		}
		return false
	})
}

func decodeStatus(t *testing.T, v string) controller.Status {
	t.Helper()
	var st controller.Status
	if err := json.Unmarshal([]byte(v), &st); err != nil {
		t.Fatalf("status annotation %q: %v", v, err)
	}
	return st
}

// TestControllerRollsBackWhatAKilledOneLeft: a migration recorded as
// Running that no controller drives (the one that started it was killed
// after quiescing the source and creating the target) is rolled back by
// the next controller: the target goes, the source serves again, and the
// consumer's hash is exact.
func TestControllerRollsBackWhatAKilledOneLeft(t *testing.T) {
	l := needLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	name := testenv.UniqueName("killed")
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	prod := produce(t, src, name, 10, 100, 10)

	// What a controller killed mid-migration leaves: the source quiesced,
	// a target pod, and a Running status.
	port, token, err := migrateSidecar(ctx, l, src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := replayQuiesce(ctx, src, port, token); err != nil {
		t.Fatal(err)
	}
	half := name + "-half"
	decoy, err := l.Pod(lab.Consumer{Name: half, Queue: name + "-none", Node: cluster.NodeName(2), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Client.CoreV1().Pods(lab.Namespace).Create(ctx, mustAdmit(t, l, decoy), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.DeletePods(context.Background(), name, half) })
	st := controller.Status{Name: half, Phase: controller.PhaseRunning, Strategy: "ms2m", Target: cluster.NodeName(2), TargetPod: half, Started: time.Now()}
	b, _ := json.Marshal(st)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q}}}`, inject.AnnotationMigrateTo, cluster.NodeName(2), inject.AnnotationMigrationStatus, string(b))
	if _, err := l.Client.CoreV1().Pods(lab.Namespace).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if mode := sidecarMode(t, src); mode != "quiesced" {
		t.Fatalf("source sidecar %q before the new controller starts, want quiesced", mode)
	}

	// A new controller starts.
	mgr, err := testManager(t, l)
	if err != nil {
		t.Fatal(err)
	}
	rec := controller.New(controller.Config{Client: l.Client, Events: mgr.GetEventRecorder(controller.EventSource),
		Agent: l.Agent(), ImageRepo: l.Cluster.RegistryAddr() + "/ms2m/checkpoints", Admit: l.Admit})
	if err := rec.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	mctx, stop := context.WithCancel(ctx)
	defer stop()
	go mgr.Start(mctx)

	testenv.Eventually(t, time.Minute, "the migration is rolled back", func() bool {
		p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, name, metav1.GetOptions{})
		return err == nil && decodeStatus(t, p.Annotations[inject.AnnotationMigrationStatus]).Phase == controller.PhaseRolledBack
	})
	waitEvent(t, ctx, l, name, "MigrationRolledBack")
	if mode := sidecarMode(t, src); mode != "serving" {
		t.Errorf("source sidecar %q after the rollback, want serving", mode)
	}
	testenv.Eventually(t, time.Minute, "the half-made target is gone", func() bool {
		_, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, half, metav1.GetOptions{})
		return err != nil
	})
	want, err := prod.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := lab.WaitFor(src, want, 30*time.Second); got.Count != want.Count || got.Hash != want.Hash {
		t.Errorf("source consumer after the rollback: count %d hash %s; producer: count %d hash %s", got.Count, got.Hash, want.Count, want.Hash)
	}
}

func migrateSidecar(ctx context.Context, l *lab.Lab, p *corev1.Pod) (int, string, error) {
	return migrate.SidecarControl(ctx, l.Client, p)
}

func replayQuiesce(ctx context.Context, p *corev1.Pod, port int, token string) (replay.Cut, error) {
	return replay.Quiesce(ctx, &http.Client{Timeout: 30 * time.Second}, replay.Endpoint{URL: fmt.Sprintf("http://%s:%d", p.Status.PodIP, port), Token: token}, 20*time.Second)
}

func mustAdmit(t *testing.T, l *lab.Lab, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	a, err := l.Admit(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// testManager is a controller-runtime manager for a test's controller.
// Each test registers its own "migration" controller in this one process,
// so the name check that guards a real binary's metrics is off here.
func testManager(t *testing.T, l *lab.Lab) (manager.Manager, error) {
	skip := true
	return manager.New(l.Cluster.RESTConfig(), manager.Options{
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             ctrlconfig.Controller{SkipNameValidation: &skip},
	})
}
