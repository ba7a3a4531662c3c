package migratorcli

import (
	"fmt"
	"os"

	"k8s.io/client-go/kubernetes"

	"github.com/ms2m/ms2m/internal/agent"
)

// DefaultAgentServerName is the name on the agents' certificate when
// MS2M_AGENT_SERVER_NAME is not set: the chart's, for release ms2m in
// ms2m-system.
const DefaultAgentServerName = "ms2m-agent.ms2m-system"

// agentClient is the client of the node agents at port on each node's
// InternalIP: over TLS checked against the CA in caFile for serverName,
// or, with caFile empty, plain HTTP (to agents started with
// MS2M_AGENT_PLAIN_HTTP, for a test on one host).
func agentClient(cs kubernetes.Interface, port int, token, caFile, serverName string) (agent.Client, error) {
	c := agent.Client{Resolve: agent.ByNodeIP(cs, port), Token: token}
	if caFile == "" {
		return c, nil
	}
	if serverName == "" {
		serverName = DefaultAgentServerName
	}
	tc, err := agent.ClientTLS(caFile, serverName)
	if err != nil {
		return agent.Client{}, err
	}
	c.TLS = tc
	return c, nil
}

// checkpointVia reads MS2M_CHECKPOINT_VIA or --checkpoint-via: whether
// checkpoints go through the node agents (agent, the default: the agent
// asks its own kubelet, with nodes/checkpoint) or the API server's node
// proxy (apiserver: needs nodes/proxy, for clusters where the agent cannot
// reach its kubelet).
func checkpointVia(v string) (throughAPIServer bool, err error) {
	switch v {
	case "", "agent":
		return false, nil
	case "apiserver":
		return true, nil
	}
	return false, fmt.Errorf("%q: want agent or apiserver", v)
}

// envOr is the environment variable k, or def when it is empty.
func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
