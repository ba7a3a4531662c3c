package webhook

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ms2m/ms2m/internal/selfsigned"
)

// File names in the cert dir: the names controller-runtime's webhook
// server and cert-manager's Secrets use.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// ServiceHosts are the DNS names under which the API server reaches the
// Service name in namespace ns.
func ServiceHosts(name, ns string) []string {
	return []string{name, name + "." + ns, name + "." + ns + ".svc", name + "." + ns + ".svc.cluster.local"}
}

// CAName is the common name of the self-signed bootstrap's CA.
const CAName = "ms2m-webhook-ca"

// WriteCerts puts the key, the certificate and the CA of s into dir
// (created if need be) as KeyFile, CertFile and CAFile, each file replaced
// in one rename so that the server's cert watcher never reads half a file.
// The key is written first: a watcher that sees the new certificate then
// finds its key.
func WriteCerts(dir string, s selfsigned.Pair) error {
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
