package migrate_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/proxy"
	"github.com/ms2m/ms2m/internal/simcluster"
	"github.com/ms2m/ms2m/internal/testenv"
)

// mutating is the calls that change something.
func mutating(calls []string) []string {
	var out []string
	for _, c := range calls {
		if !strings.HasPrefix(c, "GET ") && !strings.HasPrefix(c, "WATCH ") {
			out = append(out, c)
		}
	}
	return out
}

// TestBadInputTouchesNothing: a request the migrator can refuse up front is
// refused with a message that says what to do, before any write.
func TestBadInputTouchesNothing(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	w := deploy(t, c, "sim-bad", "Deployment", true)
	plain := deploy(t, c, "sim-plain", "Deployment", false)
	hc := &http.Client{Timeout: 10 * time.Second}
	ctlEP := control.Client{URL: "http://" + net.JoinHostPort(w.pod.Status.PodIP, "8089"), Token: c.ControlToken(w.ns), HTTP: hc}
	// pending is an injected pod that never starts: node A holds its start.
	pendingPod := func() (string, func()) {
		h := c.Nodes[nodeA].HoldStep(simcluster.StepStart)
		tpl := podTemplate(true)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "starting", Labels: map[string]string{"app": "other"}, Annotations: tpl.Annotations}, Spec: tpl.Spec}
		if _, err := c.Client.CoreV1().Pods(w.ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		<-h.Reached
		return pod.Name, func() {
			h.Release()
			if err := c.Client.CoreV1().Pods(w.ns).Delete(context.WithoutCancel(t.Context()), pod.Name, metav1.DeleteOptions{}); err != nil {
				t.Logf("undo: delete pod %s: %v", pod.Name, err)
			}
		}
	}
	for _, tc := range []struct {
		name string
		edit func(*migrate.Plan)
		want string
		// arm, if set, prepares the case and returns its undo.
		arm func(*migrate.Plan) func()
	}{
		{"unknown node", func(p *migrate.Plan) { p.TargetNode = "sim-nowhere" }, `target node sim-nowhere: nodes "sim-nowhere" not found`, nil},
		{"same node", func(p *migrate.Plan) { p.TargetNode = nodeA }, "already runs on node sim-a: pick another target", nil},
		{"statefulset strategy on a Deployment's pod", func(p *migrate.Plan) { p.Strategy = contract.StrategyStatefulSet }, "is not a StatefulSet's pod: strategy statefulset needs one; use ms2m (or auto)", nil},
		{"no such container", func(p *migrate.Plan) { p.Container = "nope" }, `has no container "nope"`, nil},
		{"unknown strategy", func(p *migrate.Plan) { p.Strategy = "teleport" }, `unknown strategy "teleport"`, nil},
		{"not injected", func(p *migrate.Plan) { p.Namespace, p.Pod = plain.ns, plain.pod.Name }, `has no ms2m sidecar (annotation ms2m.io/status missing): opt it in with ms2m.io/inject: "true"`, nil},
		{"no such pod", func(p *migrate.Plan) { p.Pod = "ghost" }, `the source pod: pods "ghost" not found`, nil},
		{"not running", func(*migrate.Plan) {}, "is not running and ready", func(p *migrate.Plan) func() {
			name, undo := pendingPod()
			p.Pod = name
			return undo
		}},
		{"a server-named queue", func(*migrate.Plan) {}, `consumes a queue that a migration cannot carry over, so nothing was checkpointed: queue "amq.gen-Xy1" is server-named`, func(*migrate.Plan) func() {
			sc := c.Nodes[nodeA].Pod(w.ns, w.pod.Name).Sidecar
			sc.SetUnreplayable([]proxy.UnreplayableQueue{{Queue: "amq.gen-Xy1", Reason: "server-named (amq.gen-*): the restored app declares a new queue with another name, which the replay log knows nothing of"}})
			return func() { sc.SetUnreplayable(nil) }
		}},
		{"already migrating", func(*migrate.Plan) {}, "is already migrating: its sidecar is quiesced, as a migration under way leaves it; wait for that migration to end", func(*migrate.Plan) func() {
			// another migration's quiesce
			if _, err := ctlEP.Quiesce(t.Context(), 10*time.Second); err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := ctlEP.Resume(t.Context()); err != nil {
					t.Error(err)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(c)
			p := plan(w, contract.StrategyMS2M)
			tc.edit(&p)
			undo := func() {}
			if tc.arm != nil {
				undo = tc.arm(&p)
			}
			defer func() { undo() }()
			cs, rec := recordingClient(t, c.Config)
			_, err := migrate.Run(t.Context(), env(c, cs), p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to say %q", err, tc.want)
			}
			if m := mutating(rec.sequence(strings.NewReplacer())); len(m) > 0 {
				t.Errorf("a refused migration wrote: %v", m)
			}
			for _, n := range c.Nodes {
				if calls := n.Calls(); len(calls) > 0 {
					t.Errorf("node %s was called: %v", n.Name, calls)
				}
			}
			undo()
			undo = func() {}
			expectServing(t, c, w)
		})
	}
}

// TestFailureLeavesTheSourceServing: a checkpoint, push or restore that
// fails leaves the source serving with its state, the target gone, and an
// error that names the phase, the cause and the fix.
func TestFailureLeavesTheSourceServing(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	w := deploy(t, c, "sim-fail", "Deployment", true)
	for _, tc := range []struct {
		name     string
		strategy contract.Strategy
		arm      func()
		want     []string
	}{
		{"checkpoint forbidden", contract.StrategyMS2M, func() {
			c.Nodes[nodeA].Fail(simcluster.StepCheckpoint, simcluster.Failure{Code: http.StatusForbidden,
				Body: "Forbidden (user=kube-apiserver-kubelet-client, verb=create, resource=nodes, subresource=checkpoint)"})
		}, []string{"checkpoint " + w.ns + "/" + w.pod.Name + " container app on node sim-a", "by its agent", "Forbidden", "the agent's ServiceAccount needs create on nodes/checkpoint"}},
		{"checkpoint fails", contract.StrategyMS2M, func() {
			c.Nodes[nodeA].Fail(simcluster.StepCheckpoint, simcluster.Failure{Code: http.StatusInternalServerError,
				Body: "checkpointing of " + w.ns + "/" + w.pod.Name + "/app failed: CRIU: Can't dump ghost file"})
		}, []string{"on node sim-a", "checkpointing of", "Can't dump ghost file", "the source was resumed and keeps serving"}},
		{"push fails", contract.StrategyMS2M, func() { c.FailPushes(true) }, []string{"the simulated registry refuses pushes"}},
		{"restore fails", contract.StrategyMS2M, func() {
			c.Nodes[nodeB].Fail(simcluster.StepRestore, simcluster.Failure{Body: "criu restore failed: Can't open inventory"})
		}, []string{"the restore failed", "CrashLoopBackOff", "Can't open inventory"}},
		{"restore fails after a stop", contract.StrategyStopAndCopy, func() {
			c.Nodes[nodeB].Fail(simcluster.StepRestore, simcluster.Failure{Body: "criu restore failed: Can't open inventory"})
		}, []string{"the restore failed", "Can't open inventory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(c)
			tc.arm()
			defer resetNodes(c)
			p := plan(w, tc.strategy)
			rep, err := migrate.Run(t.Context(), env(c, c.Client), p)
			if err == nil {
				t.Fatal("the migration succeeded")
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("err = %v\nwant it to say %q", err, s)
				}
			}
			testenv.Eventually(t, 10*time.Second, "the half-made target is gone", func() bool {
				_, err := c.Client.CoreV1().Pods(w.ns).Get(t.Context(), p.TargetPod, metav1.GetOptions{})
				return apierrors.IsNotFound(err)
			})
			expectServing(t, c, w)
			if rep.Image != "" {
				expectNoImage(t, rep.Image)
			}
			expectNoImage(t, migrate.CheckpointRef(c.ImageRepo(), w.ns, p.Name, c.SigningKey))
		})
	}
}

// expectNoImage checks that ref (a tag or a digest) is not in the
// registry: a failed migration leaves no checkpoint image behind.
func expectNoImage(t *testing.T, ref string) {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	_, err = remote.Head(r)
	var te *transport.Error
	if !errors.As(err, &te) || te.StatusCode != http.StatusNotFound {
		t.Errorf("the checkpoint image %s is left in the registry (HEAD: %v)", ref, err)
	}
}

// expectServing checks that the workload's source pod still runs on node
// A, serves, and has processed every delivery once.
func expectServing(t *testing.T, c *simcluster.Cluster, w *workload) {
	t.Helper()
	p, err := c.Client.CoreV1().Pods(w.ns).Get(t.Context(), w.pod.Name, metav1.GetOptions{})
	if err != nil || p.UID != w.pod.UID || p.Status.Phase != corev1.PodRunning {
		t.Fatalf("the source %s: %v (phase %v)", w.pod.Name, err, p.Status.Phase)
	}
	sp := c.Nodes[nodeA].Pod(w.ns, w.pod.Name)
	if sp == nil {
		t.Fatal("node A does not run the source")
	}
	before := sp.App.State().Last
	testenv.Eventually(t, 5*time.Second, "the source serves", func() bool { return sp.App.State().Last > before+2 })
	if st := sp.App.State(); len(st.Violations) > 0 || st.Count != st.Last {
		t.Errorf("the source's app: %+v", st)
	}
}

// TestStatefulSetRestoreFailsRollsBack: the statefulset strategy deletes
// the source at its cutoff, so a restore that fails on the target cannot
// resume it. The StatefulSet's pod is restored on the source's node
// instead, from the same checkpoint and replayed to the same cutoff: it
// serves there with every delivery processed once, and the record and
// the image go (before, the record stayed and the pod crash-looped on the
// target, for a human to fix). If the restore fails there too, the error
// says both and the record stays, so that the pod never starts empty.
func TestStatefulSetRestoreFailsRollsBack(t *testing.T) {
	c := cluster(t)
	for _, tc := range []struct {
		name      string
		bothNodes bool
	}{
		{"on the target", false},
		{"on both nodes", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(c)
			defer resetNodes(c)
			w := deploy(t, c, "sim-sts-restore-fails-"+suffix(), "StatefulSet", true)
			fail := simcluster.Failure{Body: "criu restore failed: Can't open inventory"}
			c.Nodes[nodeB].Fail(simcluster.StepRestore, fail)
			if tc.bothNodes {
				c.Nodes[nodeA].Fail(simcluster.StepRestore, fail)
			}
			p := plan(w, contract.StrategyStatefulSet)
			rep, err := migrate.Run(t.Context(), env(c, c.Client), p)
			if err == nil {
				t.Fatal("the migration succeeded")
			}
			cm := contract.PendingConfigMapName(w.pod.Name)
			_, cmErr := c.Client.CoreV1().ConfigMaps(w.ns).Get(t.Context(), cm, metav1.GetOptions{})
			var back *migrate.RolledBack
			if tc.bothNodes {
				if errors.As(err, &back) {
					t.Fatalf("err = %v: a rollback, but the restore on the source's node failed too", err)
				}
				for _, s := range []string{"Can't open inventory", "the rollback, the same restore on the source's node sim-a, failed too", "ConfigMap " + w.ns + "/" + cm + " stays"} {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("err = %v\nwant it to say %q", err, s)
					}
				}
				if cmErr != nil {
					t.Errorf("the pending-migration record: %v; it must stay while no pod holds the state", cmErr)
				}
				return
			}
			if !errors.As(err, &back) {
				t.Fatalf("err = %v, want a rollback (migrate.RolledBack)", err)
			}
			for _, s := range []string{"the restore on sim-b failed", "Can't open inventory", "restored on the source's node sim-a"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("err = %v\nwant it to say %q", err, s)
				}
			}
			if !apierrors.IsNotFound(cmErr) {
				t.Errorf("the pending-migration record is left (%v)", cmErr)
			}
			pod, err := c.Client.CoreV1().Pods(w.ns).Get(t.Context(), w.pod.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if pod.Spec.NodeName != nodeA || pod.UID == w.pod.UID {
				t.Fatalf("the pod %s (UID %s) runs on %s, want a new one on %s", pod.Name, pod.UID, pod.Spec.NodeName, nodeA)
			}
			if sp := c.Nodes[nodeB].Pod(w.ns, w.pod.Name); sp != nil {
				t.Errorf("node B still runs the failed restore (UID %s)", sp.UID)
			}
			sp := c.Nodes[nodeA].Pod(w.ns, w.pod.Name)
			if sp == nil || sp.UID != pod.UID {
				t.Fatal("node A does not run the restored pod")
			}
			testenv.Eventually(t, 10*time.Second, "the restored pod's sidecar serves", func() bool { return sp.Sidecar.Mode() == simcluster.ModeServing })
			before := sp.App.State().Last
			testenv.Eventually(t, 5*time.Second, "the restored pod processes", func() bool { return sp.App.State().Last > before+2 })
			st := sp.App.State()
			if len(st.Violations) > 0 || st.Count != st.Last {
				t.Errorf("the restored app: %+v", st)
			}
			if st.Count < rep.CutoffID {
				t.Errorf("the restored app processed %d deliveries, fewer than the cutoff %d", st.Count, rep.CutoffID)
			}
			expectNoImage(t, rep.Image)
		})
	}
}

// TestShadowCheckpointThroughAControlCut: statefulset-shadow's shadow has
// taken over on node B and the source is stopped for good when the
// network to node B's control APIs drops the migrator's quiesce of the
// shadow, and every request after it, for three requests. The migrator
// tries again (resuming the shadow, whose quiesce may have gone through)
// once node B answers, and completes: the StatefulSet's pod serves on node
// B with every delivery processed once, and the shadow is gone. Before,
// the migration failed there and left the shadow serving beside the
// stopped source, for a human to finish.
func TestShadowCheckpointThroughAControlCut(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	w := deploy(t, c, "sim-shadow-cut-"+suffix(), "StatefulSet", true)
	restore := c.Nodes[nodeB].CutControlOn("/quiesce")
	done, ended := make(chan struct{}), make(chan int, 1)
	go func() {
		defer func() { ended <- restore() }()
		for c.Nodes[nodeB].Dropped() < 3 {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond): // polls the condition
			}
		}
	}()
	p := plan(w, contract.StrategyStatefulSetShadow)
	rep, err := migrate.Run(t.Context(), env(c, c.Client), p)
	close(done)
	dropped := <-ended
	if dropped == 0 {
		t.Fatal("the cut dropped nothing: the fault did not fire")
	}
	if err != nil {
		t.Fatalf("migrate (the cut dropped %d requests): %v", dropped, err)
	}
	checkServing(t, c, w, rep)
	if _, err := c.Client.CoreV1().Pods(w.ns).Get(t.Context(), migrate.ShadowName(p.Name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the shadow is still there (%v)", err)
	}
	if n := len(c.Nodes[nodeB].Pods(w.ns)); n != 1 {
		t.Errorf("node B runs %d pods of the StatefulSet, want 1", n)
	}
}

// TestControllerRecordsTheRestoreOnTheSource: the migrator controller
// records the rollback of TestStatefulSetRestoreFailsRollsBack as
// RolledBack, with a Warning Event, on the StatefulSet's pod that serves
// on the source's node.
func TestControllerRecordsTheRestoreOnTheSource(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	w := deploy(t, c, "sim-sts-restore-ctl-"+suffix(), "StatefulSet", true)
	c.Nodes[nodeB].Fail(simcluster.StepRestore, simcluster.Failure{Body: "criu restore failed: Can't open inventory"})
	startController(t, c, "the controller", c.Kubeconfig)
	requestMigration(t, c, w, contract.StrategyStatefulSet)
	pod, st := finalStatus(t, c, w.ns, 90*time.Second)
	if st.Phase != contract.PhaseRolledBack || !strings.Contains(st.Message, "restored on the source's node sim-a") {
		t.Fatalf("the migration ended %s (%s), want %s, restored on the source's node", st.Phase, st.Message, contract.PhaseRolledBack)
	}
	if pod.Spec.NodeName != nodeA {
		t.Errorf("the status is on %s on %s, want the pod on %s", pod.Name, pod.Spec.NodeName, nodeA)
	}
	expectEvent(t, c, w.ns, contract.ReasonMigrationRolledBack)
}
