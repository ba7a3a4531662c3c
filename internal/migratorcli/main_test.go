package migratorcli

import (
	"bytes"
	"strings"
	"testing"
)

func TestUsageErrors(t *testing.T) {
	t.Setenv("MS2M_AGENT_TOKEN", "")
	t.Setenv("MS2M_IMAGE_REPO", "")
	for name, tc := range map[string]struct {
		args     []string
		wantCode int
		wantErr  []string
	}{
		"no command":      {nil, 2, []string{"Usage:"}},
		"unknown command": {[]string{"moveit"}, 2, []string{`unknown command "moveit"`}},
		"no pod":          {[]string{"migrate", "--to", "n2"}, 2, []string{"exactly one <namespace>/<pod>"}},
		"bad pod":         {[]string{"migrate", "consumer"}, 2, []string{`"consumer" is not <namespace>/<pod>`}},
		"everything missing": {[]string{"migrate", "shop/consumer-0", "--strategy", "teleport", "--thaw-after-dump", "sometimes"}, 2, []string{
			"--to: the target node is required", "--image-repo", `--strategy "teleport"`, "node agents' token", `--thaw-after-dump: thaw-after-dump policy "sometimes"`}},
		"flags after the pod": {[]string{"migrate", "shop/consumer-0", "--to", "n2", "--image-repo", "r/x", "--agent-token-file", "/nonexistent"}, 2, []string{"--agent-token-file: open /nonexistent"}},
		"agent with args":     {[]string{"agent", "now"}, 2, []string{"takes no arguments"}},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := Main(t.Context(), tc.args, &out, &errOut)
			if code != tc.wantCode {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tc.wantCode, errOut.String())
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, errOut.String())
				}
			}
		})
	}
}

func TestAgentConfigErrors(t *testing.T) {
	t.Setenv("MS2M_AGENT_CHECKPOINT_DIR", t.TempDir())
	t.Setenv("MS2M_AGENT_TOKEN", "")
	t.Setenv("MS2M_AGENT_LISTEN", "127.0.0.1:0")
	t.Setenv("MS2M_AGENT_PLAIN_HTTP", "true")
	var out, errOut bytes.Buffer
	if code := Main(t.Context(), []string{"agent"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "MS2M_AGENT_TOKEN") {
		t.Errorf("agent without a token: exit %d, stderr %s", code, errOut.String())
	}
	t.Setenv("MS2M_AGENT_TOKEN", "t")
	t.Setenv("MS2M_AGENT_CHECKPOINT_DIR", "/nonexistent/checkpoints")
	errOut.Reset()
	if code := Main(t.Context(), []string{"agent"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "MS2M_AGENT_CHECKPOINT_DIR=/nonexistent/checkpoints") {
		t.Errorf("agent without its folder: exit %d, stderr %s", code, errOut.String())
	}
	t.Setenv("MS2M_AGENT_CHECKPOINT_DIR", t.TempDir())
	for name, tc := range map[string]struct {
		env  map[string]string
		want string
	}{
		"no TLS":                     {map[string]string{"MS2M_AGENT_PLAIN_HTTP": "false"}, "MS2M_AGENT_TLS_CERT_FILE"},
		"a plain-HTTP kubelet":       {map[string]string{"MS2M_AGENT_KUBELET_URL": "http://10.0.0.7:10250", "NODE_NAME": "n1"}, "want https://"},
		"a kubelet without the node": {map[string]string{"MS2M_AGENT_KUBELET_URL": "https://10.0.0.7:10250", "NODE_NAME": ""}, "NODE_NAME"},
		"no kubelet CA":              {map[string]string{"MS2M_AGENT_KUBELET_URL": "https://10.0.0.7:10250", "NODE_NAME": "n1", "MS2M_AGENT_KUBELET_CA_FILE": "/nonexistent/ca.crt"}, "MS2M_AGENT_KUBELET_CA_FILE"},
	} {
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var out, errOut bytes.Buffer
			if code := Main(t.Context(), []string{"agent"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), tc.want) {
				t.Errorf("exit %d, stderr %s; want 1 and %q", code, errOut.String(), tc.want)
			}
		})
	}
}

func TestControllerConfigErrors(t *testing.T) {
	t.Setenv("MS2M_IMAGE_REPO", "")
	var out, errOut bytes.Buffer
	if code := Main(t.Context(), []string{"controller"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "MS2M_IMAGE_REPO") {
		t.Errorf("controller without an image repo: exit %d, stderr %s", code, errOut.String())
	}
	t.Setenv("MS2M_IMAGE_REPO", "registry.example.com/ckpt")
	t.Setenv("MS2M_THAW_AFTER_DUMP", "sometimes")
	errOut.Reset()
	if code := Main(t.Context(), []string{"controller"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "MS2M_THAW_AFTER_DUMP") {
		t.Errorf("controller with a bad thaw policy: exit %d, stderr %s", code, errOut.String())
	}
	t.Setenv("MS2M_THAW_AFTER_DUMP", "never")
	t.Setenv("MS2M_AGENT_TOKEN", "")
	errOut.Reset()
	if code := Main(t.Context(), []string{"controller"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "MS2M_AGENT_TOKEN") {
		t.Errorf("controller without the agents' token: exit %d, stderr %s", code, errOut.String())
	}
}

func TestAgentListenAddr(t *testing.T) {
	for _, tc := range []struct{ listen, ip, want string }{
		{":8090", "", ":8090"},
		{":8090", "10.0.0.7", "10.0.0.7:8090"},
		{"0.0.0.0:9000", "10.0.0.7", "10.0.0.7:9000"},
		{":8090", "fd00::7", "[fd00::7]:8090"},
	} {
		if got, err := agentListenAddr(tc.listen, tc.ip); err != nil || got != tc.want {
			t.Errorf("agentListenAddr(%q, %q) = %q, %v; want %q", tc.listen, tc.ip, got, err, tc.want)
		}
	}
	for _, bad := range [][2]string{{":8090", "node-a"}, {"8090", "10.0.0.7"}} {
		if _, err := agentListenAddr(bad[0], bad[1]); err == nil {
			t.Errorf("agentListenAddr(%q, %q): no error", bad[0], bad[1])
		}
	}
}
