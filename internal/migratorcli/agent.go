package migratorcli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/ms2m/ms2m/internal/agent"
	"github.com/ms2m/ms2m/internal/envconfig"
	"github.com/ms2m/ms2m/internal/ociimage"
)

// AgentConfig is `migrator agent`'s configuration, from the environment.
type AgentConfig struct {
	// Listen is the agent's address; it runs on the node's host network.
	Listen string `env:"MS2M_AGENT_LISTEN" envDefault:":8090"`
	// ListenIP, when set, is the only address the agent listens on, at
	// Listen's port: the node's InternalIP (the chart passes status.hostIP),
	// so that the API is not on every host interface.
	ListenIP string `env:"MS2M_AGENT_LISTEN_IP"`
	// CheckpointDir is the kubelet's checkpoint folder, mounted read-only.
	CheckpointDir string `env:"MS2M_AGENT_CHECKPOINT_DIR" envDefault:"/var/lib/kubelet/checkpoints"`
	// RuntimeEndpoint is the CRI socket images are pulled through.
	RuntimeEndpoint string `env:"MS2M_AGENT_RUNTIME_ENDPOINT" envDefault:"unix:///run/containerd/containerd.sock"`
	// LogDirs are the folders CRIU logs are served from (the runtime's
	// state folder), comma-separated; empty serves none.
	LogDirs []string `env:"MS2M_AGENT_LOG_DIRS" envSeparator:","`
	// Token or TokenFile authenticates the migrator.
	Token     string `env:"MS2M_AGENT_TOKEN"`
	TokenFile string `env:"MS2M_AGENT_TOKEN_FILE"`
	// RegistryInsecure allows plain HTTP to the checkpoint registry;
	// RegistryAuthFile is a docker config.json with its credentials.
	RegistryInsecure bool   `env:"MS2M_AGENT_REGISTRY_INSECURE" envDefault:"false"`
	RegistryAuthFile string `env:"MS2M_AGENT_REGISTRY_AUTH_FILE"`
	// ImageRepo is the checkpoint repository: the only one the agent
	// pushes to and deletes from (the migrator's MS2M_IMAGE_REPO).
	ImageRepo string `env:"MS2M_AGENT_IMAGE_REPO"`
	// KeepArchives leaves kubelet checkpoint archives on the node after
	// their push, for debugging; the default removes them.
	KeepArchives bool `env:"MS2M_AGENT_KEEP_ARCHIVES" envDefault:"false"`
	// ArchiveGrace is how long the archive of a checkpoint the agent took
	// may stay without an image built from it before the agent removes it
	// (a migration that ended, or an agent that died, in between).
	ArchiveGrace time.Duration `env:"MS2M_AGENT_ARCHIVE_GRACE" envDefault:"35m"`
	// CgroupRoot is where the host's cgroup hierarchies are mounted, for
	// the freeze watch (which also needs the host's PID namespace).
	CgroupRoot string `env:"MS2M_AGENT_CGROUP_ROOT" envDefault:"/sys/fs/cgroup"`
	// RuntimeConfig are the runtime's configuration files as the agent
	// sees them (mounted from the host), comma-separated, later ones
	// winning: containerd's config.toml, or CRI-O's crio.conf and its
	// drop-ins. The preflight reads whether restore is on from them;
	// empty: not checked.
	RuntimeConfig []string `env:"MS2M_AGENT_RUNTIME_CONFIG" envSeparator:","`
	// CRIUPath is the node's criu as the agent sees it (a hostPath
	// mount); the preflight runs its --version. Empty: not checked.
	CRIUPath string `env:"MS2M_AGENT_CRIU_PATH"`
	LogLevel string `env:"MS2M_AGENT_LOG_LEVEL" envDefault:"info"`

	// TLSCertFile and TLSKeyFile are the agent's serving certificate and
	// key (the chart's Secret); the agent serves TLS only, and reloads
	// them when they change. PlainHTTP serves without TLS instead: for a
	// test on one host, never on a cluster.
	TLSCertFile string `env:"MS2M_AGENT_TLS_CERT_FILE"`
	TLSKeyFile  string `env:"MS2M_AGENT_TLS_KEY_FILE"`
	PlainHTTP   bool   `env:"MS2M_AGENT_PLAIN_HTTP" envDefault:"false"`

	// NodeName is the agent's node (the chart passes spec.nodeName):
	// checkpoint tokens are for one node.
	NodeName string `env:"NODE_NAME"`
	// KubeletURL is the node's kubelet, which the agent asks for
	// checkpoints. Default: https://<ListenIP>:10250; with neither set,
	// the agent takes no checkpoints.
	KubeletURL string `env:"MS2M_AGENT_KUBELET_URL"`
	// KubeletTokenFile is the bearer token the kubelet authenticates: the
	// agent's ServiceAccount token, which may create nodes/checkpoint.
	KubeletTokenFile string `env:"MS2M_AGENT_KUBELET_TOKEN_FILE" envDefault:"/var/run/secrets/kubernetes.io/serviceaccount/token"`
	// KubeletCAFile is what the kubelet's serving certificate is checked
	// against: the cluster CA where kubelets have certificates it signed,
	// or the kubelet's own self-signed certificate (<kubelet
	// root>/pki/kubelet.crt), mounted from the node. KubeletServerName is
	// the name the certificate must carry (default: NodeName, which a
	// kubelet's self-signed certificate names).
	KubeletCAFile     string `env:"MS2M_AGENT_KUBELET_CA_FILE" envDefault:"/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"`
	KubeletServerName string `env:"MS2M_AGENT_KUBELET_SERVER_NAME"`
	// KubeletInsecureSkipVerify does not check the kubelet's certificate
	// at all; the agent's token could then go to whoever answers at the
	// kubelet's address.
	KubeletInsecureSkipVerify bool `env:"MS2M_AGENT_KUBELET_INSECURE_SKIP_VERIFY" envDefault:"false"`
}

func agentCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "migrator agent takes no arguments; it is configured by MS2M_AGENT_* variables (docs/migrator.md)\n")
		return 2
	}
	cfg, err := envconfig.Parse[AgentConfig]()
	if err != nil {
		fmt.Fprintf(stderr, "migrator agent: %v\n", err)
		return 2
	}
	level, err := envconfig.Level("MS2M_AGENT_LOG_LEVEL", cfg.LogLevel)
	if err != nil {
		fmt.Fprintf(stderr, "migrator agent: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := runAgent(ctx, cfg, log); err != nil {
		log.Error("agent stopped", "err", err)
		return 1
	}
	return 0
}

func runAgent(ctx context.Context, cfg AgentConfig, log *slog.Logger) error {
	token := cfg.Token
	if cfg.TokenFile != "" {
		b, err := os.ReadFile(cfg.TokenFile)
		if err != nil {
			return fmt.Errorf("MS2M_AGENT_TOKEN_FILE: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	if st, err := os.Stat(cfg.CheckpointDir); err != nil || !st.IsDir() {
		return fmt.Errorf("MS2M_AGENT_CHECKPOINT_DIR=%s: not a folder (%v); mount the kubelet's checkpoint folder there", cfg.CheckpointDir, err)
	}
	var puller agent.Puller
	var locator agent.Locator
	freeze := agent.FreezeWatch{CgroupRoot: cfg.CgroupRoot}
	if cfg.RuntimeEndpoint != "" {
		puller = agent.CRIPuller{Endpoint: cfg.RuntimeEndpoint}
		locator = agent.CRILocator{Endpoint: cfg.RuntimeEndpoint}
		// The thaw after CRIU's dump goes through the node's runtime:
		// containerd's task API on the same socket, or on CRI-O the OCI
		// runtime's resume, from CRI-O's configuration (RuntimeConfig).
		resumer := &agent.NodeResumer{Endpoint: cfg.RuntimeEndpoint, Config: cfg.RuntimeConfig}
		freeze.Runtime = resumer
		go func() {
			if err := resumer.Prepare(ctx); err != nil {
				log.Warn("the agent cannot resume containers through the node's runtime yet (no thaw at the dump; an unpause after a failed checkpoint thaws the freezer cgroup itself); it tries again at the first resume", "err", err)
			}
		}()
	}
	var tlsCfg *tls.Config
	switch {
	case cfg.TLSCertFile != "" || cfg.TLSKeyFile != "":
		c, err := agent.ServerTLS(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return err
		}
		tlsCfg = c
	case !cfg.PlainHTTP:
		return errors.New("no TLS certificate (MS2M_AGENT_TLS_CERT_FILE and MS2M_AGENT_TLS_KEY_FILE): the agent hands out checkpoints and CRIU logs, so it serves TLS only (MS2M_AGENT_PLAIN_HTTP=true serves plain HTTP, for a test on one host)")
	}
	kubelet, err := agentKubelet(cfg)
	if err != nil {
		return err
	}
	s, err := agent.NewServer(agent.Config{
		NodeName:      cfg.NodeName,
		Kubelet:       kubelet,
		CheckpointDir: cfg.CheckpointDir,
		LogDirs:       cfg.LogDirs,
		Repository:    cfg.ImageRepo,
		KeepArchives:  cfg.KeepArchives,
		ArchiveGrace:  cfg.ArchiveGrace,
		Token:         token,
		Push:          ociimage.PushOptions{Insecure: cfg.RegistryInsecure, AuthFile: cfg.RegistryAuthFile},
		Puller:        puller,
		Freeze:        freeze,
		Locator:       locator,
		Node:          agent.NodeProbe{RuntimeEndpoint: cfg.RuntimeEndpoint, RuntimeConfig: cfg.RuntimeConfig, CRIUPath: cfg.CRIUPath, CgroupRoot: cfg.CgroupRoot},
		Logger:        log,
	})
	if err != nil {
		return err
	}
	addr, err := agentListenAddr(cfg.Listen, cfg.ListenIP)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("MS2M_AGENT_LISTEN=%s: %w", addr, err)
	}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	} else {
		log.Warn("serving plain HTTP (MS2M_AGENT_PLAIN_HTTP): anyone on the network path reads the token and the checkpoints' paths")
	}
	kubeletURL := ""
	if kubelet != nil {
		kubeletURL = kubelet.URL
	}
	log.Info("agent ready", "listen", ln.Addr().String(), "tls", tlsCfg != nil, "node", cfg.NodeName, "kubelet", kubeletURL, "checkpoints", cfg.CheckpointDir, "runtime", cfg.RuntimeEndpoint, "repository", cfg.ImageRepo, "keepArchives", cfg.KeepArchives)
	go s.SweepArchives(ctx)
	err = s.Serve(ctx, ln)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// agentKubelet is the kubelet client cfg asks for, or nil when no kubelet
// is configured (no MS2M_AGENT_KUBELET_URL and no MS2M_AGENT_LISTEN_IP).
func agentKubelet(cfg AgentConfig) (*agent.Kubelet, error) {
	u := cfg.KubeletURL
	if u == "" && cfg.ListenIP != "" {
		u = "https://" + net.JoinHostPort(cfg.ListenIP, "10250")
	}
	if u == "" {
		return nil, nil
	}
	if !strings.HasPrefix(u, "https://") {
		return nil, fmt.Errorf("MS2M_AGENT_KUBELET_URL=%q: want https://<address>:<port>; the kubelet serves TLS", u)
	}
	if cfg.NodeName == "" {
		return nil, errors.New("NODE_NAME is not set: the agent takes checkpoints of its own node's pods only, and needs its name (the chart passes spec.nodeName)")
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.KubeletInsecureSkipVerify {
		tc.InsecureSkipVerify = true
	} else {
		pem, err := os.ReadFile(cfg.KubeletCAFile)
		if err != nil {
			return nil, fmt.Errorf("MS2M_AGENT_KUBELET_CA_FILE: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("MS2M_AGENT_KUBELET_CA_FILE=%s holds no PEM certificate", cfg.KubeletCAFile)
		}
		tc.RootCAs = pool
		tc.ServerName = cfg.KubeletServerName
		if tc.ServerName == "" {
			tc.ServerName = cfg.NodeName
		}
	}
	return &agent.Kubelet{
		URL:       u,
		TokenFile: cfg.KubeletTokenFile,
		HTTP:      &http.Client{Transport: &http.Transport{TLSClientConfig: tc, TLSHandshakeTimeout: 10 * time.Second}},
	}, nil
}

// agentListenAddr is the address to listen on: listen, or, with ip set,
// ip at listen's port.
func agentListenAddr(listen, ip string) (string, error) {
	if ip == "" {
		return listen, nil
	}
	if net.ParseIP(ip) == nil {
		return "", fmt.Errorf("MS2M_AGENT_LISTEN_IP=%q: want an IP address (the chart sets the node's, status.hostIP)", ip)
	}
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("MS2M_AGENT_LISTEN=%q: want host:port or :port: %w", listen, err)
	}
	return net.JoinHostPort(ip, port), nil
}
