package webhook

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/selfsigned"
)

// The bootstrap's files, as the server's cert watcher and the caBundle
// read them, serve the Service's names (internal/selfsigned's
// TestNewVerifies checks the certificates themselves).
func TestSelfSignedCertificates(t *testing.T) {
	now := time.Now()
	hosts := append(ServiceHosts("ms2m-webhook", "ms2m-system"), "127.0.0.1")
	s, err := selfsigned.New(CAName, hosts, now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "certs")
	if err := WriteCerts(dir, s); err != nil {
		t.Fatal(err)
	}
	// The files load as a key pair, the way the server's cert watcher
	// loads them.
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode = %v (%v), want 0600", fi.Mode(), err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.crt holds no certificate")
	}
	// The API server reaches the Service by these names.
	for _, h := range append(hosts, "ms2m-webhook.ms2m-system.svc") {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: roots, CurrentTime: now}); err != nil {
			t.Errorf("verify for %s: %v", h, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "other.ms2m-system.svc", Roots: roots, CurrentTime: now}); err == nil {
		t.Error("the certificate verifies for a name it was not made for")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: hosts[2], Roots: roots, CurrentTime: now.Add(25 * time.Hour)}); err == nil {
		t.Error("the certificate verifies after its validity")
	}
	if b, _ := pem.Decode(caPEM); b == nil || b.Type != "CERTIFICATE" {
		t.Errorf("ca.crt is not a PEM certificate")
	}
}
