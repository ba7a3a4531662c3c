package migratorcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ms2m/ms2m/internal/controller"
	"github.com/ms2m/ms2m/internal/envconfig"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/sign"
)

// ControllerConfig is `migrator controller`'s configuration, from the
// environment.
type ControllerConfig struct {
	// ImageRepo is where checkpoint images go, as the nodes pull them.
	ImageRepo string `env:"MS2M_IMAGE_REPO,required,notEmpty"`
	// AgentPort is the node agents' port on each node's InternalIP.
	AgentPort int `env:"MS2M_AGENT_PORT" envDefault:"8090"`
	// AgentToken or AgentTokenFile authenticates to the agents.
	AgentToken     string `env:"MS2M_AGENT_TOKEN"`
	AgentTokenFile string `env:"MS2M_AGENT_TOKEN_FILE"`
	// AgentCAFile is the CA the agents' TLS certificate is checked
	// against, AgentServerName the name it carries (default
	// DefaultAgentServerName); no CA file: plain HTTP to the agents.
	AgentCAFile     string `env:"MS2M_AGENT_CA_FILE"`
	AgentServerName string `env:"MS2M_AGENT_SERVER_NAME"`
	// CheckpointVia is agent (the node agents ask their own kubelet) or
	// apiserver (the API server's node proxy; needs nodes/proxy).
	CheckpointVia string `env:"MS2M_CHECKPOINT_VIA" envDefault:"agent"`
	// LeaderElection makes replicas take turns: one drives migrations.
	LeaderElection          bool   `env:"MS2M_LEADER_ELECTION" envDefault:"true"`
	LeaderElectionNamespace string `env:"MS2M_LEADER_ELECTION_NAMESPACE"`
	// Concurrent bounds the migrations run at once.
	Concurrent int `env:"MS2M_CONCURRENT_MIGRATIONS" envDefault:"4"`
	// EvacuatePerNode and EvacuateMax bound the evacuations (evictions
	// turned into migrations) under way off one node and in the cluster.
	EvacuatePerNode int `env:"MS2M_EVACUATE_PER_NODE" envDefault:"2"`
	EvacuateMax     int `env:"MS2M_EVACUATE_MAX" envDefault:"4"`
	// PlaceholderImage is the image of the placeholder pods that ask
	// kube-scheduler for an evacuation's target.
	PlaceholderImage string `env:"MS2M_PLACEHOLDER_IMAGE" envDefault:"registry.k8s.io/pause:3.10"`
	// Timeout bounds each wait of a migration.
	Timeout time.Duration `env:"MS2M_MIGRATION_TIMEOUT" envDefault:"5m"`
	// ThawAfterDump: when the node agent thaws the app as soon as CRIU's
	// dump is done (migrate.ThawPolicy: auto, always, never).
	ThawAfterDump string `env:"MS2M_THAW_AFTER_DUMP" envDefault:"auto"`
	// StatusKey or StatusKeyFile is the key that signs migration statuses;
	// neither: the Secret StatusKeySecret in the controller's namespace
	// (MS2M_LEADER_ELECTION_NAMESPACE, else its ServiceAccount's), made
	// if missing.
	StatusKey     string `env:"MS2M_STATUS_KEY"`
	StatusKeyFile string `env:"MS2M_STATUS_KEY_FILE"`
	// KeepImages keeps checkpoint images once the target serves.
	KeepImages bool `env:"MS2M_KEEP_CHECKPOINT_IMAGES" envDefault:"false"`
	// BrokerUsers provisions per-namespace broker users when its
	// MS2M_BROKER_MANAGEMENT_URL is set.
	BrokerUsers BrokerUserConfig
	MetricsAddr string `env:"MS2M_METRICS_ADDR" envDefault:":8080"`
	HealthAddr  string `env:"MS2M_HEALTH_ADDR" envDefault:":8081"`
	LogLevel    string `env:"MS2M_LOG_LEVEL" envDefault:"info"`
}

// LeaderElectionID names the lease the replicas share.
const LeaderElectionID = "ms2m-migrator"

func controllerCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "migrator controller takes no arguments; it is configured by MS2M_* variables (docs/migrator.md)\n")
		return 2
	}
	cfg, err := envconfig.Parse[ControllerConfig]()
	if err != nil {
		fmt.Fprintf(stderr, "migrator controller: %v\n", err)
		return 2
	}
	level, err := envconfig.Level("MS2M_LOG_LEVEL", cfg.LogLevel)
	if err != nil {
		fmt.Fprintf(stderr, "migrator controller: %v\n", err)
		return 2
	}
	thaw, err := migrate.ParseThawPolicy(cfg.ThawAfterDump)
	if err != nil {
		fmt.Fprintf(stderr, "migrator controller: MS2M_THAW_AFTER_DUMP: %v\n", err)
		return 2
	}
	token := cfg.AgentToken
	if cfg.AgentTokenFile != "" {
		b, err := os.ReadFile(cfg.AgentTokenFile)
		if err != nil {
			fmt.Fprintf(stderr, "migrator controller: MS2M_AGENT_TOKEN_FILE: %v\n", err)
			return 2
		}
		token = strings.TrimSpace(string(b))
	}
	if token == "" {
		fmt.Fprintln(stderr, "migrator controller: MS2M_AGENT_TOKEN or MS2M_AGENT_TOKEN_FILE: the node agents' token is required")
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := runController(ctx, cfg, token, thaw, log); err != nil {
		log.Error("controller stopped", "err", err)
		return 1
	}
	return 0
}

func runController(ctx context.Context, cfg ControllerConfig, token string, thaw migrate.ThawPolicy, log *slog.Logger) error {
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	mgr, err := manager.New(restCfg, manager.Options{
		Logger:                  logr.FromSlogHandler(log.Handler()),
		Metrics:                 metricsserver.Options{BindAddress: cfg.MetricsAddr},
		HealthProbeBindAddress:  cfg.HealthAddr,
		LeaderElection:          cfg.LeaderElection,
		LeaderElectionID:        LeaderElectionID,
		LeaderElectionNamespace: cfg.LeaderElectionNamespace,
		// A replica that loses its lease stops at once, so that two never
		// drive the same migration.
		LeaderElectionReleaseOnCancel: true,
		// Of the ConfigMaps, only the pending-migration records.
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{&corev1.ConfigMap{}: {Label: controller.PendingSelector()}}},
	})
	if err != nil {
		return fmt.Errorf("set up the controller-runtime manager: %w", err)
	}
	key, err := statusKey(ctx, cs, cfg)
	if err != nil {
		// Still safe: a key of this process alone signs and checks; but a
		// restarted controller then treats what it left as forged.
		log.Error("no shared status key: using one for this process alone; a restarted controller will not roll back migrations it left running", "err", err)
	}
	viaAPIServer, err := checkpointVia(cfg.CheckpointVia)
	if err != nil {
		return fmt.Errorf("MS2M_CHECKPOINT_VIA: %w", err)
	}
	ac, err := agentClient(cs, cfg.AgentPort, token, cfg.AgentCAFile, cfg.AgentServerName)
	if err != nil {
		return err
	}
	rec := controller.New(controller.Config{
		CheckpointThroughAPIServer: viaAPIServer,
		StatusKey:                  key,
		Client:                     cs,
		Events:                     mgr.GetEventRecorder(controller.EventSource),
		Agent:                      ac,
		ImageRepo:                  cfg.ImageRepo,
		Timeout:                    cfg.Timeout,
		Concurrent:                 cfg.Concurrent,
		ThawAfterDump:              thaw,
		KeepImages:                 cfg.KeepImages,

		EvacuatePerNode:  cfg.EvacuatePerNode,
		EvacuateMax:      cfg.EvacuateMax,
		PlaceholderImage: cfg.PlaceholderImage,
	})
	if err := rec.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the migration controller: %w", err)
	}
	if cfg.BrokerUsers.ManagementURL != "" {
		prov, err := cfg.BrokerUsers.provisioner(cs)
		if err != nil {
			return fmt.Errorf("per-namespace broker users: %w", err)
		}
		bu := &controller.BrokerUsers{
			Provisioner: prov, Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
			Namespaces: cfg.BrokerUsers.Namespaces,
			Exclude:    []string{"kube-system", cfg.LeaderElectionNamespace},
			Log:        logr.FromSlogHandler(log.Handler()).WithName("broker-users"),
		}
		if err := bu.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("set up the broker-users controller: %w", err)
		}
		log.Info("provisioning per-namespace broker users", "managementURL", cfg.BrokerUsers.ManagementURL,
			"streamAddress", cfg.BrokerUsers.StreamAddress, "userPrefix", cfg.BrokerUsers.UserPrefix, "namespaces", cfg.BrokerUsers.Namespaces)
	}
	if err := addProbes(mgr); err != nil {
		return err
	}
	log.Info("controller starting", "imageRepo", cfg.ImageRepo, "leaderElection", cfg.LeaderElection, "thawAfterDump", thaw)
	return mgr.Start(ctx)
}

// addProbes registers the checks behind /healthz and /readyz on
// MS2M_HEALTH_ADDR. Live: the process serves. Ready: the informer cache
// has synced; a replica waiting for the lease has no informers yet and is
// ready at once, a new leader once its cache of annotated pods is filled.
func addProbes(mgr manager.Manager) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("add the liveness check (/healthz): %w", err)
	}
	if err := mgr.AddReadyzCheck("cache", func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("the pod cache has not synced yet")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("add the readiness check (/readyz): %w", err)
	}
	return nil
}

// StatusKeySecret is the Secret that holds the key signing migration
// statuses, in the controller's namespace; key StatusKeySecretKey.
const (
	StatusKeySecret    = "ms2m-migration-status-key"
	StatusKeySecretKey = "key"
)

// statusKey returns the key that signs migration statuses: from the
// environment, else from StatusKeySecret, which it creates if missing.
func statusKey(ctx context.Context, cs kubernetes.Interface, cfg ControllerConfig) ([]byte, error) {
	switch {
	case cfg.StatusKey != "":
		return []byte(cfg.StatusKey), nil
	case cfg.StatusKeyFile != "":
		k, err := sign.ReadKeyFile(cfg.StatusKeyFile)
		if err != nil {
			return nil, fmt.Errorf("MS2M_STATUS_KEY_FILE: %w", err)
		}
		return k, nil
	}
	ns := cfg.LeaderElectionNamespace
	if ns == "" {
		b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
		if err != nil {
			return nil, fmt.Errorf("the controller's namespace for Secret %s: set MS2M_LEADER_ELECTION_NAMESPACE: %w", StatusKeySecret, err)
		}
		ns = strings.TrimSpace(string(b))
	}
	secrets := cs.CoreV1().Secrets(ns)
	for range 2 {
		s, err := secrets.Get(ctx, StatusKeySecret, metav1.GetOptions{})
		if err == nil {
			if k := s.Data[StatusKeySecretKey]; len(k) >= 16 {
				return k, nil
			}
			return nil, fmt.Errorf("the Secret %s/%s: key %q is missing or shorter than 16 bytes: delete the Secret and the controller makes a new one", ns, StatusKeySecret, StatusKeySecretKey)
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("get Secret %s/%s (the controller needs get and create on it): %w", ns, StatusKeySecret, err)
		}
		k, err := sign.NewKey()
		if err != nil {
			return nil, err
		}
		_, err = secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: StatusKeySecret, Namespace: ns}, Data: map[string][]byte{StatusKeySecretKey: k}}, metav1.CreateOptions{})
		if err == nil {
			return k, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create Secret %s/%s (the controller needs get and create on it): %w", ns, StatusKeySecret, err)
		}
		// Another replica made it meanwhile: read that one.
	}
	return nil, fmt.Errorf("the Secret %s/%s: made and gone again", ns, StatusKeySecret)
}
