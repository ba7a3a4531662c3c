package inject

import (
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/internal/contract"
)

// Defaults for the Config fields left zero.
const (
	DefaultListenPort int32 = 5672
	// DefaultNATSListenPort is the listen port of a NATS app's sidecar.
	DefaultNATSListenPort int32 = 4222
	DefaultControlPort    int32 = 8089
	DefaultRunAsUser      int64 = 65532
)

// ControlPortName names the sidecar's control API port in its container
// spec; its probes use it.
const ControlPortName = "ms2m-control"

// withDefaults fills the zero fields that have a default.
func (c Config) withDefaults() Config {
	if c.ListenPort == 0 {
		c.ListenPort = DefaultListenPort
	}
	if c.ControlPort == 0 {
		c.ControlPort = DefaultControlPort
	}
	if c.NATSListenPort == 0 {
		c.NATSListenPort = DefaultNATSListenPort
	}
	if c.RunAsUser == 0 {
		c.RunAsUser = DefaultRunAsUser
	}
	if c.BrokerUsers && c.StreamURI == (SecretKey{}) {
		c.StreamURI = BrokerUserStreamURI
	}
	return c
}

// BrokerUserStreamURI is where a sidecar's stream URI comes from when each
// namespace has a broker user of its own (Config.BrokerUsers).
var BrokerUserStreamURI = SecretKey{Name: contract.BrokerUserSecret, Key: contract.BrokerUserSecretStreamURI}

// Validate checks the configuration once, at the webhook's start. Inject
// calls it too, and fails with its error (not a *DenyError) on a bad Config.
func (c Config) Validate() error {
	var errs []error
	if c.BrokerUsers && c.StreamURI != (SecretKey{}) && c.StreamURI != BrokerUserStreamURI {
		errs = append(errs, fmt.Errorf("streamURI %s/%s: with brokerUsers each namespace's sidecars use the namespace's own broker user (Secret %s, key %s); the shared stream URI would reach every namespace's logs: leave streamURI unset",
			c.StreamURI.Name, c.StreamURI.Key, BrokerUserStreamURI.Name, BrokerUserStreamURI.Key))
	}
	c = c.withDefaults()
	if c.SidecarImage == "" {
		errs = append(errs, errors.New("sidecarImage is empty: set the sidecar's image"))
	}
	switch c.ImagePullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, fmt.Errorf("imagePullPolicy %q: use Always, IfNotPresent or Never", c.ImagePullPolicy))
	}
	if c.StreamURI.Name == "" || c.StreamURI.Key == "" {
		errs = append(errs, errors.New("streamURI: set the name and key of the Secret that holds the broker's stream URI"))
	}
	if c.ControlToken.Name == "" || c.ControlToken.Key == "" {
		errs = append(errs, errors.New("controlToken: set the name and key of the Secret that holds the sidecar's control token"))
	}
	for _, p := range []struct {
		name string
		port int32
	}{{"listenPort", c.ListenPort}, {"controlPort", c.ControlPort}, {"natsListenPort", c.NATSListenPort}} {
		if p.port < 1 || p.port > 65535 {
			errs = append(errs, fmt.Errorf("%s %d: use a port from 1 to 65535", p.name, p.port))
		}
	}
	if c.ListenPort == c.ControlPort {
		errs = append(errs, fmt.Errorf("listenPort and controlPort are both %d: the sidecar needs two ports", c.ListenPort))
	}
	if c.NATSListenPort == c.ControlPort {
		errs = append(errs, fmt.Errorf("natsListenPort and controlPort are both %d: the sidecar needs two ports", c.NATSListenPort))
	}
	if (c.NATSURL.Name == "") != (c.NATSURL.Key == "") {
		errs = append(errs, errors.New("natsURL: set both the name and the key of the Secret that holds the NATS URL, or neither"))
	}
	if c.LogMaxAge != "" {
		if d, err := time.ParseDuration(c.LogMaxAge); err != nil || d < 0 {
			errs = append(errs, fmt.Errorf("logMaxAge %q: use a Go duration such as 24h (0 keeps records forever)", c.LogMaxAge))
		}
	}
	if c.LogMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("logMaxBytes %d: use a byte count of 0 or more", c.LogMaxBytes))
	}
	if c.RunAsUser < 1 {
		errs = append(errs, fmt.Errorf("runAsUser %d: the sidecar runs as a non-root user; use a uid above 0", c.RunAsUser))
	}
	if _, _, err := checkpointRepository(c); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("inject config: %w", err)
	}
	return nil
}
