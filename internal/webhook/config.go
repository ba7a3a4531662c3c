package webhook

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/ms2m/ms2m/internal/envconfig"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/sign"
)

// Config is the webhook binary's configuration, read from the environment.
// Every field is documented in docs/webhook.md; keep the two in step.
type Config struct {
	// Port is the HTTPS port of the admission endpoint.
	Port int `env:"MS2M_WEBHOOK_PORT" envDefault:"9443"`
	// CertDir holds tls.crt and tls.key (and ca.crt, when self-signed). The
	// server reloads them when they change.
	CertDir string `env:"MS2M_WEBHOOK_CERT_DIR" envDefault:"/tmp/ms2m-webhook/certs"`

	// What is injected.
	SidecarImage      string `env:"MS2M_WEBHOOK_SIDECAR_IMAGE,required"`
	SidecarPullPolicy string `env:"MS2M_WEBHOOK_SIDECAR_PULL_POLICY"`
	// BrokerUsers: each namespace has a broker user of its own (made by the
	// controller or `migrator broker-users`), and each sidecar's stream URI
	// comes from the Secret ms2m-broker-user in its pod's namespace. Then
	// StreamURISecret, the one URI for every namespace, must be unset.
	BrokerUsers        bool   `env:"MS2M_WEBHOOK_BROKER_USERS" envDefault:"false"`
	StreamURISecret    string `env:"MS2M_WEBHOOK_STREAM_URI_SECRET"`
	StreamURISecretKey string `env:"MS2M_WEBHOOK_STREAM_URI_SECRET_KEY" envDefault:"stream-uri"`
	// NATSURLSecret, when set, names the Secret that holds the NATS URL
	// (with credentials) of the server keeping NATS apps' replay logs;
	// without it, pods whose app speaks NATS are left alone.
	NATSURLSecret         string `env:"MS2M_WEBHOOK_NATS_URL_SECRET"`
	NATSURLSecretKey      string `env:"MS2M_WEBHOOK_NATS_URL_SECRET_KEY" envDefault:"nats-url"`
	SidecarNATSListenPort int32  `env:"MS2M_WEBHOOK_SIDECAR_NATS_LISTEN_PORT" envDefault:"4222"`
	ControlTokenSecret    string `env:"MS2M_WEBHOOK_CONTROL_TOKEN_SECRET,required"`
	ControlTokenSecretKey string `env:"MS2M_WEBHOOK_CONTROL_TOKEN_SECRET_KEY" envDefault:"control-token"`
	SidecarListenPort     int32  `env:"MS2M_WEBHOOK_SIDECAR_LISTEN_PORT" envDefault:"5672"`
	SidecarControlPort    int32  `env:"MS2M_WEBHOOK_SIDECAR_CONTROL_PORT" envDefault:"8089"`
	SidecarRunAsUser      int64  `env:"MS2M_WEBHOOK_SIDECAR_RUN_AS_USER" envDefault:"65532"`
	LogMaxAge             string `env:"MS2M_WEBHOOK_LOG_MAX_AGE" envDefault:"24h"`
	LogMaxBytes           int64  `env:"MS2M_WEBHOOK_LOG_MAX_BYTES" envDefault:"1073741824"`
	SidecarCPURequest     string `env:"MS2M_WEBHOOK_SIDECAR_CPU_REQUEST" envDefault:"50m"`
	SidecarMemoryRequest  string `env:"MS2M_WEBHOOK_SIDECAR_MEMORY_REQUEST" envDefault:"64Mi"`
	SidecarCPULimit       string `env:"MS2M_WEBHOOK_SIDECAR_CPU_LIMIT"`
	SidecarMemoryLimit    string `env:"MS2M_WEBHOOK_SIDECAR_MEMORY_LIMIT" envDefault:"256Mi"`

	// SigningKey or SigningKeyFile is the controller's signing key (the
	// Secret ms2m-migration-status-key): the webhook turns a pod into a
	// restore only when the controller signed the instruction with it.
	// Neither: no pod is restored.
	SigningKey     string `env:"MS2M_WEBHOOK_SIGNING_KEY"`
	SigningKeyFile string `env:"MS2M_WEBHOOK_SIGNING_KEY_FILE"`

	// CheckpointRepository is where ms2m's checkpoint images go (the
	// migrator's MS2M_IMAGE_REPO): the webhook denies every pod that names
	// an image in it or below it, except the restore the controller
	// ordered. Empty: images are not checked.
	CheckpointRepository string `env:"MS2M_WEBHOOK_CHECKPOINT_REPOSITORY"`

	// MetricsAddr serves /metrics; HealthAddr serves /healthz and /readyz.
	// "0" turns either off.
	MetricsAddr string `env:"MS2M_WEBHOOK_METRICS_ADDR" envDefault:":8080"`
	HealthAddr  string `env:"MS2M_WEBHOOK_HEALTH_ADDR" envDefault:":8081"`

	// SelfSigned makes the webhook generate its own CA and serving
	// certificate at start, write them to CertDir, and put the CA into the
	// caBundle of the MutatingWebhookConfiguration ConfigName; it renews
	// both while running, once a third of CertValidity is left.
	SelfSigned       bool          `env:"MS2M_WEBHOOK_SELF_SIGNED" envDefault:"false"`
	ServiceName      string        `env:"MS2M_WEBHOOK_SERVICE_NAME" envDefault:"ms2m-webhook"`
	ServiceNamespace string        `env:"MS2M_WEBHOOK_SERVICE_NAMESPACE"`
	CertHosts        []string      `env:"MS2M_WEBHOOK_CERT_HOSTS" envSeparator:","`
	ConfigName       string        `env:"MS2M_WEBHOOK_CONFIG_NAME" envDefault:"ms2m-webhook"`
	CertValidity     time.Duration `env:"MS2M_WEBHOOK_CERT_VALIDITY" envDefault:"8760h"`

	// LogLevel is debug, info, warn or error.
	LogLevel string `env:"MS2M_WEBHOOK_LOG_LEVEL" envDefault:"info"`
}

// LoadConfig reads the configuration from the environment and checks it.
// Errors name the variable at fault.
func LoadConfig() (Config, error) {
	cfg, err := envconfig.Parse[Config]()
	if err != nil {
		return Config{}, fmt.Errorf("configuration: %w", err)
	}
	if err := cfg.check(); err != nil {
		return Config{}, fmt.Errorf("configuration: %w", err)
	}
	return cfg, nil
}

// check reports every setting that is wrong, each naming its variable,
// then checks the injector's configuration that the settings make.
func (c *Config) check() error {
	var errs configErrors
	if c.Port < 1 || c.Port > 65535 {
		errs.bad("MS2M_WEBHOOK_PORT", c.Port, "want a port from 1 to 65535")
	}
	if c.CertDir == "" {
		errs.bad("MS2M_WEBHOOK_CERT_DIR", `""`, "want the folder that holds tls.crt and tls.key")
	}
	switch corev1.PullPolicy(c.SidecarPullPolicy) {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs.bad("MS2M_WEBHOOK_SIDECAR_PULL_POLICY", c.SidecarPullPolicy, "want Always, IfNotPresent or Never (or leave it unset)")
	}
	c.checkSecretRefs(&errs)
	c.checkSidecarSettings(&errs)
	c.checkServeAddrs(&errs)
	if c.SelfSigned {
		c.checkSelfSigned(&errs)
	}
	if _, err := c.Level(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if _, err := c.Inject(); err != nil {
		return err
	}
	return nil
}

// configErrors collects what check finds wrong, in the order it checks.
type configErrors []error

// bad records that variable name's value is wrong, and what is wanted.
func (e *configErrors) bad(name string, value any, want string) {
	*e = append(*e, fmt.Errorf("%s=%v: %s", name, value, want))
}

// checkSecretRefs checks the names and keys of the Secrets that the
// sidecar's stream URI, NATS URL and control token come from. With broker
// users, there must be no one stream URI for every namespace.
func (c *Config) checkSecretRefs(errs *configErrors) {
	secrets := []struct{ name, value string }{{"MS2M_WEBHOOK_CONTROL_TOKEN_SECRET", c.ControlTokenSecret}}
	switch {
	case c.BrokerUsers && c.StreamURISecret != "":
		errs.bad("MS2M_WEBHOOK_STREAM_URI_SECRET", fmt.Sprintf("%q", c.StreamURISecret), fmt.Sprintf(
			"with MS2M_WEBHOOK_BROKER_USERS=true each namespace's sidecars use the namespace's own broker user (Secret %s); one stream URI for every namespace would reach every namespace's replay logs: unset it",
			contract.BrokerUserSecret))
	case !c.BrokerUsers:
		secrets = append(secrets, struct{ name, value string }{"MS2M_WEBHOOK_STREAM_URI_SECRET", c.StreamURISecret})
	}
	for _, s := range secrets {
		if msgs := validation.IsDNS1123Subdomain(s.value); len(msgs) > 0 {
			errs.bad(s.name, fmt.Sprintf("%q", s.value), "want a Secret name: "+strings.Join(msgs, "; "))
		}
	}
	if c.NATSURLSecret != "" {
		if msgs := validation.IsDNS1123Subdomain(c.NATSURLSecret); len(msgs) > 0 {
			errs.bad("MS2M_WEBHOOK_NATS_URL_SECRET", fmt.Sprintf("%q", c.NATSURLSecret), "want a Secret name: "+strings.Join(msgs, "; "))
		}
	}
	for _, s := range []struct{ name, value string }{
		{"MS2M_WEBHOOK_NATS_URL_SECRET_KEY", c.NATSURLSecretKey},
		{"MS2M_WEBHOOK_STREAM_URI_SECRET_KEY", c.StreamURISecretKey},
		{"MS2M_WEBHOOK_CONTROL_TOKEN_SECRET_KEY", c.ControlTokenSecretKey},
	} {
		if msgs := validation.IsConfigMapKey(s.value); len(msgs) > 0 {
			errs.bad(s.name, fmt.Sprintf("%q", s.value), "want a Secret key: "+strings.Join(msgs, "; "))
		}
	}
}

// checkSidecarSettings checks the sidecar's ports, its user and its replay
// log's limits.
func (c *Config) checkSidecarSettings(errs *configErrors) {
	for _, p := range []struct {
		name string
		port int32
	}{{"MS2M_WEBHOOK_SIDECAR_LISTEN_PORT", c.SidecarListenPort}, {"MS2M_WEBHOOK_SIDECAR_CONTROL_PORT", c.SidecarControlPort}, {"MS2M_WEBHOOK_SIDECAR_NATS_LISTEN_PORT", c.SidecarNATSListenPort}} {
		if p.port < 1 || p.port > 65535 {
			errs.bad(p.name, p.port, "want a port from 1 to 65535")
		}
	}
	if c.SidecarListenPort == c.SidecarControlPort {
		*errs = append(*errs, fmt.Errorf("MS2M_WEBHOOK_SIDECAR_LISTEN_PORT and MS2M_WEBHOOK_SIDECAR_CONTROL_PORT are both %d: the sidecar needs two ports", c.SidecarListenPort))
	}
	if c.SidecarRunAsUser < 1 {
		errs.bad("MS2M_WEBHOOK_SIDECAR_RUN_AS_USER", c.SidecarRunAsUser, "want a uid above 0: the sidecar runs as a non-root user")
	}
	if d, err := time.ParseDuration(c.LogMaxAge); err != nil || d < 0 {
		errs.bad("MS2M_WEBHOOK_LOG_MAX_AGE", fmt.Sprintf("%q", c.LogMaxAge), "want a Go duration such as 24h (0 keeps records forever)")
	}
	if c.LogMaxBytes < 0 {
		errs.bad("MS2M_WEBHOOK_LOG_MAX_BYTES", c.LogMaxBytes, "want a byte count of 0 or more (0 means no size limit)")
	}
}

// checkServeAddrs checks the metrics and health addresses: host:port, or
// "0" for off.
func (c *Config) checkServeAddrs(errs *configErrors) {
	for _, a := range []struct{ name, value string }{
		{"MS2M_WEBHOOK_METRICS_ADDR", c.MetricsAddr},
		{"MS2M_WEBHOOK_HEALTH_ADDR", c.HealthAddr},
	} {
		if a.value == "0" {
			continue
		}
		if _, _, err := net.SplitHostPort(a.value); err != nil {
			errs.bad(a.name, fmt.Sprintf("%q", a.value), "want host:port such as :8080, or 0 to turn it off")
		}
	}
}

// checkSelfSigned checks what a self-signed webhook needs to make its
// certificate and set its caBundle.
func (c *Config) checkSelfSigned(errs *configErrors) {
	if msgs := validation.IsDNS1123Label(c.ServiceName); len(msgs) > 0 {
		errs.bad("MS2M_WEBHOOK_SERVICE_NAME", fmt.Sprintf("%q", c.ServiceName), "want the webhook Service's name: "+strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1123Label(c.ServiceNamespace); len(msgs) > 0 {
		errs.bad("MS2M_WEBHOOK_SERVICE_NAMESPACE", fmt.Sprintf("%q", c.ServiceNamespace), "want the webhook Service's namespace (required with MS2M_WEBHOOK_SELF_SIGNED=true; set it from the pod's metadata.namespace)")
	}
	if msgs := validation.IsDNS1123Subdomain(c.ConfigName); len(msgs) > 0 {
		errs.bad("MS2M_WEBHOOK_CONFIG_NAME", fmt.Sprintf("%q", c.ConfigName), "want the name of the MutatingWebhookConfiguration whose caBundle to set: "+strings.Join(msgs, "; "))
	}
	if c.CertValidity < time.Hour {
		errs.bad("MS2M_WEBHOOK_CERT_VALIDITY", c.CertValidity, "want at least 1h")
	}
	for _, h := range c.CertHosts {
		if net.ParseIP(h) == nil && len(validation.IsDNS1123Subdomain(h)) > 0 {
			errs.bad("MS2M_WEBHOOK_CERT_HOSTS", fmt.Sprintf("%q", strings.Join(c.CertHosts, ",")), fmt.Sprintf("%q is neither a DNS name nor an IP address", h))
		}
	}
}

// Level is the slog level of LogLevel.
func (c *Config) Level() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return 0, fmt.Errorf("MS2M_WEBHOOK_LOG_LEVEL=%q: want debug, info, warn or error", c.LogLevel)
	}
	return l, nil
}

// Inject is the configuration of what the handler injects.
func (c *Config) Inject() (inject.Config, error) {
	ic := inject.Config{
		SidecarImage:    c.SidecarImage,
		ImagePullPolicy: corev1.PullPolicy(c.SidecarPullPolicy),
		BrokerUsers:     c.BrokerUsers,
		ControlToken:    inject.SecretKey{Name: c.ControlTokenSecret, Key: c.ControlTokenSecretKey},
		ListenPort:      c.SidecarListenPort,
		NATSListenPort:  c.SidecarNATSListenPort,
		ControlPort:     c.SidecarControlPort,
		LogMaxAge:       c.LogMaxAge,
		LogMaxBytes:     c.LogMaxBytes,
		RunAsUser:       c.SidecarRunAsUser,

		CheckpointRepository: c.CheckpointRepository,
	}
	if !c.BrokerUsers {
		ic.StreamURI = inject.SecretKey{Name: c.StreamURISecret, Key: c.StreamURISecretKey}
	}
	if c.NATSURLSecret != "" {
		ic.NATSURL = inject.SecretKey{Name: c.NATSURLSecret, Key: c.NATSURLSecretKey}
	}
	var errs []error
	switch {
	case c.SigningKey != "" && c.SigningKeyFile != "":
		errs = append(errs, errors.New("MS2M_WEBHOOK_SIGNING_KEY and MS2M_WEBHOOK_SIGNING_KEY_FILE are both set: set one"))
	case c.SigningKey != "":
		ic.RestoreKey = []byte(c.SigningKey)
		if err := sign.Check(ic.RestoreKey); err != nil {
			errs = append(errs, fmt.Errorf("MS2M_WEBHOOK_SIGNING_KEY: %w", err))
		}
	case c.SigningKeyFile != "":
		k, err := sign.ReadKeyFile(c.SigningKeyFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("MS2M_WEBHOOK_SIGNING_KEY_FILE: %w", err))
		}
		ic.RestoreKey = k
	}
	set := func(list *corev1.ResourceList, name corev1.ResourceName, variable, v string) {
		if v == "" {
			return
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want a Kubernetes quantity such as 100m or 128Mi, or nothing", variable, v))
			return
		}
		if *list == nil {
			*list = corev1.ResourceList{}
		}
		(*list)[name] = q
	}
	set(&ic.Resources.Requests, corev1.ResourceCPU, "MS2M_WEBHOOK_SIDECAR_CPU_REQUEST", c.SidecarCPURequest)
	set(&ic.Resources.Requests, corev1.ResourceMemory, "MS2M_WEBHOOK_SIDECAR_MEMORY_REQUEST", c.SidecarMemoryRequest)
	set(&ic.Resources.Limits, corev1.ResourceCPU, "MS2M_WEBHOOK_SIDECAR_CPU_LIMIT", c.SidecarCPULimit)
	set(&ic.Resources.Limits, corev1.ResourceMemory, "MS2M_WEBHOOK_SIDECAR_MEMORY_LIMIT", c.SidecarMemoryLimit)
	for _, r := range []struct {
		name       corev1.ResourceName
		req, limit string
	}{
		{corev1.ResourceCPU, "MS2M_WEBHOOK_SIDECAR_CPU_REQUEST", "MS2M_WEBHOOK_SIDECAR_CPU_LIMIT"},
		{corev1.ResourceMemory, "MS2M_WEBHOOK_SIDECAR_MEMORY_REQUEST", "MS2M_WEBHOOK_SIDECAR_MEMORY_LIMIT"},
	} {
		req, okr := ic.Resources.Requests[r.name]
		lim, okl := ic.Resources.Limits[r.name]
		if okr && okl && req.Cmp(lim) > 0 {
			errs = append(errs, fmt.Errorf("%s=%s is above %s=%s: the API server would reject every injected pod", r.req, req.String(), r.limit, lim.String()))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return ic, err
	}
	if err := ic.Validate(); err != nil {
		return ic, fmt.Errorf("MS2M_WEBHOOK_SIDECAR_*: %w", err)
	}
	return ic, nil
}
