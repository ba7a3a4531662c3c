package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/testenv"
)

// The lab (cluster, images, Secret) is made once per test binary and taken
// down by TestMain, unless MS2M_E2E_KEEP is set.
var (
	labOnce sync.Once
	theLab  *lab.Lab
	labErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if theLab != nil && os.Getenv("MS2M_E2E_KEEP") != "" {
		fmt.Fprintf(os.Stderr, "e2e: MS2M_E2E_KEEP is set: the cluster stays up (kubeconfig %s); take it down with: go run ./hack/cluster down -state %s\n", theLab.Cluster.Kubeconfig(), theLab.Opts.StateDir)
	} else if theLab != nil {
		if err := theLab.Down(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: cluster down: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// needLab returns the shared lab, bringing it up on first use.
func needLab(t *testing.T) *lab.Lab {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a real cluster")
	}
	testenv.WatchdogFor(t, 15*time.Minute)
	testenv.RequireBroker(t)
	labOnce.Do(func() {
		root := testenv.ModuleRoot(t)
		opts := cluster.Options{
			Nodes:          2,
			StateDir:       envOr("MS2M_E2E_STATE", "/var/tmp/ms2m-e2e"),
			RepoDir:        root,
			BinDir:         filepath.Join(root, "bin"),
			Log:            os.Stderr,
			WaitForNetwork: true,
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		var l *lab.Lab
		l, labErr = lab.Start(ctx, opts)
		if l != nil && l.Cluster != nil {
			theLab = l
		} else if labErr != nil {
			cluster.Down(opts) // whatever a failed up left
		}
	})
	var pe *cluster.PreconditionError
	if errors.As(labErr, &pe) {
		testenv.Missing(t, "what a real cluster needs: "+labErr.Error(), "the fix under each item above; `make node-bin criu node-setup` covers most")
	}
	if labErr != nil {
		t.Fatalf("bring up the lab: %v", labErr)
	}
	return theLab
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// produce runs the sample producer on the host (n messages to queue at rate
// per second; stopped when the test ends) and waits until the consumer in
// src has folded its first folds of them, so that a migration starts on a
// consumer with state.
func produce(t *testing.T, src *corev1.Pod, queue string, rate float64, n, folds int) *lab.Producer {
	t.Helper()
	prod, err := lab.StartProducer(testenv.Build(t, "examples/producer"), queue, rate, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Stop)
	testenv.Eventually(t, time.Minute, fmt.Sprintf("the source consumer folds its first %d messages", folds), func() bool {
		st, err := lab.GetAppState(src)
		return err == nil && st.Count >= folds
	})
	return prod
}

// expectExact waits for the producer to finish and for pod's consumer to
// settle, and fails the test unless its count and hash are the producer's.
func expectExact(t *testing.T, ctx context.Context, prod *lab.Producer, pod *corev1.Pod) {
	t.Helper()
	want, err := prod.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := lab.WaitFor(pod, want, 30*time.Second); got.Count != want.Count || got.Hash != want.Hash {
		t.Errorf("the consumer in %s: count %d hash %s; producer: count %d hash %s", pod.Name, got.Count, got.Hash, want.Count, want.Hash)
	}
}

// startController runs the annotation-driven controller, with agent for
// the node-local steps, until the test ends. Without the webhook it admits
// targets itself, as the lab's Env does.
func startController(t *testing.T, ctx context.Context, l *lab.Lab, agent migrate.NodeAgent) {
	t.Helper()
	mgr, err := testManager(l)
	if err != nil {
		t.Fatal(err)
	}
	cfg := controller.Config{Client: l.Client, Events: mgr.GetEventRecorder(controller.EventSource),
		Agent: agent, ImageRepo: l.Cluster.RegistryAddr() + "/ms2m/checkpoints"}
	if !l.WebhookRunning() {
		cfg.Admit = l.Admit
	}
	if err := controller.New(cfg).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	mctx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go mgr.Start(mctx)
}

// testManager is a controller-runtime manager for a test's controller.
// Each test registers its own "migration" controller in this one process,
// so the name check that guards a real binary's metrics is off here.
func testManager(l *lab.Lab) (manager.Manager, error) {
	skip := true
	return manager.New(l.Cluster.RESTConfig(), manager.Options{
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             ctrlconfig.Controller{SkipNameValidation: &skip},
	})
}

// annotate sets (a string) or removes (nil) annotations on pod name.
func annotate(t *testing.T, ctx context.Context, l *lab.Lab, name string, ann map[string]any) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Client.CoreV1().Pods(lab.Namespace).Patch(ctx, name, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		t.Fatalf("annotate %s: %v", name, err)
	}
}

// migrationStatus is pod's ms2m.io/migration-status, or the zero Status.
func migrationStatus(t *testing.T, p *corev1.Pod) controller.Status {
	t.Helper()
	v, ok := p.Annotations[inject.AnnotationMigrationStatus]
	if !ok {
		return controller.Status{}
	}
	st, err := controller.DecodeStatus(v)
	if err != nil {
		t.Fatalf("pod %s: status annotation %q: %v", p.Name, v, err)
	}
	return st
}

// waitMigrated waits until the controller records a Succeeded migration of
// src on a pod labelled app=app that is not src, and returns that pod (the
// target) and the status. It fails at once when src's status says Failed.
func waitMigrated(t *testing.T, ctx context.Context, l *lab.Lab, app string, src *corev1.Pod) (*corev1.Pod, controller.Status) {
	t.Helper()
	var target *corev1.Pod
	var failed string
	testenv.Eventually(t, 4*time.Minute, "a pod of "+app+" whose status says Succeeded", func() bool {
		pods, err := l.Client.CoreV1().Pods(lab.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return false
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			switch st := migrationStatus(t, p); {
			case p.UID == src.UID && st.Phase == controller.PhaseFailed:
				failed = st.Message
				return true
			case p.UID != src.UID && st.Phase == controller.PhaseSucceeded:
				target = p
				return true
			}
		}
		return false
	})
	if target == nil {
		t.Fatalf("the migration of %s failed: %s", src.Name, failed)
	}
	return target, migrationStatus(t, target)
}

// waitEvent waits for an Event with reason regarding pod (by UID: a
// StatefulSet's recreated pod has the source's name).
func waitEvent(t *testing.T, ctx context.Context, l *lab.Lab, pod *corev1.Pod, reason string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "Event "+reason+" on "+pod.Name, func() bool {
		evs, err := l.Client.EventsV1().Events(lab.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Regarding.UID == pod.UID && e.Reason == reason {
				return true
			}
		}
		return false
	})
}

// missingPhases reports the names in want that the report's phases lack.
func missingPhases(rep *migrate.Report, want []string) []string {
	have := map[string]bool{}
	for _, ph := range rep.Phases {
		have[ph.Name] = true
	}
	var missing []string
	for _, w := range want {
		if !have[w] {
			missing = append(missing, w)
		}
	}
	return missing
}

// madePod is a pod seen created.
type madePod struct {
	name, restore string
	uid           types.UID
}

type podLog struct {
	mu   sync.Mutex
	seen map[types.UID]madePod
	list []madePod
}

func (pl *podLog) created() []madePod {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return append([]madePod(nil), pl.list...)
}

// watchPods records every pod with label app=app that is created, and
// whether the webhook made it a restore.
func watchPods(t *testing.T, ctx context.Context, l *lab.Lab, app string) *podLog {
	t.Helper()
	w, err := l.Client.CoreV1().Pods(lab.Namespace).Watch(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	pl := &podLog{seen: map[types.UID]madePod{}}
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type != watch.Added {
				continue
			}
			st := p.Annotations[inject.AnnotationStatus]
			restore := ""
			if _, ok := p.Annotations[inject.AnnotationRestoreImage]; ok || containsRestore(st) {
				restore = "yes"
			}
			pl.mu.Lock()
			if _, dup := pl.seen[p.UID]; !dup {
				m := madePod{name: p.Name, restore: restore, uid: p.UID}
				pl.seen[p.UID] = m
				pl.list = append(pl.list, m)
			}
			pl.mu.Unlock()
		}
	}()
	return pl
}

// expectNoEmptyReplica fails the test unless pods made exactly want pods,
// and every one but the source src was a restore: no controller ever
// started a replica with empty state.
func expectNoEmptyReplica(t *testing.T, pods *podLog, src types.UID, want int) {
	t.Helper()
	made := pods.created()
	if len(made) != want {
		var names []string
		for _, p := range made {
			names = append(names, p.name)
		}
		t.Errorf("pods made: %s, want %d", strings.Join(names, ", "), want)
	}
	for _, p := range made {
		if p.restore == "" && p.uid != src {
			t.Errorf("pod %s (%s) was started without a restore: empty state", p.name, p.uid)
		}
	}
}

func containsRestore(status string) bool {
	var st inject.Status
	return json.Unmarshal([]byte(status), &st) == nil && st.Restore != ""
}
