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
// checks that name.
func ClientTLS(caFile, serverName string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("the agents' CA (MS2M_AGENT_CA_FILE): %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("the agents' CA (MS2M_AGENT_CA_FILE) %s holds no PEM certificate", caFile)
	}
	if serverName == "" {
		return nil, errors.New("the agents' certificate name (MS2M_AGENT_SERVER_NAME) is not set")
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: serverName}, nil
}
