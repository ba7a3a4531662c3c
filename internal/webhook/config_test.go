package webhook

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/ms2m/ms2m/internal/inject"
)

// requiredEnv is the least configuration that loads.
var requiredEnv = map[string]string{
	"MS2M_WEBHOOK_SIDECAR_IMAGE":        "registry.test/ms2m/sidecar:1",
	"MS2M_WEBHOOK_STREAM_URI_SECRET":    "ms2m-broker",
	"MS2M_WEBHOOK_CONTROL_TOKEN_SECRET": "ms2m-control",
}

func validConfig(t *testing.T) Config {
	t.Helper()
	for k, v := range requiredEnv {
		t.Setenv(k, v)
	}
	cfg, err := LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestConfigDefaults(t *testing.T) {
	cfg := validConfig(t)
	got, err := cfg.Inject()
	if err != nil {
		t.Fatal(err)
	}
	want := inject.Config{
		SidecarImage:   "registry.test/ms2m/sidecar:1",
		StreamURI:      inject.SecretKey{Name: "ms2m-broker", Key: "stream-uri"},
		ControlToken:   inject.SecretKey{Name: "ms2m-control", Key: "control-token"},
		ListenPort:     5672,
		NATSListenPort: 4222,
		ControlPort:    8089,
		LogMaxAge:      "24h",
		LogMaxBytes:    1 << 30,
		RunAsUser:      65532,
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
		},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })); diff != "" {
		t.Errorf("inject config (-want +got):\n%s", diff)
	}
	if cfg.Port != 9443 || cfg.SelfSigned || cfg.MetricsAddr != ":8080" || cfg.HealthAddr != ":8081" {
		t.Errorf("defaults: %+v", cfg)
	}
}

// TestConfigBrokerUsers: with per-namespace broker users the sidecar's
// stream URI is the namespace's own Secret, and no shared one is named.
func TestConfigBrokerUsers(t *testing.T) {
	for k, v := range requiredEnv {
		if k != "MS2M_WEBHOOK_STREAM_URI_SECRET" {
			t.Setenv(k, v)
		}
	}
	t.Setenv("MS2M_WEBHOOK_BROKER_USERS", "true")
	cfg, err := LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	ic, err := cfg.Inject()
	if err != nil {
		t.Fatal(err)
	}
	if !ic.BrokerUsers || ic.StreamURI != (inject.SecretKey{}) {
		t.Errorf("inject config: BrokerUsers %v, StreamURI %+v; want true and none", ic.BrokerUsers, ic.StreamURI)
	}
}

func TestConfigErrorsNameTheVariable(t *testing.T) {
	tests := map[string]struct {
		env      map[string]string
		unset    string
		wantVars []string
	}{
		"missing image":       {unset: "MS2M_WEBHOOK_SIDECAR_IMAGE", wantVars: []string{"MS2M_WEBHOOK_SIDECAR_IMAGE"}},
		"port not a number":   {env: map[string]string{"MS2M_WEBHOOK_PORT": "https"}, wantVars: []string{"MS2M_WEBHOOK_PORT"}},
		"port out of range":   {env: map[string]string{"MS2M_WEBHOOK_PORT": "70000"}, wantVars: []string{"MS2M_WEBHOOK_PORT"}},
		"bad secret name":     {env: map[string]string{"MS2M_WEBHOOK_STREAM_URI_SECRET": "Broker_Secret"}, wantVars: []string{"MS2M_WEBHOOK_STREAM_URI_SECRET"}},
		"bad secret key":      {env: map[string]string{"MS2M_WEBHOOK_CONTROL_TOKEN_SECRET_KEY": "a/b"}, wantVars: []string{"MS2M_WEBHOOK_CONTROL_TOKEN_SECRET_KEY"}},
		"bad pull policy":     {env: map[string]string{"MS2M_WEBHOOK_SIDECAR_PULL_POLICY": "Sometimes"}, wantVars: []string{"MS2M_WEBHOOK_SIDECAR_PULL_POLICY"}},
		"same ports":          {env: map[string]string{"MS2M_WEBHOOK_SIDECAR_CONTROL_PORT": "5672"}, wantVars: []string{"MS2M_WEBHOOK_SIDECAR_LISTEN_PORT", "MS2M_WEBHOOK_SIDECAR_CONTROL_PORT"}},
		"bad retention":       {env: map[string]string{"MS2M_WEBHOOK_LOG_MAX_AGE": "a day"}, wantVars: []string{"MS2M_WEBHOOK_LOG_MAX_AGE"}},
		"bad quantity":        {env: map[string]string{"MS2M_WEBHOOK_SIDECAR_MEMORY_LIMIT": "lots"}, wantVars: []string{"MS2M_WEBHOOK_SIDECAR_MEMORY_LIMIT"}},
		"request over limit":  {env: map[string]string{"MS2M_WEBHOOK_SIDECAR_MEMORY_REQUEST": "1Gi"}, wantVars: []string{"MS2M_WEBHOOK_SIDECAR_MEMORY_REQUEST", "MS2M_WEBHOOK_SIDECAR_MEMORY_LIMIT"}},
		"bad metrics address": {env: map[string]string{"MS2M_WEBHOOK_METRICS_ADDR": "8080"}, wantVars: []string{"MS2M_WEBHOOK_METRICS_ADDR"}},
		"bad bool":            {env: map[string]string{"MS2M_WEBHOOK_SELF_SIGNED": "maybe"}, wantVars: []string{"MS2M_WEBHOOK_SELF_SIGNED"}},
		"self-signed without namespace": {
			env:      map[string]string{"MS2M_WEBHOOK_SELF_SIGNED": "true"},
			wantVars: []string{"MS2M_WEBHOOK_SERVICE_NAMESPACE"},
		},
		"bad cert host": {
			env:      map[string]string{"MS2M_WEBHOOK_SELF_SIGNED": "true", "MS2M_WEBHOOK_SERVICE_NAMESPACE": "ms2m", "MS2M_WEBHOOK_CERT_HOSTS": "ok.example,not a host"},
			wantVars: []string{"MS2M_WEBHOOK_CERT_HOSTS"},
		},
		"bad log level": {env: map[string]string{"MS2M_WEBHOOK_LOG_LEVEL": "loud"}, wantVars: []string{"MS2M_WEBHOOK_LOG_LEVEL"}},
		"no stream URI": {unset: "MS2M_WEBHOOK_STREAM_URI_SECRET", wantVars: []string{"MS2M_WEBHOOK_STREAM_URI_SECRET"}},
		// The shared URI beside per-namespace users is refused, not ignored.
		"broker users and the shared URI": {env: map[string]string{"MS2M_WEBHOOK_BROKER_USERS": "true"}, wantVars: []string{"MS2M_WEBHOOK_STREAM_URI_SECRET", "ms2m-broker-user", "unset it"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for k, v := range requiredEnv {
				if k != tc.unset {
					t.Setenv(k, v)
				}
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := LoadConfig()
			if err == nil {
				t.Fatal("LoadConfig succeeded; want an error")
			}
			for _, v := range tc.wantVars {
				if !strings.Contains(err.Error(), v) {
					t.Errorf("error %q does not name %s", err, v)
				}
			}
		})
	}
}

// TestConfigSigningKey: the controller's key reaches the injection config
// from a mounted file or a variable; a short or unreadable key, or both
// set, is a configuration error naming the variable.
func TestConfigSigningKey(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "key")
	if err := os.WriteFile(good, []byte("a-key-of-the-controller-0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		env     map[string]string
		wantKey string
		wantErr string
	}{
		"none":      {env: nil},
		"from file": {env: map[string]string{"MS2M_WEBHOOK_SIGNING_KEY_FILE": good}, wantKey: "a-key-of-the-controller-0123"},
		"from env":  {env: map[string]string{"MS2M_WEBHOOK_SIGNING_KEY": "another-key-0123456789"}, wantKey: "another-key-0123456789"},
		"short":     {env: map[string]string{"MS2M_WEBHOOK_SIGNING_KEY": "short"}, wantErr: "MS2M_WEBHOOK_SIGNING_KEY: the signing key is 5 bytes"},
		"missing":   {env: map[string]string{"MS2M_WEBHOOK_SIGNING_KEY_FILE": filepath.Join(dir, "nope")}, wantErr: "MS2M_WEBHOOK_SIGNING_KEY_FILE: read the signing key"},
		"both":      {env: map[string]string{"MS2M_WEBHOOK_SIGNING_KEY_FILE": good, "MS2M_WEBHOOK_SIGNING_KEY": "another-key-0123456789"}, wantErr: "both set"},
	} {
		t.Run(name, func(t *testing.T) {
			for k, v := range requiredEnv {
				t.Setenv(k, v)
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			cfg, err := LoadConfig()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("LoadConfig = %v; want an error saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ic, err := cfg.Inject()
			if err != nil || string(ic.RestoreKey) != tc.wantKey {
				t.Errorf("Inject().RestoreKey = %q, %v; want %q", ic.RestoreKey, err, tc.wantKey)
			}
		})
	}
}
