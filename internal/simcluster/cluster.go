package simcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/sign"
	"github.com/ms2m/ms2m/internal/webhook"
)

// NamespaceLabel opts a namespace into the cluster's webhook.
const NamespaceLabel = "ms2m-sim/webhook"

// Secret is the Secret every test namespace needs, as the chart makes it:
// the sidecars' stream URI and control token.
const Secret = "ms2m"

// Options configure Start.
type Options struct {
	// Assets is the folder with kube-apiserver, etcd and
	// kube-controller-manager (the repository's bin/k8s).
	Assets string
	// Nodes are the simulated nodes' names.
	Nodes []string
	// Scheduler runs the real kube-scheduler too (from Assets), which binds
	// pods that name no node: the controller's placeholder pods that ask
	// where an evacuated pod goes. Pods that name their node are not
	// touched by it.
	Scheduler bool
	// Logf, if set, hears what the simulation could not do.
	Logf func(format string, args ...any)
}

// Cluster is a running simulated cluster.
type Cluster struct {
	Config *rest.Config
	Client kubernetes.Interface
	// Kubeconfig is a file for processes: cluster-admin.
	Kubeconfig string
	// RegistryHost is the in-process registry, host:port.
	RegistryHost string
	// AgentToken is the agents' token.
	AgentToken string
	// SigningKey is the controller's key (text): the webhook restores only
	// what it signed. Controllers the tests start get it as
	// MS2M_STATUS_KEY, migrate.Env as SigningKey.
	SigningKey []byte
	Nodes      map[string]*Node

	env       *envtest.Environment
	ns        *netns
	dir       string
	kcm       *exec.Cmd
	kcmDone   chan error
	sched     *exec.Cmd
	schedDone chan error
	reg       *http.Server
	failPush  atomic.Bool
	// failPushTag: the registry refuses manifest pushes of this tag
	// (FailPushesOf).
	failPushTag atomic.Pointer[string]
	cancel      context.CancelFunc
	stopped     chan struct{}
	logsMu      sync.Mutex
	logs        map[string]*Log
	logf        func(format string, args ...any)
	inject      inject.Config
	broker      broker // the sidecars' broker (CutBroker)
}

// Missing says what Start needs that this machine lacks, or "".
func Missing(assets string) string {
	for _, b := range []string{"kube-apiserver", "etcd", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			return fmt.Sprintf("%s in %s (make k8s-bin node-bin builds it)", b, assets)
		}
	}
	if os.Geteuid() != 0 {
		return "root, for the simulated nodes' network namespace"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "iproute2's ip (apt-get install iproute2)"
	}
	return ""
}

// Start brings a cluster up. Close takes it down, also after an error.
func Start(o Options) (c *Cluster, err error) {
	c = &Cluster{Nodes: map[string]*Node{}, logs: map[string]*Log{}, logf: o.Logf, stopped: make(chan struct{}),
		AgentToken: "sim-agent-token"}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()
	quiet := logr.FromSlogHandler(slog.DiscardHandler)
	logf.SetLogger(quiet)
	klog.SetLogger(quiet)

	if c.dir, err = os.MkdirTemp("", "ms2m-sim-"); err != nil {
		return c, err
	}
	if c.ns, err = newNetns(); err != nil {
		return c, err
	}
	if err := c.startRegistry(); err != nil {
		return c, err
	}
	if err := c.configureInjection(); err != nil {
		return c, err
	}
	if err := c.startAPIServer(o.Assets); err != nil {
		return c, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	if err := c.startWebhook(ctx); err != nil {
		return c, err
	}
	if err := c.startControllerManager(o.Assets); err != nil {
		return c, err
	}
	if o.Scheduler {
		if err := c.startScheduler(o.Assets); err != nil {
			return c, err
		}
	}
	return c, c.startNodes(ctx, o.Nodes)
}

// configureInjection makes the controller's signing key and the webhook's
// settings, as the chart does.
func (c *Cluster) configureInjection() (err error) {
	if c.SigningKey, err = sign.NewKey(); err != nil {
		return err
	}
	c.inject = inject.Config{
		RestoreKey:   c.SigningKey,
		SidecarImage: c.RegistryHost + "/ms2m/sidecar:sim",
		StreamURI:    inject.SecretKey{Name: Secret, Key: "stream-uri"},
		ControlToken: inject.SecretKey{Name: Secret, Key: "control-token"},
	}
	c.inject.CheckpointRepository = c.ImageRepo()
	return nil
}

// startAPIServer starts etcd and kube-apiserver (envtest) with the
// webhook's registration, and writes an admin kubeconfig for processes.
func (c *Cluster) startAPIServer(assets string) (err error) {
	path := strings.TrimPrefix(webhook.Path, "/") // envtest joins host:port and path with a slash
	c.env = &envtest.Environment{
		BinaryAssetsDirectory: assets,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			LocalServingHost: "127.0.0.1",
			MutatingWebhooks: []*admissionregistrationv1.MutatingWebhookConfiguration{webhook.Registration{
				Name:              "ms2m-sim",
				ClientConfig:      admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Name: "ms2m-webhook", Namespace: "default", Path: &path}},
				NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{NamespaceLabel: "true"}},
			}.Configuration()},
		},
	}
	if c.Config, err = c.env.Start(); err != nil {
		return fmt.Errorf("start kube-apiserver and etcd from %s: %w", assets, err)
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return err
	}
	admin, err := c.env.AddUser(envtest.User{Name: "sim-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kc, err := admin.KubeConfig()
	if err != nil {
		return err
	}
	c.Kubeconfig = filepath.Join(c.dir, "kubeconfig")
	return os.WriteFile(c.Kubeconfig, kc, 0o600)
}

// startNodes starts the simulated nodes, each on an address of the
// cluster's network namespace.
func (c *Cluster) startNodes(ctx context.Context, names []string) error {
	for _, name := range names {
		ip, err := c.ns.take()
		if err != nil {
			return err
		}
		n := &Node{Name: name, IP: ip, CheckpointDir: filepath.Join(c.dir, name, "checkpoints"), c: c,
			fail: map[Step]Failure{}, holds: map[Step]*Hold{}, pods: map[types.UID]*SimPod{}, images: map[string]AppState{}}
		if err := os.MkdirAll(n.CheckpointDir, 0o700); err != nil {
			return err
		}
		c.Nodes[name] = n
		if err := n.start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// startRegistry serves go-containerregistry's in-memory registry on
// loopback; FailPushes makes it refuse manifest uploads.
func (c *Cluster) startRegistry() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	c.reg = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tag := c.failPushTag.Load()
		if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/manifests/") && (c.failPush.Load() || tag != nil && strings.HasSuffix(r.URL.Path, "/manifests/"+*tag)) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"errors":[{"code":"UNAVAILABLE","message":"the simulated registry refuses pushes"}]}`)
			return
		}
		h.ServeHTTP(w, r)
	})}
	go c.reg.Serve(ln)
	c.RegistryHost = ln.Addr().String()
	return nil
}

// FailPushes makes the registry refuse (true) or accept manifest pushes.
func (c *Cluster) FailPushes(on bool) { c.failPush.Store(on) }

// FailPushesOf makes the registry refuse manifest pushes tagged tag alone
// ("": none): one image of several fails.
func (c *Cluster) FailPushesOf(tag string) {
	if tag == "" {
		c.failPushTag.Store(nil)
		return
	}
	c.failPushTag.Store(&tag)
}

// ImageRepo is where the migrator pushes checkpoint images.
func (c *Cluster) ImageRepo() string { return c.RegistryHost + "/ms2m/checkpoints" }

// startWebhook runs the real webhook handler on envtest's serving address.
func (c *Cluster) startWebhook(ctx context.Context) error {
	wio := c.env.WebhookInstallOptions
	mgr, err := manager.New(c.Config, manager.Options{
		Scheme:                 webhook.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer:          ctrlwebhook.NewServer(ctrlwebhook.Options{Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: wio.LocalServingCertDir}),
	})
	if err != nil {
		return fmt.Errorf("webhook manager: %w", err)
	}
	m, err := webhook.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		return err
	}
	if _, err := webhook.Setup(mgr, c.inject, m, nil); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		errc <- mgr.Start(ctx)
		close(c.stopped)
	}()
	check := mgr.GetWebhookServer().StartedChecker()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-errc:
			return fmt.Errorf("webhook manager stopped: %w", err)
		default:
		}
		if check(nil) == nil && mgr.GetCache().WaitForCacheSync(ctx) {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the webhook did not start in 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startControllerManager runs the real kube-controller-manager with the
// controllers that own pods: ReplicaSet, Deployment and StatefulSet.
func (c *Cluster) startControllerManager(assets string) error {
	logFile, err := os.Create(filepath.Join(c.dir, "kube-controller-manager.log"))
	if err != nil {
		return err
	}
	c.kcm = exec.Command(filepath.Join(assets, "kube-controller-manager"),
		"--kubeconfig="+c.Kubeconfig,
		"--controllers=replicaset,deployment,statefulset",
		"--leader-elect=false",
		"--secure-port=0",
		"--concurrent-statefulset-syncs=2",
		"--v=1",
	)
	c.kcm.Stdout, c.kcm.Stderr = logFile, logFile
	if err := c.kcm.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start kube-controller-manager: %w", err)
	}
	c.kcmDone = make(chan error, 1)
	go func() {
		c.kcmDone <- c.kcm.Wait()
		logFile.Close()
	}()
	return nil
}

// startScheduler runs the real kube-scheduler, with its defaults.
func (c *Cluster) startScheduler(assets string) error {
	logFile, err := os.Create(filepath.Join(c.dir, "kube-scheduler.log"))
	if err != nil {
		return err
	}
	c.sched = exec.Command(filepath.Join(assets, "kube-scheduler"),
		"--kubeconfig="+c.Kubeconfig,
		"--authentication-kubeconfig="+c.Kubeconfig,
		"--authorization-kubeconfig="+c.Kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--v=1",
	)
	c.sched.Stdout, c.sched.Stderr = logFile, logFile
	if err := c.sched.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start kube-scheduler: %w", err)
	}
	c.schedDone = make(chan error, 1)
	go func() {
		c.schedDone <- c.sched.Wait()
		logFile.Close()
	}()
	return nil
}

// SchedulerLog is the end of kube-scheduler's log.
func (c *Cluster) SchedulerLog() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "kube-scheduler.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// ControllerManagerLog is the end of kube-controller-manager's log.
func (c *Cluster) ControllerManagerLog() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "kube-controller-manager.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// ControlToken is the sidecars' control token in namespace ns: derived
// from the controller's key, as the webhook writes it and the controller
// computes it.
func (c *Cluster) ControlToken(ns string) string { return control.TokenFor(c.SigningKey, ns) }

// Namespace creates a namespace that the webhook serves, with the Secret
// the sidecars need.
func (c *Cluster) Namespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{NamespaceLabel: "true"}}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return err
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: Secret, Namespace: name}, StringData: map[string]string{
		"stream-uri": "rabbitmq-stream://sim:sim@127.0.0.1:5552/", "control-token": c.ControlToken(name),
	}}
	_, err := c.Client.CoreV1().Secrets(name).Create(ctx, s, metav1.CreateOptions{})
	return err
}

// Log returns the replay log name, as the sidecars share it.
func (c *Cluster) Log(name string) *Log { return c.log(name) }

func (c *Cluster) log(name string) *Log {
	c.logsMu.Lock()
	defer c.logsMu.Unlock()
	l := c.logs[name]
	if l == nil {
		l = &Log{name: name}
		c.logs[name] = l
	}
	return l
}

// Close takes everything down; it is safe on a half-started cluster.
func (c *Cluster) Close() error {
	var errs []error
	for _, n := range c.Nodes {
		n.close()
	}
	if c.kcm != nil && c.kcm.Process != nil {
		c.kcm.Process.Kill()
		<-c.kcmDone //nolint:errcheck // "signal: killed", from the kill above
	}
	if c.sched != nil && c.sched.Process != nil {
		c.sched.Process.Kill()
		<-c.schedDone //nolint:errcheck // "signal: killed", from the kill above
	}
	if c.cancel != nil {
		c.cancel()
		select {
		case <-c.stopped:
		case <-time.After(30 * time.Second):
		}
	}
	if c.env != nil {
		errs = append(errs, c.env.Stop())
	}
	if c.reg != nil {
		c.reg.Close()
	}
	if c.ns != nil {
		errs = append(errs, c.ns.close())
	}
	if c.dir != "" {
		os.RemoveAll(c.dir)
	}
	return errors.Join(errs...)
}
