package simcluster

import (
	"crypto/tls"
	"crypto/x509"
	"time"

	"github.com/ms2m/ms2m/internal/selfsigned"
)

// servingCert returns a serving certificate for a simulated kubelet at ip,
// and the pool of its CA: the API server does not verify kubelets that it
// has no CA for (no --kubelet-certificate-authority); the node's agent,
// which calls its kubelet directly, does.
func servingCert(ip string) (tls.Certificate, *x509.CertPool, error) {
	p, err := selfsigned.New("simulated kubelet CA", []string{ip}, time.Now(), 24*time.Hour)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.CA)
	c, err := p.TLS()
	return c, pool, err
}
