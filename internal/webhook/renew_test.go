package webhook

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestSelfSignedRenewsWithoutRestart runs the webhook with a self-signed
// certificate valid for 9 s (MS2M_WEBHOOK_CERT_VALIDITY allows no less
// than an hour; the field is set directly): it must serve a new one before
// the first expires, without a restart, one that the caBundle already
// trusts and that the API server accepts; pods are still injected after
// the first certificate has expired. 58fa1c0 made the certificate once, at
// start, and never again.
func TestSelfSignedRenewsWithoutRestart(t *testing.T) {
	c := requireSuite(t)
	ctx := t.Context()
	const validity = 9 * time.Second
	r := startRun(t, c, func(cfg *Config) { cfg.CertValidity = validity })

	first := served(t, r.port)
	testenv.Eventually(t, 3*validity, "a renewed certificate to be served", func() bool {
		return served(t, r.port).SerialNumber.Cmp(first.SerialNumber) != 0
	})
	renewed := served(t, r.port)
	if time.Until(first.NotAfter) < 0 {
		t.Errorf("the first certificate expired (%s) before the renewed one was served", first.NotAfter)
	}

	// The caBundle trusts the certificate served now.
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := c.Get(ctx, client.ObjectKey{Name: r.mwcName}, mwc); err != nil {
		t.Fatal(err)
	}
	for _, wh := range mwc.Webhooks {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(wh.ClientConfig.CABundle) {
			t.Fatalf("webhook %s: caBundle holds no certificate", wh.Name)
		}
		if _, err := renewed.Verify(x509.VerifyOptions{Roots: pool}); err != nil {
			t.Errorf("webhook %s: the caBundle does not trust the renewed certificate: %v", wh.Name, err)
		}
	}
	// The cert dir has it too (tools that read ca.crt and tls.crt).
	if b, err := os.ReadFile(filepath.Join(r.certDir, CertFile)); err != nil {
		t.Error(err)
	} else if blk, _ := pem.Decode(b); blk == nil {
		t.Errorf("%s holds no certificate", CertFile)
	}

	// Once the first certificate has expired, the API server still calls
	// the webhook.
	testenv.Eventually(t, validity, "the first certificate to expire", func() bool { return time.Now().After(first.NotAfter) })
	ns := newNamespace(t, c, map[string]string{skipLabel: r.mwcName, contract.LabelNamespaceInject: "enabled"})
	pod := appPod(ns, "after-renewal", nil)
	if err := c.Create(ctx, pod); err != nil {
		t.Fatalf("create after the first certificate expired: %v", err)
	}
	if len(sidecars(pod)) != 1 {
		t.Errorf("the pod was not injected after the renewal: init containers %v", pod.Spec.InitContainers)
	}
}

// served is the certificate the webhook on port serves now.
func served(t *testing.T, port int) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("TLS to the webhook: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}
