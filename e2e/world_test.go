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

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/testenv"
)

// The lab (cluster, images, Secret) is made once per test binary and taken
// down by TestMain, unless MS2M_E2E_KEEP is set.
//
// With MS2M_E2E_KUBECONFIG set (`make e2e KUBECONFIG=...`), the suite runs
// against that cluster instead, which must have ms2m installed (`go run
// ./hack/cluster up --with-ms2m`, or the Helm chart): the tests that drive
// ms2m the way a user does, by annotation or by the CLI, run against its
// webhook, controller and agents; those that need the lab's own cluster
// (its nodes' folders and containerd, a webhook or controller of the
// test's own, migrate.Run in the test process) skip, saying why. Nothing
// is taken down. MS2M_E2E_REGISTRY, MS2M_E2E_BROKER_ADDR, MS2M_E2E_NODES,
// MS2M_E2E_IMAGE_REPO and MS2M_E2E_AGENT_TOKEN describe the cluster
// (docs/local-cluster.md); the defaults are those of `up --with-ms2m`.
var (
	labOnce sync.Once
	theLab  *lab.Lab
	labErr  error
)

func TestMain(m *testing.M) {
	// Each test's controller has a logger of its own (controllerLog); the
	// global one only gets what controller-runtime logs outside a manager.
	ctrllog.SetLogger(funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, "controller-runtime:", prefix, args) }, funcr.Options{}))
	code := m.Run()
	switch {
	case theLab == nil || theLab.External: // nothing of ours to take down
	case os.Getenv("MS2M_E2E_KEEP") != "":
		fmt.Fprintf(os.Stderr, "e2e: MS2M_E2E_KEEP is set: the cluster stays up (kubeconfig %s); take it down with: go run ./hack/cluster down -state %s\n", theLab.Cluster.Kubeconfig(), theLab.Opts.StateDir)
	default:
		if err := theLab.Down(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: cluster down: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// externalKubeconfig is the kubeconfig of the external cluster the suite
// runs against, or "" for a lab of its own.
func externalKubeconfig() string { return os.Getenv("MS2M_E2E_KUBECONFIG") }

// needLab returns the shared lab on the suite's own cluster, bringing it up
// on first use. Against an external cluster it skips: why says what the
// test needs that only the lab has.
func needLab(t *testing.T, why string) *lab.Lab {
	t.Helper()
	if externalKubeconfig() != "" {
		t.Skipf("needs the suite's own local cluster, not the external one of MS2M_E2E_KUBECONFIG: %s", why)
	}
	return needCluster(t)
}

// needCluster returns the shared lab: on the suite's own cluster, or on
// the external one of MS2M_E2E_KUBECONFIG.
func needCluster(t *testing.T) *lab.Lab {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a real cluster")
	}
	testenv.WatchdogFor(t, 15*time.Minute)
	testenv.RequireBroker(t)
	labOnce.Do(func() {
		root := testenv.ModuleRoot(t)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
		defer cancel()
		if kc := externalKubeconfig(); kc != "" {
			o := lab.ExternalOptions{Kubeconfig: kc, RepoDir: root, Registry: os.Getenv("MS2M_E2E_REGISTRY"),
				BrokerAMQP: os.Getenv("MS2M_E2E_BROKER_ADDR"), Log: os.Stderr}
			if n := os.Getenv("MS2M_E2E_NODES"); n != "" {
				o.Nodes = strings.Split(n, ",")
			}
			theLab, labErr = lab.External(ctx, o)
			return
		}
		runtime := e2eRuntime()
		state := "/var/tmp/ms2m-e2e"
		switch {
		case strings.Contains(runtime, ","):
			state = "/var/tmp/ms2m-e2e-mixed"
		case runtime == cluster.RuntimeCRIO:
			state = "/var/tmp/ms2m-e2e-crio"
		}
		opts := cluster.Options{
			Nodes:          3,
			StateDir:       envOr("MS2M_E2E_STATE", state),
			RepoDir:        root,
			BinDir:         filepath.Join(root, "bin"),
			Log:            os.Stderr,
			WaitForNetwork: true,
			Runtime:        runtime,
		}
		var l *lab.Lab
		l, labErr = lab.Start(ctx, opts)
		if l != nil && l.Cluster != nil {
			theLab = l
		} else if labErr != nil {
			if err := cluster.Down(opts); err != nil { // whatever a failed up left
				t.Logf("take down what the failed start left: %v", err)
			}
		}
		if labErr == nil {
			labErr = nodesRun(ctx, l)
		}
		if labErr == nil {
			// Its controller would race the tests' own for every
			// migration they ask for.
			if name, err := lab.InstalledWebhook(ctx, l.Client); err != nil || name != "" {
				theLab = nil // not ours to take down
				labErr = fmt.Errorf("the cluster in %s has ms2m installed (MutatingWebhookConfiguration %q; %v): run the suite against it with `make e2e KUBECONFIG=%s`, or take it down first (go run ./hack/cluster down -state %s)",
					opts.StateDir, name, err, l.Kubeconfig, opts.StateDir)
			}
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

// e2eRuntime is the container runtime of the suite's own nodes:
// MS2M_E2E_RUNTIME, containerd (the default) or crio, or one per node
// (cluster.Options.Runtime: crio,crio,containerd). `make test` runs the
// suite on containerd, and on crio,crio,containerd one ms2m migration
// between the CRI-O nodes and TestMixedRuntimesRefused (docs/runtimes.md).
func e2eRuntime() string {
	if r := os.Getenv("MS2M_E2E_RUNTIME"); r != "" {
		return r
	}
	return cluster.RuntimeContainerd
}

// nodesRun checks that every node of the lab reports the runtime the
// suite asked for it (the kubelet's containerRuntimeVersion, cri-o://1.34.0
// or containerd://2.3.x), so that a run on CRI-O cannot pass on a
// cluster of containerd nodes left up in the state folder.
func nodesRun(ctx context.Context, l *lab.Lab) error {
	for i := 1; i <= l.Cluster.Nodes(); i++ {
		info := l.Cluster.Node(i)
		want := "containerd://"
		if info.Runtime == cluster.RuntimeCRIO {
			want = "cri-o://"
		}
		n, err := l.Client.CoreV1().Nodes().Get(ctx, info.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if v := n.Status.NodeInfo.ContainerRuntimeVersion; !strings.HasPrefix(v, want) {
			return fmt.Errorf("node %s runs %q, not the %s the suite asked for (MS2M_E2E_RUNTIME=%s)", n.Name, v, info.Runtime, l.Cluster.Runtime())
		}
	}
	return nil
}

// needContainerdNodes skips a test that drives the nodes' containerd
// itself when the suite runs on other nodes (MS2M_E2E_RUNTIME=crio); why
// says what it does. An external cluster's nodes are not looked at.
func needContainerdNodes(t *testing.T, l *lab.Lab, why string) {
	t.Helper()
	if l.Cluster != nil && l.Cluster.Runtime() != cluster.RuntimeContainerd {
		t.Skipf("the suite runs on %s nodes (MS2M_E2E_RUNTIME), and %s", l.Cluster.Runtime(), why)
	}
}

// ms2mSetup says what of ms2m a test needs running on the suite's own
// cluster; on an external one, all of it is installed already.
type ms2mSetup int

const (
	// withController: the webhook, and the controller with the lab's
	// host-side node agent.
	withController ms2mSetup = iota
	// withControllerAndAgents: the webhook, `migrator agent` on every
	// node, and the controller through them.
	withControllerAndAgents
	// withAgents: the webhook and the agents; the test runs the CLI.
	withAgents
)

// needMS2M returns a lab with ms2m running as setup says: on the suite's
// own cluster it starts the webhook, the agents and the controller for the
// test and stops them when it ends; on an external cluster they are the
// installed ones.
func needMS2M(t *testing.T, ctx context.Context, setup ms2mSetup) *lab.Lab {
	t.Helper()
	l, _ := needMS2MAgents(t, ctx, setup)
	return l
}

// needMS2MAgents is needMS2M that also returns the agents it started
// (nil on an external cluster, or without agents in setup).
func needMS2MAgents(t *testing.T, ctx context.Context, setup ms2mSetup) (*lab.Lab, *lab.Agents) {
	t.Helper()
	l := needCluster(t)
	if l.External {
		return l, nil
	}
	if _, err := l.StartWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.StopWebhook() })
	a := l.Agent()
	var agents *lab.Agents
	if setup == withControllerAndAgents || setup == withAgents {
		var err error
		agents, err = l.StartAgents(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(agents.Stop)
		if a, err = l.AgentClient(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if setup != withAgents {
		startController(t, ctx, l, a)
	}
	return l, agents
}

// agentToken and imageRepo are the node agents' token and the checkpoint
// images' repository, for the CLI: the lab's, or on an external cluster
// MS2M_E2E_AGENT_TOKEN and MS2M_E2E_IMAGE_REPO, which default to those of
// `up --with-ms2m`.
func agentToken(l *lab.Lab) string {
	if l.External {
		return envOr("MS2M_E2E_AGENT_TOKEN", lab.AgentToken)
	}
	return lab.AgentToken
}

func imageRepo(l *lab.Lab) string {
	if l.External {
		return envOr("MS2M_E2E_IMAGE_REPO", l.ImageRepo())
	}
	return l.ImageRepo()
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

// startWorkload starts c as a Deployment or StatefulSet (kind) and
// returns its first pod; the workload, its pods and its pod's replay log
// go when the test ends. It fails the test if the workload makes no
// running pod.
func startWorkload(t *testing.T, ctx context.Context, l *lab.Lab, kind lab.Kind, c lab.Consumer) *corev1.Pod {
	t.Helper()
	src, err := l.StartWorkload(ctx, kind, c)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
		defer cancel()
		logCleanup(t, "delete the workload", l.DeleteWorkload(ctx, kind, c.Name))
		if src != nil {
			logCleanup(t, "delete the stream", shadowqueue.DeleteStream(ctx, testenv.RequireBroker(t).StreamURI, inject.LogName(src)))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// expectExact waits for the producer to finish and for pod's consumer to
// settle, and fails the test unless its count and hash are the producer's
// and it skipped no redelivery (the sample consumers fold every delivery
// unless SKIP_REDELIVERIES is set, so a skip is a duplicate the hash would
// not show).
func expectExact(t *testing.T, ctx context.Context, prod *lab.Producer, pod *corev1.Pod) {
	t.Helper()
	want, err := prod.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := lab.WaitFor(pod, want, 30*time.Second); got.Count != want.Count || got.Hash != want.Hash || got.Skipped != 0 {
		t.Errorf("the consumer in %s: count %d hash %s, %d redeliveries skipped; producer: count %d hash %s", pod.Name, got.Count, got.Hash, got.Skipped, want.Count, want.Hash)
	}
}

// logGap logs the migration's processing gap, the downtime as the consumer
// sees it, from the journals read across it (only the Go consumers, AMQP
// and NATS, keep one), over the window [from, to] of migrate.Run.
func logGap(t *testing.T, what string, j *lab.Journals, target *corev1.Pod, from, to time.Time) time.Duration {
	t.Helper()
	j.Target(target)
	g, err := j.Gap(from, to)
	if err != nil {
		t.Logf("%s: no processing gap: %v", what, err)
		return 0
	}
	t.Logf("%s: processing gap %v (no consumer finished a message while one waited), %v after the migration began",
		what, g.Duration().Round(time.Millisecond), g.Start.Sub(from).Round(time.Millisecond))
	return g.Duration()
}

// logWatchedGap is logGap for a migration the controller ran, from the
// journals w read across it, over [from, to] (from the request to the
// target's status). It reports false when there is none.
func logWatchedGap(t *testing.T, what string, w *lab.JournalWatch, target *corev1.Pod, from, to time.Time) (time.Duration, bool) {
	t.Helper()
	gap, err := w.Stop(target, from, to)
	if err != nil {
		t.Logf("%s: no processing gap: %v", what, err)
		return 0, false
	}
	t.Logf("%s: processing gap %v (no consumer finished a message while one waited; an upper bound, by at most the journals' 100 ms between reads), %v after the request",
		what, gap.Duration().Round(time.Millisecond), gap.Start.Sub(from).Round(time.Millisecond))
	return gap.Duration(), true
}

// e2eStatusKey signs the migration statuses of the controllers the tests
// start, so that a test can write what a killed one leaves.
var e2eStatusKey = []byte(lab.SigningKey)

// signingKey is the controller's signing key: the lab's, or the chart's
// Secret on an external cluster.
func signingKey(t *testing.T, ctx context.Context, l *lab.Lab) []byte {
	t.Helper()
	if l.External {
		return externalStatusKey(t, ctx, l)
	}
	return e2eStatusKey
}

// startController runs the annotation-driven controller, with agent for
// the node-local steps, until the test ends. Without the webhook it admits
// targets itself, as the lab's Env does.
func startController(t *testing.T, ctx context.Context, l *lab.Lab, agent migrate.NodeAgent) {
	t.Helper()
	mgr, err := testManager(l, controllerLog(t, l))
	if err != nil {
		t.Fatal(err)
	}
	cfg := controller.Config{Client: l.Client, Events: mgr.GetEventRecorder(controller.EventSource),
		Agent: agent, ImageRepo: l.ImageRepo(), StatusKey: e2eStatusKey}
	if !l.WebhookRunning() {
		cfg.Admit = l.Admit
	}
	if err := controller.New(cfg).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	mctx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go func() {
		if err := mgr.Start(mctx); err != nil && mctx.Err() == nil {
			t.Errorf("the test's controller manager stopped: %v", err)
		}
	}()
}

// controllerLog is the log of a test's controller: on the suite's own
// cluster, <state>/logs/controller-<test>.log (kept with the cluster's other
// logs, for a look after a failure); on an external cluster, the test's log
// is enough (the installed controller has its own).
func controllerLog(t *testing.T, l *lab.Lab) logr.Logger {
	t.Helper()
	if l.External || l.Cluster == nil {
		return funcr.New(func(prefix, args string) { t.Log(prefix, args) }, funcr.Options{})
	}
	name := strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
	f, err := os.Create(filepath.Join(l.Cluster.StateDir(), "logs", "controller-"+name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	t.Logf("the controller's log: %s", f.Name())
	var mu sync.Mutex
	return funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(f, "%s %s %s\n", time.Now().UTC().Format("15:04:05.000"), prefix, args)
	}, funcr.Options{Verbosity: 1})
}

// testManager is a controller-runtime manager for a test's controller.
// Each test registers its own "migration" controller in this one process,
// so the name check that guards a real binary's metrics is off here.
func testManager(l *lab.Lab, log logr.Logger) (manager.Manager, error) {
	skip := true
	return manager.New(l.Cluster.RESTConfig(), manager.Options{
		Logger:                 log,
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
	v, ok := p.Annotations[contract.AnnotationMigrationStatus]
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
	var seen []string // the pods' phases and statuses at the last look, for a timeout's report
	defer func() {
		if t.Failed() && target == nil && failed == "" {
			t.Logf("the pods of %s at the last look: %s", app, strings.Join(seen, "; "))
		}
	}()
	testenv.Eventually(t, 4*time.Minute, "a pod of "+app+" whose status says Succeeded", func() bool {
		pods, err := l.Client.CoreV1().Pods(lab.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return false
		}
		seen = seen[:0]
		for i := range pods.Items {
			p := &pods.Items[i]
			seen = append(seen, fmt.Sprintf("%s (%s, %s) on %s: %s", p.Name, p.UID, p.Status.Phase, p.Spec.NodeName, p.Annotations[contract.AnnotationMigrationStatus]))
			switch st := migrationStatus(t, p); {
			case p.UID == src.UID && st.Phase == contract.PhaseFailed:
				failed = st.Message
				return true
			case p.UID != src.UID && st.Phase == contract.PhaseSucceeded:
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
			st := p.Annotations[contract.AnnotationStatus]
			restore := ""
			if _, ok := p.Annotations[contract.AnnotationRestoreImage]; ok || containsRestore(st) {
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
