package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migratorcli"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
)

// drainee is one consumer of a drain test: a Deployment's or a
// StatefulSet's pod on the node drained, opted in by ms2m.io/on-evict.
type drainee struct {
	kind  lab.Kind
	image string
	// fail runs the app as a user other than root: CRIU cannot dump it
	// here, so its migration fails at the checkpoint and it keeps serving.
	fail bool
	name string
	src  *corev1.Pod
	prod *lab.Producer
	pods *podLog
}

// startDrainees starts ds on node, each with a producer of n messages at
// 10/s, and waits until each has folded its first messages. It returns
// the label selector of exactly their pods: whatever else runs on the
// node is not the test's to evict. The node is uncordoned when the test
// ends.
func startDrainees(t *testing.T, ctx context.Context, l *lab.Lab, node string, ds []*drainee, n int) string {
	t.Helper()
	t.Cleanup(func() {
		patch := []byte(`{"spec":{"unschedulable":false}}`)
		if _, err := l.Client.CoreV1().Nodes().Patch(context.WithoutCancel(t.Context()), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Errorf("uncordon %s: %v", node, err)
		}
	})
	names := make([]string, 0, len(ds))
	for _, d := range ds {
		if _, ok := l.Images[d.image]; !ok {
			testenv.Missing(t, "the "+d.image+" image (Debian's python3-pika on this host)", "run `make setup`, which installs python3-pika")
		}
		d.name = testenv.UniqueName("drain")
		names = append(names, d.name)
		d.pods = watchPods(t, ctx, l, d.name)
		fail := d.fail
		src, err := l.StartWorkload(ctx, d.kind, lab.Consumer{Name: d.name, Queue: d.name, Node: node, WorkMS: 50, Image: d.image,
			Mutate: func(p *corev1.Pod) {
				p.Annotations[contract.AnnotationOnEvict] = contract.OnEvictMigrate
				if fail {
					u := int64(65532)
					p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: &u, RunAsGroup: &u}
				}
			}})
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
			defer cancel()
			logCleanup(t, "delete the workload", l.DeleteWorkload(ctx, d.kind, d.name))
			if d.src != nil {
				logCleanup(t, "delete the stream", shadowqueue.DeleteStream(ctx, testenv.RequireBroker(t).StreamURI, inject.LogName(d.src)))
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		d.src = src
		d.prod = produce(t, src, d.name, 10, n, 20)
	}
	return "app in (" + strings.Join(names, ",") + ")"
}

// expectMovedOff checks that d's pod left node by its migration: one pod
// of d's workload, restored on another node by an evacuation off node,
// every message folded exactly once, and no pod of the workload started
// empty. It returns the node the pod went to.
func expectMovedOff(t *testing.T, ctx context.Context, l *lab.Lab, d *drainee, node string) string {
	t.Helper()
	// kubectl drain ends once the source is gone, and the controller
	// records the outcome on the target just after it deleted the source
	// (a second later, once, on a loaded machine): wait for the record.
	var (
		list *corev1.PodList
		err  error
		st   controller.Status
	)
	for deadline := time.Now().Add(30 * time.Second); ; {
		list, err = l.Client.CoreV1().Pods(lab.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + d.name})
		if err == nil && len(list.Items) == 1 {
			if st = migrationStatus(t, &list.Items[0]); st.Phase != "" && st.Phase != contract.PhaseRunning {
				break
			}
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil || len(list.Items) != 1 {
		t.Errorf("%s %s: %d pods (%v), want 1", d.kind, d.name, len(list.Items), err)
		return ""
	}
	target := &list.Items[0]
	t.Logf("%s/%s: %s on %s by %s, %s", d.kind, d.image, target.Name, target.Spec.NodeName, st.Strategy, st.Message)
	if target.UID == d.src.UID || target.Spec.NodeName == node || st.Phase != contract.PhaseSucceeded || st.Evacuation != node {
		t.Errorf("%s %s: %s on %s, status %s evacuation %q; want a restore on another node by an evacuation off %s (status %s, restored from %s)", d.kind, d.name, target.Name, target.Spec.NodeName, st.Phase, st.Evacuation, node,
			target.Annotations[contract.AnnotationMigrationStatus], target.Annotations[contract.AnnotationRestoredFrom])
		return target.Spec.NodeName
	}
	expectExact(t, ctx, d.prod, target)
	expectNoEmptyReplica(t, d.pods, d.src.UID, map[lab.Kind]int{lab.Deployment: 2, lab.StatefulSet: 3}[d.kind])
	return target.Spec.NodeName
}

// needNodes fails the test unless the lab has at least n nodes.
func needNodes(t *testing.T, l *lab.Lab, n int) {
	t.Helper()
	if l.Cluster != nil && l.Cluster.Nodes() < n {
		t.Fatalf("the lab has %d nodes, the test needs %d", l.Cluster.Nodes(), n)
	}
}

// TestDrain: node 1 holds four consumers opted in by ms2m.io/on-evict
// (Go and Python, Deployment and StatefulSet) that are consuming.
// `migrator drain` of node 1 (cordon, evictions retried as kubectl drain
// does) ends with exit 0 and all four on the other nodes, where
// kube-scheduler placed their placeholders, each restored from its
// checkpoint (no pod restarted empty) and every hash exact.
func TestDrain(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 18*time.Minute)
	defer cancel()
	l := needMS2M(t, ctx, withController)
	if l.External {
		t.Skip("drains node 1 of the suite's own cluster")
	}
	needNodes(t, l, 2)
	ds := []*drainee{
		{kind: lab.Deployment, image: "consumer"},
		{kind: lab.Deployment, image: "consumer-python"},
		{kind: lab.StatefulSet, image: "consumer"},
		{kind: lab.StatefulSet, image: "consumer-python"},
	}
	node1 := l.NodeName(1)
	// Long enough that every consumer still has deliveries when it
	// migrates: the drain moves consumers under load.
	sel := startDrainees(t, ctx, l, node1, ds, 1500)

	var out bytes.Buffer
	start := time.Now()
	code := migratorcli.Main(ctx, []string{"drain", "-kubeconfig", l.Kubeconfig, "-timeout", "10m", "-pod-selector", sel, node1}, &out, &out)
	t.Logf("migrator drain %s (%s):\n%s", node1, time.Since(start).Round(time.Second), out.String())
	if code != 0 {
		t.Errorf("migrator drain exited %d, want 0", code)
	}
	for _, d := range ds {
		expectMovedOff(t, ctx, l, d, node1)
	}
	expectNoPlaceholders(t, ctx, l)
	if !strings.Contains(out.String(), fmt.Sprintf("%d migrated", len(ds))) {
		t.Errorf("the drain's summary does not count %d migrated", len(ds))
	}
}

func expectNoPlaceholders(t *testing.T, ctx context.Context, l *lab.Lab) {
	t.Helper()
	list, err := l.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: contract.LabelPlaceholderFor})
	if err != nil || len(list.Items) != 0 {
		t.Errorf("placeholders left: %d (%v)", len(list.Items), err)
	}
}

// kubectl is the kubectl that `make node-bin` builds.
func kubectl(t *testing.T) string {
	t.Helper()
	p := filepath.Join(testenv.ModuleRoot(t), "bin", "k8s", "kubectl")
	if _, err := os.Stat(p); err != nil {
		testenv.Missing(t, "kubectl ("+err.Error()+")", "run `make node-bin`, which builds it from the hack/k8s module")
	}
	return p
}

// syncBuffer is a bytes.Buffer safe to read while a command writes it.
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

// drainRun is a `kubectl drain` running.
type drainRun struct {
	out   syncBuffer
	done  chan struct{}
	err   error // kubectl's exit, once done is closed
	start time.Time
	took  time.Duration
}

// startKubectlDrain runs the real `kubectl drain` of node, as an operator
// does, restricted to the pods of sel.
func startKubectlDrain(t *testing.T, ctx context.Context, l *lab.Lab, node, sel string, timeout time.Duration) *drainRun {
	t.Helper()
	cmd := exec.CommandContext(ctx, kubectl(t), "--kubeconfig", l.Kubeconfig, "drain", node,
		"--ignore-daemonsets", "--delete-emptydir-data", "--pod-selector", sel, "--timeout", timeout.String())
	r := &drainRun{done: make(chan struct{}), start: time.Now()}
	cmd.Stdout, cmd.Stderr = &r.out, &r.out
	t.Logf("%s", strings.Join(cmd.Args, " "))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		r.err = cmd.Wait()
		r.took = time.Since(r.start)
		close(r.done)
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-r.done
		}
	})
	return r
}

// wait waits for kubectl to end and returns its exit code.
func (r *drainRun) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(within):
		t.Fatalf("kubectl drain still runs after %v:\n%s", time.Since(r.start).Round(time.Second), r.out.String())
	}
	t.Logf("kubectl drain ended after %v (%v):\n%s", r.took.Round(time.Second), r.err, r.out.String())
	var ee *exec.ExitError
	switch {
	case r.err == nil:
		return 0
	case errors.As(r.err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("kubectl drain: %v", r.err)
	return -1
}

// TestKubectlDrain: the real `kubectl drain` of node 1 of three, with
// eight opted-in consumers on it (Go and Python, two Deployments' and two
// StatefulSets' pods of each), ends by itself with exit status 0 and all
// eight on nodes 2 and 3, placed there by kube-scheduler, each restored
// from its checkpoint (no pod restarted empty) and every hash exact.
// kubectl takes the webhook's 429s as a PodDisruptionBudget's and
// retries; a StatefulSet's pod, back under its name on another node, is
// answered as gone.
func TestKubectlDrain(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 18*time.Minute)
	defer cancel()
	l := needMS2M(t, ctx, withController)
	if l.External {
		t.Skip("drains node 1 of the suite's own cluster")
	}
	needNodes(t, l, 3)
	var ds []*drainee
	for _, kind := range []lab.Kind{lab.Deployment, lab.StatefulSet} {
		for _, image := range []string{"consumer", "consumer-python"} {
			ds = append(ds, &drainee{kind: kind, image: image}, &drainee{kind: kind, image: image})
		}
	}
	node1 := l.NodeName(1)
	// 90 s of messages: the first migrations move consumers under load,
	// the last ones consumers idle since their producer finished (a
	// target with nothing to replay).
	sel := startDrainees(t, ctx, l, node1, ds, 900)

	r := startKubectlDrain(t, ctx, l, node1, sel, 10*time.Minute)
	if code := r.wait(t, 11*time.Minute); code != 0 {
		t.Errorf("kubectl drain exited %d, want 0", code)
	}
	went := map[string]int{}
	for _, d := range ds {
		went[expectMovedOff(t, ctx, l, d, node1)]++
	}
	t.Logf("where they went: %v", went)
	expectNoPlaceholders(t, ctx, l)
}

// TestKubectlDrainWithAFailedMigration: one of node 1's opted-in consumers
// cannot be checkpointed (its app runs as another user than root, which
// CRIU cannot dump here). `kubectl drain` moves the others and then
// waits: the failed one keeps serving on node 1 and its evictions are
// refused with why and what to do. Once the operator sets
// ms2m.io/on-evict-override on it, the next eviction goes through and
// kubectl drain ends with exit status 0.
func TestKubectlDrainWithAFailedMigration(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	l := needMS2M(t, ctx, withController)
	if l.External {
		t.Skip("drains node 1 of the suite's own cluster")
	}
	needNodes(t, l, 3)
	bad := &drainee{kind: lab.Deployment, image: "consumer", fail: true}
	good := []*drainee{{kind: lab.Deployment, image: "consumer-python"}, {kind: lab.StatefulSet, image: "consumer"}}
	node1 := l.NodeName(1)
	sel := startDrainees(t, ctx, l, node1, append([]*drainee{bad}, good...), 1500)

	r := startKubectlDrain(t, ctx, l, node1, sel, 10*time.Minute)
	pods := l.Client.CoreV1().Pods(lab.Namespace)
	var why string
	testenv.Eventually(t, 6*time.Minute, "the bad consumer's migration failed and the others moved", func() bool {
		p, err := pods.Get(ctx, bad.src.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		st := migrationStatus(t, p)
		if st.Phase != contract.PhaseFailed && st.Phase != contract.PhaseRolledBack {
			return false
		}
		why = st.Message
		for _, d := range good {
			if _, err := pods.Get(ctx, d.src.Name, metav1.GetOptions{}); d.kind == lab.Deployment && !apierrors.IsNotFound(err) {
				return false
			}
			list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=" + d.name})
			if err != nil || len(list.Items) != 1 || list.Items[0].Spec.NodeName == node1 || migrationStatus(t, &list.Items[0]).Phase != contract.PhaseSucceeded {
				return false
			}
		}
		return true
	})
	t.Logf("the bad consumer's migration failed: %s", why)
	select {
	case <-r.done:
		t.Fatalf("kubectl drain ended (%v) while the failed pod is still on %s:\n%s", r.err, node1, r.out.String())
	default:
	}
	// It keeps serving where it is.
	st0, err := lab.GetAppState(bad.src)
	if err != nil {
		t.Fatalf("the failed consumer does not answer: %v", err)
	}
	testenv.Eventually(t, time.Minute, "the failed consumer folds more messages on "+node1, func() bool {
		st, err := lab.GetAppState(bad.src)
		return err == nil && st.Count > st0.Count
	})
	// kubectl shows the refusal: the failure and the way out.
	testenv.Eventually(t, time.Minute, "kubectl drain shows the failed migration's refusal", func() bool {
		return strings.Contains(r.out.String(), contract.AnnotationOnEvictOverride)
	})
	select {
	case <-r.done:
		t.Fatalf("kubectl drain ended (%v) while the failed pod is still on %s:\n%s", r.err, node1, r.out.String())
	default:
	}

	annotate(t, ctx, l, bad.src.Name, map[string]any{contract.AnnotationOnEvictOverride: "true"})
	if code := r.wait(t, 2*time.Minute); code != 0 {
		t.Errorf("kubectl drain exited %d after the override, want 0", code)
	}
	if p, err := pods.Get(ctx, bad.src.Name, metav1.GetOptions{}); err == nil && p.UID == bad.src.UID && p.DeletionTimestamp == nil {
		t.Errorf("the overridden pod %s is still there", p.Name)
	} else if err != nil && !apierrors.IsNotFound(err) {
		t.Error(err)
	}
	for _, d := range good {
		expectMovedOff(t, ctx, l, d, node1)
	}
	expectNoPlaceholders(t, ctx, l)
}
