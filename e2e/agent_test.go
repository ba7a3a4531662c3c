package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	nodeagent "github.com/ms2m/ms2m/internal/agent"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestMigrationThroughTheAgent runs an ms2m migration whose node-local
// steps go through the real node agents: `migrator agent` processes, one in
// each node's network namespace, over that node's kubelet checkpoint
// folder, the runtime's CRI socket and state folder, reached at the
// node's InternalIP as a host-network DaemonSet would be. The app's root
// filesystem is read-only, so the source node's agent thaws it as soon as
// CRIU's dump is done (ThawAuto), through the node's runtime: containerd's
// task API, or runc's resume on CRI-O nodes.
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
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50, ReadOnlyRoot: true})
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
	ac, err := l.AgentClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	env.Agent = ac
	began := time.Now()
	rep, err := migrate.Run(ctx, env, plan)
	ended := time.Now()
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Logf("through the agent: total %v, switch %v, image %s", rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond), rep.Image)
	if h := rep.Hold; h == nil || !h.ThawedAtDump {
		t.Errorf("the agent did not thaw the app (read-only root filesystem) at the dump: %+v", h)
	} else {
		t.Logf("through the agent: thawed at the dump, the call returned %v after it (CRIU held the app %v)", h.AfterDump.Round(time.Millisecond), h.CRIU.Round(time.Millisecond))
	}
	target, err := migrate.WaitRunning(ctx, l.Client, lab.Namespace, plan.TargetPod, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	expectExact(t, ctx, prod, target)
	logGap(t, "through the agent", journals, target, began, ended)
	// The checkpoint was the source node's agent's, by its own kubelet:
	// not the API server's node proxy.
	b, err := os.ReadFile(agents.Log(cluster.NodeName(1)))
	if err != nil || !strings.Contains(string(b), `"msg":"checkpoint taken"`) {
		t.Errorf("the agent on %s took no checkpoint (%v); its log:\n%s", cluster.NodeName(1), err, b)
	}
}

// TestAgentCheckpointsOnlyItsNodeAndNamespace plays callers of the node
// agents and of the kubelets who want more than ms2m's own checkpoint:
// against the real agents, the real kubelets (webhook authentication and
// authorization) and the real API server. The agent of a node checkpoints
// a pod there through its own kubelet, with its ServiceAccount's token,
// which may create nodes/checkpoint and nothing else; a checkpoint token
// is good for one node and one namespace; the agent's identity reaches
// neither the kubelet's exec/run nor the API server's node proxy.
func TestAgentCheckpointsOnlyItsNodeAndNamespace(t *testing.T) {
	l := needLab(t, "it starts the node agents for the test")
	agents, err := l.StartAgents(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agents.Stop)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	name := testenv.UniqueName("agentcp")
	if _, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: 50}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.DeletePods(context.WithoutCancel(t.Context()), name) })
	c, err := l.AgentClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node1, node2 := cluster.NodeName(1), cluster.NodeName(2)
	ask := func(token, node, ns string) error {
		return askCheckpoint(ctx, c, token, node, ns, name)
	}

	// The agent's own kubelet takes the checkpoint: the agent's identity
	// has nodes/checkpoint, and nothing took it through the API server.
	archive, err := c.Checkpoint(ctx, node1, lab.Namespace, name, "app", time.Minute)
	if err != nil {
		t.Fatalf("the agent on %s checkpointing its own pod: %v", node1, err)
	}
	st, err := os.Stat(archive)
	if err != nil || st.Size() == 0 {
		t.Fatalf("the archive %s the kubelet named: %v", archive, err)
	}
	t.Logf("checkpoint by the agent on %s: %s, %d bytes", node1, filepath.Base(archive), st.Size())
	_ = os.Remove(archive) // the process's memory

	for what, tc := range map[string]struct {
		token, node, ns string
		want            string
	}{
		"node-2's token at node-1's agent":                  {nodeagent.CheckpointToken(lab.AgentToken, node2, lab.Namespace), node1, lab.Namespace, "not this agent's checkpoint token for node " + node1},
		"kube-system's token for a pod of " + lab.Namespace: {nodeagent.CheckpointToken(lab.AgentToken, node1, "kube-system"), node1, lab.Namespace, "not this agent's checkpoint token"},
		"the agents' token itself":                          {lab.AgentToken, node1, lab.Namespace, "not this agent's checkpoint token"},
		// The right token for node-2, at node-2's agent, for the pod on
		// node-1: node-2's kubelet does not run it.
		"node-1's pod through node-2's agent": {nodeagent.CheckpointToken(lab.AgentToken, node2, lab.Namespace), node2, lab.Namespace, "the kubelet answered 404 Not Found"},
	} {
		err := ask(tc.token, tc.node, tc.ns)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to say %q", what, err, tc.want)
		}
	}

	// The agent's identity: its ServiceAccount token, which the kubelet
	// authenticates. Straight to the kubelet's /run (exec in a pod,
	// authorized as nodes/proxy) and through the API server's node proxy,
	// it is refused; its /checkpoint is not.
	files, err := l.AgentFiles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := os.ReadFile(files.KubeletToken)
	if err != nil {
		t.Fatal(err)
	}
	n1 := l.Cluster.Node(1)
	kubeletCA, err := os.ReadFile(n1.KubeletCert)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(kubeletCA)
	kc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: node1, MinVersion: tls.VersionTLS12}}}
	run := fmt.Sprintf("https://%s:10250/run/%s/%s/app?cmd=cat+/etc/hostname", n1.IP, lab.Namespace, name)
	if code, body := post(t, kc, run, string(tok)); code != http.StatusForbidden {
		t.Errorf("the agent's token at the kubelet's /run: %d %s, want 403", code, body)
	} else {
		t.Logf("the kubelet refuses the agent's /run: %s", body)
	}
	cfg := rest.CopyConfig(l.Cluster.RESTConfig())
	cfg.BearerToken, cfg.CertData, cfg.KeyData, cfg.CertFile, cfg.KeyFile = string(tok), nil, nil, "", ""
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	proxied := fmt.Sprintf("%s/api/v1/nodes/%s/proxy/run/%s/%s/app?cmd=cat+/etc/hostname", cfg.Host, node1, lab.Namespace, name)
	if code, body := post(t, hc, proxied, ""); code != http.StatusForbidden {
		t.Errorf("the agent's token at the API server's node proxy: %d %s, want 403", code, body)
	}
}

// askCheckpoint asks node's agent for a checkpoint of pod in ns with
// token as the bearer, as any caller could.
func askCheckpoint(ctx context.Context, c nodeagent.Client, token, node, ns, pod string) error {
	return c.RawCheckpoint(ctx, token, node, nodeagent.CheckpointRequest{Namespace: ns, Pod: pod, Container: "app", TimeoutSeconds: 60})
}

// post sends an empty POST to url, with token as the bearer if set, and
// returns the status and the body's start.
func post(t *testing.T, c *http.Client, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(token))
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return resp.StatusCode, strings.TrimSpace(string(b))
}
