package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// File names in the cert dir: the names controller-runtime's webhook
// server and cert-manager's Secrets use.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// SelfSigned is a CA and a serving certificate signed by it, PEM encoded.
type SelfSigned struct {
	CA, Cert, Key []byte
}

// ServiceHosts are the DNS names under which the API server reaches the
// Service name in namespace ns.
func ServiceHosts(name, ns string) []string {
	return []string{name, name + "." + ns, name + "." + ns + ".svc", name + "." + ns + ".svc.cluster.local"}
}

// GenerateSelfSigned makes a new CA and a serving certificate for hosts
// (DNS names or IP addresses), both valid from an hour before now (for
// clock skew) for validity. Keys are ECDSA P-256.
func GenerateSelfSigned(hosts []string, now time.Time, validity time.Duration) (SelfSigned, error) {
	if len(hosts) == 0 {
		return SelfSigned{}, errors.New("self-signed certificate: no host names")
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return SelfSigned{}, fmt.Errorf("self-signed certificate: CA key: %w", err)
	}
	notBefore, notAfter := now.Add(-time.Hour), now.Add(validity)
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "ms2m-webhook-ca"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return SelfSigned{}, fmt.Errorf("self-signed certificate: CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return SelfSigned{}, fmt.Errorf("self-signed certificate: CA: %w", err)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return SelfSigned{}, fmt.Errorf("self-signed certificate: serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return SelfSigned{}, fmt.Errorf("self-signed certificate: serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return SelfSigned{}, fmt.Errorf("self-signed certificate: serving key: %w", err)
	}
	return SelfSigned{
		CA:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// Write puts the key, the certificate and the CA into dir (created if
// need be), each file replaced in one rename so that the server's cert
// watcher never reads half a file. The key is written first: a watcher
// that sees the new certificate then finds its key.
func (s SelfSigned) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write certificates: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{{KeyFile, s.Key, 0o600}, {CertFile, s.Cert, 0o644}, {CAFile, s.CA, 0o644}} {
		if err := writeFileAtomic(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return fmt.Errorf("write certificates to MS2M_WEBHOOK_CERT_DIR=%s: %w", dir, err)
		}
	}
	return nil
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// PatchCABundle sets ca as the caBundle of every webhook in the
// MutatingWebhookConfiguration name, retrying on update conflicts. It does
// nothing if every caBundle already equals ca.
func PatchCABundle(ctx context.Context, c client.Client, name string, ca []byte) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := c.Get(ctx, types.NamespacedName{Name: name}, mwc); err != nil {
			return fmt.Errorf("read MutatingWebhookConfiguration %s (MS2M_WEBHOOK_CONFIG_NAME) to set its caBundle: %w", name, err)
		}
		if len(mwc.Webhooks) == 0 {
			return fmt.Errorf("MutatingWebhookConfiguration %s (MS2M_WEBHOOK_CONFIG_NAME) has no webhooks to set the caBundle of", name)
		}
		changed := false
		for i := range mwc.Webhooks {
			if !bytes.Equal(mwc.Webhooks[i].ClientConfig.CABundle, ca) {
				mwc.Webhooks[i].ClientConfig.CABundle = ca
				changed = true
			}
		}
		if !changed {
			return nil
		}
		if err := c.Update(ctx, mwc); err != nil {
			return fmt.Errorf("set the caBundle of MutatingWebhookConfiguration %s: %w", name, err)
		}
		return nil
	})
}
