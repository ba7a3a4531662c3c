package sidecar

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ms2m/ms2m/internal/envconfig"
	"github.com/ms2m/ms2m/internal/replay"
	"github.com/ms2m/ms2m/internal/upstream"
)

// Config is the sidecar's configuration, read from the environment. Every
// field is documented in docs/sidecar.md; keep the two in step.
type Config struct {
	// Broker is the protocol the app speaks: amqp (RabbitMQ, AMQP 0-9-1)
	// or nats (NATS with JetStream; see docs/nats.md).
	Broker string `env:"MS2M_BROKER" envDefault:"amqp"`
	// Listen is where the app connects, as if to the broker.
	Listen string `env:"MS2M_LISTEN" envDefault:"127.0.0.1:5672"`
	// Upstream is the real broker (with MS2M_BROKER=nats: the NATS
	// server's host:port, required): one or more comma-separated host:port,
	// amqp:// or amqps:// URIs, or Spring's user:password@host:port/vhost,
	// tried in order. An amqps:// entry turns TLS on; the first entry's
	// user info and path replace the app's placeholder credentials and
	// virtual host (see internal/upstream).
	// Empty: the broker is resolved from the app's own settings (AppEnv,
	// AppConfigFiles), as the webhook passes them for envFrom and mounted
	// Spring configuration.
	Upstream string `env:"MS2M_UPSTREAM"`
	// AppConfigFiles are the app's Spring configuration files, mounted
	// into the sidecar, comma separated, later ones winning.
	AppConfigFiles string `env:"MS2M_APP_CONFIG_FILES"`
	// AppEnv holds the app's vars that the sidecar got under the prefix
	// MS2M_APP_ (from the app's envFrom sources), by their own names.
	// LoadConfig fills it from the environment.
	AppEnv map[string]string
	// UpstreamTLS turns TLS to the broker on (amqps:// entries do too).
	UpstreamTLS bool `env:"MS2M_UPSTREAM_TLS" envDefault:"false"`
	// UpstreamTLSCAFile, UpstreamTLSCertFile and UpstreamTLSKeyFile are the
	// broker's CA and the sidecar's client certificate and key (PEM files,
	// read again for every connection); UpstreamTLSServerName is the name
	// checked against the broker's certificate (default: the host dialed).
	UpstreamTLSCAFile     string `env:"MS2M_UPSTREAM_TLS_CA_FILE"`
	UpstreamTLSCertFile   string `env:"MS2M_UPSTREAM_TLS_CERT_FILE"`
	UpstreamTLSKeyFile    string `env:"MS2M_UPSTREAM_TLS_KEY_FILE"`
	UpstreamTLSServerName string `env:"MS2M_UPSTREAM_TLS_SERVER_NAME"`
	// UpstreamUsername, UpstreamPassword and UpstreamVirtualHost replace the
	// app's placeholder credentials and virtual host when MS2M_UPSTREAM
	// carries none.
	UpstreamUsername    string `env:"MS2M_UPSTREAM_USERNAME"`
	UpstreamPassword    string `env:"MS2M_UPSTREAM_PASSWORD"`
	UpstreamVirtualHost string `env:"MS2M_UPSTREAM_VHOST"`
	// UpstreamAuth is PLAIN (the app's mechanism, as it sent it) or
	// EXTERNAL (the client certificate is the identity).
	UpstreamAuth string `env:"MS2M_UPSTREAM_AUTH" envDefault:"PLAIN"`
	// UpstreamConnectTimeout bounds how long an app connection waits for the
	// broker (retrying) before the sidecar closes it.
	UpstreamConnectTimeout time.Duration `env:"MS2M_UPSTREAM_CONNECT_TIMEOUT" envDefault:"10s"`
	// StreamURI is the broker's stream protocol address with credentials:
	// rabbitmq-stream://user:password@host:5552/vhost.
	// Required for MS2M_BROKER=amqp.
	StreamURI string `env:"MS2M_STREAM_URI"`
	// NATSURL is, for MS2M_BROKER=nats, the NATS server that holds the
	// replay log as a JetStream stream: nats://user:password@host:4222.
	NATSURL string `env:"MS2M_NATS_URL"`
	// LogName is the replay log's stream name: the workload's stable identity.
	LogName string `env:"MS2M_LOG_NAME,required"`
	// LogMaxAge and LogMaxBytes are the log's retention.
	LogMaxAge   time.Duration `env:"MS2M_LOG_MAX_AGE" envDefault:"24h"`
	LogMaxBytes int64         `env:"MS2M_LOG_MAX_BYTES" envDefault:"1073741824"`
	// LogPendingMaxBytes and LogPendingMaxRecords bound the deliveries
	// teed but not yet confirmed by the log. At either bound the sidecar
	// stops reading from the broker until the log catches up
	// (backpressure), so a log outage cannot grow the sidecar's memory
	// without limit (an auto-ack consumer has no prefetch to bound it).
	LogPendingMaxBytes   int64 `env:"MS2M_LOG_PENDING_MAX_BYTES" envDefault:"67108864"`
	LogPendingMaxRecords int   `env:"MS2M_LOG_PENDING_MAX_RECORDS" envDefault:"65536"`
	// ControlListen is the control API's address.
	ControlListen string `env:"MS2M_CONTROL_LISTEN" envDefault:":8089"`
	// ControlToken, or the contents of ControlTokenFile, is the control
	// API's bearer token. Exactly one of the two must be set.
	ControlToken     string `env:"MS2M_CONTROL_TOKEN"`
	ControlTokenFile string `env:"MS2M_CONTROL_TOKEN_FILE"`
	// DrainTimeout bounds how long acks still waiting on the log are
	// forwarded after the app closed its connection.
	DrainTimeout time.Duration `env:"MS2M_DRAIN_TIMEOUT" envDefault:"10s"`
	// LossDrain bounds how long, once the broker's connection is gone, the
	// app's connection stays open for the app to settle (ack) the
	// deliveries it holds, so that their redeliveries are absorbed (AMQP).
	LossDrain time.Duration `env:"MS2M_LOSS_DRAIN" envDefault:"5s"`
	// ReplayStart, when set, makes this a target sidecar: it replays the
	// log's deliveries after this ID (the checkpoint ID) to the app before
	// it consumes the primary queue.
	ReplayStart string `env:"MS2M_REPLAY_START"`
	// ReplayCutoff is the last ID to replay, or "marker" to learn it from
	// the cutoff marker that the source's stop writes.
	ReplayCutoff string `env:"MS2M_REPLAY_CUTOFF" envDefault:"marker"`
	// ReplayEpoch is the log's epoch at the checkpoint (the quiesce reports
	// it): with a "marker" cutoff, only a cutoff marker of a later epoch
	// ends the replay, so that one an earlier migration left is not taken.
	ReplayEpoch string `env:"MS2M_REPLAY_EPOCH"`
	// ReplaySkip are delivery IDs in the range not to replay, ascending,
	// comma-separated: what the app was handed and never acked before its
	// connection ended, which the broker delivered again under other IDs.
	ReplaySkip string `env:"MS2M_REPLAY_SKIP"`
	// PublishCheck turns publish checking on: serving, the sidecar records
	// the app's publishes in the log (a digest per publish); replaying, it
	// compares the publishes it absorbs against the source's and reports
	// mismatches as a sign of a non-deterministic app. Set it on source and
	// target alike.
	PublishCheck bool `env:"MS2M_PUBLISH_CHECK" envDefault:"false"`
	// StateDir is a folder that outlives the sidecar's container (the
	// webhook mounts an emptyDir): a stop is recorded there before /stop
	// answers, so that a sidecar the kubelet restarts while stopped
	// starts stopped, at the same cutoff, instead of serving again. Empty:
	// a stop does not survive a restart.
	StateDir string `env:"MS2M_STATE_DIR"`
	// StopHeld says what a stop does with the deliveries held back since a
	// quiesce: "deliver" gives them to the app before the cutoff, in the
	// broker's order; "requeue" gives them back to the broker, which makes
	// the stop shorter but lets the next consumer see later messages first.
	StopHeld string `env:"MS2M_STOP_HELD" envDefault:"deliver"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `env:"MS2M_LOG_LEVEL" envDefault:"info"`
}

// The brokers a sidecar speaks (MS2M_BROKER).
const (
	BrokerAMQP = "amqp"
	BrokerNATS = "nats"
)

// logMaxBatch is the records per replay log write: a JetStream log takes
// larger batches (a pull consumer's ack window may be in the thousands, and
// acks wait for the write that holds their delivery); 0 is the Tee's
// default.
func (c *Config) logMaxBatch() int {
	if c.Broker == BrokerNATS {
		return 4096
	}
	return 0
}

// appEnvPrefix prefixes the app's own vars in the sidecar's environment.
const appEnvPrefix = "MS2M_APP_"

// LoadConfig reads the configuration from the environment and checks it.
// Errors name the variable at fault.
func LoadConfig() (Config, error) {
	cfg, err := envconfig.Parse[Config]()
	if err != nil {
		return Config{}, fmt.Errorf("configuration: %w", err)
	}
	cfg.AppEnv = map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, appEnvPrefix) {
			cfg.AppEnv[strings.TrimPrefix(k, appEnvPrefix)] = v
		}
	}
	if err := cfg.complete(); err != nil {
		return Config{}, fmt.Errorf("configuration: %w", err)
	}
	return cfg, nil
}

// complete checks cfg and reads the token file.
func (c *Config) complete() error {
	var errs []error
	if _, err := c.UpstreamConfig(); err != nil {
		errs = append(errs, err)
	}
	for name, addr := range map[string]string{"MS2M_LISTEN": c.Listen, "MS2M_CONTROL_LISTEN": c.ControlListen} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want host:port, for example 127.0.0.1:5672 (%v)", name, addr, err))
		}
	}
	switch c.Broker {
	case BrokerAMQP:
		if u, err := url.Parse(c.StreamURI); err != nil || (u.Scheme != "rabbitmq-stream" && u.Scheme != "rabbitmq-stream+tls") || u.Host == "" {
			errs = append(errs, fmt.Errorf("MS2M_STREAM_URI: want rabbitmq-stream://user:password@host:5552/vhost (or rabbitmq-stream+tls://, port 5551), got %q", redact(c.StreamURI)))
		}
	case BrokerNATS:
		if c.Upstream == "" {
			errs = append(errs, errors.New("MS2M_UPSTREAM: with MS2M_BROKER=nats, required: the NATS server's host:port"))
		}
		if u, err := url.Parse(c.NATSURL); err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Host == "" {
			errs = append(errs, fmt.Errorf("MS2M_NATS_URL: with MS2M_BROKER=nats, want nats://user:password@host:4222, got %q", redact(c.NATSURL)))
		}
		if c.PublishCheck {
			errs = append(errs, errors.New("MS2M_PUBLISH_CHECK with MS2M_BROKER=nats: publish checking is AMQP only for now (see docs/nats.md)"))
		}
		if c.StopHeld != "deliver" {
			errs = append(errs, fmt.Errorf("MS2M_STOP_HELD=%q with MS2M_BROKER=nats: a NATS stop always hands the held deliveries to the app (see docs/nats.md)", c.StopHeld))
		}
	default:
		errs = append(errs, fmt.Errorf("MS2M_BROKER=%q: want amqp or nats", c.Broker))
	}
	if c.LogName == "" || len(c.LogName) > 255 || strings.ContainsAny(c.LogName, " /") {
		errs = append(errs, fmt.Errorf("MS2M_LOG_NAME=%q: want a stream name of 1 to 255 characters without spaces or slashes", c.LogName))
	}
	if c.LogMaxAge < 0 {
		errs = append(errs, fmt.Errorf("MS2M_LOG_MAX_AGE=%s: must not be negative (0 keeps records forever)", c.LogMaxAge))
	}
	if c.LogMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("MS2M_LOG_MAX_BYTES=%d: must not be negative (0 means no size limit)", c.LogMaxBytes))
	}
	if c.LogPendingMaxBytes <= 0 {
		errs = append(errs, fmt.Errorf("MS2M_LOG_PENDING_MAX_BYTES=%d: must be positive (it bounds the sidecar's memory while the log is slow or down)", c.LogPendingMaxBytes))
	}
	if c.LogPendingMaxRecords <= 0 {
		errs = append(errs, fmt.Errorf("MS2M_LOG_PENDING_MAX_RECORDS=%d: must be positive (it bounds the sidecar's memory while the log is slow or down)", c.LogPendingMaxRecords))
	}
	if c.UpstreamConnectTimeout <= 0 {
		errs = append(errs, fmt.Errorf("MS2M_UPSTREAM_CONNECT_TIMEOUT=%s: must be positive", c.UpstreamConnectTimeout))
	}
	switch {
	case c.ControlToken != "" && c.ControlTokenFile != "":
		errs = append(errs, errors.New("MS2M_CONTROL_TOKEN and MS2M_CONTROL_TOKEN_FILE are both set: set only one"))
	case c.ControlTokenFile != "":
		b, err := os.ReadFile(c.ControlTokenFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("MS2M_CONTROL_TOKEN_FILE: %w", err))
		} else if c.ControlToken = strings.TrimSpace(string(b)); c.ControlToken == "" {
			errs = append(errs, fmt.Errorf("MS2M_CONTROL_TOKEN_FILE=%s: the file is empty", c.ControlTokenFile))
		}
	case c.ControlToken == "":
		errs = append(errs, errors.New("MS2M_CONTROL_TOKEN or MS2M_CONTROL_TOKEN_FILE: one must be set; the control API never runs without a token"))
	}
	if c.StopHeld != "deliver" && c.StopHeld != "requeue" {
		errs = append(errs, fmt.Errorf("MS2M_STOP_HELD=%q: want deliver (the default: the app takes them, in order) or requeue", c.StopHeld))
	}
	if _, err := c.Level(); err != nil {
		errs = append(errs, err)
	}
	if _, _, err := c.Replay(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// UpstreamConfig is the broker as the sidecar reaches it. Its errors name
// the variable and never show a password.
func (c *Config) UpstreamConfig() (upstream.Config, error) {
	spec, tlsOn := c.Upstream, c.UpstreamTLS
	user, pass, vhost := c.UpstreamUsername, c.UpstreamPassword, c.UpstreamVirtualHost
	if spec == "" {
		var files []string
		for _, f := range strings.Split(c.AppConfigFiles, ",") {
			if f = strings.TrimSpace(f); f != "" {
				files = append(files, f)
			}
		}
		r, err := upstream.AppSettings{Env: c.AppEnv, Files: files}.Resolve()
		if err != nil {
			return upstream.Config{}, fmt.Errorf("MS2M_UPSTREAM is empty, so the broker comes from the app's settings (%s* vars, MS2M_APP_CONFIG_FILES): %w", appEnvPrefix, err)
		}
		spec, tlsOn = r.Spec, tlsOn || r.TLS
		if user == "" && pass == "" {
			user, pass = r.Username, r.Password
		}
		if vhost == "" {
			vhost = r.VirtualHost
		}
	}
	a, err := upstream.ParseAddresses(spec, tlsOn)
	if err != nil {
		return upstream.Config{}, fmt.Errorf("MS2M_UPSTREAM: %w", err)
	}
	u := upstream.Config{Addresses: a.Hosts, Mechanism: c.UpstreamAuth, Username: user, Password: pass, VirtualHost: vhost}
	if a.HasCredentials {
		u.Username, u.Password = a.Username, a.Password
	}
	if a.HasVirtualHost {
		u.VirtualHost = a.VirtualHost
	}
	if u.Username != "" && u.Password == "" && u.Mechanism != upstream.MechanismEXTERNAL {
		return upstream.Config{}, errors.New("MS2M_UPSTREAM_USERNAME is set but no password (MS2M_UPSTREAM_PASSWORD, or user info in MS2M_UPSTREAM)")
	}
	if a.TLS || tlsOn {
		u.TLS = &upstream.TLS{CAFile: c.UpstreamTLSCAFile, CertFile: c.UpstreamTLSCertFile, KeyFile: c.UpstreamTLSKeyFile, ServerName: c.UpstreamTLSServerName}
	} else if c.UpstreamTLSCAFile != "" || c.UpstreamTLSCertFile != "" || c.UpstreamTLSServerName != "" {
		return upstream.Config{}, errors.New("MS2M_UPSTREAM_TLS_* is set but TLS is off: set MS2M_UPSTREAM_TLS=true or use amqps:// in MS2M_UPSTREAM")
	}
	if err := u.Validate(); err != nil {
		return upstream.Config{}, fmt.Errorf("MS2M_UPSTREAM*: %w", err)
	}
	return u, nil
}

// StreamTLS is the TLS configuration of a rabbitmq-stream+tls URI: the
// upstream's CA and client certificate, read now; nil for a plain URI.
func (c *Config) StreamTLS() (*tls.Config, error) {
	if !strings.HasPrefix(c.StreamURI, "rabbitmq-stream+tls:") {
		return nil, nil
	}
	u, err := url.Parse(c.StreamURI)
	if err != nil {
		return nil, errors.New("MS2M_STREAM_URI does not parse (it is not shown: it holds the password)")
	}
	return upstream.ClientTLS(&upstream.TLS{CAFile: c.UpstreamTLSCAFile, CertFile: c.UpstreamTLSCertFile, KeyFile: c.UpstreamTLSKeyFile}, u.Host)
}

func (c *Config) Level() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return 0, fmt.Errorf("MS2M_LOG_LEVEL=%q: want debug, info, warn or error", c.LogLevel)
	}
	return l, nil
}

// Replay returns the replay range, and whether this is a target sidecar.
func (c *Config) Replay() (replay.Range, bool, error) {
	if c.ReplayStart == "" {
		return replay.Range{}, false, nil
	}
	var r replay.Range
	var err error
	if r.Start, err = strconv.ParseUint(c.ReplayStart, 10, 64); err != nil {
		return r, true, fmt.Errorf("MS2M_REPLAY_START=%q: want the checkpoint ID, a whole number >= 0", c.ReplayStart)
	}
	switch c.ReplayCutoff {
	case "", "marker":
	case "end":
		r.ToEnd = true // the log's end, read at the start (Start sets LogEnd)
	default:
		if r.Cutoff, err = strconv.ParseUint(c.ReplayCutoff, 10, 64); err != nil || r.Cutoff == 0 {
			return r, true, fmt.Errorf("MS2M_REPLAY_CUTOFF=%q: want \"marker\", \"end\" or the last ID to replay, a whole number > 0", c.ReplayCutoff)
		}
	}
	if c.ReplayEpoch != "" {
		if r.Epoch, err = strconv.ParseUint(c.ReplayEpoch, 10, 64); err != nil {
			return r, true, fmt.Errorf("MS2M_REPLAY_EPOCH=%q: want the log's epoch at the checkpoint, a whole number >= 0", c.ReplayEpoch)
		}
	}
	if r.Skip, err = ParseSkip(c.ReplaySkip); err != nil {
		return r, true, fmt.Errorf("MS2M_REPLAY_SKIP: %w", err)
	}
	if err := r.Validate(); err != nil {
		return r, true, fmt.Errorf("MS2M_REPLAY_START, MS2M_REPLAY_CUTOFF and MS2M_REPLAY_SKIP: %w", err)
	}
	return r, true, nil
}

// redact hides the password in a URI for messages and logs. A URI that
// does not parse is redacted too: everything between the scheme and the
// last '@' (where a password would be) is replaced, since url.Parse cannot
// say where the user info ends.
func redact(uri string) string {
	u, err := url.Parse(uri)
	if err != nil || (u.User == nil && strings.Contains(uri, "@")) {
		return redactUnparsed(uri)
	}
	if u.User == nil {
		return uri
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// redactUnparsed hides whatever could be user info in a URI that url.Parse
// rejected or misread: a password may hold '/', '#', '?' or '%' unescaped.
func redactUnparsed(uri string) string {
	at := strings.LastIndex(uri, "@")
	if at < 0 {
		return uri // no user info: url.Parse failed on something else
	}
	start := 0
	if i := strings.Index(uri, "://"); i >= 0 && i < at {
		start = i + len("://")
	}
	return uri[:start] + "xxxxx@" + uri[at+1:]
}

// ParseSkip reads MS2M_REPLAY_SKIP: delivery IDs, comma-separated; ""
// is none. Their order and range are Range.Validate's to check.
func ParseSkip(v string) ([]uint64, error) {
	if v == "" {
		return nil, nil
	}
	parts := strings.Split(v, ",")
	if len(parts) > replay.MaxSkip {
		return nil, fmt.Errorf("%d IDs, more than %d", len(parts), replay.MaxSkip)
	}
	out := make([]uint64, 0, len(parts))
	for _, p := range parts {
		id, err := strconv.ParseUint(p, 10, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("%q is not a delivery ID (want whole numbers > 0, comma-separated)", p)
		}
		out = append(out, id)
	}
	return out, nil
}
