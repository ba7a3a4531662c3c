package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ms2m/ms2m/internal/contract"
)

// Client talks to the agents. It implements migrate.NodeAgent and
// migrate.LogReader.
type Client struct {
	// Resolve returns the base URL of node's agent (http://host:port).
	Resolve func(ctx context.Context, node string) (string, error)
	Token   string
	// TLS, when set, is how the agents are called: over TLS (https, whatever
	// scheme Resolve gives), their certificate checked against it
	// (ClientTLS). Nil: plain HTTP, for agents started without TLS.
	TLS *tls.Config
	// HTTP is the client. Default: one with a 10-minute timeout (a 1 GB
	// checkpoint image takes a while to push), over TLS when TLS is set.
	HTTP *http.Client
}

// ByNodeIP resolves a node's agent at its InternalIP and port: the agent
// runs on the host network of every node (a DaemonSet).
func ByNodeIP(cs kubernetes.Interface, port int) func(ctx context.Context, node string) (string, error) {
	return func(ctx context.Context, node string) (string, error) {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("node %s: %w", node, err)
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				return "http://" + net.JoinHostPort(a.Address, strconv.Itoa(port)), nil
			}
		}
		return "", fmt.Errorf("node %s has no InternalIP to reach its agent at", node)
	}
}

// Checkpoint asks node's agent to have its kubelet checkpoint container
// of pod ns/pod, with timeout for the runtime, and returns the archive's
// path on the node. It sends the CheckpointToken of node and ns, not the
// agents' token.
func (c Client) Checkpoint(ctx context.Context, node, ns, pod, container string, timeout time.Duration) (string, error) {
	secs := max(1, int(timeout.Round(time.Second)/time.Second))
	var res CheckpointResponse
	req := CheckpointRequest{Namespace: ns, Pod: pod, Container: container, TimeoutSeconds: secs}
	if err := c.doAs(ctx, CheckpointToken(c.Token, node, ns), node, http.MethodPost, "/v1/checkpoints", req, &res); err != nil {
		return "", err
	}
	if res.Archive == "" {
		return "", fmt.Errorf("the agent on node %s answered no archive", node)
	}
	return res.Archive, nil
}

// RawCheckpoint sends req to node's agent with token as the bearer, as
// it is: for tests that play a caller with a token of their choosing.
func (c Client) RawCheckpoint(ctx context.Context, token, node string, req CheckpointRequest) error {
	return c.doAs(ctx, token, node, http.MethodPost, "/v1/checkpoints", req, &CheckpointResponse{})
}

// BuildCheckpointImage asks node's agent to build and push the image.
func (c Client) BuildCheckpointImage(ctx context.Context, node, archive, container, ref string) (string, error) {
	var res BuildResponse
	if err := c.do(ctx, node, http.MethodPost, "/v1/checkpoint-images", BuildRequest{Archive: archive, Container: container, Ref: ref}, &res); err != nil {
		return "", err
	}
	return res.Image, nil
}

// DeleteCheckpointImage asks node's agent to delete the checkpoint image
// ref from the registry; one that is not there is no error.
func (c Client) DeleteCheckpointImage(ctx context.Context, node, ref string) error {
	return c.do(ctx, node, http.MethodDelete, "/v1/checkpoint-images?ref="+url.QueryEscape(ref), nil, nil)
}

// PullImage asks node's agent to pull ref through the runtime, with auth
// (the pod's pull secret for ref's registry) when it is not nil.
func (c Client) PullImage(ctx context.Context, node, ref string, auth *contract.RegistryAuth) error {
	return c.do(ctx, node, http.MethodPost, "/v1/pulls", PullRequest{Ref: ref, Auth: auth}, nil)
}

// NodeCapabilities asks node's agent what the node's runtime can do. An
// older agent, without GET /v1/node, answers an error.
func (c Client) NodeCapabilities(ctx context.Context, node string) (contract.NodeCapabilities, error) {
	var res contract.NodeCapabilities
	if err := c.do(ctx, node, http.MethodGet, "/v1/node", nil, &res); err != nil {
		return contract.NodeCapabilities{}, err
	}
	res.Node = node
	return res, nil
}

// ReadLog returns the end of a log file on node.
func (c Client) ReadLog(ctx context.Context, node, path string) (string, error) {
	var out bytes.Buffer
	if err := c.do(ctx, node, http.MethodGet, "/v1/logs?path="+url.QueryEscape(path), nil, &out); err != nil {
		return "", err
	}
	return out.String(), nil
}

// WatchFreeze watches the container containerID of the pod podUID on
// node until it is in state (Frozen or Thawed), for at most timeout. It
// returns once the agent's watch is in place; wait blocks until the state
// is seen (nil), or not in time, or ctx ends (an error).
func (c Client) WatchFreeze(ctx context.Context, node, podUID, containerID, state string, timeout time.Duration) (wait func() error, err error) {
	w, err := c.watch(ctx, node, podUID, containerID, state, false, timeout)
	if err != nil {
		return nil, err
	}
	return func() error {
		_, err := w()
		return err
	}, nil
}

// WatchDump watches the container containerID of the pod podUID on node
// until CRIU has dumped it (Dumped), for at most timeout; with thaw, the
// agent then has the runtime resume the container if it is still frozen.
// It returns once the agent's watch is in place; wait blocks until the
// dump is seen, and says whether the agent thawed the container (and if
// it was asked to and did not, why not in noThaw) and how long CRIU held
// the tasks (from the first poll that saw it tracing them to the one that
// saw them free), or fails when not in time or ctx ends.
func (c Client) WatchDump(ctx context.Context, node, podUID, containerID string, thaw bool, timeout time.Duration) (wait func() (thawed bool, noThaw string, criu time.Duration, err error), err error) {
	w, err := c.watch(ctx, node, podUID, containerID, Dumped, thaw, timeout)
	if err != nil {
		return nil, err
	}
	return func() (bool, string, time.Duration, error) {
		res, err := w()
		return res.ThawedByUs, res.NoThaw, res.CRIU(), err
	}, nil
}

func (c Client) watch(ctx context.Context, node, podUID, containerID, state string, thaw bool, timeout time.Duration) (wait func() (FreezeResult, error), err error) {
	q := url.Values{"pod": {podUID}, "container": {containerID}, "state": {state}, "timeout": {timeout.String()}}
	if thaw {
		q.Set("thaw", "true")
	}
	resp, err := c.send(ctx, c.Token, node, http.MethodGet, "/v1/freeze?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, 1<<20))
	var watching FreezeWatching
	if err := dec.Decode(&watching); err != nil || watching.Watching == "" {
		resp.Body.Close()
		return nil, fmt.Errorf("the agent on node %s: its freeze watch did not start (%v)", node, err)
	}
	return func() (FreezeResult, error) {
		defer resp.Body.Close()
		var res struct {
			FreezeResult
			Error string `json:"error"`
		}
		if err := dec.Decode(&res); err != nil {
			return FreezeResult{}, fmt.Errorf("the agent on node %s: freeze watch of %s: %w", node, watching.Watching, err)
		}
		if res.Error != "" || res.State != state {
			return FreezeResult{}, fmt.Errorf("the agent on node %s: freeze watch: %s", node, res.Error)
		}
		return res.FreezeResult, nil
	}, nil
}

func (c Client) do(ctx context.Context, node, method, path string, body, out any) error {
	return c.doAs(ctx, c.Token, node, method, path, body, out)
}

func (c Client) doAs(ctx context.Context, token, node, method, path string, body, out any) error {
	resp, err := c.send(ctx, token, node, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	switch o := out.(type) {
	case nil:
		return nil
	case *bytes.Buffer:
		o.Write(b)
		return nil
	default:
		return json.Unmarshal(b, out)
	}
}

// send sends a request to node's agent and returns an answer that is 200
// OK, its body unread.
func (c Client) send(ctx context.Context, token, node, method, path string, body any) (*http.Response, error) {
	base, err := c.Resolve(ctx, node)
	if err != nil {
		return nil, err
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	if c.TLS != nil {
		base = "https://" + strings.TrimPrefix(strings.TrimPrefix(base, "http://"), "https://")
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(base, "/")+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Minute}
		if c.TLS != nil {
			// No idle connections kept: Client is a value, made per
			// use, and the calls of a migration are few.
			hc.Transport = &http.Transport{TLSClientConfig: c.TLS, Proxy: http.ProxyFromEnvironment, TLSHandshakeTimeout: 10 * time.Second, DisableKeepAlives: true}
		}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the agent on node %s (%s): %w", node, base, err)
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		return nil, fmt.Errorf("the agent on node %s: %s", node, e.Error)
	}
	return nil, fmt.Errorf("the agent on node %s: %s: %s", node, resp.Status, bytes.TrimSpace(b))
}
