package agent

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/selfsigned"
)

// fakeKubelet answers POST /checkpoint/{ns}/{pod}/{container} for the pods
// it runs, as the kubelet does (404 for others), and records the bearer
// tokens it was sent. It stands in for the kubelet in these unit tests of
// the agent's own checks; the e2e suite calls real kubelets.
type fakeKubelet struct {
	mu     sync.Mutex
	pods   map[string]bool // ns/pod/container
	tokens []string
	fail   string // if set, answered with 500 and this body
}

func (k *fakeKubelet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.tokens = append(k.tokens, r.Header.Get("Authorization"))
	p, ok := strings.CutPrefix(r.URL.Path, "/checkpoint/")
	if r.Method != http.MethodPost || !ok {
		http.NotFound(w, r)
		return
	}
	if k.fail != "" {
		http.Error(w, k.fail, http.StatusInternalServerError)
		return
	}
	if !k.pods[p] {
		http.Error(w, `{"kind":"Status","message":"pod does not exist"}`, http.StatusNotFound)
		return
	}
	_, _ = w.Write([]byte(`{"items":["/var/lib/kubelet/checkpoints/checkpoint-x.tar"]}`))
}

// agentWithKubelet serves an agent of node-1 whose kubelet is k, and
// returns a client of it (node-1 and node-2 both resolve to it, as if
// node-2's agent's address were taken over).
func agentWithKubelet(t *testing.T, k *fakeKubelet) Client {
	t.Helper()
	ks := httptest.NewTLSServer(k)
	t.Cleanup(ks.Close)
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte("sa-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(Config{CheckpointDir: t.TempDir(), Token: "tok", NodeName: "node-1",
		Kubelet: &Kubelet{URL: ks.URL, TokenFile: tokFile, HTTP: ks.Client()}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return Client{Token: "tok", Resolve: func(context.Context, string) (string, error) { return srv.URL, nil }}
}

func TestCheckpointThroughTheKubelet(t *testing.T) {
	k := &fakeKubelet{pods: map[string]bool{"shop/app-0/app": true}}
	c := agentWithKubelet(t, k)
	got, err := c.Checkpoint(t.Context(), "node-1", "shop", "app-0", "app", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got != "/var/lib/kubelet/checkpoints/checkpoint-x.tar" {
		t.Errorf("archive %q", got)
	}
	if len(k.tokens) != 1 || k.tokens[0] != "Bearer sa-token" {
		t.Errorf("the kubelet was sent %q, want the agent's ServiceAccount token from its file", k.tokens)
	}
}

// TestCheckpointTokenIsForOneNodeAndNamespace plays a caller that holds a
// checkpoint token and wants another pod's memory with it.
func TestCheckpointTokenIsForOneNodeAndNamespace(t *testing.T) {
	k := &fakeKubelet{pods: map[string]bool{"shop/app-0/app": true, "bank/ledger-0/app": true}}
	c := agentWithKubelet(t, k)
	ask := func(token, ns, pod string) error {
		return c.doAs(t.Context(), token, "node-1", http.MethodPost, "/v1/checkpoints",
			CheckpointRequest{Namespace: ns, Pod: pod, Container: "app", TimeoutSeconds: 10}, &CheckpointResponse{})
	}
	for name, tc := range map[string]struct {
		token, ns, pod string
		want           string
	}{
		"shop's token for bank's pod":    {CheckpointToken("tok", "node-1", "shop"), "bank", "ledger-0", "not this agent's checkpoint token for node node-1 and namespace bank"},
		"node-2's token on node-1":       {CheckpointToken("tok", "node-2", "shop"), "shop", "app-0", "not this agent's checkpoint token for node node-1"},
		"the agents' token itself":       {"tok", "shop", "app-0", "not this agent's checkpoint token"},
		"a token made with another key":  {CheckpointToken("other", "node-1", "shop"), "shop", "app-0", "not this agent's checkpoint token"},
		"no token":                       {"", "shop", "app-0", "not this agent's checkpoint token"},
		"a pod the kubelet does not run": {CheckpointToken("tok", "node-1", "shop"), "shop", "elsewhere-0", "the kubelet answered 404 Not Found: the kubelet says: pod does not exist"},
	} {
		t.Run(name, func(t *testing.T) {
			k.mu.Lock()
			before := len(k.tokens)
			k.mu.Unlock()
			err := ask(tc.token, tc.ns, tc.pod)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to say %q", err, tc.want)
			}
			k.mu.Lock()
			defer k.mu.Unlock()
			if called := len(k.tokens) > before; called != strings.Contains(tc.want, "kubelet") {
				t.Errorf("kubelet called: %v", called)
			}
		})
	}
	// The right token for the right namespace works.
	if err := ask(CheckpointToken("tok", "node-1", "bank"), "bank", "ledger-0"); err != nil {
		t.Errorf("bank's token for bank's pod: %v", err)
	}
}

func TestCheckpointBadRequests(t *testing.T) {
	k := &fakeKubelet{pods: map[string]bool{}}
	c := agentWithKubelet(t, k)
	for name, req := range map[string]CheckpointRequest{
		"a path in the namespace": {Namespace: "../pods", Pod: "a", Container: "app", TimeoutSeconds: 1},
		"a path in the pod":       {Namespace: "shop", Pod: "a/../../x", Container: "app", TimeoutSeconds: 1},
		"no container":            {Namespace: "shop", Pod: "a", TimeoutSeconds: 1},
		"no timeout":              {Namespace: "shop", Pod: "a", Container: "app"},
		"a day's timeout":         {Namespace: "shop", Pod: "a", Container: "app", TimeoutSeconds: 86400},
	} {
		err := c.doAs(t.Context(), CheckpointToken("tok", "node-1", req.Namespace), "node-1", http.MethodPost, "/v1/checkpoints", req, &CheckpointResponse{})
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if len(k.tokens) != 0 {
		t.Errorf("the kubelet was called %d times for bad requests", len(k.tokens))
	}
}

func TestCheckpointKubeletErrorsAreQuoted(t *testing.T) {
	k := &fakeKubelet{fail: "checkpointing of shop/app-0/app failed: CRIU: Can't dump ghost file"}
	c := agentWithKubelet(t, k)
	_, err := c.Checkpoint(t.Context(), "node-1", "shop", "app-0", "app", time.Minute)
	if err == nil || !strings.Contains(err.Error(), "the kubelet says: checkpointing of shop/app-0/app failed: CRIU: Can't dump ghost file") {
		t.Fatalf("err = %v, want the kubelet's words", err)
	}
	if msg := (&KubeletError{Code: http.StatusForbidden}).Error(); !strings.Contains(msg, "needs create on nodes/checkpoint") {
		t.Errorf("403: %q, want the missing RBAC named", msg)
	}
}

func TestParseCheckpointResponse(t *testing.T) {
	for name, tc := range map[string]struct {
		body    string
		want    string
		wantErr string
	}{
		"one archive":   {body: `{"items":["/var/lib/kubelet/checkpoints/checkpoint-a_default-app-2026.tar"]}`, want: "/var/lib/kubelet/checkpoints/checkpoint-a_default-app-2026.tar"},
		"no items":      {body: `{"items":[]}`, wantErr: "want one archive path"},
		"two items":     {body: `{"items":["/a.tar","/b.tar"]}`, wantErr: "want one archive path"},
		"not json":      {body: `checkpointing failed`, wantErr: "not the expected JSON"},
		"empty archive": {body: `{"items":[""]}`, wantErr: "want one archive path"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := ParseCheckpointResponse([]byte(tc.body))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("= %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestAgentServesTLSOnly: a client that trusts the chart's CA reaches the
// agent; a plain-HTTP call, a client of another CA, and a client that
// expects another name do not.
func TestAgentServesTLSOnly(t *testing.T) {
	dir := t.TempDir()
	pair, err := selfsigned.New("ms2m agent CA", []string{"ms2m-agent.ms2m-system"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	for f, b := range map[string][]byte{certFile: pair.Cert, keyFile: pair.Key, caFile: pair.CA} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sc, err := ServerTLS(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(Config{CheckpointDir: dir, Token: "tok", Node: fixedProbe{}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, tls.NewListener(ln, sc)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	addr := ln.Addr().String()
	resolve := func(context.Context, string) (string, error) { return "http://" + addr, nil }

	good, err := ClientTLS(caFile, "ms2m-agent.ms2m-system")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (Client{Token: "tok", Resolve: resolve, TLS: good}).NodeCapabilities(t.Context(), "node-1"); err != nil {
		t.Fatalf("over TLS with the chart's CA: %v", err)
	}
	if _, err := (Client{Token: "tok", Resolve: resolve}).NodeCapabilities(t.Context(), "node-1"); err == nil {
		t.Error("a plain-HTTP call was answered")
	}
	other, err := selfsigned.New("another CA", []string{"ms2m-agent.ms2m-system"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherCA := filepath.Join(dir, "other.crt")
	if err := os.WriteFile(otherCA, other.CA, 0o600); err != nil {
		t.Fatal(err)
	}
	bad, err := ClientTLS(otherCA, "ms2m-agent.ms2m-system")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (Client{Token: "tok", Resolve: resolve, TLS: bad}).NodeCapabilities(t.Context(), "node-1"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client of another CA: %v, want a certificate error", err)
	}
	wrongName, err := ClientTLS(caFile, "evil.example")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (Client{Token: "tok", Resolve: resolve, TLS: wrongName}).NodeCapabilities(t.Context(), "node-1"); err == nil {
		t.Error("a client expecting another name was answered")
	}
	// A renewed certificate is served without a restart.
	renewed, err := selfsigned.New("ms2m agent CA 2", []string{"ms2m-agent.ms2m-system"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, renewed.Key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, append(renewed.Cert, '\n'), 0o600); err != nil { // another size: seen as changed at once
		t.Fatal(err)
	}
	if _, err := (Client{Token: "tok", Resolve: resolve, TLS: good}).NodeCapabilities(t.Context(), "node-1"); err == nil {
		t.Error("the renewed certificate passed with the old CA")
	}
	// The client reads the renewed CA file without a restart.
	if err := os.WriteFile(caFile, append(renewed.CA, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (Client{Token: "tok", Resolve: resolve, TLS: good}).NodeCapabilities(t.Context(), "node-1"); err != nil {
		t.Errorf("after the renewal, with the CA file renewed too: %v", err)
	}
	if p, _ := pem.Decode(pair.CA); p == nil {
		t.Error("the CA is not PEM")
	}
}

type fixedProbe struct{}

func (fixedProbe) Probe(context.Context) contract.NodeCapabilities {
	return contract.NodeCapabilities{}
}
