package selfsigned

import (
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"
)

// A certificate from New verifies against its CA for every host it was
// made for, by name or address, and for no other, nor outside its
// validity; it loads as a key pair.
func TestNewVerifies(t *testing.T) {
	now := time.Now()
	hosts := []string{"ms2m-webhook", "ms2m-webhook.ms2m-system.svc", "127.0.0.1", "::1"}
	p, err := New("ms2m-webhook-ca", hosts, now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := p.TLS()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(p.CA) {
		t.Fatal("CA holds no certificate")
	}
	for _, h := range hosts {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: roots, CurrentTime: now}); err != nil {
			t.Errorf("verify for %s: %v", h, err)
		}
	}
	for _, h := range []string{"other.ms2m-system.svc", "127.0.0.2"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: roots, CurrentTime: now}); err == nil {
			t.Errorf("the certificate verifies for %s, which it was not made for", h)
		}
	}
	for _, at := range []time.Time{now.Add(-2 * time.Hour), now.Add(25 * time.Hour)} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: hosts[0], Roots: roots, CurrentTime: at}); err == nil {
			t.Errorf("the certificate verifies at %s, outside its validity", at)
		}
	}
	// Another Pair's CA does not vouch for it.
	other, err := New("ms2m-webhook-ca", hosts, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherRoots := x509.NewCertPool()
	otherRoots.AppendCertsFromPEM(other.CA)
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: hosts[0], Roots: otherRoots, CurrentTime: now}); err == nil {
		t.Error("the certificate verifies against another CA of the same name")
	}
	for name, b := range map[string][]byte{"CA": p.CA, "Cert": p.Cert, "Key": p.Key} {
		if blk, _ := pem.Decode(b); blk == nil || !strings.HasSuffix(blk.Type, map[string]string{"CA": "CERTIFICATE", "Cert": "CERTIFICATE", "Key": "PRIVATE KEY"}[name]) {
			t.Errorf("%s is not the PEM block it should be", name)
		}
	}
}

func TestNewRefusesNoHosts(t *testing.T) {
	if _, err := New("ca", nil, time.Now(), time.Hour); err == nil {
		t.Error("New with no hosts: no error")
	}
	if _, err := New("ca", []string{"h"}, time.Now(), 0); err == nil {
		t.Error("New with no validity: no error")
	}
}
