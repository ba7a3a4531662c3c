package migrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// Checkpoint asks the kubelet of node to checkpoint container of pod ns/name,
// through the API server's node proxy
// (POST /api/v1/nodes/{node}/proxy/checkpoint/{ns}/{pod}/{container}), and
// returns the archive's path on that node. The container keeps running.
//
// The caller needs create on nodes/proxy. The kubelet needs the
// ContainerCheckpoint feature gate, and its runtime CRIU.
func Checkpoint(ctx context.Context, rc rest.Interface, node, ns, name, container string, timeout time.Duration) (string, error) {
	secs := max(1, int(timeout.Round(time.Second)/time.Second))
	res := rc.Post().
		AbsPath("/api/v1/nodes", node, "proxy", "checkpoint", ns, name, container).
		Param("timeout", strconv.Itoa(secs)).
		Timeout(timeout + 10*time.Second).
		Do(ctx)
	body, err := res.Raw()
	if err != nil {
		return "", fmt.Errorf("checkpoint %s/%s container %s on node %s: %w%s", ns, name, container, node, err, kubeletSays(body))
	}
	return parseCheckpointResponse(body)
}

// parseCheckpointResponse reads the kubelet's answer: {"items":["<path>"]}.
func parseCheckpointResponse(body []byte) (string, error) {
	var out struct {
		Items []string `json:"items"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return "", fmt.Errorf("checkpoint: the kubelet's answer %q is not the expected JSON: %w", truncate(body), err)
	}
	if len(out.Items) != 1 || out.Items[0] == "" {
		return "", fmt.Errorf("checkpoint: the kubelet answered %q, want one archive path", truncate(body))
	}
	return out.Items[0], nil
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
