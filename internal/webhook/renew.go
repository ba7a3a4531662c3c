package webhook

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ms2m/ms2m/internal/selfsigned"
)

// selfSignedTLS is the self-signed bootstrap: it makes a CA and a serving
// certificate, serves the certificate from memory, sets the CA as the
// caBundle of the MutatingWebhookConfiguration, and renews both while the
// webhook runs, once a third of their validity is left. A renewal first
// puts the new CA into the caBundle beside the current one, waits for the
// API server to see it, and only then serves the new certificate, so no
// call fails on the change.
type selfSignedTLS struct {
	hosts      []string
	dir        string
	validity   time.Duration
	configName string
	log        logr.Logger

	serving atomic.Pointer[tls.Certificate]
	ready   atomic.Bool // the first caBundle is set
	cur     selfsigned.Pair
	expires time.Time
}

// newSelfSignedTLS makes the first CA and certificate and writes them to
// dir, so that they exist before the server starts.
func newSelfSignedTLS(hosts []string, dir string, validity time.Duration, configName string, log logr.Logger) (*selfSignedTLS, error) {
	s := &selfSignedTLS{hosts: hosts, dir: dir, validity: validity, configName: configName, log: log}
	certs, expires, err := s.issue()
	if err != nil {
		return nil, err
	}
	if err := s.use(certs, expires); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *selfSignedTLS) issue() (selfsigned.Pair, time.Time, error) {
	now := time.Now()
	certs, err := selfsigned.New(CAName, s.hosts, now, s.validity)
	return certs, now.Add(s.validity), err
}

// use writes certs to the cert dir and serves them.
func (s *selfSignedTLS) use(certs selfsigned.Pair, expires time.Time) error {
	if err := WriteCerts(s.dir, certs); err != nil {
		return err
	}
	pair, err := certs.TLS()
	if err != nil {
		return fmt.Errorf("self-signed certificate: %w", err)
	}
	s.serving.Store(&pair)
	s.cur, s.expires = certs, expires
	s.log.Info("serving a self-signed certificate", "dir", s.dir, "hosts", s.hosts, "validUntil", expires.UTC(), "renewAt", s.renewAt().UTC())
	return nil
}

// renewAt is when the current certificate is renewed: with a third of its
// validity left.
func (s *selfSignedTLS) renewAt() time.Time { return s.expires.Add(-s.validity / 3) }

// getCertificate is the server's tls.Config.GetCertificate.
func (s *selfSignedTLS) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.serving.Load(), nil
}

// run sets the caBundle, then renews until ctx is done. It is a manager
// runnable; c reaches the API server.
func (s *selfSignedTLS) run(ctx context.Context, c client.Client) error {
	if !patchCABundleUntilDone(ctx, c, s.configName, s.cur.CA, s.log) {
		return nil
	}
	s.ready.Store(true)
	for {
		t := time.NewTimer(time.Until(s.renewAt()))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		next, expires, err := s.issue()
		if err != nil {
			// Only the random source can fail; try again in a while.
			s.log.Error(err, "could not renew the self-signed certificate; retrying in a minute")
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Minute):
			}
			continue
		}
		bundle := append(append([]byte(nil), next.CA...), s.cur.CA...)
		if !patchCABundleUntilDone(ctx, c, s.configName, bundle, s.log) {
			return nil
		}
		// The API server reads the configuration through a watch: give
		// it a moment to trust the new CA before it is needed.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(min(s.validity/6, 10*time.Second)):
		}
		if err := s.use(next, expires); err != nil {
			s.log.Error(err, "could not switch to the renewed self-signed certificate; serving the current one until the next try")
		}
	}
}
