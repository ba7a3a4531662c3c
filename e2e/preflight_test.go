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
// CRIU); with the second node's containerd config turned to restore off
// (the file only: the running containerd is not restarted, and the file
// is put back), `migrator migrate` onto it is refused before anything is
// done: no quiesce, no checkpoint archive on the source's node.
func TestPreflightOnRealNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	l := needMS2M(t, ctx, withAgents)
	if l.External {
		t.Skip("the node's containerd config is edited by the test: only on the suite's own cluster")
	}
	migrator := testenv.Build(t, "cmd/migrator")
	run := func(args ...string) (string, string, error) {
		cmd := exec.CommandContext(ctx, migrator, args...)
		cmd.Env = append(os.Environ(), "MS2M_AGENT_TOKEN="+agentToken(l), "MS2M_STATUS_KEY="+string(signingKey(t, ctx, l)))
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		return out.String(), errOut.String(), err
	}

	out, errOut, err := run("nodes", "-kubeconfig", l.Kubeconfig)
	if err != nil {
		t.Fatalf("migrator nodes: %v\n%s%s", err, out, errOut)
	}
	t.Logf("migrator nodes printed:\n%s", out)
	for _, node := range []string{l.NodeName(1), l.NodeName(2)} {
		var row string
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, node+" ") {
				row = line
			}
		}
		f := strings.Fields(row)
		// NODE RUNTIME VERSION CRIU CHECKPOINT RESTORE CGROUP NOTE
		if len(f) < 7 || f[1] != "containerd" || f[3] == "?" || f[3] == "missing" || f[4] != "yes" || f[5] != "yes" {
			t.Errorf("node %s's row %q: want containerd with its version, CRIU's version, checkpoint yes, restore yes", node, row)
		}
	}

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

	name := testenv.UniqueName("preflight")
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: l.NodeName(1), WorkMS: 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.DeletePods(context.WithoutCancel(t.Context()), name) })
	out, errOut, err = run("migrate", lab.Namespace+"/"+name, "--to", l.NodeName(2), "--image-repo", imageRepo(l), "--kubeconfig", l.Kubeconfig)
	if err == nil {
		t.Fatalf("migrator migrate onto a node with restore off succeeded:\n%s", out)
	}
	for _, want := range []string{"target node " + l.NodeName(2) + " cannot restore", "enable_experimental_restore_via_create = true", conf} {
		if !strings.Contains(errOut, want) {
			t.Errorf("migrator migrate's error %q lacks %q", errOut, want)
		}
	}
	for _, phase := range []string{"quiesce", "checkpoint", "prepare target"} {
		if strings.Contains(out, phase) {
			t.Errorf("the refused migration ran %s:\n%s", phase, out)
		}
	}
	archives, _ := filepath.Glob(filepath.Join(l.Cluster.Node(1).CheckpointDir, "checkpoint-"+src.Name+"_*"))
	if len(archives) != 0 {
		t.Errorf("the source was checkpointed: %v", archives)
	}
}
