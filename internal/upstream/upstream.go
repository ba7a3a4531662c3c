package upstream

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ms2m/ms2m/internal/amqpwire"
)

// Placeholder credentials: the webhook gives them to an app whose real
// broker credentials it cannot read (they come from a Secret), and the
// sidecar replaces them in the handshake with Config.Username and
// Config.Password. An app that sends any other credentials keeps them.
const (
	PlaceholderUser     = "ms2m-placeholder"
	PlaceholderPassword = "ms2m-placeholder"
)

// SASL mechanisms the sidecar can put into the handshake.
const (
	MechanismPLAIN    = "PLAIN"
	MechanismEXTERNAL = "EXTERNAL"
)

// TLS is how the sidecar verifies the broker and proves itself to it. The
// files are read again for every connection, so that a rotated Secret
// reaches the next one.
type TLS struct {
	// CAFile holds the PEM CA certificates that sign the broker's
	// certificate; empty means the system's roots.
	CAFile string
	// CertFile and KeyFile are the client certificate and key, both or
	// neither; needed for EXTERNAL auth.
	CertFile, KeyFile string
	// ServerName is the name checked against the broker's certificate and
	// sent as SNI; empty means the host of the address dialed. The
	// certificate is always verified.
	ServerName string
}

// Config is the broker as the sidecar reaches it.
type Config struct {
	// Addresses are the brokers' host:port, tried in this order.
	Addresses []string
	// TLS, if set, makes every connection TLS.
	TLS *TLS
	// Username and Password replace the app's placeholder credentials;
	// empty leaves them as the app sent them.
	Username, Password string
	// VirtualHost replaces the app's virtual host when the app sent the
	// placeholder credentials (it was given the loopback address without
	// the real URL's path); empty leaves it.
	VirtualHost string
	// Mechanism, if EXTERNAL, makes every handshake use EXTERNAL (the
	// client certificate is the identity), whatever the app chose.
	Mechanism string
	// AttemptTimeout bounds one address's dial and TLS handshake.
	// Default 2 s.
	AttemptTimeout time.Duration
}

// Validate checks c and says what is wrong without showing the password.
func (c Config) Validate() error {
	var errs []error
	if len(c.Addresses) == 0 {
		errs = append(errs, errors.New("no broker address"))
	}
	for _, a := range c.Addresses {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("broker address %q: want host:port (%v)", a, err))
		}
	}
	switch c.Mechanism {
	case "", MechanismPLAIN:
	case MechanismEXTERNAL:
		if c.TLS == nil || c.TLS.CertFile == "" {
			errs = append(errs, errors.New("EXTERNAL auth needs TLS with a client certificate"))
		}
	default:
		errs = append(errs, fmt.Errorf("auth mechanism %q: want PLAIN or EXTERNAL", c.Mechanism))
	}
	if (c.Username == "") != (c.Password == "") && c.Mechanism != MechanismEXTERNAL {
		errs = append(errs, errors.New("set both the broker username and password, or neither"))
	}
	if t := c.TLS; t != nil && (t.CertFile == "") != (t.KeyFile == "") {
		errs = append(errs, errors.New("TLS client certificate and key: set both, or neither"))
	}
	return errors.Join(errs...)
}

// Dialer connects to the first broker of the list that answers.
type Dialer struct {
	cfg  Config
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// last is the index of the address that answered last: a new
	// connection starts there, so that one broker down costs one timeout,
	// not one per connection.
	last atomic.Int32
}

// NewDialer returns a Dialer for cfg; dial connects TCP (nil: net.Dialer).
func NewDialer(cfg Config, dial func(ctx context.Context, network, addr string) (net.Conn, error)) (*Dialer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = 2 * time.Second
	}
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	return &Dialer{cfg: cfg, dial: dial}, nil
}

// Config returns the dialer's configuration.
func (d *Dialer) Config() Config { return d.cfg }

// String names the brokers for logs, without credentials.
func (d *Dialer) String() string {
	s := strings.Join(d.cfg.Addresses, ",")
	if d.cfg.TLS != nil {
		s = "amqps://" + s
	}
	return s
}

// Dial tries each address once, starting with the one that answered last
// and going on in list order, and returns the first connection (after its
// TLS handshake, if TLS is on) and its address. The error names every
// address and why it failed.
func (d *Dialer) Dial(ctx context.Context) (net.Conn, string, error) {
	n := len(d.cfg.Addresses)
	start := int(d.last.Load())
	var errs []error
	for k := range n {
		i := (start + k) % n
		addr := d.cfg.Addresses[i]
		nc, err := d.dialOne(ctx, addr)
		if err == nil {
			d.last.Store(int32(i))
			return nc, addr, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, "", fmt.Errorf("no broker answered: %w", errors.Join(errs...))
}

func (d *Dialer) dialOne(ctx context.Context, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.AttemptTimeout)
	defer cancel()
	nc, err := d.dial(ctx, "tcp", addr)
	if err != nil || d.cfg.TLS == nil {
		return nc, err
	}
	tc, err := ClientTLS(d.cfg.TLS, addr)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c := tls.Client(nc, tc)
	if err := c.HandshakeContext(ctx); err != nil {
		nc.Close()
		return nil, fmt.Errorf("TLS handshake (server name %q): %w", tc.ServerName, err)
	}
	return c, nil
}

// ClientTLS builds the tls.Config for a connection to addr (host:port),
// reading the files now. The stream log's client uses it too.
func ClientTLS(t *TLS, addr string) (*tls.Config, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if tc.ServerName == "" {
		tc.ServerName = host
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read the broker's CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("the broker's CA file %s holds no PEM certificate", t.CAFile)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load the client certificate %s and key %s: %w", t.CertFile, t.KeyFile, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// Handshake rewrites one connection's handshake frames from the app. It is
// not safe for concurrent use: one per connection.
type Handshake struct {
	cfg *Config
	// placeholder is set once the app's start-ok carried the placeholder
	// credentials: its virtual host is a placeholder too.
	placeholder bool
}

// Unresolved says that the app sent the placeholder credentials and the
// sidecar has none to put in their place: the broker will refuse the
// connection, and the sidecar's configuration is at fault.
func (h *Handshake) Unresolved() bool {
	return h.placeholder && h.cfg.Username == "" && h.cfg.Mechanism != MechanismEXTERNAL
}

// NewHandshake returns the rewriter of one connection's handshake.
func (d *Dialer) NewHandshake() *Handshake { return &Handshake{cfg: &d.cfg} }

// StartOk rewrites the app's connection.start-ok: EXTERNAL when the
// sidecar's identity is its certificate, the configured credentials in
// place of the placeholders. It returns nil when nothing changes.
func (h *Handshake) StartOk(m *amqpwire.ConnectionStartOk) amqpwire.Method {
	placeholder := isPlaceholder(m)
	h.placeholder = placeholder
	switch {
	case h.cfg.Mechanism == MechanismEXTERNAL:
		if m.Mechanism == MechanismEXTERNAL {
			return nil
		}
		out := *m
		out.Mechanism, out.Response = MechanismEXTERNAL, nil
		return &out
	case placeholder && h.cfg.Username != "":
		out := *m
		out.Mechanism = MechanismPLAIN
		out.Response = plainResponse(h.cfg.Username, h.cfg.Password)
		return &out
	}
	return nil
}

// Open rewrites the app's connection.open: the configured virtual host in
// place of the placeholder one. It returns nil when nothing changes.
func (h *Handshake) Open(m *amqpwire.ConnectionOpen) amqpwire.Method {
	if !h.placeholder || h.cfg.VirtualHost == "" || m.VirtualHost == h.cfg.VirtualHost {
		return nil
	}
	return &amqpwire.ConnectionOpen{VirtualHost: h.cfg.VirtualHost}
}

// isPlaceholder says whether the app sent the placeholder user with PLAIN
// ("\x00user\x00password"), the mechanism every common client uses by
// default.
func isPlaceholder(m *amqpwire.ConnectionStartOk) bool {
	if m.Mechanism != MechanismPLAIN {
		return false
	}
	parts := bytes.SplitN(m.Response, []byte{0}, 3)
	return len(parts) == 3 && string(parts[1]) == PlaceholderUser
}

func plainResponse(user, password string) []byte {
	b := make([]byte, 0, 2+len(user)+len(password))
	b = append(b, 0)
	b = append(b, user...)
	b = append(b, 0)
	return append(b, password...)
}
