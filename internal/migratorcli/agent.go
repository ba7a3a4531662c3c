package migratorcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"

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
	freeze := agent.FreezeWatch{CgroupRoot: cfg.CgroupRoot}
	if cfg.RuntimeEndpoint != "" {
		puller = agent.CRIPuller{Endpoint: cfg.RuntimeEndpoint}
		// The thaw after CRIU's dump goes through containerd's task API
		// on the same socket; another runtime refuses it, and no thaw
		// happens.
		freeze.Runtime = agent.ContainerdResumer{Endpoint: cfg.RuntimeEndpoint}
	}
	s, err := agent.NewServer(agent.Config{
		CheckpointDir: cfg.CheckpointDir,
		LogDirs:       cfg.LogDirs,
		Repository:    cfg.ImageRepo,
		KeepArchives:  cfg.KeepArchives,
		Token:         token,
		Push:          ociimage.PushOptions{Insecure: cfg.RegistryInsecure, AuthFile: cfg.RegistryAuthFile},
		Puller:        puller,
		Freeze:        freeze,
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
	log.Info("agent ready", "listen", ln.Addr().String(), "checkpoints", cfg.CheckpointDir, "runtime", cfg.RuntimeEndpoint, "repository", cfg.ImageRepo, "keepArchives", cfg.KeepArchives)
	err = s.Serve(ctx, ln)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
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
