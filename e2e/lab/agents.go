package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/ms2m/ms2m/e2e/cluster"
)

// AgentPort is where the lab's node agents listen, on each node's address.
const AgentPort = 8090

// AgentToken is the node agents' token in the lab.
const AgentToken = "lab-agent-token"

// Agents are `migrator agent` processes, one per node, each in its node's
// network namespace (so the migrator reaches it at the node's InternalIP,
// as in a cluster where the agent is a host-network DaemonSet) and over its
// node's folders and containerd socket.
type Agents struct {
	procs []*exec.Cmd
}

// StartAgents builds cmd/migrator and starts an agent on every node, and
// waits until each answers.
func (l *Lab) StartAgents(ctx context.Context) (*Agents, error) {
	bin, err := BuildStatic(l.Opts.RepoDir, "cmd/migrator")
	if err != nil {
		return nil, err
	}
	a := &Agents{}
	for i := 1; i <= l.Cluster.Nodes(); i++ {
		n := l.Cluster.Node(i)
		logf, err := os.Create(filepath.Join(l.Opts.StateDir, "logs", n.Name+"-agent.log"))
		if err != nil {
			a.Stop()
			return nil, err
		}
		cmd := exec.Command("nsenter", "--net="+n.Netns, bin, "agent")
		cmd.Env = append(os.Environ(), agentEnv(n, l.ImageRepo())...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			logf.Close()
			a.Stop()
			return nil, fmt.Errorf("start the agent on %s: %w", n.Name, err)
		}
		logf.Close()
		a.procs = append(a.procs, cmd)
		if err := waitAgent(ctx, n, logf.Name(), func() (bool, string) { return false, "" }); err != nil {
			a.Stop()
			return nil, err
		}
	}
	return a, nil
}

// agentEnv configures `migrator agent` for node n: it listens on the
// node's address, over the node's kubelet checkpoint folder, containerd
// socket and state folder, with the lab's token, and pushes to repo in the
// cluster's plain-HTTP registry.
func agentEnv(n cluster.NodeInfo, repo string) []string {
	return []string{
		"MS2M_AGENT_LISTEN=" + n.IP + ":" + strconv.Itoa(AgentPort),
		"MS2M_AGENT_CHECKPOINT_DIR=" + n.CheckpointDir,
		"MS2M_AGENT_RUNTIME_ENDPOINT=unix://" + n.ContainerdSock,
		"MS2M_AGENT_LOG_DIRS=" + filepath.Join(filepath.Dir(n.ContainerdSock), "containerd", "state"),
		"MS2M_AGENT_TOKEN=" + AgentToken,
		"MS2M_AGENT_REGISTRY_INSECURE=true",
		"MS2M_AGENT_IMAGE_REPO=" + repo,
	}
}

// waitAgent waits up to 20 s until the agent on n answers /healthz.
func waitAgent(ctx context.Context, n cluster.NodeInfo, log string, exited func() (bool, string)) error {
	return waitHTTP(ctx, "the agent on "+n.Name, fmt.Sprintf("http://%s:%d/healthz", n.IP, AgentPort), 20*time.Second, log, exited)
}

// Stop ends the agents.
func (a *Agents) Stop() {
	for _, p := range a.procs {
		_ = p.Process.Signal(syscall.SIGTERM) // fails only if it has exited: the wait returns then
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }() // how it ended shows in its log
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			p.Process.Kill()
			<-done
		}
	}
	a.procs = nil
}
