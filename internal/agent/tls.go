package agent

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// ServerTLS is the agent's TLS configuration: the serving certificate and
// key from certFile and keyFile (a mounted Secret), read again whenever
// the certificate file changes, so that a renewed certificate is served
// without a restart. The files must be readable now.
func ServerTLS(certFile, keyFile string) (*tls.Config, error) {
	fc := &fileCert{cert: certFile, key: keyFile}
	if _, err := fc.get(nil); err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: fc.get}, nil
}

// fileCert is a certificate kept in files, reloaded when they change.
type fileCert struct {
	cert, key string

	mu      sync.Mutex
	mod     time.Time
	size    int64
	current *tls.Certificate
}

func (f *fileCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := os.Stat(f.cert)
	if err != nil {
		if f.current != nil {
			return f.current, nil // mid-swap of the mounted Secret: the last one holds
		}
		return nil, fmt.Errorf("the agent's TLS certificate (MS2M_AGENT_TLS_CERT_FILE): %w", err)
	}
	if f.current != nil && st.ModTime().Equal(f.mod) && st.Size() == f.size {
		return f.current, nil
	}
	c, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		if f.current != nil {
			return f.current, nil // the key not written yet: the old pair until it is
		}
		return nil, fmt.Errorf("the agent's TLS certificate and key (MS2M_AGENT_TLS_CERT_FILE, MS2M_AGENT_TLS_KEY_FILE): %w", err)
	}
	f.current, f.mod, f.size = &c, st.ModTime(), st.Size()
	return f.current, nil
}

// ClientTLS is the migrator's TLS configuration for the agents: their
// certificate must chain to the CA in caFile and name serverName. The
// agents of every node share one certificate, for one name (the chart's
// <release>-agent.<namespace>), since a node's address is not known when
// the certificate is made; the migrator dials the node's InternalIP and
// checks that name. caFile is read again whenever it changes (a renewed
// Secret: cert-manager's self-signed certificate is its own CA), so the
// migrator needs no restart; it must hold a CA now.
func ClientTLS(caFile, serverName string) (*tls.Config, error) {
	if serverName == "" {
		return nil, errors.New("the agents' certificate name (MS2M_AGENT_SERVER_NAME) is not set")
	}
	ca := &fileCA{file: caFile}
	if _, err := ca.pool(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		// The chain is checked in VerifyConnection, against the CA file
		// as it is now; crypto/tls's own check would take a fixed pool.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection below
		VerifyConnection: func(cs tls.ConnectionState) error {
			roots, err := ca.pool()
			if err != nil {
				return err
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the agent sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: serverName})
			if err != nil {
				return fmt.Errorf("the agent's certificate: %w", err)
			}
			return nil
		},
	}, nil
}

// fileCA is a CA bundle kept in a file, read again when it changes.
type fileCA struct {
	file string

	mu      sync.Mutex
	mod     time.Time
	size    int64
	current *x509.CertPool
}

func (f *fileCA) pool() (*x509.CertPool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := os.Stat(f.file)
	if err != nil {
		if f.current != nil {
			return f.current, nil // mid-swap of the mounted Secret
		}
		return nil, fmt.Errorf("the agents' CA (MS2M_AGENT_CA_FILE): %w", err)
	}
	if f.current != nil && st.ModTime().Equal(f.mod) && st.Size() == f.size {
		return f.current, nil
	}
	pem, err := os.ReadFile(f.file)
	if err != nil {
		return nil, fmt.Errorf("the agents' CA (MS2M_AGENT_CA_FILE): %w", err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		if f.current != nil {
			return f.current, nil // half written: the last one until it is whole
		}
		return nil, fmt.Errorf("the agents' CA (MS2M_AGENT_CA_FILE) %s holds no PEM certificate", f.file)
	}
	f.current, f.mod, f.size = p, st.ModTime(), st.Size()
	return p, nil
}
