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
		}, []string{"checkpoint " + w.ns + "/" + w.pod.Name + " container app on node sim-a", "Forbidden", "the API server's kubelet client identity needs nodes/checkpoint on the kubelet (see docs/install.md)"}},
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
