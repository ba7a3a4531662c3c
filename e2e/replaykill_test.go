package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
)

// How a test kills the target.
type targetKill string

const (
	// deleteTarget deletes the target pod through the API, as an eviction
	// or a user would.
	deleteTarget targetKill = "pod deleted"
	// killApp and killSidecar SIGKILL one container's process on the
	// target node (through its containerd); the kubelet restarts it.
	killApp     targetKill = "app killed"
	killSidecar targetKill = "sidecar killed"
)

// TestTargetKilledDuringReplay: a migration asked for by annotation whose
// target is killed while it replays the log, before the source stops (ms2m,
// λ = 14/s against μ = 20/s: the target catches up for several seconds) or
// after it (ms2m-cutoff at λ above μ: the source stops at T_cutoff with
// records left to replay). Each must end with the source serving again or
// the migration completed, and the consumer's hash exactly the producer's.
func TestTargetKilledDuringReplay(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	l := needMS2M(t, ctx, withController)
	needContainerdNodes(t, l, "it kills the target's containers with ctr")
	for _, tc := range []struct {
		name      string
		strategy  contract.Strategy
		rate      float64
		n         int
		afterStop bool // kill once the source has stopped at the cutoff
		kill      targetKill
	}{
		{name: "pod deleted before the stop", strategy: contract.StrategyMS2M, rate: 14, n: 300, kill: deleteTarget},
		{name: "pod deleted after the stop", strategy: contract.StrategyMS2MCutoff, rate: 30, n: 400, afterStop: true, kill: deleteTarget},
		{name: "app killed before the stop", strategy: contract.StrategyMS2M, rate: 14, n: 300, kill: killApp},
		{name: "sidecar killed before the stop", strategy: contract.StrategyMS2M, rate: 14, n: 300, kill: killSidecar},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.kill != deleteTarget && l.External {
				t.Skipf("%s: kills a container through its node's containerd, which only the suite's own cluster gives the test", tc.kill)
			}
			ctx, cancel := context.WithTimeout(ctx, 6*time.Minute)
			defer cancel()
			name := testenv.UniqueName("tk")
			src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: l.NodeName(1), WorkMS: 50})
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
			prod := produce(t, src, name, tc.rate, tc.n, 20)

			annotate(t, ctx, l, name, map[string]any{contract.AnnotationMigrateTo: l.NodeName(2), contract.AnnotationStrategy: string(tc.strategy)})
			target, st := waitReplaying(t, ctx, l, src, tc.afterStop)
			t.Logf("target %s replays: replayed %d, %d records behind the log, source %s; %s it",
				target.Name, st.Replay.Replayed, st.lag(), sidecarMode(t, src), tc.kill)
			killTarget(t, ctx, l, target, tc.kill)

			serving, status := waitOutcome(t, ctx, l, name, src)
			t.Logf("outcome: %s on %s serves; migration %s: %s", serving.Name, serving.Spec.NodeName, status.Phase, status.Message)
			switch serving.UID {
			case src.UID:
				if mode := sidecarMode(t, src); mode != "serving" {
					t.Errorf("the migration failed, but the source's sidecar is %q, not serving", mode)
				}
				waitEvent(t, ctx, l, src, contract.ReasonMigrationFailed)
				testenv.Eventually(t, time.Minute, "the killed target "+target.Name+" is gone", func() bool {
					_, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, target.Name, metav1.GetOptions{})
					return apierrors.IsNotFound(err)
				})
			default:
				if serving.Spec.NodeName != l.NodeName(2) {
					t.Errorf("the migration completed, but %s runs on %s, not %s", serving.Name, serving.Spec.NodeName, l.NodeName(2))
				}
				if p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, src.Name, metav1.GetOptions{}); err == nil && p.UID == src.UID {
					t.Errorf("the migration completed, but the source %s is still there", src.Name)
				}
			}
			expectExact(t, ctx, prod, serving)
		})
	}
}

// replayState is the part of a target sidecar's GET /state that
// TestTargetKilledDuringReplay reads.
type replayState struct {
	Mode      string  `json:"mode"`
	ReplayLag *uint64 `json:"replayLag"`
	Replay    *struct {
		Replayed   uint64     `json:"replayed"`
		Replaying  int        `json:"replaying"`
		SwitchedAt *time.Time `json:"switchedAt"`
	} `json:"replay"`
}

func (st replayState) lag() uint64 {
	if st.ReplayLag == nil {
		return 0
	}
	return *st.ReplayLag
}

// waitReplaying waits until the target of src's migration is in the middle
// of its replay: it has handed its app some records, has more to go, and
// has not switched; with afterStop, also the source has stopped at the
// cutoff. It fails the test if the migration ends first.
func waitReplaying(t *testing.T, ctx context.Context, l *lab.Lab, src *corev1.Pod, afterStop bool) (*corev1.Pod, replayState) {
	t.Helper()
	var target *corev1.Pod
	last := "no target yet"
	deadline := time.Now().Add(3 * time.Minute)
	for ; time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if target == nil {
			p, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, src.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("the source %s: %v", src.Name, err)
			}
			ms := migrationStatus(t, p)
			if ms.Phase != "" && ms.Phase != contract.PhaseRunning {
				t.Fatalf("the migration ended before its target replayed: %s: %s", ms.Phase, ms.Message)
			}
			if ms.TargetPod == "" {
				continue
			}
			tp, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, ms.TargetPod, metav1.GetOptions{})
			if err != nil || tp.Status.PodIP == "" || tp.Status.Phase != corev1.PodRunning {
				last = fmt.Sprintf("target %s not running yet (%v)", ms.TargetPod, err)
				continue
			}
			target = tp
		}
		var s replayState
		if err := sidecarState(ctx, l, target, &s); err != nil {
			last = err.Error()
			continue
		}
		if s.Replay == nil {
			last = fmt.Sprintf("target %s: sidecar mode %q, no replay yet", target.Name, s.Mode)
			continue
		}
		if s.Replay.SwitchedAt != nil {
			t.Fatalf("the target %s switched to the primary queue before the test could kill it in the middle of its replay", target.Name)
		}
		last = fmt.Sprintf("target %s: mode %s, replayed %d, lag %d", target.Name, s.Mode, s.Replay.Replayed, s.lag())
		if s.Replay.Replayed < 5 || s.lag() < 5 {
			continue
		}
		if afterStop && sidecarMode(t, src) != "stopped" {
			continue
		}
		return target, s
	}
	t.Fatalf("no target in the middle of its replay within 3m: %s", last)
	return nil, replayState{}
}

// killTarget kills the target as kill says.
func killTarget(t *testing.T, ctx context.Context, l *lab.Lab, target *corev1.Pod, kill targetKill) {
	t.Helper()
	if kill == deleteTarget {
		if err := l.Client.CoreV1().Pods(lab.Namespace).Delete(ctx, target.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete the target %s: %v", target.Name, err)
		}
		return
	}
	if err := killContainer(ctx, l, target, kill); err != nil {
		t.Fatal(err)
	}
}

// killContainer SIGKILLs pod's app (killApp) or sidecar (killSidecar)
// through its node's containerd; the kubelet restarts it. It does not
// fail the test, so that a goroutine of the test may call it.
func killContainer(ctx context.Context, l *lab.Lab, pod *corev1.Pod, kill targetKill) error {
	statuses, container := pod.Status.ContainerStatuses, inject.AppContainer(pod)
	if kill == killSidecar {
		statuses, container = pod.Status.InitContainerStatuses, inject.SidecarName
	}
	var id string
	for _, cs := range statuses {
		if cs.Name == container {
			id = strings.TrimPrefix(cs.ContainerID, "containerd://")
		}
	}
	if id == "" {
		return fmt.Errorf("pod %s reports no container ID for %s", pod.Name, container)
	}
	node := 0
	for i := 1; i <= l.Cluster.Nodes(); i++ {
		if l.Cluster.Node(i).Name == pod.Spec.NodeName {
			node = i
		}
	}
	if node == 0 {
		return fmt.Errorf("pod %s runs on %q, not a node of the lab", pod.Name, pod.Spec.NodeName)
	}
	ctr := filepath.Join(l.Opts.BinDir, "containerd", "ctr")
	out, err := exec.CommandContext(ctx, ctr, "-a", l.Cluster.Node(node).ContainerdSock, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kill the %s container of %s (%s): %v: %s", container, pod.Name, id, err, out)
	}
	return nil
}

// waitOutcome waits until src's migration has ended and returns the pod
// that serves: the target, if a pod of app records the migration
// Succeeded, or src, if its status says Failed or RolledBack; and that
// status.
func waitOutcome(t *testing.T, ctx context.Context, l *lab.Lab, app string, src *corev1.Pod) (*corev1.Pod, controller.Status) {
	t.Helper()
	var serving *corev1.Pod
	var status controller.Status
	testenv.Eventually(t, 4*time.Minute, "the migration of "+src.Name+" ends", func() bool {
		pods, err := l.Client.CoreV1().Pods(lab.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return false
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			st := migrationStatus(t, p)
			switch {
			case p.UID == src.UID && (st.Phase == contract.PhaseFailed || st.Phase == contract.PhaseRolledBack):
				serving, status = p, st
				return true
			case p.UID != src.UID && st.Phase == contract.PhaseSucceeded:
				serving, status = p, st
				return true
			}
		}
		return false
	})
	if serving == nil {
		t.Fatalf("the migration of %s did not end", src.Name)
	}
	return serving, status
}
