package migrate_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/migratorcli"
)

// TestPreflightRefusesIncapableNodes asks the controller to migrate onto
// a node whose agent reports restore off in its runtime's configuration,
// then from a node without CRIU: each request is refused with a
// MigrationNodeNotCapable Event that names the node and the setting, and
// before anything is done (no checkpoint call, no pull on the target, the
// source serves on). Then the target's agent is one from before the
// preflight (404 on GET /v1/node): the migration goes on, and its status
// says the target was not checked. Without the preflight, the first
// request checkpointed the source and failed at the restore.
func TestPreflightRefusesIncapableNodes(t *testing.T) {
	c := cluster(t)
	resetNodes(c)
	defer resetNodes(c)
	ctx := t.Context()
	w := deploy(t, c, "sim-preflight", "Deployment", true)
	startController(t, c, "the controller", c.Kubeconfig)
	pods := c.Client.CoreV1().Pods(w.ns)
	ask := func() {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, contract.AnnotationMigrateTo, nodeB)
		if _, err := pods.Patch(ctx, w.pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("ask %s to migrate to %s: %v", w.pod.Name, nodeB, err)
		}
	}
	untouched := func(what string) {
		t.Helper()
		for _, n := range []string{nodeA, nodeB} {
			for _, call := range c.Nodes[n].Calls() {
				if strings.HasPrefix(call, "kubelet ") || strings.Contains(call, "/v1/checkpoint-images") || strings.Contains(call, "/v1/pulls") || strings.Contains(call, "/v1/freeze") {
					t.Errorf("%s: node %s was called %q before the refusal", what, n, call)
				}
			}
		}
		if got := c.Nodes[nodeB].Pulls(); len(got) != 0 {
			t.Errorf("%s: the target pulled %v", what, got)
		}
		if got := w.created.names(); len(got) != 1 {
			t.Errorf("%s: %d pods were created, want only the source: %v", what, len(got), got)
		}
		expectServing(t, c, w)
	}
	statusOf := func() string {
		t.Helper()
		p, err := pods.Get(ctx, w.pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.Annotations[contract.AnnotationMigrationStatus]
	}

	const setting = `[plugins."io.containerd.cri.v1.runtime"] enable_experimental_restore_via_create = true`
	c.Nodes[nodeB].Degrade(func(n *contract.NodeCapabilities) {
		off := false
		n.Runtime, n.RuntimeVersion, n.RestoreEnabled, n.Setting, n.ConfigPath = "containerd", "2.3.4", &off, setting, "/etc/containerd/config.toml"
	})
	// `migrator nodes` shows it, from the nodes' agents.
	t.Setenv("MS2M_AGENT_TOKEN", c.AgentToken)
	var out, errOut bytes.Buffer
	if code := migratorcli.Main(ctx, []string{"nodes", "-kubeconfig", c.Kubeconfig}, &out, &errOut); code != 0 {
		t.Fatalf("migrator nodes: exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{nodeA + " ", nodeB + " ", "containerd 2.3.4", "set " + setting} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("migrator nodes printed\n%s\nwithout %q", out.String(), want)
		}
	}

	ask()
	st := waitAnswered(t, c, w.ns, w.pod.Name, "")
	for _, part := range []string{"target node " + nodeB + " cannot restore", setting, "/etc/containerd/config.toml", "nothing was touched"} {
		if st.Phase != contract.PhaseFailed || !strings.Contains(st.Message, part) {
			t.Errorf("restore off: the status is %s %q, want Failed saying %q", st.Phase, st.Message, part)
		}
	}
	expectEventOn(t, c, w.ns, w.pod.Name, contract.ReasonMigrationNodeNotCapable, "target node "+nodeB+" cannot restore")
	untouched("restore off on the target")

	c.Nodes[nodeB].Degrade(nil)
	c.Nodes[nodeA].Degrade(func(n *contract.NodeCapabilities) {
		missing := false
		n.CRIUFound, n.CRIU = &missing, ""
	})
	ask()
	st = waitAnswered(t, c, w.ns, w.pod.Name, statusOf())
	if want := "source node " + nodeA + " has no CRIU"; st.Phase != contract.PhaseFailed || !strings.Contains(st.Message, want) {
		t.Errorf("no CRIU: the status is %s %q, want Failed saying %q", st.Phase, st.Message, want)
	}
	expectEventOn(t, c, w.ns, w.pod.Name, contract.ReasonMigrationNodeNotCapable, "source node "+nodeA+" has no CRIU")
	untouched("no CRIU on the source")

	// An agent that predates the preflight is no refusal.
	c.Nodes[nodeA].Degrade(nil)
	c.Nodes[nodeB].OldAgent(true)
	ask()
	got := waitMigrated(t, c, w.ns, w.pod, nodeB, "")
	done, err := controller.DecodeStatus(got.Annotations[contract.AnnotationMigrationStatus])
	if err != nil {
		t.Fatal(err)
	}
	if done.Report == nil || !strings.Contains(strings.Join(done.Report.Unchecked, "\n"), "node "+nodeB+": its agent did not say what the node can do") {
		t.Errorf("the migration past an old agent: report %+v, want it to say that %s was not checked", done.Report, nodeB)
	}
}
