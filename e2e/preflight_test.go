package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestPreflightOnRealNodes: `migrator nodes` shows what the real agents
// find on the nodes (containerd through CRI, its config, the nodes'
// CRIU). Then two nodes are made unable to restore, and `migrator
// migrate` onto each is refused before anything is done (no quiesce, no
// checkpoint archive on the source's node), with what to change:
//   - node 2: its containerd config turned to restore off (the file only:
//     the running containerd is not restarted; the file is put back);
//   - node 3: its agent restarted with its CRIU at a path that is not
//     there, a node without CRIU (put back after).
func TestPreflightOnRealNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	l, agents := needMS2MAgents(t, ctx, withAgents)
	needContainerdNodes(t, l, "it turns restore off in a node's containerd config.toml")
	if l.External {
		t.Skip("the node's containerd config and agent are changed by the test: only on the suite's own cluster")
	}
	if l.Cluster.Nodes() < 3 {
		t.Fatalf("the test needs three nodes, the cluster has %d", l.Cluster.Nodes())
	}
	run := migratorWithAgents(t, ctx, l)
	// row is node's row of `migrator nodes`, split in fields:
	// NODE RUNTIME(name version) CRIU CHECKPOINT RESTORE CGROUP NOTE...
	row := func(out, node string) []string {
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, node+" ") {
				return strings.Fields(line)
			}
		}
		return nil
	}

	out, errOut, err := run("nodes", "-kubeconfig", l.Kubeconfig)
	if err != nil {
		t.Fatalf("migrator nodes: %v\n%s%s", err, out, errOut)
	}
	t.Logf("migrator nodes printed:\n%s", out)
	for i := 1; i <= 3; i++ {
		node := l.NodeName(i)
		if f := row(out, node); len(f) < 7 || f[1] != "containerd" || f[3] == "?" || f[3] == "missing" || f[4] != "yes" || f[5] != "yes" {
			t.Errorf("node %s's row %q: want containerd with its version, CRIU's version, checkpoint yes, restore yes", node, f)
		}
	}

	// Node 2: restore off in its containerd config.
	conf := l.Cluster.Node(2).ContainerdConfig
	orig, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	const on = "enable_experimental_restore_via_create = true"
	if !bytes.Contains(orig, []byte(on)) {
		t.Fatalf("%s lacks %q", conf, on)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(conf, orig, 0o644); err != nil {
			t.Errorf("put back %s: %v", conf, err)
		}
	})
	if err := os.WriteFile(conf, bytes.Replace(orig, []byte(on), []byte("enable_experimental_restore_via_create = false"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	// Node 3: no CRIU where its agent looks.
	noCRIU := filepath.Join(t.TempDir(), "no-criu-here")
	if err := agents.Restart(ctx, 3, noCRIU); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := agents.Restart(context.WithoutCancel(t.Context()), 3, l.CRIUPath()); err != nil {
			t.Errorf("put back node 3's agent: %v", err)
		}
	})

	out, errOut, err = run("nodes", "-kubeconfig", l.Kubeconfig)
	if err != nil {
		t.Fatalf("migrator nodes: %v\n%s%s", err, out, errOut)
	}
	t.Logf("migrator nodes printed, node 2 with restore off and node 3 without CRIU:\n%s", out)
	if f := row(out, l.NodeName(2)); len(f) < 7 || f[5] != "no" || !strings.Contains(strings.Join(f[7:], " "), on) {
		t.Errorf("node 2's row %q: want restore no and the setting %q", f, on)
	}
	if f := row(out, l.NodeName(3)); len(f) < 7 || f[3] != "missing" || !strings.Contains(strings.Join(f[7:], " "), noCRIU) {
		t.Errorf("node 3's row %q: want CRIU missing, with its path %s", f, noCRIU)
	}

	name := testenv.UniqueName("preflight")
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: l.NodeName(1), WorkMS: 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.DeletePods(context.WithoutCancel(t.Context()), name) })
	for _, tc := range []struct {
		node int
		want []string
	}{
		{2, []string{"target node " + l.NodeName(2) + " cannot restore", on, conf}},
		{3, []string{"target node " + l.NodeName(3) + " has no CRIU", "install CRIU"}},
	} {
		out, errOut, err := run("migrate", lab.Namespace+"/"+name, "--to", l.NodeName(tc.node), "--image-repo", imageRepo(l), "--kubeconfig", l.Kubeconfig)
		if err == nil {
			t.Fatalf("migrator migrate onto %s succeeded:\n%s", l.NodeName(tc.node), out)
		}
		t.Logf("migrator migrate onto %s refused: %s", l.NodeName(tc.node), strings.TrimSpace(errOut))
		for _, want := range tc.want {
			if !strings.Contains(errOut, want) {
				t.Errorf("migrator migrate onto %s: its error %q lacks %q", l.NodeName(tc.node), errOut, want)
			}
		}
		for _, phase := range []string{"quiesce", "checkpoint", "prepare target"} {
			if strings.Contains(out, phase) {
				t.Errorf("the migration refused onto %s ran %s:\n%s", l.NodeName(tc.node), phase, out)
			}
		}
	}
	archives, _ := filepath.Glob(filepath.Join(l.Cluster.Node(1).CheckpointDir, "checkpoint-"+src.Name+"_*"))
	if len(archives) != 0 {
		t.Errorf("the source was checkpointed: %v", archives)
	}
}

// migratorWithAgents builds `migrator` and returns a runner of it that
// talks to the lab's node agents (their token and CA) and signs with the
// lab's status key: its stdout, its stderr and how it exited.
func migratorWithAgents(t *testing.T, ctx context.Context, l *lab.Lab) func(args ...string) (string, string, error) {
	t.Helper()
	files, err := l.AgentFiles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	migrator := testenv.Build(t, "cmd/migrator")
	env := append(os.Environ(), "MS2M_AGENT_TOKEN="+agentToken(l), "MS2M_STATUS_KEY="+string(signingKey(t, ctx, l)),
		"MS2M_AGENT_CA_FILE="+files.CA, "MS2M_AGENT_SERVER_NAME="+lab.AgentServerName)
	return func(args ...string) (string, string, error) {
		cmd := exec.CommandContext(ctx, migrator, args...)
		cmd.Env = env
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		return out.String(), errOut.String(), err
	}
}
