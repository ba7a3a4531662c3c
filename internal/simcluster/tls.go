package simcluster

import (
	"crypto/tls"
	"time"

	"github.com/ms2m/ms2m/internal/selfsigned"
)

// servingCert returns a serving certificate for a simulated kubelet at ip:
// the API server does not verify kubelets that it has no CA for (no
// --kubelet-certificate-authority), so its CA is thrown away.
func servingCert(ip string) (tls.Certificate, error) {
	p, err := selfsigned.New("simulated kubelet CA", []string{ip}, time.Now(), 24*time.Hour)
	if err != nil {
		return tls.Certificate{}, err
	}
	return p.TLS()
}
