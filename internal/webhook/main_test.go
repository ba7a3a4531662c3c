package webhook

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/testenv"
)

// The integration tests share one control plane (a real kube-apiserver and
// etcd from bin/k8s, see `make k8s-bin`) and one webhook server with the
// Handler, registered through a MutatingWebhookConfiguration as in a
// cluster. Each test works in its own namespace.

// skipLabel on a namespace keeps the suite's webhook out of it (run_test.go
// runs the whole binary's wiring there, with its own configuration).
const skipLabel = "ms2m-test/own-webhook"

// testInject is what the suite's handler injects.
var testInject = inject.Config{
	SidecarImage: "registry.test/ms2m/sidecar:test",
	StreamURI:    inject.SecretKey{Name: "ms2m", Key: "stream-uri"},
	ControlToken: inject.SecretKey{Name: "ms2m", Key: "control-token"},
	RestoreKey:   suiteKey,

	CheckpointRepository: suiteCheckpoints,
}

// suiteCheckpoints is the suite's checkpoint repository.
const suiteCheckpoints = "registry.test/ms2m/checkpoints"

// suite is the shared environment; nil when it could not start.
var suite struct {
	missing  string // what is missing, for testenv.Missing
	startErr error  // a control plane that is there but would not start
	cfg      *rest.Config
	client   client.Client
	registry *prometheus.Registry
	timings  *timings
	handler  *Handler
	stopped  chan struct{} // closed when the manager has stopped
}

func TestMain(m *testing.M) {
	flag.Parse()
	// controller-runtime and client-go log through logr and klog; keep
	// them quiet unless asked.
	level := slog.LevelError
	if os.Getenv("MS2M_TEST_VERBOSE") != "" {
		level = slog.LevelDebug
	}
	var quiet atomic.Bool
	log := logr.FromSlogHandler(muted{slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}), &quiet})
	logf.SetLogger(log)
	klog.SetLogger(log)

	var stop func()
	if !testing.Short() {
		stop = startSuite()
	}
	code := m.Run()
	if stop != nil {
		quiet.Store(true) // events still in flight fail at shutdown; that is expected
		stop()
	}
	os.Exit(code)
}

// muted is a slog.Handler that drops everything once off is set.
type muted struct {
	slog.Handler
	off *atomic.Bool
}

func (m muted) Enabled(ctx context.Context, l slog.Level) bool {
	return !m.off.Load() && m.Handler.Enabled(ctx, l)
}

func (m muted) Handle(ctx context.Context, r slog.Record) error {
	if m.off.Load() {
		return nil
	}
	return m.Handler.Handle(ctx, r)
}

func (m muted) WithAttrs(a []slog.Attr) slog.Handler { return muted{m.Handler.WithAttrs(a), m.off} }
func (m muted) WithGroup(g string) slog.Handler      { return muted{m.Handler.WithGroup(g), m.off} }

// assetsDir is where kube-apiserver and etcd are: KUBEBUILDER_ASSETS (the
// Makefile sets it), else the repository's bin/k8s.
func assetsDir() string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "bin", "k8s")
}

func startSuite() (stop func()) {
	dir := assetsDir()
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			suite.missing = fmt.Sprintf("the test control plane's %s in %s", b, dir)
			return nil
		}
	}
	path := strings.TrimPrefix(Path, "/") // envtest joins host:port and path with a slash
	env := &envtest.Environment{
		BinaryAssetsDirectory: dir,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			LocalServingHost: "127.0.0.1",
			MutatingWebhooks: []*admissionregistrationv1.MutatingWebhookConfiguration{
				testWebhookConfiguration("ms2m-suite", &admissionregistrationv1.WebhookClientConfig{
					Service: &admissionregistrationv1.ServiceReference{Name: "ms2m-webhook", Namespace: "default", Path: &path},
				}, metav1.LabelSelectorRequirement{Key: skipLabel, Operator: metav1.LabelSelectorOpDoesNotExist}),
			},
		},
	}
	cfg, err := env.Start()
	if err != nil {
		suite.startErr = fmt.Errorf("start envtest with the binaries in %s: %w", dir, err)
		_ = env.Stop()
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	stop = func() {
		cancel()
		select { // the manager first, while its certificates still exist
		case <-stopped:
		case <-time.After(30 * time.Second):
		}
		_ = env.Stop()
	}
	suite.stopped = stopped
	if err := startManager(ctx, cfg, env.WebhookInstallOptions); err != nil {
		suite.startErr = err
		return stop
	}
	return stop
}

// startManager runs the handler on a manager the way Run does, with the
// server on envtest's host, port and certificates.
func startManager(ctx context.Context, cfg *rest.Config, wio envtest.WebhookInstallOptions) error {
	mgr, err := manager.New(cfg, manager.Options{
		Scheme:                 Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer: ctrlwebhook.NewServer(ctrlwebhook.Options{
			Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: wio.LocalServingCertDir,
		}),
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	suite.registry = prometheus.NewRegistry()
	m, err := NewMetrics(suite.registry)
	if err != nil {
		return err
	}
	suite.timings = &timings{}
	if suite.handler, err = Setup(mgr, testInject, m, suite.timings.wrap); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		err := mgr.Start(ctx)
		close(suite.stopped)
		errc <- err
	}()

	// Ready when the server answers TLS and the namespace cache synced.
	check := mgr.GetWebhookServer().StartedChecker()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-errc:
			return fmt.Errorf("manager stopped: %w", err)
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, "/", nil)
		if check(req) == nil {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the webhook server did not start within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	syncCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		return errors.New("the namespace cache did not sync within 30s")
	}
	suite.cfg = cfg
	suite.client, err = client.New(cfg, client.Options{Scheme: Scheme()})
	return err
}

// testWebhookConfiguration registers the pod handler at cc for pods in
// namespaces that match sel, as the chart does (Registration).
func testWebhookConfiguration(name string, cc *admissionregistrationv1.WebhookClientConfig, sel metav1.LabelSelectorRequirement) *admissionregistrationv1.MutatingWebhookConfiguration {
	return Registration{
		Name:              name,
		ClientConfig:      *cc,
		NamespaceSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{sel}},
	}.Configuration()
}

// requireSuite returns the shared client, or fails (CI) or skips the test
// when the control plane is missing.
func requireSuite(t testing.TB) client.Client {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the test control plane (kube-apiserver and etcd); skipped with -short")
	}
	if suite.missing != "" {
		testenv.Missing(t, suite.missing, "run `make k8s-bin` (it builds kube-apiserver and etcd into bin/k8s), or set KUBEBUILDER_ASSETS")
	}
	if suite.startErr != nil {
		t.Fatal(suite.startErr)
	}
	return suite.client
}

// timings records how long the handler takes per request, when on. The
// benchmark reads it; the histogram measures the same span.
type timings struct {
	mu sync.Mutex
	on bool
	d  []time.Duration
}

func (tm *timings) wrap(h admission.Handler) admission.Handler {
	return admission.HandlerFunc(func(ctx context.Context, req admission.Request) admission.Response {
		start := time.Now()
		resp := h.Handle(ctx, req)
		d := time.Since(start)
		tm.mu.Lock()
		if tm.on {
			tm.d = append(tm.d, d)
		}
		tm.mu.Unlock()
		return resp
	})
}

func (tm *timings) start() {
	tm.mu.Lock()
	tm.on, tm.d = true, nil
	tm.mu.Unlock()
}

func (tm *timings) stop() []time.Duration {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	tm.on = false
	return tm.d
}
