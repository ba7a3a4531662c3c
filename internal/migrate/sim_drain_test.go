package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/simcluster"
	"github.com/ms2m/ms2m/internal/testenv"
)

// drainNode does what kubectl drain does after cordoning node: it asks
// for the eviction of each pod, retries on 429, is done with a pod once
// the eviction answers "not found" or the pod (its UID) is gone. It
// returns, per pod, how the eviction ended: "migrated" (every eviction
// refused until the pod left) or "evicted" (an eviction went through).
func drainNode(t *testing.T, c *simcluster.Cluster, pods []corev1.Pod, timeout time.Duration) map[string]string {
	t.Helper()
	ctx := t.Context()
	var mu sync.Mutex
	out := map[string]string{}
	var wg sync.WaitGroup
	deadline := time.Now().Add(timeout)
	for _, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := p.Namespace + "/" + p.Name
			how := "timeout"
			for time.Now().Before(deadline) && ctx.Err() == nil {
				cur, err := c.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
				if apierrors.IsNotFound(err) || (err == nil && cur.UID != p.UID) {
					if how == "timeout" {
						how = "migrated"
					}
					break
				}
				err = c.Client.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}})
				switch {
				case err == nil:
					how = "evicted"
				case apierrors.IsNotFound(err):
					if how == "timeout" {
						how = "migrated"
					}
				case apierrors.IsTooManyRequests(err):
				default:
					t.Logf("evict %s: %v", key, err)
				}
				if how != "timeout" {
					break
				}
				time.Sleep(300 * time.Millisecond)
			}
			mu.Lock()
			out[key] = how
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func cordon(t *testing.T, c *simcluster.Cluster, node string, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
	if _, err := c.Client.CoreV1().Nodes().Patch(context.WithoutCancel(t.Context()), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("cordon %s (%v): %v", node, on, err)
	}
}

// TestDrainMigratesOptedInPods: node A holds three consumers opted in by
// their namespace's ms2m.io/on-evict=migrate (two Deployments, one
// StatefulSet). Node A is cordoned and each pod's eviction asked for
// until it is gone, as kubectl drain does: every eviction is refused
// (429) while the controller moves the pod, to the node the real
// kube-scheduler chose for its placeholder (node B), by its strategy,
// at most two off the node at once; each ends on node B restored from its
// checkpoint, every delivery processed once, and no placeholder is left.
func TestDrainMigratesOptedInPods(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	ctx := t.Context()
	workloads := []*workload{
		deploy(t, c, "sim-drain-a", "Deployment", true),
		deploy(t, c, "sim-drain-b", "Deployment", true),
		deploy(t, c, "sim-drain-s", "StatefulSet", true),
	}
	var pods []corev1.Pod
	for _, w := range workloads {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, contract.LabelNamespaceOnEvict, contract.OnEvictMigrate)
		if _, err := c.Client.CoreV1().Namespaces().Patch(ctx, w.ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, *w.pod)
	}
	startController(t, c, "the controller", c.Kubeconfig, "MS2M_EVACUATE_PER_NODE=2")

	// At most two evacuations off node A at a time, as far as a poll sees.
	stopPoll := make(chan struct{})
	pollDone := make(chan int)
	go func() {
		most := 0
		for {
			select {
			case <-stopPoll:
				pollDone <- most
				return
			case <-time.After(50 * time.Millisecond):
			}
			n := 0
			for _, w := range workloads {
				list, err := c.Client.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{})
				if err != nil {
					continue
				}
				for _, p := range list.Items {
					st, _ := controller.DecodeStatus(p.Annotations[contract.AnnotationMigrationStatus])
					_, asked := p.Annotations[contract.AnnotationMigrateTo]
					if p.Spec.NodeName == nodeA && p.Annotations[contract.AnnotationEvacuate] == nodeA && (asked || st.Phase == contract.PhaseRunning) {
						n++
					}
				}
			}
			most = max(most, n)
		}
	}()

	cordon(t, c, nodeA, true)
	t.Cleanup(func() { cordon(t, c, nodeA, false) })
	got := drainNode(t, c, pods, 3*time.Minute)
	close(stopPoll)
	if most := <-pollDone; most > 2 {
		t.Errorf("%d evacuations off node A at once, want at most 2 (MS2M_EVACUATE_PER_NODE)", most)
	}
	for _, p := range pods {
		if how := got[p.Namespace+"/"+p.Name]; how != "migrated" {
			t.Errorf("pod %s/%s: %s, want migrated (every eviction refused until it left)", p.Namespace, p.Name, how)
		}
	}
	if t.Failed() {
		t.Logf("kube-scheduler's log:\n%s", c.SchedulerLog())
		t.FailNow()
	}
	for _, w := range workloads {
		moved := waitEvacuated(t, c, w, nodeA, nodeB)
		expectEventOn(t, c, w.ns, w.pod.Name, contract.ReasonEvacuationTarget, nodeB)
		t.Logf("%s %s: %s", w.owner, moved.Name, moved.Annotations[contract.AnnotationMigrationStatus])
	}
	testenv.Eventually(t, 30*time.Second, "no placeholder pod is left", func() bool {
		list, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: contract.LabelPlaceholderFor})
		return err == nil && len(list.Items) == 0
	})
}

// waitEvacuated waits for w's pod to serve on node to, moved off from by
// its evacuation, restored from a checkpoint, every delivery once.
func waitEvacuated(t *testing.T, c *simcluster.Cluster, w *workload, from, to string) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	var st controller.Status
	testenv.Eventually(t, 90*time.Second, w.ns+"'s pod serves on "+to, func() bool {
		list, err := c.Client.CoreV1().Pods(w.ns).List(t.Context(), metav1.ListOptions{})
		if err != nil || len(list.Items) != 1 {
			return false
		}
		p := &list.Items[0]
		s, err := controller.DecodeStatus(p.Annotations[contract.AnnotationMigrationStatus])
		if err != nil || p.UID == w.pod.UID || p.Spec.NodeName != to || s.Phase != contract.PhaseSucceeded || p.Status.Phase != corev1.PodRunning {
			return false
		}
		got, st = p, s
		return true
	})
	if st.Evacuation != from || st.Source != from || st.Target != to {
		t.Errorf("%s's status: evacuation %q, from %q to %q; want an evacuation off %s to %s", got.Name, st.Evacuation, st.Source, st.Target, from, to)
	}
	if _, ok := got.Annotations[contract.AnnotationEvacuate]; ok && w.owner == "Deployment" {
		t.Errorf("%s (the target) carries %s", got.Name, contract.AnnotationEvacuate)
	}
	sp := c.Nodes[to].Pod(w.ns, got.Name)
	if sp == nil || sp.UID != got.UID || !sp.Restored {
		t.Fatalf("node %s does not run %s restored from a checkpoint", to, got.Name)
	}
	before := sp.App.State().Last
	testenv.Eventually(t, 10*time.Second, got.Name+" processes new deliveries", func() bool { return sp.App.State().Last > before+3 })
	if s := sp.App.State(); len(s.Violations) > 0 || s.Count != s.Last {
		t.Errorf("%s's app processed %d deliveries, the last %d, out of order %v: want each once, in order", got.Name, s.Count, s.Last, s.Violations)
	}
	if sp := c.Nodes[from].Pod(w.ns, w.pod.Name); sp != nil {
		t.Errorf("node %s still runs %s", from, w.pod.Name)
	}
	return got
}

// TestDrainWithAFailedMigration: the evacuated pod's restore fails on the
// node the scheduler chose. The source keeps serving on the cordoned
// node, every eviction is refused with why (not retried by the
// controller), and the override lets a plain eviction through.
func TestDrainWithAFailedMigration(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	ctx := t.Context()
	w := deploy(t, c, "sim-drain-fail", "Deployment", true)
	pods := c.Client.CoreV1().Pods(w.ns)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, contract.AnnotationOnEvict, contract.OnEvictMigrate)
	if _, err := pods.Patch(ctx, w.pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Nodes[nodeB].Fail(simcluster.StepRestore, simcluster.Failure{Body: "criu restore failed: Can't open inventory"})
	startController(t, c, "the controller", c.Kubeconfig)
	cordon(t, c, nodeA, true)
	t.Cleanup(func() { cordon(t, c, nodeA, false) })

	evict := func() error {
		return c.Client.PolicyV1().Evictions(w.ns).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: w.pod.Name}})
	}
	var last error
	testenv.Eventually(t, 90*time.Second, "the eviction is refused with the migration's failure", func() bool {
		last = evict()
		if last == nil || !apierrors.IsTooManyRequests(last) {
			t.Fatalf("eviction while the migration is under way or failed: %v, want 429", last)
		}
		return strings.Contains(last.Error(), "Can't open inventory")
	})
	for _, want := range []string{contract.AnnotationOnEvictOverride, "Failed", nodeB} {
		if !strings.Contains(last.Error(), want) {
			t.Errorf("refusal %q does not say %q", last, want)
		}
	}
	// The source serves on node A, exact, and is not migrated again.
	src, err := pods.Get(ctx, w.pod.Name, metav1.GetOptions{})
	if err != nil || src.UID != w.pod.UID || src.Spec.NodeName != nodeA {
		t.Fatalf("the source after the failed migration: %v %v", src, err)
	}
	st, _ := controller.DecodeStatus(src.Annotations[contract.AnnotationMigrationStatus])
	sp := c.Nodes[nodeA].Pod(w.ns, w.pod.Name)
	if sp == nil || sp.Sidecar.Mode() != simcluster.ModeServing {
		t.Fatalf("the source's sidecar does not serve on %s", nodeA)
	}
	before := sp.App.State().Last
	testenv.Eventually(t, 10*time.Second, "the source processes new deliveries", func() bool { return sp.App.State().Last > before+3 })
	if s := sp.App.State(); len(s.Violations) > 0 || s.Count != s.Last {
		t.Errorf("the source's app processed %d deliveries, the last %d, out of order %v", s.Count, s.Last, s.Violations)
	}
	if again := within(5*time.Second, func() bool {
		p, err := pods.Get(ctx, w.pod.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		now, _ := controller.DecodeStatus(p.Annotations[contract.AnnotationMigrationStatus])
		_, asked := p.Annotations[contract.AnnotationMigrateTo]
		return asked || now.Name != st.Name
	}); again {
		t.Errorf("the failed evacuation %s was tried again", st.Name)
	}
	list, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: contract.LabelPlaceholderFor})
	if err != nil || len(list.Items) != 0 {
		t.Errorf("placeholders left after the failure: %d (%v)", len(list.Items), err)
	}

	// The override: a plain eviction.
	patch = fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, contract.AnnotationOnEvictOverride)
	if _, err := pods.Patch(ctx, w.pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := evict(); err != nil {
		t.Errorf("eviction with %s=true: %v, want it through", contract.AnnotationOnEvictOverride, err)
	}
}

// TestMigratorDrain: `migrator drain` of node A, with a Deployment's and
// a StatefulSet's pod opted in by annotation, exits 0 once both serve on
// node B, with the table's rows and the summary; a drain that cannot
// move a pod (its migration fails) exits 1 and names it.
func TestMigratorDrain(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	ctx := t.Context()
	workloads := []*workload{
		deploy(t, c, "sim-cli-drain-d", "Deployment", true),
		deploy(t, c, "sim-cli-drain-s", "StatefulSet", true),
	}
	// The drain takes this test's pods only (-pod-selector): the simulated
	// cluster runs no namespace controller, so earlier tests' pods stay
	// on node A in their terminating namespaces.
	const mine = `{"metadata":{"labels":{"ms2m-test":"cli-drain"},"annotations":{%q:%q}}}`
	for _, w := range workloads {
		patch := fmt.Sprintf(mine, contract.AnnotationOnEvict, contract.OnEvictMigrate)
		if _, err := c.Client.CoreV1().Pods(w.ns).Patch(ctx, w.pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	startController(t, c, "the controller", c.Kubeconfig)
	t.Cleanup(func() { cordon(t, c, nodeA, false) })
	bin := testenv.Build(t, "cmd/migrator")
	run := func() (string, int) {
		cmd := exec.CommandContext(ctx, bin, "drain", "-retry=500ms", "-timeout=2m", "-pod-selector=ms2m-test=cli-drain", nodeA)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
		out, err := cmd.CombinedOutput()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatalf("migrator drain: %v", err)
		}
		return string(out), code
	}
	out, code := run()
	t.Logf("migrator drain:\n%s", out)
	if code != 0 {
		t.Errorf("migrator drain exited %d, want 0", code)
	}
	for _, w := range workloads {
		if !strings.Contains(out, w.ns+"/"+w.pod.Name) {
			t.Errorf("the output does not show %s/%s", w.ns, w.pod.Name)
		}
		waitEvacuated(t, c, w, nodeA, nodeB)
	}
	if !strings.Contains(out, "2 migrated") {
		t.Errorf("the summary does not count 2 migrated")
	}
	if n, err := c.Client.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{}); err != nil || !n.Spec.Unschedulable {
		t.Errorf("node A is not cordoned after the drain (%v)", err)
	}

	// One that cannot move: exit 1, named with why.
	cordon(t, c, nodeA, false)
	w := deploy(t, c, "sim-cli-drain-f", "Deployment", true)
	patch := fmt.Sprintf(mine, contract.AnnotationOnEvict, contract.OnEvictMigrate)
	if _, err := c.Client.CoreV1().Pods(w.ns).Patch(ctx, w.pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Nodes[nodeB].Fail(simcluster.StepRestore, simcluster.Failure{Body: "criu restore failed: Can't open inventory"})
	out, code = run()
	t.Logf("migrator drain:\n%s", out)
	if code != 1 || !strings.Contains(out, w.ns+"/"+w.pod.Name+": failed") || !strings.Contains(out, "Can't open inventory") {
		t.Errorf("migrator drain with a failing migration: exit %d, want 1 and the pod named failed with why", code)
	}
	if p, err := c.Client.CoreV1().Pods(w.ns).Get(ctx, w.pod.Name, metav1.GetOptions{}); err != nil || p.UID != w.pod.UID || p.Spec.NodeName != nodeA {
		t.Errorf("the pod whose migration failed: %v, want it serving on node A", err)
	}
}
