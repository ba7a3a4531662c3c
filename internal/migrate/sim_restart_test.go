package migrate_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/simcluster"
	"github.com/ms2m/ms2m/internal/testenv"
)

// The migrator killed in each phase: `migrator controller` runs as a
// process of its own, its API calls through a gate (simcluster.APIGate)
// and its node calls to the simulated nodes, either of which can hold it at
// an exact point. There it is killed (SIGKILL: no clean-up of its own), a
// second controller starts, and the migration must end with the source
// serving (RolledBack) or completed on the target (Succeeded), with every
// delivery processed once, and nothing left behind.

// syncBuffer is a process's output, safe to read while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// controllerProc is a running `migrator controller`.
type controllerProc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

func startController(t *testing.T, c *simcluster.Cluster, name, kubeconfig string, env ...string) *controllerProc {
	t.Helper()
	bin := testenv.Build(t, "cmd/migrator")
	p := &controllerProc{name: name, out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, "controller")
	p.cmd.Env = append(os.Environ(),
		"KUBECONFIG="+kubeconfig,
		"MS2M_IMAGE_REPO="+c.ImageRepo(),
		"MS2M_AGENT_TOKEN="+c.AgentToken,
		"MS2M_AGENT_PORT="+strconv.Itoa(simcluster.AgentPort),
		"MS2M_LEADER_ELECTION=false",
		"MS2M_METRICS_ADDR=0",
		"MS2M_HEALTH_ADDR=0",
		"MS2M_MIGRATION_TIMEOUT=1m",
		"MS2M_LOG_LEVEL=debug",
		"MS2M_STATUS_KEY="+string(c.SigningKey), // shared by every controller a test starts and the webhook, as a Secret would be
	)
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }() // how it ended shows in its log
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s's log:\n%s", p.name, p.out.String())
		}
	})
	return p
}

// kill kills the process at once, the way a node loss or an OOM kill does.
func (p *controllerProc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Kill()
	<-p.done
}

// requestMigration annotates the workload's pod the way a user does.
func requestMigration(t *testing.T, c *simcluster.Cluster, w *workload, strategy contract.Strategy) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q,%q:"2s"}}}`,
		contract.AnnotationMigrateTo, nodeB, contract.AnnotationStrategy, strategy, contract.AnnotationReplayMax)
	if _, err := c.Client.CoreV1().Pods(w.ns).Patch(t.Context(), w.pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// finalStatus waits for a pod of the namespace to carry a migration status
// that is no longer Running, and returns the pod and the status.
func finalStatus(t *testing.T, c *simcluster.Cluster, ns string, timeout time.Duration) (*corev1.Pod, controller.Status) {
	t.Helper()
	var pod *corev1.Pod
	var st controller.Status
	testenv.Eventually(t, timeout, "the restarted controller ends the migration", func() bool {
		pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for i := range pods.Items {
			v, ok := pods.Items[i].Annotations[contract.AnnotationMigrationStatus]
			if !ok {
				continue
			}
			if s, err := controller.DecodeStatus(v); err == nil && s.Phase != contract.PhaseRunning {
				pod, st = &pods.Items[i], s
				return true
			}
		}
		return false
	})
	return pod, st
}

// killPoint arms where the first controller is held; reached is closed
// once it is there. release lets the held step go on (after the kill).
type killPoint func(t *testing.T, c *simcluster.Cluster, g *simcluster.APIGate, w *workload) (reached <-chan struct{}, release func())

// atNodeStep holds step on node.
func atNodeStep(node string, step simcluster.Step) killPoint {
	return func(t *testing.T, c *simcluster.Cluster, g *simcluster.APIGate, w *workload) (<-chan struct{}, func()) {
		h := c.Nodes[node].HoldStep(step)
		return h.Reached, h.Release
	}
}

// atRequest holds the first API request that match picks.
func atRequest(match func(w *workload, r simcluster.Request) bool) killPoint {
	return func(t *testing.T, c *simcluster.Cluster, g *simcluster.APIGate, w *workload) (<-chan struct{}, func()) {
		h := g.HoldRequest(func(r simcluster.Request) bool { return match(w, r) })
		return h.Reached, h.Release
	}
}

// inReplay holds the replay of the first target that starts on node B
// after the pods in skip serve there: the controller is killed while that
// target replays.
func inReplay(skip int) killPoint {
	return func(t *testing.T, c *simcluster.Cluster, g *simcluster.APIGate, w *workload) (<-chan struct{}, func()) {
		reached := make(chan struct{})
		stop := make(chan struct{})
		n := c.Nodes[nodeB]
		if skip == 0 {
			n.HoldReplays(true)
		}
		go func() {
			armed := skip == 0
			for {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				serving, replaying := 0, 0
				for _, sp := range n.Pods(w.ns) {
					switch sp.Sidecar.Mode() {
					case simcluster.ModeServing:
						serving++
					case simcluster.ModeReplaying:
						replaying++
					}
				}
				if !armed && serving >= skip {
					n.HoldReplays(true)
					armed = true
				} else if armed && replaying > 0 {
					close(reached)
					return
				}
			}
		}()
		return reached, func() { close(stop); n.HoldReplays(false) }
	}
}

func TestKilledMigratorResumesOrRollsBack(t *testing.T) {
	c := cluster(t)
	for _, tc := range []struct {
		name     string
		strategy contract.Strategy
		owner    string
		at       killPoint
		want     contract.Phase
		reason   string // the Event the restarted controller records
	}{
		{"ms2m in the checkpoint", contract.StrategyMS2M, "Deployment", atNodeStep(nodeA, simcluster.StepCheckpoint), contract.PhaseRolledBack, contract.ReasonMigrationRolledBack},
		{"ms2m in the image build", contract.StrategyMS2M, "Deployment", atNodeStep(nodeA, simcluster.StepImage), contract.PhaseRolledBack, contract.ReasonMigrationRolledBack},
		{"ms2m in the restore", contract.StrategyMS2M, "Deployment", atNodeStep(nodeB, simcluster.StepRestore), contract.PhaseRolledBack, contract.ReasonMigrationRolledBack},
		{"ms2m in the replay", contract.StrategyMS2M, "Deployment", inReplay(0), contract.PhaseRolledBack, contract.ReasonMigrationRolledBack},
		{"ms2m after the switch", contract.StrategyMS2M, "Deployment", atRequest(func(w *workload, r simcluster.Request) bool {
			return r.Method == "PATCH" && strings.HasSuffix(r.Path, "/pods/"+w.pod.Name) && bytes.Contains(r.Body, []byte(migrate.DeletionCostAnnotation))
		}), contract.PhaseSucceeded, contract.ReasonMigrationSucceeded},
		{"stop-and-copy in the checkpoint", contract.StrategyStopAndCopy, "Deployment", atNodeStep(nodeA, simcluster.StepCheckpoint), contract.PhaseRolledBack, contract.ReasonMigrationRolledBack},
		{"statefulset after the stop", contract.StrategyStatefulSet, "StatefulSet", atRequest(func(w *workload, r simcluster.Request) bool {
			return r.Method == "POST" && strings.HasSuffix(r.Path, "/configmaps")
		}), contract.PhaseRolledBack, contract.ReasonMigrationRolledBack},
		{"statefulset after the source is deleted", contract.StrategyStatefulSet, "StatefulSet", atNodeStep(nodeB, simcluster.StepRestore), contract.PhaseSucceeded, contract.ReasonMigrationSucceeded},
		{"statefulset-shadow in the shadow's replay", contract.StrategyStatefulSetShadow, "StatefulSet", inReplay(0), contract.PhaseRolledBack, contract.ReasonMigrationRolledBack},
		{"statefulset-shadow once the shadow serves", contract.StrategyStatefulSetShadow, "StatefulSet", atNodeStep(nodeB, simcluster.StepCheckpoint), contract.PhaseSucceeded, contract.ReasonMigrationContinued},
		{"statefulset-shadow while the StatefulSet's pod replays", contract.StrategyStatefulSetShadow, "StatefulSet", inReplay(1), contract.PhaseSucceeded, contract.ReasonMigrationSucceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := "sim-kill-" + strconv.Itoa(int(time.Now().UnixNano()%1e6))
			resetNodes(c)
			defer resetNodes(c)
			w := deploy(t, c, ns, tc.owner, true)
			g, err := c.NewGate()
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			reached, release := tc.at(t, c, g, w)
			first := startController(t, c, "the first controller", g.Kubeconfig)
			requestMigration(t, c, w, tc.strategy)
			select {
			case <-reached:
			case <-time.After(time.Minute):
				release()
				t.Fatalf("the first controller never got to the kill point; its log:\n%s", first.out.String())
			}
			first.kill()
			release()
			startController(t, c, "the restarted controller", c.Kubeconfig)

			pod, st := finalStatus(t, c, ns, 90*time.Second)
			t.Logf("%s on %s: %s", st.Phase, pod.Name, st.Message)
			if st.Phase != tc.want {
				t.Fatalf("the migration ended %s (%s), want %s", st.Phase, st.Message, tc.want)
			}
			switch tc.want {
			case contract.PhaseRolledBack:
				if pod.UID != w.pod.UID {
					t.Errorf("the rollback was recorded on %s, want the source", pod.Name)
				}
				expectServing(t, c, w)
				expectNoImage(t, migrate.CheckpointRef(c.ImageRepo(), ns, st.Name, c.SigningKey))
				expectNoImage(t, migrate.CheckpointRef(c.ImageRepo(), ns, migrate.ShadowName(st.Name), c.SigningKey))
				testenv.Eventually(t, 15*time.Second, "only the source is left", func() bool {
					pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
					return err == nil && len(pods.Items) == 1 && pods.Items[0].UID == w.pod.UID
				})
			case contract.PhaseSucceeded:
				target := checkServing(t, c, w, migrate.Report{TargetPod: pod.Name})
				// Completed by the restarted controller, its images go as
				// they would have.
				expectNoImage(t, migrate.CheckpointRef(c.ImageRepo(), ns, st.Name, c.SigningKey))
				expectNoImage(t, migrate.CheckpointRef(c.ImageRepo(), ns, migrate.ShadowName(st.Name), c.SigningKey))
				testenv.Eventually(t, 15*time.Second, "only the target is left", func() bool {
					pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
					return err == nil && len(pods.Items) == 1 && pods.Items[0].UID == target.UID
				})
				if ctrl := metav1.GetControllerOf(target); ctrl == nil || ctrl.Kind == "Pod" {
					t.Errorf("the target's controller is %v, want the workload's", ctrl)
				}
				for _, p := range w.created.all()[1:] {
					if !strings.Contains(p.Annotations[contract.AnnotationStatus], `"restore"`) {
						t.Errorf("pod %s was created without a restore: it would start with empty state", p.Name)
					}
				}
			}
			if _, err := c.Client.CoreV1().ConfigMaps(ns).Get(t.Context(), contract.PendingConfigMapName(w.pod.Name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("the pending-migration ConfigMap is left (err %v): the pod's next recreation would restore a stale checkpoint", err)
			}
			expectEvent(t, c, ns, tc.reason)
		})
	}
}

// expectEvent checks that an Event of reason was recorded in ns.
func expectEvent(t *testing.T, c *simcluster.Cluster, ns, reason string) {
	t.Helper()
	var seen []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		evs, err := c.Client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			continue
		}
		seen = seen[:0]
		for _, e := range evs.Items {
			if e.Reason == reason {
				return
			}
			seen = append(seen, e.Reason)
		}
	}
	t.Errorf("no Event %s in %s; seen: %v", reason, ns, seen)
}

// TestControllerRejectsBadRequests: a request the controller cannot carry
// out gets a Warning Event and a Failed status that says why and what to
// do, and nothing is touched: the source serves on, and no pod is made.
func TestControllerRejectsBadRequests(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	w := deploy(t, c, "sim-reject", "Deployment", true)
	plain := deploy(t, c, "sim-reject-plain", "Deployment", false)
	startController(t, c, "the controller", c.Kubeconfig)
	hc := &http.Client{Timeout: 10 * time.Second}
	ctlEP := control.Client{URL: "http://" + net.JoinHostPort(w.pod.Status.PodIP, "8089"), Token: c.ControlToken(w.ns), HTTP: hc}
	for _, tc := range []struct {
		name, node string
		w          *workload
		arm        func() func()
		want       string
	}{
		{name: "unknown node", node: "sim-nowhere", w: w, want: `annotation ms2m.io/migrate-to: node sim-nowhere: nodes "sim-nowhere" not found; nothing was touched`},
		{name: "same node", node: nodeA, w: w, want: "annotation ms2m.io/migrate-to: the pod already runs on sim-a; nothing was touched"},
		{name: "not injected", node: nodeB, w: plain, want: `the pod has no ms2m sidecar: opt it in with ms2m.io/inject: "true" and recreate it; nothing was touched`},
		{name: "already migrating", node: nodeB, w: w, arm: func() func() {
			if _, err := ctlEP.Quiesce(t.Context(), 10*time.Second); err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := ctlEP.Resume(context.WithoutCancel(t.Context())); err != nil {
					t.Logf("undo: resume: %v", err)
				}
			}
		}, want: "is already migrating: its sidecar is quiesced"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			undo := func() {}
			if tc.arm != nil {
				undo = tc.arm()
			}
			defer func() { undo() }()
			ctx := t.Context()
			pods := c.Client.CoreV1().Pods(tc.w.ns)
			patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:null}}}`, contract.AnnotationMigrateTo, tc.node, contract.AnnotationMigrationStatus)
			if _, err := pods.Patch(ctx, tc.w.pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			var st controller.Status
			testenv.Eventually(t, 30*time.Second, "a Failed status", func() bool {
				p, err := pods.Get(ctx, tc.w.pod.Name, metav1.GetOptions{})
				if err != nil {
					return false
				}
				s, err := controller.DecodeStatus(p.Annotations[contract.AnnotationMigrationStatus])
				st = s
				return err == nil && s.Phase == contract.PhaseFailed
			})
			if !strings.Contains(st.Message, tc.want) {
				t.Errorf("status message %q, want it to say %q", st.Message, tc.want)
			}
			expectEvent(t, c, tc.w.ns, contract.ReasonMigrationRejected)
			undo()
			undo = func() {}
			expectServing(t, c, tc.w)
			if got := len(tc.w.created.names()); got != 1 {
				t.Errorf("%d pods were created, want only the source: %v", got, tc.w.created.names())
			}
		})
	}
}
