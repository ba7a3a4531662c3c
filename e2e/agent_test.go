package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/agent"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/ociimage"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestMigrationThroughTheAgent runs an ms2m migration whose node-local
// steps go through the real node agent: one per node, over each node's
// kubelet checkpoint folder, containerd's CRI socket and state folder. The
// agents run on the host here (their folders are host folders); in a
// cluster they are the migrator's DaemonSet.
func TestMigrationThroughTheAgent(t *testing.T) {
	l := needLab(t)
	urls := map[string]string{}
	for i := 1; i <= l.Cluster.Nodes(); i++ {
		n := l.Cluster.Node(i)
		s, err := agent.NewServer(agent.Config{
			CheckpointDir: n.CheckpointDir,
			LogDirs:       []string{filepath.Join(filepath.Dir(n.ContainerdSock), "containerd", "state")},
			Token:         "agent-token",
			Push:          ociimage.PushOptions{Insecure: true},
			Puller:        agent.CRIPuller{Endpoint: n.ContainerdSock},
		})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go s.Serve(ctx, ln)
		urls[n.Name] = "http://" + ln.Addr().String()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	name := testenv.UniqueName("agent")
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.DeletePods(context.Background(), name, name+"-target") })
	prod, err := lab.StartProducer(testenv.Build(t, "examples/producer"), name, 10, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Stop()
	testenv.Eventually(t, time.Minute, "the source consumer folds its first 10 messages", func() bool {
		st, err := lab.GetAppState(src)
		return err == nil && st.Count >= 10
	})

	env := l.Env(func(phase string, took time.Duration) { t.Logf("phase %-20s %v", phase, took.Round(time.Millisecond)) })
	env.Agent = agent.Client{Token: "agent-token", Resolve: func(_ context.Context, node string) (string, error) {
		if u, ok := urls[node]; ok {
			return u, nil
		}
		return "", fmt.Errorf("no agent on node %s", node)
	}}
	plan := migrate.Plan{Name: fmt.Sprintf("a%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
		TargetNode: cluster.NodeName(2), TargetPod: name + "-target", Strategy: migrate.MS2M}
	rep, err := migrate.Run(ctx, env, plan)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Logf("through the agent: total %v, downtime %v, image %s", rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond), rep.Image)
	want, err := prod.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	target, err := migrate.WaitRunning(ctx, l.Client, lab.Namespace, plan.TargetPod, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got := lab.WaitFor(target, want, 30*time.Second); got.Count != want.Count || got.Hash != want.Hash {
		t.Errorf("restored consumer: count %d hash %s; producer: count %d hash %s", got.Count, got.Hash, want.Count, want.Hash)
	}
}
