package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/agent"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestMigrationThroughTheAgent runs an ms2m migration whose node-local
// steps go through the real node agents: `migrator agent` processes, one in
// each node's network namespace, over that node's kubelet checkpoint
// folder, containerd's CRI socket and state folder, reached at the node's
// InternalIP as a host-network DaemonSet would be.
func TestMigrationThroughTheAgent(t *testing.T) {
	l := needLab(t, "it runs migrate.Run in the test process, with the agents started for the test")
	agents, err := l.StartAgents(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agents.Stop)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	name := testenv.UniqueName("agent")
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.DeletePods(context.WithoutCancel(t.Context()), name, name+"-target") })
	prod := produce(t, src, name, 10, 100, 10)

	plan := migrate.Plan{Name: fmt.Sprintf("a%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
		TargetNode: cluster.NodeName(2), TargetPod: name + "-target", Strategy: contract.StrategyMS2M}
	journals := l.NewJournals(src, plan)
	env := l.Env(func(phase string, took time.Duration) {
		t.Logf("phase %-20s %v", phase, took.Round(time.Millisecond))
		journals.AfterPhase(ctx, phase)
	})
	env.Agent = agent.Client{Token: lab.AgentToken, Resolve: agent.ByNodeIP(l.Client, lab.AgentPort)}
	began := time.Now()
	rep, err := migrate.Run(ctx, env, plan)
	ended := time.Now()
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Logf("through the agent: total %v, switch %v, image %s", rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond), rep.Image)
	target, err := migrate.WaitRunning(ctx, l.Client, lab.Namespace, plan.TargetPod, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	expectExact(t, ctx, prod, target)
	logGap(t, "through the agent", journals, target, began, ended)
}
