package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ms2m/ms2m/internal/sign"
)

// Kubelet calls the checkpoint API of the agent's own node's kubelet
// directly (POST /checkpoint/{namespace}/{pod}/{container} on its port),
// not through the API server's node proxy: the agent's identity then needs
// create on nodes/checkpoint, which the kubelet checks (webhook
// authorization) for that path alone, where the proxy needs nodes/proxy, the
// kubelet's whole API on every node.
type Kubelet struct {
	// URL is the kubelet's base URL: https://<the node's address>:10250.
	URL string
	// TokenFile holds the bearer token the kubelet authenticates (webhook
	// authentication, a TokenReview): the agent's ServiceAccount token. It
	// is read for every call, so that a projected token that the kubelet
	// rotates is always the current one.
	TokenFile string
	// HTTP is the client, with the CA the kubelet's serving certificate is
	// checked against. Its timeout, if any, must outlast a checkpoint.
	HTTP *http.Client
}

// KubeletError is the kubelet's answer to a checkpoint it did not take:
// its status code and its own words (which carry the runtime's and
// CRIU's).
type KubeletError struct {
	Code    int
	Message string
}

func (e *KubeletError) Error() string {
	s := fmt.Sprintf("the kubelet answered %d %s", e.Code, http.StatusText(e.Code))
	if e.Message != "" {
		s += ": the kubelet says: " + e.Message
	}
	switch e.Code {
	case http.StatusUnauthorized:
		s += "; the kubelet did not accept the agent's ServiceAccount token: it needs webhook authentication on (authentication.webhook.enabled)"
	case http.StatusForbidden:
		s += "; the agent's ServiceAccount needs create on nodes/checkpoint, and the kubelet webhook authorization (authorization.mode: Webhook)"
	}
	return s
}

// Checkpoint asks the kubelet to checkpoint container of pod ns/pod, with
// timeout for the runtime, and returns the archive's path on the node. A
// pod the kubelet does not run (one on another node) is a 404.
func (k Kubelet) Checkpoint(ctx context.Context, ns, pod, container string, timeout time.Duration) (string, error) {
	tok, err := os.ReadFile(k.TokenFile)
	if err != nil {
		return "", fmt.Errorf("the agent's token for the kubelet (MS2M_AGENT_KUBELET_TOKEN_FILE): %w", err)
	}
	secs := max(1, int(timeout.Round(time.Second)/time.Second))
	u := strings.TrimSuffix(k.URL, "/") + "/checkpoint/" + url.PathEscape(ns) + "/" + url.PathEscape(pod) + "/" + url.PathEscape(container) + "?timeout=" + strconv.Itoa(secs)
	ctx, cancel := context.WithTimeout(ctx, timeout+10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	hc := k.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("the kubelet at %s: %w", k.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("the kubelet at %s: reading its answer: %w", k.URL, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", &KubeletError{Code: resp.StatusCode, Message: kubeletMessage(body)}
	}
	return ParseCheckpointResponse(body)
}

// ParseCheckpointResponse reads the kubelet's answer to a checkpoint:
// {"items":["<path>"]}.
func ParseCheckpointResponse(body []byte) (string, error) {
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

// kubeletMessage is the kubelet's own words from an error body: a
// Status's message, or the text as it is.
func kubeletMessage(body []byte) string {
	var status struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &status) == nil && status.Message != "" {
		return truncate([]byte(status.Message))
	}
	return truncate(bytes.TrimSpace(body))
}

func truncate(b []byte) string {
	const n = 2000
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// checkpointTokenContext keeps checkpoint tokens apart from every other
// MAC made with the agents' token.
const checkpointTokenContext = "ms2m agent checkpoint v1"

// CheckpointToken is the bearer token for a checkpoint of a pod in
// namespace on node: derived from the agents' token, so that the migrator
// makes one per call, and each is good for that node and namespace only.
// The agents' token itself is not accepted for a checkpoint.
func CheckpointToken(agentToken, node, namespace string) string {
	return sign.MAC([]byte(agentToken), checkpointTokenContext, node, namespace)
}

// CheckpointRequest asks the agent for a checkpoint by its node's kubelet.
type CheckpointRequest struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
	// TimeoutSeconds is the kubelet's (and so the runtime's) timeout.
	TimeoutSeconds int `json:"timeoutSeconds"`
}

// CheckpointResponse is the archive the kubelet wrote.
type CheckpointResponse struct {
	Archive string        `json:"archive"` // its path on the node
	Took    time.Duration `json:"took"`
}

// maxCheckpointTimeout bounds a checkpoint request's timeout.
const maxCheckpointTimeout = 30 * time.Minute

// checkRequest says what is wrong with a checkpoint request, if anything.
func (req CheckpointRequest) check() error {
	if errs := validation.IsDNS1123Label(req.Namespace); len(errs) > 0 {
		return fmt.Errorf("namespace %q: %s", req.Namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(req.Pod); len(errs) > 0 {
		return fmt.Errorf("pod %q: %s", req.Pod, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Label(req.Container); len(errs) > 0 {
		return fmt.Errorf("container %q: %s", req.Container, strings.Join(errs, "; "))
	}
	if req.TimeoutSeconds <= 0 || time.Duration(req.TimeoutSeconds)*time.Second > maxCheckpointTimeout {
		return fmt.Errorf("timeoutSeconds %d: want 1 to %d", req.TimeoutSeconds, int(maxCheckpointTimeout/time.Second))
	}
	return nil
}

// checkpoint has the node's kubelet checkpoint a container (POST
// /v1/checkpoints, a CheckpointRequest). The bearer token must be the
// CheckpointToken of this agent's node and the request's namespace; the
// kubelet is this node's, so a pod on another node is unknown to it.
func (s *Server) checkpoint(w http.ResponseWriter, r *http.Request) {
	var req CheckpointRequest
	if err := decode(r, &req); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	if err := req.check(); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || !sign.Valid([]byte(s.cfg.Token), got, checkpointTokenContext, s.cfg.NodeName, req.Namespace) {
		httpError(w, http.StatusUnauthorized, fmt.Errorf("the token is not this agent's checkpoint token for node %s and namespace %s", s.cfg.NodeName, req.Namespace))
		return
	}
	if s.cfg.Kubelet == nil {
		httpError(w, http.StatusNotImplemented, errors.New("this agent has no kubelet to checkpoint with (MS2M_AGENT_KUBELET_URL)"))
		return
	}
	t0 := time.Now()
	entry, done, err := s.jan.begin(req.Namespace, req.Pod, req.Container)
	if err != nil {
		httpError(w, http.StatusInternalServerError, err)
		return
	}
	defer done()
	archive, err := s.cfg.Kubelet.Checkpoint(r.Context(), req.Namespace, req.Pod, req.Container, time.Duration(req.TimeoutSeconds)*time.Second)
	if err == nil {
		err = s.jan.taken(entry, archive)
	}
	if err != nil || r.Context().Err() != nil {
		// The runtime may have left the app paused (unpause.go).
		why := "failed"
		if err == nil {
			why = "its caller went away"
		}
		defer func() { go s.unpauseAfter(req.Namespace, req.Pod, req.Container, why) }()
	}
	if err == nil && r.Context().Err() != nil {
		// The caller went away while the kubelet checkpointed: nobody
		// will build from the archive.
		if !s.cfg.KeepArchives && filepath.Dir(filepath.Clean(archive)) == filepath.Clean(s.cfg.CheckpointDir) {
			if rerr := os.Remove(archive); rerr == nil {
				s.jan.built(archive)
			}
		}
		return
	}
	if err != nil {
		code := http.StatusBadGateway
		var ke *KubeletError
		if errors.As(err, &ke) && ke.Code == http.StatusNotFound {
			code = http.StatusNotFound
		}
		s.log.Warn("checkpoint failed", "namespace", req.Namespace, "pod", req.Pod, "container", req.Container, "err", err)
		httpError(w, code, err)
		return
	}
	res := CheckpointResponse{Archive: archive, Took: time.Since(t0)}
	s.log.Info("checkpoint taken", "namespace", req.Namespace, "pod", req.Pod, "container", req.Container, "archive", archive, "took", res.Took)
	writeJSON(w, res)
}
