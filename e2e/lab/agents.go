package lab

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	nodeagent "github.com/ms2m/ms2m/internal/agent"
	"github.com/ms2m/ms2m/internal/selfsigned"
)

// AgentPort is where the lab's node agents listen, on each node's address.
const AgentPort = 8090

// AgentToken is the node agents' token in the lab.
const AgentToken = "lab-agent-token"

// AgentServerName is the name on the lab's agents' certificate: the
// chart's, for its release in ChartNamespace.
const AgentServerName = "ms2m-agent." + ChartNamespace

// Agent identities in the lab: the ServiceAccount whose token the agents
// send their kubelet, and the ClusterRole that lets it create
// nodes/checkpoint (the chart's agent rule).
const (
	agentServiceAccount = "ms2m-lab-agent"
	agentKubeletRole    = "ms2m-lab-agent-kubelet"
)

// AgentFiles are the files the lab's agents and their callers need
// besides the token: the agents' TLS certificate, key and CA, and the
// ServiceAccount token the agents send their kubelet.
type AgentFiles struct {
	Cert, Key, CA string
	KubeletToken  string
}

// AgentFiles makes the agents' files in the cluster's state folder: the
// TLS pair once (kept while it has a month left), the ServiceAccount and
// its role once, and a new ServiceAccount token on every call (valid two
// days).
func (l *Lab) AgentFiles(ctx context.Context) (AgentFiles, error) {
	dir := filepath.Join(l.Cluster.StateDir(), "agent")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return AgentFiles{}, err
	}
	f := AgentFiles{Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key"), CA: filepath.Join(dir, "ca.crt"), KubeletToken: filepath.Join(dir, "kubelet-token")}
	if !certLasts(f.Cert, 30*24*time.Hour) {
		p, err := selfsigned.New("ms2m lab agent CA", []string{AgentServerName}, time.Now(), 365*24*time.Hour)
		if err != nil {
			return AgentFiles{}, err
		}
		for path, b := range map[string][]byte{f.Key: p.Key, f.CA: p.CA, f.Cert: p.Cert} {
			if err := os.WriteFile(path, b, 0o600); err != nil {
				return AgentFiles{}, err
			}
		}
	}
	if err := l.agentIdentity(ctx); err != nil {
		return AgentFiles{}, err
	}
	exp := int64(48 * 3600)
	tr, err := l.Client.CoreV1().ServiceAccounts(metav1.NamespaceSystem).CreateToken(ctx, agentServiceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return AgentFiles{}, fmt.Errorf("a token for the agents' ServiceAccount: %w", err)
	}
	if err := os.WriteFile(f.KubeletToken, []byte(tr.Status.Token), 0o600); err != nil {
		return AgentFiles{}, err
	}
	return f, nil
}

// certLasts says whether the PEM certificate in file is valid for d more.
func certLasts(file string, d time.Duration) bool {
	b, err := os.ReadFile(file)
	if err != nil {
		return false
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return false
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	return err == nil && time.Now().Add(d).Before(c.NotAfter)
}

// agentIdentity makes the agents' ServiceAccount in kube-system and lets
// it create nodes/checkpoint, and nothing else: the chart's agent rule.
func (l *Lab) agentIdentity(ctx context.Context) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: agentServiceAccount, Namespace: metav1.NamespaceSystem}}
	if _, err := l.Client.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("the agents' ServiceAccount: %w", err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: agentKubeletRole},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/checkpoint"}, Verbs: []string{"create"}}}}
	if _, err := l.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("the agents' ClusterRole: %w", err)
	}
	b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: agentKubeletRole},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: agentKubeletRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: agentServiceAccount, Namespace: metav1.NamespaceSystem}}}
	if _, err := l.Client.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("the agents' ClusterRoleBinding: %w", err)
	}
	return nil
}

// AgentClient is a client of the lab's agents, over TLS checked against
// the lab's agent CA.
func (l *Lab) AgentClient(ctx context.Context) (nodeagent.Client, error) {
	f, err := l.AgentFiles(ctx)
	if err != nil {
		return nodeagent.Client{}, err
	}
	tc, err := nodeagent.ClientTLS(f.CA, AgentServerName)
	if err != nil {
		return nodeagent.Client{}, err
	}
	return nodeagent.Client{Token: AgentToken, Resolve: nodeagent.ByNodeIP(l.Client, AgentPort), TLS: tc}, nil
}

// Agents are `migrator agent` processes, one per node, each in its node's
// network namespace (so the migrator reaches it at the node's InternalIP,
// as in a cluster where the agent is a host-network DaemonSet) and over its
// node's folders and containerd socket.
type Agents struct {
	l     *Lab
	bin   string
	files AgentFiles
	procs map[int]*exec.Cmd // node index -> its agent
	logs  map[string]string // node -> log file
}

// StartAgents builds cmd/migrator and starts an agent on every node, and
// waits until each answers.
func (l *Lab) StartAgents(ctx context.Context) (*Agents, error) {
	bin, err := BuildStatic(l.Opts.RepoDir, "cmd/migrator")
	if err != nil {
		return nil, err
	}
	files, err := l.AgentFiles(ctx)
	if err != nil {
		return nil, err
	}
	a := &Agents{l: l, bin: bin, files: files, procs: map[int]*exec.Cmd{}, logs: map[string]string{}}
	for i := 1; i <= l.Cluster.Nodes(); i++ {
		if err := os.Remove(filepath.Join(l.Opts.StateDir, "logs", l.Cluster.Node(i).Name+"-agent.log")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		if err := a.start(ctx, i, l.CRIUPath()); err != nil {
			a.Stop()
			return nil, err
		}
	}
	return a, nil
}

// Restart stops node i's agent and starts it again with its preflight
// running criu (a path that is not there: a node without CRIU), and waits
// until it answers.
func (a *Agents) Restart(ctx context.Context, i int, criu string) error {
	a.stop(i)
	return a.start(ctx, i, criu)
}

// Kill kills node i's agent (SIGKILL), as a crash or the OOM killer
// does, and waits until it has exited; StartAgain starts a new one.
func (a *Agents) Kill(i int) error {
	p, ok := a.procs[i]
	if !ok {
		return fmt.Errorf("no agent runs on node %d", i)
	}
	delete(a.procs, i)
	// nsenter execs the agent: the process is the agent's.
	if err := p.Process.Kill(); err != nil {
		return err
	}
	_ = p.Wait() // "signal: killed"
	return nil
}

// StartAgain starts node i's agent after Kill, with extra variables
// (MS2M_AGENT_ARCHIVE_GRACE, say), and waits until it answers.
func (a *Agents) StartAgain(ctx context.Context, i int, extra ...string) error {
	return a.start(ctx, i, a.l.CRIUPath(), extra...)
}

// start starts node i's agent, with extra variables, and waits until it
// answers; its log is appended to.
func (a *Agents) start(ctx context.Context, i int, criu string, extra ...string) error {
	n := a.l.Cluster.Node(i)
	logf, err := os.OpenFile(filepath.Join(a.l.Opts.StateDir, "logs", n.Name+"-agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("nsenter", "--net="+n.Netns, a.bin, "agent")
	cmd.Env = append(append(os.Environ(), agentEnv(n, a.l.ImageRepo(), a.files, criu)...), extra...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the agent on %s: %w", n.Name, err)
	}
	a.procs[i] = cmd
	a.logs[n.Name] = logf.Name()
	return waitAgent(ctx, n, a.files, logf.Name(), func() (bool, string) { return false, "" })
}

// agentEnv configures `migrator agent` for node n: it listens on the
// node's address, over TLS, over the node's kubelet checkpoint folder,
// runtime's socket and state folder, with the lab's token; it asks the
// node's kubelet for checkpoints with the ServiceAccount token of files,
// checking the kubelet's own certificate, and pushes to repo in the
// cluster's plain-HTTP registry; its preflight reads the node's runtime
// config (containerd's or CRI-O's) and runs criu, the nodes' CRIU.
func agentEnv(n cluster.NodeInfo, repo string, files AgentFiles, criu string) []string {
	return []string{
		"NODE_NAME=" + n.Name,
		"MS2M_AGENT_TLS_CERT_FILE=" + files.Cert,
		"MS2M_AGENT_TLS_KEY_FILE=" + files.Key,
		"MS2M_AGENT_KUBELET_URL=https://" + n.IP + ":10250",
		"MS2M_AGENT_KUBELET_TOKEN_FILE=" + files.KubeletToken,
		"MS2M_AGENT_KUBELET_CA_FILE=" + n.KubeletCert,
		"MS2M_AGENT_LISTEN=" + n.IP + ":" + strconv.Itoa(AgentPort),
		"MS2M_AGENT_CHECKPOINT_DIR=" + n.CheckpointDir,
		"MS2M_AGENT_RUNTIME_ENDPOINT=unix://" + n.RuntimeSock,
		"MS2M_AGENT_LOG_DIRS=" + n.RuntimeStateDir,
		"MS2M_AGENT_TOKEN=" + AgentToken,
		"MS2M_AGENT_REGISTRY_INSECURE=true",
		"MS2M_AGENT_IMAGE_REPO=" + repo,
		"MS2M_AGENT_RUNTIME_CONFIG=" + n.RuntimeConfig,
		"MS2M_AGENT_CRIU_PATH=" + criu,
	}
}

// waitAgent waits up to 20 s until the agent on n answers /healthz over
// TLS, its certificate checked against the CA of files.
func waitAgent(ctx context.Context, n cluster.NodeInfo, files AgentFiles, log string, exited func() (bool, string)) error {
	tc, err := nodeagent.ClientTLS(files.CA, AgentServerName)
	if err != nil {
		return err
	}
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	return waitHTTPWith(ctx, c, "the agent on "+n.Name, fmt.Sprintf("https://%s:%d/healthz", n.IP, AgentPort), 20*time.Second, log, exited)
}

// Log is the log file of node's agent.
func (a *Agents) Log(node string) string { return a.logs[node] }

// Stop ends the agents.
func (a *Agents) Stop() {
	for i := range a.procs {
		a.stop(i)
	}
}

// stop ends node i's agent: SIGTERM, SIGKILL after 5 s.
func (a *Agents) stop(i int) {
	p, ok := a.procs[i]
	if !ok {
		return
	}
	delete(a.procs, i)
	_ = p.Process.Signal(syscall.SIGTERM) // fails only if it has exited: the wait returns then
	done := make(chan struct{})
	go func() { _ = p.Wait(); close(done) }() // how it ended shows in its log
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.Process.Kill()
		<-done
	}
}
