package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/ms2m/ms2m/internal/inject"
)

// EventSource is the reporting controller of the webhook's Events.
const EventSource = "ms2m-webhook"

// Setup builds a Handler on mgr's clients and registers it at Path on the
// manager's webhook server: namespace metadata comes from the manager's
// cache (its informer registered here, so that it syncs when the manager
// starts), pending-migration ConfigMaps straight from the API server, and
// Events go through the manager's recorder. wrap, if not nil, wraps the
// handler before it is registered (tests time it).
func Setup(mgr manager.Manager, cfg inject.Config, m *Metrics, wrap func(admission.Handler) admission.Handler) (*Handler, error) {
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	if _, err := mgr.GetCache().GetInformer(context.Background(), ns); err != nil {
		return nil, fmt.Errorf("set up the namespace cache: %w", err)
	}
	h, err := NewHandler(cfg, mgr.GetScheme(), mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder(EventSource), m)
	if err != nil {
		return nil, err
	}
	h.SetWriter(mgr.GetClient())
	h.secrets = mgr.GetClient()
	var ah admission.Handler = h
	if wrap != nil {
		ah = wrap(h)
	}
	mgr.GetWebhookServer().Register(Path, &admission.Webhook{Handler: ah})
	return h, nil
}

// Scheme is the scheme the webhook's clients use: the built-in types.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err) // only on a broken build
	}
	return s
}

// Run runs the webhook until ctx is done: it makes its certificates if
// cfg.SelfSigned, then serves the admission endpoint (HTTPS on cfg.Port),
// /healthz and /readyz (cfg.HealthAddr) and /metrics (cfg.MetricsAddr).
// restCfg reaches the API server.
func Run(ctx context.Context, cfg Config, restCfg *rest.Config, log logr.Logger) error {
	ic, err := cfg.Inject()
	if err != nil {
		return err
	}
	self, tlsOpts, err := serverTLS(cfg, log)
	if err != nil {
		return err
	}
	mgr, err := newManager(restCfg, cfg, tlsOpts, log)
	if err != nil {
		return err
	}
	m, err := NewMetrics(ctrlmetrics.Registry)
	if err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	if _, err := Setup(mgr, ic, m, nil); err != nil {
		return err
	}
	if self != nil {
		if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error { return self.run(ctx, mgr.GetClient()) })); err != nil {
			return err
		}
	}
	if err := addChecks(mgr, cfg.ConfigName, self); err != nil {
		return err
	}

	if len(ic.RestoreKey) == 0 {
		log.Error(nil, "no signing key (MS2M_WEBHOOK_SIGNING_KEY_FILE): every restore is refused, so no migration can complete; mount the controller's Secret ms2m-migration-status-key")
	}
	if ic.CheckpointRepository == "" {
		log.Error(nil, "no checkpoint repository (MS2M_WEBHOOK_CHECKPOINT_REPOSITORY): pods that name a checkpoint image, another pod's memory, in their image are not denied; set it to the migrator's MS2M_IMAGE_REPO")
	}
	log.Info("starting", "port", cfg.Port, "path", Path, "sidecarImage", ic.SidecarImage, "selfSigned", cfg.SelfSigned, "signingKey", len(ic.RestoreKey) > 0, "checkpointRepository", ic.CheckpointRepository)
	return mgr.Start(ctx)
}

// serverTLS is where the serving certificate comes from: with
// cfg.SelfSigned, the webhook's own CA and certificate, made now (self,
// whose run renews them and sets the caBundle); else the files in
// cfg.CertDir, which must be there.
func serverTLS(cfg Config, log logr.Logger) (self *selfSignedTLS, tlsOpts []func(*tls.Config), err error) {
	if !cfg.SelfSigned {
		return nil, nil, certsPresent(cfg.CertDir)
	}
	hosts := append(ServiceHosts(cfg.ServiceName, cfg.ServiceNamespace), cfg.CertHosts...)
	if self, err = newSelfSignedTLS(hosts, cfg.CertDir, cfg.CertValidity, cfg.ConfigName, log); err != nil {
		return nil, nil, err
	}
	return self, []func(*tls.Config){func(c *tls.Config) { c.GetCertificate = self.getCertificate }}, nil
}

// newManager makes the controller-runtime manager that serves the webhook:
// it caches namespace metadata only, and reads the rest straight from the
// API server.
func newManager(restCfg *rest.Config, cfg Config, tlsOpts []func(*tls.Config), log logr.Logger) (manager.Manager, error) {
	mgr, err := manager.New(restCfg, manager.Options{
		Scheme: Scheme(),
		Logger: log,
		Cache: cache.Options{
			// Only namespace metadata is cached; drop what it does not need.
			DefaultTransform: cache.TransformStripManagedFields(),
		},
		// Everything else is read straight from the API server, rarely.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{
			&corev1.ConfigMap{}, &admissionregistrationv1.MutatingWebhookConfiguration{},
		}}},
		Metrics:                metricsserver.Options{BindAddress: cfg.MetricsAddr},
		HealthProbeBindAddress: cfg.HealthAddr,
		WebhookServer:          webhook.NewServer(webhook.Options{Port: cfg.Port, CertDir: cfg.CertDir, TLSOpts: tlsOpts}),
	})
	if err != nil {
		return nil, fmt.Errorf("set up the controller-runtime manager: %w", err)
	}
	return mgr, nil
}

// addChecks adds /healthz and /readyz's checks: ready once the webhook
// server has started, the namespace cache has synced, and, when self is
// set, the caBundle of the MutatingWebhookConfiguration configName is.
func addChecks(mgr manager.Manager, configName string, self *selfSignedTLS) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhook-server", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("namespace-cache", func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("the namespace cache has not synced yet")
		}
		return nil
	}); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("ca-bundle", func(*http.Request) error {
		if self != nil && !self.ready.Load() {
			return fmt.Errorf("the caBundle of MutatingWebhookConfiguration %s is not set yet", configName)
		}
		return nil
	})
}

// patchCABundleUntilDone sets the caBundle, retrying with back-off until it
// succeeds (true) or ctx is done (false): the MutatingWebhookConfiguration
// may be created after the webhook starts (one Helm release makes both).
func patchCABundleUntilDone(ctx context.Context, c client.Client, name string, ca []byte, log logr.Logger) bool {
	wait := 500 * time.Millisecond
	for {
		err := PatchCABundle(ctx, c, name, ca)
		if err == nil {
			log.Info("set the caBundle", "mutatingWebhookConfiguration", name)
			return true
		}
		log.Error(err, "could not set the caBundle; retrying", "in", wait)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// certsPresent checks, at start, that the cert dir has a certificate and a
// key, so that a missing Secret mount fails with a message that says so.
func certsPresent(dir string) error {
	for _, f := range []string{CertFile, KeyFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return fmt.Errorf("MS2M_WEBHOOK_CERT_DIR=%s: %w: mount a TLS Secret there (cert-manager makes one), or set MS2M_WEBHOOK_SELF_SIGNED=true", dir, err)
		}
	}
	return nil
}
