package webhook

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestRunSelfSigned runs the binary's wiring (Run, configured from the
// environment) against the real API server: it makes its own CA and serving
// certificate, sets the caBundle of its MutatingWebhookConfiguration, turns
// ready, injects a pod in a namespace that opted in, and counts it in
// /metrics.
func TestRunSelfSigned(t *testing.T) {
	c := requireSuite(t)
	ctx := t.Context()
	r := startRun(t, c, nil)
	certDir, mwcName, health, metrics := r.certDir, r.mwcName, r.health, r.metrics
	if code, _ := get(t, "http://"+health+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", code)
	}

	ca, err := os.ReadFile(filepath.Join(certDir, CAFile))
	if err != nil {
		t.Fatal(err)
	}
	got := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := c.Get(ctx, client.ObjectKey{Name: mwcName}, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Webhooks[0].ClientConfig.CABundle, ca) {
		t.Fatalf("caBundle of %s is not the CA in %s", mwcName, certDir)
	}

	const series = `ms2m_webhook_admission_requests_total{operation="CREATE",outcome="injected"}`
	_, body := get(t, "http://"+metrics+"/metrics")
	before := sample(body, series) // Run's metrics are process-wide: -count=N runs it N times

	ns := newNamespace(t, c, map[string]string{skipLabel: mwcName, contract.LabelNamespaceInject: "enabled"})
	pod := appPod(ns, "via-run", nil)
	if err := c.Create(ctx, pod); err != nil {
		t.Fatalf("create: %v", err)
	}
	if sc := sidecars(pod); len(sc) != 1 || sc[0].Image != "registry.test/ms2m/sidecar:run" {
		t.Fatalf("the pod was not injected by Run's webhook: init containers %v", pod.Spec.InitContainers)
	}
	if got := envValue(pod.Spec.Containers[0], "AMQP_URL"); got != localURL {
		t.Errorf("AMQP_URL = %q, want %q", got, localURL)
	}

	_, body = get(t, "http://"+metrics+"/metrics")
	if got := sample(body, series); got != before+1 {
		t.Errorf("/metrics: %s = %v, want %v", series, got, before+1)
	}
	if !strings.Contains(body, "ms2m_webhook_admission_duration_seconds_bucket") {
		t.Errorf("/metrics lacks the duration histogram")
	}
}

// sample is the value of series in a Prometheus text exposition, 0 if
// absent.
func sample(body, series string) float64 {
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRunNeedsCertificates: without certificates and without the
// self-signed bootstrap, Run says what to mount.
func TestRunNeedsCertificates(t *testing.T) {
	cfg := validConfig(t)
	cfg.CertDir = t.TempDir()
	err := Run(t.Context(), cfg, nil, logr.Discard())
	if err == nil || !strings.Contains(err.Error(), "MS2M_WEBHOOK_CERT_DIR") || !strings.Contains(err.Error(), "MS2M_WEBHOOK_SELF_SIGNED") {
		t.Errorf("Run = %v, want an error naming MS2M_WEBHOOK_CERT_DIR and MS2M_WEBHOOK_SELF_SIGNED", err)
	}
}

// running is a Run of the webhook binary's wiring, self-signed, with its
// own MutatingWebhookConfiguration for namespaces labelled skipLabel=mwcName.
type running struct {
	certDir, mwcName, health, metrics string
	port                              int
}

// startRun runs Run, configured from the environment and then changed by
// edit (if not nil), until t ends, and waits until it is ready.
func startRun(t *testing.T, c client.Client, edit func(*Config)) running {
	t.Helper()
	ctx := t.Context()
	_, portText, _ := net.SplitHostPort(testenv.FreeAddr(t))
	port, _ := strconv.Atoi(portText)
	health, metrics := testenv.FreeAddr(t), testenv.FreeAddr(t)
	certDir := filepath.Join(t.TempDir(), "certs")
	mwcName := testenv.UniqueName("ms2m-run")

	// The configuration, the way a Helm chart would create it: the
	// caBundle empty, for the webhook to fill. Only namespaces with
	// skipLabel=run go to this webhook (and none to the suite's).
	url := "https://127.0.0.1:" + portText + Path
	mwc := testWebhookConfiguration(mwcName, &admissionregistrationv1.WebhookClientConfig{URL: &url},
		metav1.LabelSelectorRequirement{Key: skipLabel, Operator: metav1.LabelSelectorOpIn, Values: []string{mwcName}})
	if err := c.Create(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.WithoutCancel(t.Context()), mwc) })

	for k, v := range map[string]string{
		"MS2M_WEBHOOK_PORT":                 portText,
		"MS2M_WEBHOOK_CERT_DIR":             certDir,
		"MS2M_WEBHOOK_SIDECAR_IMAGE":        "registry.test/ms2m/sidecar:run",
		"MS2M_WEBHOOK_STREAM_URI_SECRET":    "ms2m",
		"MS2M_WEBHOOK_CONTROL_TOKEN_SECRET": "ms2m",
		"MS2M_WEBHOOK_METRICS_ADDR":         metrics,
		"MS2M_WEBHOOK_HEALTH_ADDR":          health,
		"MS2M_WEBHOOK_SELF_SIGNED":          "true",
		"MS2M_WEBHOOK_SERVICE_NAMESPACE":    "ms2m-system",
		"MS2M_WEBHOOK_CERT_HOSTS":           "127.0.0.1",
		"MS2M_WEBHOOK_CONFIG_NAME":          mwcName,
	} {
		t.Setenv(k, v)
	}
	cfg, err := LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Port != port {
		t.Fatalf("port %d, want %d", cfg.Port, port)
	}
	if edit != nil {
		edit(&cfg)
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(runCtx, cfg, suite.cfg, logr.Discard()) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return within 30s of its context's end")
		}
	})

	testenv.Eventually(t, 30*time.Second, "/readyz to answer 200", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		default:
		}
		code, _ := get(t, "http://"+health+"/readyz")
		return code == http.StatusOK
	})
	return running{certDir: certDir, mwcName: mwcName, health: health, metrics: metrics, port: port}
}
