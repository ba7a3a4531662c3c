package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/simcluster"
	"github.com/ms2m/ms2m/internal/testenv"
)

// The fault matrix of the node's processes and the broker (docs/faults.md):
// each fault in each phase it can hit, for each strategy. A cell passes
// when the migration completes exact or rolls back exact, as the cell
// says: exactly one pod of the workload serves, its app has processed
// every delivery of the log once and goes on, and nothing of the
// migration is left: no other pod, no pending-migration ConfigMap, no
// checkpoint image, no checkpoint archive on either node.

// outcome is what a cell expects.
type outcome string

const (
	completed  outcome = "completed"   // the target serves
	rolledBack outcome = "rolled back" // the source's node serves
	either     outcome = "either"      // both are right; exact is what counts
)

var allStrategies = []contract.Strategy{contract.StrategyMS2M, contract.StrategyMS2MCutoff, contract.StrategyStopAndCopy,
	contract.StrategyStatefulSet, contract.StrategyStatefulSetShadow}

// fault is a cell's fault: arm sets it up before the migration and
// returns when it is reached (nil: at once), what it does then (fire),
// and what undoes it (heal, which the driver runs after down, and again,
// idempotent, once the migration ended).
type fault struct {
	arm  func(t *testing.T, c *simcluster.Cluster, w *workload) (reached <-chan struct{}, fire, heal func())
	down time.Duration
}

type matrixCell struct {
	fault, phase string
	strategies   []contract.Strategy
	f            fault
	want         outcome
	timeout      time.Duration // the plan's, when not a minute
	// open are the strategies for which the cell fails with an open
	// defect (docs/faults.md): they are skipped, saying so, unless
	// MS2M_SIM_OPEN_DEFECTS=1 runs them.
	open map[contract.Strategy]string
}

// atHold fires at a node step's hold, then releases it.
func atHold(node string, step simcluster.Step, fire func(t *testing.T, c *simcluster.Cluster, w *workload) func()) func(t *testing.T, c *simcluster.Cluster, w *workload) (<-chan struct{}, func(), func()) {
	return func(t *testing.T, c *simcluster.Cluster, w *workload) (<-chan struct{}, func(), func()) {
		h := c.Nodes[node].HoldStep(step)
		heal := func() {}
		var mu sync.Mutex
		return h.Reached, func() {
				undo := fire(t, c, w)
				mu.Lock()
				heal = undo
				mu.Unlock()
				h.Release()
			}, func() {
				h.Release()
				mu.Lock()
				undo := heal
				mu.Unlock()
				undo()
			}
	}
}

// atReplay fires once the first target on node B replays (held there
// until it fired).
func atReplay(fire func(t *testing.T, c *simcluster.Cluster, w *workload) func()) func(t *testing.T, c *simcluster.Cluster, w *workload) (<-chan struct{}, func(), func()) {
	return func(t *testing.T, c *simcluster.Cluster, w *workload) (<-chan struct{}, func(), func()) {
		reached, release := inReplay(0)(t, c, nil, w)
		heal := func() {}
		var mu sync.Mutex
		var once sync.Once
		return reached, func() {
				undo := fire(t, c, w)
				mu.Lock()
				heal = undo
				mu.Unlock()
				once.Do(release)
			}, func() {
				once.Do(release)
				mu.Lock()
				undo := heal
				mu.Unlock()
				undo()
			}
	}
}

// atStart fires before the migration.
func atStart(fire func(t *testing.T, c *simcluster.Cluster, w *workload) func()) func(t *testing.T, c *simcluster.Cluster, w *workload) (<-chan struct{}, func(), func()) {
	return func(t *testing.T, c *simcluster.Cluster, w *workload) (<-chan struct{}, func(), func()) {
		heal := fire(t, c, w)
		var once sync.Once
		return nil, func() {}, func() { once.Do(heal) }
	}
}

// atSourceStop fires once the source's sidecar has stopped.
func atSourceStop(fire func(t *testing.T, c *simcluster.Cluster, w *workload) func()) func(t *testing.T, c *simcluster.Cluster, w *workload) (<-chan struct{}, func(), func()) {
	return func(t *testing.T, c *simcluster.Cluster, w *workload) (<-chan struct{}, func(), func()) {
		reached, stop := make(chan struct{}), make(chan struct{})
		sp := c.Nodes[nodeA].Pod(w.ns, w.pod.Name)
		go func() {
			for sp.Sidecar.Mode() != simcluster.ModeStopped {
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
				}
			}
			close(reached)
		}()
		heal := func() {}
		var mu sync.Mutex
		var once sync.Once
		return reached, func() {
				undo := fire(t, c, w)
				mu.Lock()
				heal = undo
				mu.Unlock()
			}, func() {
				once.Do(func() { close(stop) })
				mu.Lock()
				undo := heal
				mu.Unlock()
				undo()
			}
	}
}

// The faults' fire functions: each returns its heal.

func killAgent(node string) func(*testing.T, *simcluster.Cluster, *workload) func() {
	return func(t *testing.T, c *simcluster.Cluster, w *workload) func() {
		restart := c.Nodes[node].KillAgent()
		return func() {
			if err := restart(); err != nil {
				t.Errorf("restart the agent on %s: %v", node, err)
			}
		}
	}
}

func stopKubelet(node string) func(*testing.T, *simcluster.Cluster, *workload) func() {
	return func(t *testing.T, c *simcluster.Cluster, w *workload) func() {
		start := c.Nodes[node].StopKubelet()
		return func() {
			if err := start(); err != nil {
				t.Errorf("start the kubelet on %s: %v", node, err)
			}
		}
	}
}

func cutBroker(t *testing.T, c *simcluster.Cluster, w *workload) func() { return c.CutBroker() }

func killSourceSidecar(t *testing.T, c *simcluster.Cluster, w *workload) func() {
	restart, err := c.Nodes[nodeA].KillSidecar(t.Context(), w.ns, w.pod.Name)
	if err != nil {
		t.Errorf("kill the source's sidecar: %v", err)
		return func() {}
	}
	return func() {
		if err := restart(context.WithoutCancel(t.Context())); err != nil {
			t.Errorf("restart the source's sidecar: %v", err)
		}
	}
}

func restartSourceSidecar(t *testing.T, c *simcluster.Cluster, w *workload) func() {
	if err := c.Nodes[nodeA].RestartSidecar(t.Context(), w.ns, w.pod.Name); err != nil {
		t.Logf("restart the source's sidecar: %v (the source is gone: the fault is moot)", err)
	}
	return func() {}
}

func killSourceApp(t *testing.T, c *simcluster.Cluster, w *workload) func() {
	if err := c.Nodes[nodeA].RestartApp(t.Context(), w.ns, w.pod.Name); err != nil {
		t.Errorf("kill the source's app: %v", err)
	}
	return func() {}
}

var matrix = []matrixCell{
	{fault: "agent killed", phase: "checkpoint", f: fault{arm: atHold(nodeA, simcluster.StepCheckpoint, killAgent(nodeA)), down: time.Second}, want: rolledBack},
	{fault: "agent killed", phase: "image", f: fault{arm: atHold(nodeA, simcluster.StepImage, killAgent(nodeA)), down: time.Second}, want: rolledBack},
	{fault: "agent killed", phase: "pre (pull on the target)", f: fault{arm: atHold(nodeB, simcluster.StepPull, killAgent(nodeB)), down: time.Second}, want: rolledBack},
	{fault: "broker restarted", phase: "checkpoint", f: fault{arm: atHold(nodeA, simcluster.StepCheckpoint, cutBroker), down: 1500 * time.Millisecond}, want: either},
	{fault: "broker restarted", phase: "replay", f: fault{arm: atReplay(cutBroker), down: 1500 * time.Millisecond}, want: completed},
	{fault: "kubelet stopped, source", phase: "checkpoint", f: fault{arm: atHold(nodeA, simcluster.StepCheckpoint, stopKubelet(nodeA)), down: 1500 * time.Millisecond}, want: rolledBack},
	{fault: "kubelet stopped, source", phase: "image to finalise", f: fault{arm: atHold(nodeA, simcluster.StepImage, stopKubelet(nodeA)), down: 2 * time.Second}, want: completed},
	{fault: "kubelet stopped, target", phase: "restore", f: fault{arm: atStart(stopKubelet(nodeB)), down: 2 * time.Second}, want: completed},
	{fault: "kubelet stopped, target", phase: "restore, past the timeout", strategies: []contract.Strategy{contract.StrategyMS2M, contract.StrategyStopAndCopy},
		f: fault{arm: atStart(stopKubelet(nodeB)), down: 12 * time.Second}, want: rolledBack, timeout: 6 * time.Second},
	{fault: "source app killed", phase: "after the checkpoint", f: fault{arm: atHold(nodeA, simcluster.StepImage, killSourceApp)}, want: completed},
	{fault: "source sidecar killed", phase: "pre (before the quiesce)", f: fault{arm: atHold(nodeB, simcluster.StepPull, killSourceSidecar), down: time.Second}, want: rolledBack},
	{fault: "source sidecar killed", phase: "checkpoint", strategies: []contract.Strategy{contract.StrategyMS2M, contract.StrategyMS2MCutoff, contract.StrategyStatefulSet, contract.StrategyStatefulSetShadow},
		f: fault{arm: atHold(nodeA, simcluster.StepCheckpoint, killSourceSidecar)}, want: rolledBack},
	// stop-and-copy stops before its checkpoint: the restarted sidecar
	// starts stopped at the same cutoff, so the checkpoint holds exactly
	// what precedes it.
	{fault: "source sidecar killed", phase: "checkpoint", strategies: []contract.Strategy{contract.StrategyStopAndCopy},
		f: fault{arm: atHold(nodeA, simcluster.StepCheckpoint, killSourceSidecar)}, want: completed},
	// The statefulset strategy deletes its source right after the stop.
	// The restarted sidecar starts stopped: its stop is in its state folder.
	{fault: "source sidecar killed", phase: "after the stop", strategies: []contract.Strategy{contract.StrategyMS2M, contract.StrategyMS2MCutoff, contract.StrategyStopAndCopy, contract.StrategyStatefulSetShadow},
		f: fault{arm: atSourceStop(restartSourceSidecar)}, want: completed},
}

// TestFaultMatrix runs the matrix's cells, for each of their strategies.
// Each cell arms the shared cluster's watchdog for itself.
func TestFaultMatrix(t *testing.T) {
	for i, cell := range matrix {
		strategies := cell.strategies
		if strategies == nil {
			strategies = allStrategies
		}
		for _, s := range strategies {
			t.Run(fmt.Sprintf("%s/%s/%s", cell.fault, cell.phase, s), func(t *testing.T) {
				if why := cell.open[s]; why != "" && os.Getenv("MS2M_SIM_OPEN_DEFECTS") != "1" {
					t.Skip(why + "; MS2M_SIM_OPEN_DEFECTS=1 runs it")
				}
				runCell(t, cluster(t), cell, s, fmt.Sprintf("sim-mx-%d-%s-%s", i, strings.ReplaceAll(string(s), "statefulset", "sts"), suffix()))
			})
		}
	}
}

func runCell(t *testing.T, c *simcluster.Cluster, cell matrixCell, s contract.Strategy, ns string) {
	resetNodes(c)
	defer resetNodes(c)
	owner := "Deployment"
	if s == contract.StrategyStatefulSet || s == contract.StrategyStatefulSetShadow {
		owner = "StatefulSet"
	}
	w := deploy(t, c, ns, owner, true)
	defer removeWorkload(t, c, w)
	p := plan(w, s)
	if cell.timeout != 0 {
		p.Timeout = cell.timeout
	}
	reached, fire, heal := cell.f.arm(t, c, w)
	defer heal()
	type result struct {
		rep migrate.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := migrate.Run(t.Context(), env(c, c.Client), p)
		done <- result{rep, err}
	}()
	fired := reached == nil
	var r result
	if !fired {
		select {
		case <-reached:
			fire()
			fired = true
		case r = <-done:
		}
	}
	var healed <-chan time.Time
	if fired {
		healed = time.After(cell.f.down)
	}
	if !fired {
		t.Fatalf("the migration ended (%v) before the fault's moment", r.err)
	}
	for waiting := true; waiting; {
		select {
		case <-healed:
			heal()
			healed = nil
		case r = <-done:
			waiting = false
		}
	}
	heal()
	t.Logf("migrate: %v", r.err)
	got := completed
	if r.err != nil {
		got = rolledBack
	}
	if cell.want != either && got != cell.want {
		t.Errorf("the migration %s (%v), want it %s", got, r.err, cell.want)
	}
	served := expectOneServesExact(t, c, w)
	switch on := served.Spec.NodeName; {
	case got == completed && on != nodeB:
		t.Errorf("the migration succeeded, but %s serves on %s", served.Name, on)
	case got == rolledBack && on != nodeA:
		t.Errorf("the migration failed, but %s serves on %s", served.Name, on)
	}
	expectNothingLeft(t, c, w, p, r.rep, served)
}

// removeWorkload deletes w's controller and pods and waits until the
// nodes ran them down: the simulated cluster runs no garbage collector or
// namespace controller, and its nodes have 60 addresses for all the
// suite's pods.
func removeWorkload(t *testing.T, c *simcluster.Cluster, w *workload) {
	ctx := context.WithoutCancel(t.Context())
	apps := c.Client.AppsV1()
	var errs []error
	switch w.owner {
	case "Deployment":
		errs = append(errs, apps.Deployments(w.ns).Delete(ctx, "consumer", metav1.DeleteOptions{}),
			apps.ReplicaSets(w.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	case "StatefulSet":
		errs = append(errs, apps.StatefulSets(w.ns).Delete(ctx, "consumer", metav1.DeleteOptions{}))
	}
	errs = append(errs, c.Client.CoreV1().Pods(w.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	if err := errors.Join(errs...); err != nil {
		t.Logf("remove the workload: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && len(c.Nodes[nodeA].Pods(w.ns))+len(c.Nodes[nodeB].Pods(w.ns)) > 0 {
		time.Sleep(50 * time.Millisecond)
	}
}

// expectOneServesExact waits until the workload has one pod, running, and
// checks that its simulated sidecar is the only one of the workload that
// serves, and that its app has processed every delivery of the log once
// and goes on.
func expectOneServesExact(t *testing.T, c *simcluster.Cluster, w *workload) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	var sp *simcluster.SimPod
	testenv.Eventually(t, 30*time.Second, "one pod of the workload runs and serves", func() bool {
		list, err := c.Client.CoreV1().Pods(w.ns).List(t.Context(), metav1.ListOptions{})
		if err != nil || len(list.Items) != 1 || list.Items[0].Status.Phase != corev1.PodRunning || list.Items[0].DeletionTimestamp != nil {
			return false
		}
		pod = &list.Items[0]
		sp = c.Nodes[pod.Spec.NodeName].Pod(w.ns, pod.Name)
		return sp != nil && sp.UID == pod.UID && sp.Sidecar.Mode() == simcluster.ModeServing
	})
	for _, n := range c.Nodes {
		for _, o := range n.Pods(w.ns) {
			if o != sp && o.Sidecar.Mode() == simcluster.ModeServing {
				t.Errorf("%s on %s serves beside %s", o.Name, n.Name, pod.Name)
			}
		}
	}
	before := sp.App.State().Last
	testenv.Eventually(t, 10*time.Second, pod.Name+" processes new deliveries", func() bool { return sp.App.State().Last > before+3 })
	st := sp.App.State()
	logLast := c.Log(inject.LogName(pod)).LastID()
	if len(st.Violations) > 0 {
		t.Errorf("%s's app saw deliveries out of order: %v", pod.Name, st.Violations)
	}
	if st.Count != st.Last || st.Last+1 < logLast {
		t.Errorf("%s's app processed %d deliveries, the last %d; the log holds %d: want each of them once", pod.Name, st.Count, st.Last, logLast)
	}
	return pod
}

// expectNothingLeft checks that the migration left nothing behind: no pod
// but the one that serves, no pending-migration ConfigMap, no checkpoint
// image, no checkpoint archive of the namespace on either node.
func expectNothingLeft(t *testing.T, c *simcluster.Cluster, w *workload, p migrate.Plan, rep migrate.Report, served *corev1.Pod) {
	t.Helper()
	cms, err := c.Client.CoreV1().ConfigMaps(w.ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		if strings.HasPrefix(cm.Name, "ms2m-") {
			t.Errorf("ConfigMap %s is left", cm.Name)
		}
	}
	for _, ref := range []string{rep.Image, rep.ShadowImage, migrate.CheckpointRef(c.ImageRepo(), w.ns, p.Name, c.SigningKey),
		migrate.CheckpointRef(c.ImageRepo(), w.ns, migrate.ShadowName(p.Name), c.SigningKey)} {
		if ref != "" {
			expectNoImage(t, ref)
		}
	}
	for _, n := range []string{nodeA, nodeB} {
		if err := waitArchivesGone(c.Nodes[n], w.ns, 10*time.Second); err != nil {
			t.Error(err)
		}
	}
	list, err := c.Client.CoreV1().Pods(w.ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range list.Items {
		if o.UID != served.UID {
			t.Errorf("pod %s is left (on %s)", o.Name, o.Spec.NodeName)
		}
	}
}

// waitArchivesGone waits until n holds no checkpoint archive of a pod of
// namespace ns (the kubelet names them checkpoint-<pod>_<ns>-...).
func waitArchivesGone(n *simcluster.Node, ns string, limit time.Duration) error {
	var left []string
	for deadline := time.Now().Add(limit); ; time.Sleep(50 * time.Millisecond) {
		all, err := n.Archives()
		if err != nil {
			return err
		}
		left = left[:0]
		for _, a := range all {
			if strings.Contains(a, "_"+ns+"-") {
				left = append(left, a)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New(fmt.Sprint("checkpoint archives left on ", n.Name, ": ", left))
		}
	}
}

// TestSourceSidecarRestartAfterStopIsReported: a source sidecar without a
// state folder (a pod injected before MS2M_STATE_DIR) that restarts
// between its stop and the target's switch forgets its stop and serves
// again; the migrator finds it serving before it deletes the source and
// says in the report that the deliveries it took after the cutoff are not
// on the target, so that the loss is not silent. (With a state folder it
// starts stopped: TestFaultMatrix's "after the stop" cells.)
func TestSourceSidecarRestartAfterStopIsReported(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	w := deploy(t, c, "sim-restart-after-stop-"+suffix(), "Deployment", true)
	defer removeWorkload(t, c, w)
	reached, fire, heal := atSourceStop(func(t *testing.T, c *simcluster.Cluster, w *workload) func() {
		if err := c.Nodes[nodeA].RestartSidecarWithoutState(t.Context(), w.ns, w.pod.Name); err != nil {
			t.Errorf("restart the source's sidecar: %v", err)
		}
		return func() {}
	})(t, c, w)
	defer heal()
	done := make(chan migrate.Report, 1)
	go func() {
		rep, err := migrate.Run(t.Context(), env(c, c.Client), plan(w, contract.StrategyMS2M))
		if err != nil {
			t.Errorf("migrate: %v", err)
		}
		done <- rep
	}()
	select {
	case <-reached:
		fire()
	case <-done:
		t.Fatal("the migration ended before the source stopped")
	}
	rep := <-done
	for _, warn := range rep.Warnings {
		if strings.Contains(warn, "restarted after its stop") && strings.Contains(warn, "not on the target") {
			return
		}
	}
	t.Errorf("the report does not say that the source served again after its stop: warnings %q", rep.Warnings)
}
