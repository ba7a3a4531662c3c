package migrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/ms2m/ms2m/internal/agent"
)

// Checkpoint asks the kubelet of node to checkpoint container of pod ns/name,
// through the API server's node proxy
// (POST /api/v1/nodes/{node}/proxy/checkpoint/{ns}/{pod}/{container}), and
// returns the archive's path on that node. The container keeps running.
//
// The caller needs create on nodes/proxy, the kubelet's whole API on every
// node: this is the fallback (Env.CheckpointThroughAPIServer, an agent
// that is no Checkpointer); a migration's checkpoint normally goes to the
// node's agent, which asks its own kubelet with nodes/checkpoint only. The
// kubelet needs the ContainerCheckpoint feature gate, and its runtime CRIU.
func Checkpoint(ctx context.Context, rc rest.Interface, node, ns, name, container string, timeout time.Duration) (string, error) {
	secs := max(1, int(timeout.Round(time.Second)/time.Second))
	// The deadline goes on the context: Request.Timeout would add a second
	// "timeout" parameter in Go duration syntax, and the kubelet, which
	// takes the last one as whole seconds, answers 404 to it.
	ctx, cancel := context.WithTimeout(ctx, timeout+10*time.Second)
	defer cancel()
	res := rc.Post().
		AbsPath("/api/v1/nodes", node, "proxy", "checkpoint", ns, name, container).
		Param("timeout", strconv.Itoa(secs)).
		Do(ctx)
	body, err := res.Raw()
	if err != nil {
		says := kubeletSays(serverMessage(err))
		if strings.Contains(err.Error(), strings.TrimPrefix(says, ": the kubelet says: ")) {
			says = "" // the error quotes it already
		}
		return "", fmt.Errorf("checkpoint %s/%s container %s on node %s: %w%s%s", ns, name, container, node, err, says, forbiddenHint(err))
	}
	return agent.ParseCheckpointResponse(body)
}

// serverMessage digs the body that the kubelet (or the API server) sent out
// of a client-go error: client-go keeps only a generic message per status
// code and puts the body in the error's cause.
func serverMessage(err error) []byte {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return nil
	}
	if d := st.Status().Details; d != nil {
		for _, c := range d.Causes {
			if c.Type == metav1.CauseTypeUnexpectedServerResponse && c.Message != "" && c.Message != "unknown" {
				return []byte(c.Message)
			}
		}
	}
	return nil
}

// forbiddenHint names the RBAC a 403 is missing.
func forbiddenHint(err error) string {
	if !apierrors.IsForbidden(err) {
		return ""
	}
	return "; the migrator needs create on nodes/proxy, and the API server's kubelet client identity needs nodes/checkpoint on the kubelet (see docs/install.md)"
}

// kubeletSays returns the kubelet's own words from an error body, which
// carry containerd's or CRIU's message.
func kubeletSays(body []byte) string {
	s := strings.TrimSpace(string(body))
	if s == "" {
		return ""
	}
	var status struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &status) == nil && status.Message != "" {
		s = status.Message
	}
	return ": the kubelet says: " + truncate([]byte(s))
}

func truncate(b []byte) string {
	const n = 2000
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// ErrNotFound is wrapped when an object a step waits for is gone.
var ErrNotFound = errors.New("not found")
