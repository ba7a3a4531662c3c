package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestMigratorCLI is the way a user migrates today: the real webhook
// injects the consumer, `migrator agent` runs on every node, and
// `migrator migrate <ns>/<pod> --to <node>` moves it, showing its phases.
func TestMigratorCLI(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	l := needMS2M(t, ctx, withAgents)

	name := testenv.UniqueName("cli")
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: l.NodeName(1), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := src.Annotations[contract.AnnotationStatus]; !ok {
		t.Fatalf("the webhook did not inject %s", name)
	}
	prod := produce(t, src, name, 10, 120, 20)

	cmd := exec.CommandContext(ctx, testenv.Build(t, "cmd/migrator"), "migrate", lab.Namespace+"/"+name,
		"--to", l.NodeName(2), "--image-repo", imageRepo(l), "--kubeconfig", l.Kubeconfig)
	cmd.Env = append(os.Environ(), "MS2M_AGENT_TOKEN="+agentToken(l), "MS2M_STATUS_KEY="+string(signingKey(t, ctx, l)))
	if !l.External {
		files, err := l.AgentFiles(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Env = append(cmd.Env, "MS2M_AGENT_CA_FILE="+files.CA, "MS2M_AGENT_SERVER_NAME="+lab.AgentServerName)
	} else if ca := envOr("MS2M_E2E_AGENT_CA_FILE", filepath.Join(filepath.Dir(l.Kubeconfig), "agent", "ca.crt")); fileExists(ca) {
		// `up --with-ms2m` keeps the agents' CA beside the kubeconfig.
		cmd.Env = append(cmd.Env, "MS2M_AGENT_CA_FILE="+ca, "MS2M_AGENT_SERVER_NAME="+envOr("MS2M_E2E_AGENT_SERVER_NAME", lab.AgentServerName))
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("migrator migrate: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	t.Logf("migrator migrate printed:\n%s", out.String())
	for _, phase := range []string{"preconditions", "prepare target", "quiesce", "checkpoint", "resume", "image", "restore", "replay and handover", "finalise", "downtime"} {
		if !strings.Contains(out.String(), phase) {
			t.Errorf("the output lacks %q", phase)
		}
	}
	m := regexp.MustCompile(`target pod\s+(\S+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatal("the output names no target pod")
	}
	t.Cleanup(func() { l.DeletePods(context.WithoutCancel(t.Context()), name, m[1]) })
	target, err := migrate.WaitRunning(ctx, l.Client, lab.Namespace, m[1], time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if target.Spec.NodeName != l.NodeName(2) {
		t.Errorf("target %s runs on %s", m[1], target.Spec.NodeName)
	}
	expectExact(t, ctx, prod, target)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
