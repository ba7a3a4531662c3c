package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/testenv"
)

// More of the fault matrix's real-node samples (docs/faults.md), one cell
// each: the source's app killed after the checkpoint, the registry
// unavailable for the checkpoint image, and the migrator's requests to the
// target's sidecar cut during the handover. Like the others they run with
// MS2M_E2E_FAULTS=1 (make test and make e2e set it).

func needFaults(t *testing.T) {
	t.Helper()
	if os.Getenv("MS2M_E2E_FAULTS") != "1" {
		t.Skip("the real-node faults run with MS2M_E2E_FAULTS=1 (make e2e and make test set it)")
	}
}

// faultRun is a consumer on node 1 under a producer, about to be migrated
// to node 2.
type faultRun struct {
	l    *lab.Lab
	name string
	prod *lab.Producer
	plan migrate.Plan
}

func startFaultRun(t *testing.T, ctx context.Context, l *lab.Lab, prefix string, s contract.Strategy) *faultRun {
	t.Helper()
	name := testenv.UniqueName(prefix)
	pod, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.DeletePods(context.WithoutCancel(t.Context()), name, name+"-target") })
	return &faultRun{l: l, name: name, prod: produce(t, pod, name, 10, 120, 10),
		plan: migrate.Plan{Name: fmt.Sprintf("f%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
			TargetNode: cluster.NodeName(2), TargetPod: name + "-target", Strategy: s}}
}

// exactOn checks the consumer of pod name (the source or the target)
// exact once the producer is done.
func (f *faultRun) exactOn(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	pod, err := f.l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	expectExact(t, ctx, f.prod, pod)
}

// killingAgent kills the source's app as the checkpoint image is built:
// after the checkpoint, while the source still serves.
type killingAgent struct {
	migrate.NodeAgent
	once sync.Once
	kill func() error
	err  error
}

func (a *killingAgent) BuildCheckpointImage(ctx context.Context, node, archive, container, ref string) (string, error) {
	a.once.Do(func() { a.err = a.kill() })
	return a.NodeAgent.BuildCheckpointImage(ctx, node, archive, container, ref)
}

// TestSourceAppKilledAfterTheCheckpoint: the source's app is SIGKILLed
// (the kubelet restarts it, empty) once its checkpoint is taken, while its
// image is built: the migration completes exact, since the target is the
// checkpoint and the log, not the source's app. The app is killed idle:
// the producer is done and the app has folded everything.
// TestSourceAppKilledHoldingADelivery kills it with deliveries in hand.
func TestSourceAppKilledAfterTheCheckpoint(t *testing.T) {
	needFaults(t)
	l := needLab(t, "it kills a container through its node's containerd")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	f := startFaultRun(t, ctx, l, "appkill", contract.StrategyMS2M)
	want, err := f.prod.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	src, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, f.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := lab.WaitFor(src, want, 30*time.Second); got.Count != want.Count {
		t.Fatalf("the source folded %d of %d before the migration", got.Count, want.Count)
	}
	appKilledAfterCheckpoint(t, ctx, l, f)
}

// TestSourceAppKilledHoldingADelivery is TestSourceAppKilledAfterTheCheckpoint
// with the producer still going, so that the app dies holding deliveries
// it has not acked. Their records are in the log, which the target
// replays, and the broker redelivers them to the restarted source app;
// the sidecar logs each redelivery as repeating its first delivery, which
// the target leaves out: exact. Before the repeat mark the target folded
// them twice (121 of 120).
func TestSourceAppKilledHoldingADelivery(t *testing.T) {
	needFaults(t)
	l := needLab(t, "it kills a container through its node's containerd")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	appKilledAfterCheckpoint(t, ctx, l, startFaultRun(t, ctx, l, "appkill", contract.StrategyMS2M))
}

func appKilledAfterCheckpoint(t *testing.T, ctx context.Context, l *lab.Lab, f *faultRun) {
	t.Helper()
	env := l.Env(nil)
	src, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, f.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ka := &killingAgent{NodeAgent: env.Agent, kill: func() error { return killContainer(ctx, l, src, killApp) }}
	env.Agent = ka
	if _, err := migrate.Run(ctx, env, f.plan); err != nil {
		t.Fatalf("migrate with the source's app killed after the checkpoint: %v", err)
	}
	if ka.err != nil {
		t.Fatalf("kill the source's app: %v", ka.err)
	}
	f.exactOn(t, ctx, f.plan.TargetPod)
	// How many redeliveries of what the killed app held came to the
	// source before its stop: the target's replay left them out.
	if pod, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, f.plan.TargetPod, metav1.GetOptions{}); err == nil {
		var st struct {
			Source struct {
				Repeats int `json:"repeats"`
			} `json:"source"`
		}
		if err := sidecarState(ctx, l, pod, &st); err == nil {
			t.Logf("the target's replay left out %d repeats", st.Source.Repeats)
		}
	}
}

// TestRegistryUnavailableOnRealNodes: the node agents push checkpoint
// images to a registry nobody serves (10.77.0.1, a port nothing listens
// on): the migration fails at the image and rolls back exact: the source
// serves, there is no target, and its checkpoint archive is gone (the
// failed build removes it).
func TestRegistryUnavailableOnRealNodes(t *testing.T) {
	needFaults(t)
	l := needLab(t, "it starts node agents of its own")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	agents, err := l.StartAgents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agents.Stop)
	host, _, _ := strings.Cut(l.Registry, ":")
	repo := host + ":5999/ms2m/checkpoints"
	if err := agents.Kill(1); err != nil {
		t.Fatal(err)
	}
	if err := agents.StartAgain(ctx, 1, "MS2M_AGENT_IMAGE_REPO="+repo); err != nil {
		t.Fatal(err)
	}
	ac, err := l.AgentClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f := startFaultRun(t, ctx, l, "regdown", contract.StrategyMS2M)
	env := l.Env(nil)
	env.Agent, env.ImageRepo = ac, repo
	rep, err := migrate.Run(ctx, env, f.plan)
	t.Logf("migrate with the registry unavailable: %v", err)
	if err == nil {
		t.Fatal("the migration succeeded with no registry to push to")
	}
	if rep.Image != "" {
		t.Errorf("a checkpoint image %s was reported", rep.Image)
	}
	testenv.Eventually(t, time.Minute, "no target", func() bool {
		_, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, f.plan.TargetPod, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	src, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, f.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if mode := sidecarMode(t, src); mode != "serving" {
		t.Errorf("the source's sidecar is %s, want serving", mode)
	}
	dir := l.Cluster.Node(1).CheckpointDir
	testenv.Eventually(t, time.Minute, "no checkpoint archive of "+f.name, func() bool {
		m, _ := filepath.Glob(filepath.Join(dir, "checkpoint-"+f.name+"_*"))
		return len(m) == 0
	})
	f.exactOn(t, ctx, f.name)
}

// cutTransport fails the migrator's requests to every sidecar but the
// source's for a while, from the moment the source's POST /stop has
// answered: the network between the migrator and the target cut in the
// handover, after the stop.
type cutTransport struct {
	base   http.RoundTripper
	source string // the source pod's IP
	cut    time.Duration

	mu    sync.Mutex
	until time.Time
	drops int
}

func (c *cutTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	cutNow := req.URL.Hostname() != c.source && time.Now().Before(c.until)
	if cutNow {
		c.drops++
	}
	c.mu.Unlock()
	if cutNow {
		return nil, fmt.Errorf("dial tcp %s: connect: network is unreachable (the test's cut)", req.URL.Host)
	}
	resp, err := c.base.RoundTrip(req)
	if err == nil && req.Method == http.MethodPost && req.URL.Path == "/stop" && req.URL.Hostname() == c.source && resp.StatusCode == http.StatusOK {
		c.mu.Lock()
		if c.until.IsZero() {
			c.until = time.Now().Add(c.cut)
		}
		c.mu.Unlock()
	}
	return resp, err
}

// TestControlCutToTheTarget: once the source has stopped at its cutoff,
// the migrator's requests to the target's sidecar fail for 3 s (its
// reads of the replay and the switch): they are tried again, and the
// migration completes exact.
func TestControlCutToTheTarget(t *testing.T) {
	needFaults(t)
	l := needLab(t, "it runs migrate.Run in the test process with a transport of its own")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	f := startFaultRun(t, ctx, l, "ctlcut", contract.StrategyMS2M)
	src, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, f.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	env := l.Env(nil)
	base := http.DefaultTransport
	if env.HTTP != nil && env.HTTP.Transport != nil {
		base = env.HTTP.Transport
	}
	ct := &cutTransport{base: base, source: src.Status.PodIP, cut: 3 * time.Second}
	env.HTTP = &http.Client{Transport: ct, Timeout: 10 * time.Second}
	if _, err := migrate.Run(ctx, env, f.plan); err != nil {
		t.Fatalf("migrate with the control network to the target cut for 3 s after the stop: %v", err)
	}
	ct.mu.Lock()
	drops := ct.drops
	ct.mu.Unlock()
	t.Logf("requests to the target dropped by the cut: %d", drops)
	if drops == 0 {
		t.Error("no request to the target was cut: the migration ended before the fault")
	}
	f.exactOn(t, ctx, f.plan.TargetPod)
}
