package e2e

import (
	"context"
	"fmt"
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
	nodeagent "github.com/ms2m/ms2m/internal/agent"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/testenv"
)

// faultyAgent is the real agents' client, with a fault fired as a call
// begins: the fault runs beside the call (it kills the agent that serves
// it, say).
type faultyAgent struct {
	nodeagent.Client
	onCheckpoint, onPull func()
	// onBuild runs as the image build is asked for, before the call: the
	// checkpoint is taken and the target does not exist yet.
	onBuild func()
	// onFrozen fires when the agent's freeze watch sees the app frozen:
	// CRIU is dumping it.
	onFrozen func()
}

func (a faultyAgent) WatchFreeze(ctx context.Context, node, podUID, containerID, state string, timeout time.Duration) (func() error, error) {
	wait, err := a.Client.WatchFreeze(ctx, node, podUID, containerID, state, timeout)
	if err != nil || a.onFrozen == nil || state != "frozen" {
		return wait, err
	}
	return func() error {
		err := wait()
		if err == nil {
			go a.onFrozen()
		}
		return err
	}, nil
}

func (a faultyAgent) Checkpoint(ctx context.Context, node, ns, pod, container string, timeout time.Duration) (string, error) {
	if a.onCheckpoint != nil {
		go a.onCheckpoint()
	}
	return a.Client.Checkpoint(ctx, node, ns, pod, container, timeout)
}

func (a faultyAgent) BuildCheckpointImage(ctx context.Context, node, archive, container, ref string) (string, error) {
	if a.onBuild != nil {
		a.onBuild()
	}
	return a.Client.BuildCheckpointImage(ctx, node, archive, container, ref)
}

func (a faultyAgent) PullImage(ctx context.Context, node, ref string, auth *contract.RegistryAuth) error {
	if a.onPull != nil {
		go a.onPull()
	}
	return a.Client.PullImage(ctx, node, ref, auth)
}

// TestNodeAgentKilledOnRealNodes is the fault matrix's sample on real
// nodes (docs/faults.md; the simulated cluster runs every cell): the node
// agent killed (SIGKILL) while the source node's kubelet and CRIU
// checkpoint the app, and while the target node's agent pulls the app's
// image. Each migration rolls back exact: the source serves, its
// consumer's count and hash are the producer's when it is done, there is
// no target, no checkpoint image, and, once the restarted agent's janitor
// has run (MS2M_AGENT_ARCHIVE_GRACE=5s), no checkpoint archive of the pod
// on its node. Real-node faults take minutes, so the test runs when
// MS2M_E2E_FAULTS=1 (make e2e and make test set it).
func TestNodeAgentKilledOnRealNodes(t *testing.T) {
	if os.Getenv("MS2M_E2E_FAULTS") != "1" {
		t.Skip("the real-node faults run with MS2M_E2E_FAULTS=1 (make e2e and make test set it)")
	}
	l := needLab(t, "it kills the agents the test started")
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Minute)
	defer cancel()
	agents, err := l.StartAgents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agents.Stop)
	ac, err := l.AgentClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		node int // whose agent is killed: 1, the source's; 2, the target's
		arm  func(a *faultyAgent, kill func())
	}{
		{"in the checkpoint", 1, func(a *faultyAgent, kill func()) {
			// The agent dies once its freeze watch sees CRIU freeze the
			// app: while the kubelet waits for the dump. (If the watch
			// never says so, 100 ms into the call; a checkpoint and its
			// image took less than 300 ms here.)
			var once sync.Once
			a.onFrozen = func() { once.Do(kill) }
			a.onCheckpoint = func() { time.Sleep(100 * time.Millisecond); once.Do(kill) }
		}},
		{"in the pull", 2, func(a *faultyAgent, kill func()) { a.onPull = kill }},
	} {
		t.Run(tc.name, func(t *testing.T) { agentKilled(t, ctx, l, agents, ac, tc.node, tc.arm) })
	}
}

// agentKilled is one case of TestNodeAgentKilledOnRealNodes: a consumer on
// node 1 migrated to node 2 by ms2m, with node i's agent killed as arm
// says.
func agentKilled(t *testing.T, ctx context.Context, l *lab.Lab, agents *lab.Agents, ac nodeagent.Client, i int, arm func(a *faultyAgent, kill func())) {
	node := cluster.NodeName(i)
	src, tgt := cluster.NodeName(1), cluster.NodeName(2)
	name := testenv.UniqueName("agentkill")
	pod, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: src, WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.DeletePods(context.WithoutCancel(t.Context()), name, name+"-target") })
	prod := produce(t, pod, name, 10, 100, 10)

	killed := make(chan error, 1)
	fa := faultyAgent{Client: ac}
	arm(&fa, func() { killed <- agents.Kill(i) })
	env := l.Env(nil)
	env.Agent = fa
	plan := migrate.Plan{Name: fmt.Sprintf("k%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
		TargetNode: tgt, TargetPod: name + "-target", Strategy: contract.StrategyMS2M}
	rep, err := migrate.Run(ctx, env, plan)
	select {
	case kerr := <-killed:
		if kerr != nil {
			t.Fatalf("kill the agent on %s: %v", node, kerr)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the agent on %s was never killed: the migration ended (%v) without the call the fault waits for", node, err)
	}
	if rerr := agents.StartAgain(ctx, i, "MS2M_AGENT_ARCHIVE_GRACE=5s"); rerr != nil {
		t.Fatalf("restart the agent on %s: %v", node, rerr)
	}
	t.Logf("migrate with the agent on %s killed: %v", node, err)
	if err == nil {
		t.Fatalf("the migration succeeded with the agent on %s killed", node)
	}
	testenv.Eventually(t, time.Minute, "no target", func() bool {
		_, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, plan.TargetPod, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if mode := sidecarMode(t, pod); mode != "serving" {
		t.Errorf("the source's sidecar is %s, want serving", mode)
	}
	if rep.Image != "" {
		t.Errorf("a checkpoint image %s was reported", rep.Image)
	}
	dir := l.Cluster.Node(1).CheckpointDir
	var left []string
	testenv.Eventually(t, time.Minute, "no checkpoint archive of "+name+" on "+src, func() bool {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return false
		}
		left = left[:0]
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "checkpoint-"+name+"_") {
				left = append(left, filepath.Join(dir, e.Name()))
			}
		}
		return len(left) == 0
	})
	expectExact(t, ctx, prod, pod)
}
