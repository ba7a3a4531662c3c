package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/ms2m/ms2m/e2e/cluster"
)

const (
	// InstalledWebhookConfigName is the MutatingWebhookConfiguration of the
	// webhook that Install runs: not the tests' (WebhookConfigName), so
	// that the two are never taken for one another.
	InstalledWebhookConfigName = "ms2m-webhook"
	// Installed components' loopback ports: the webhook's health and
	// metrics, the controller's health and metrics. The webhook itself
	// listens on WebhookPort, the agents on AgentPort of their node.
	installedWebhookHealth  = "127.0.0.1:9444"
	installedWebhookMetrics = "127.0.0.1:9445"
	installedControlHealth  = "127.0.0.1:9446"
	installedControlMetrics = "127.0.0.1:9447"
	// Addon names, as `status` lists them.
	addonWebhook    = "ms2m-webhook"
	addonController = "ms2m-controller"
)

func addonAgent(i int) string { return "ms2m-agent-" + cluster.NodeName(i) }

// Installed is ms2m running on the lab's cluster as the cluster's addons
// (cluster.Addon): host processes that stay up after the process that
// started them exits, and go with the cluster's Down.
type Installed struct {
	// WebhookURL is what the API server calls; the registration is
	// InstalledWebhookConfigName.
	WebhookURL string
	// ImageRepo is where checkpoint images go.
	ImageRepo string
	// Components are the processes, in the order they started, or the
	// chart's pods.
	Components []InstalledComponent
	// Chart says ms2m runs in pods, installed by the chart (InstallChart)
	// with the values file Values.
	Chart  bool
	Values string
}

// InstalledComponent is one process of an installation.
type InstalledComponent struct {
	Name string // the addon's name
	PID  int    // a process's; 0 for a pod
	Node string // a pod's node
	Log  string // a process's log file, or how to read a pod's
	// Addr is where it serves: the webhook's URL, an agent's address, the
	// controller's health address.
	Addr string
}

// Install runs ms2m on the lab's cluster the way a user's cluster runs it,
// as host processes with the cluster's admin kubeconfig: the webhook
// (cmd/webhook, registered by URL as InstalledWebhookConfigName, with its
// self-signed certificate), one node agent per node (`migrator agent`, in
// the node's network namespace, over that node's kubelet checkpoint folder
// and containerd socket) and the annotation-driven controller (`migrator
// controller`, with leader election). The images and the Secret are those
// Start put in place. It replaces an installation that runs, and returns
// once every part answers its health check. The cluster's Down stops them.
func (l *Lab) Install(ctx context.Context) (*Installed, error) {
	return l.InstallWith(ctx, InstallOptions{})
}

// InstallOptions change what Install runs.
type InstallOptions struct {
	// ControllerEnv is added to the controller's environment, after the
	// lab's own settings (so it wins): MS2M_EVACUATE_PER_NODE=1, say.
	ControllerEnv []string
}

// InstallWith is Install with o.
func (l *Lab) InstallWith(ctx context.Context, o InstallOptions) (*Installed, error) {
	if l.Cluster == nil {
		return nil, fmt.Errorf("install ms2m: the lab has no local cluster")
	}
	dir := filepath.Join(l.Cluster.StateDir(), "ms2m")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// The chart's installation and this one must not serve side by side.
	if l.chartInstalled(ctx) {
		if err := l.UninstallChart(ctx); err != nil {
			return nil, fmt.Errorf("uninstall the chart first: %w", err)
		}
	}
	in := &Installed{ImageRepo: l.ImageRepo()}
	migrator := filepath.Join(dir, "migrator")
	if err := l.run(ctx, "go", "build", "-o", migrator, "./cmd/migrator"); err != nil {
		return nil, err
	}
	started := func(name string, pid int, log, addr string) {
		in.Components = append(in.Components, InstalledComponent{Name: name, PID: pid, Log: log, Addr: addr})
		fmt.Fprintf(l.log, "lab: %s ready, pid %d (%s; log %s)\n", name, pid, addr, log)
	}
	exited := func(name string) func() (bool, string) {
		return func() (bool, string) {
			_, ok := l.Cluster.AddonRunning(name)
			return !ok, "see its log"
		}
	}

	// The webhook.
	w := &Webhook{Dir: filepath.Join(dir, "webhook"), HealthAddr: installedWebhookHealth, MetricsAddr: installedWebhookMetrics}
	if err := l.Cluster.StopAddon(addonWebhook); err != nil {
		return nil, fmt.Errorf("stop the webhook left from before: %w", err)
	}
	bin, env, err := l.prepareWebhook(ctx, w, InstalledWebhookConfigName, WebhookPort)
	if err != nil {
		return nil, err
	}
	pid, log, err := l.Cluster.StartAddon(cluster.Addon{Name: addonWebhook, Bin: bin, Env: env})
	if err != nil {
		return nil, errors.Join(err, l.deleteWebhookConfig(InstalledWebhookConfigName))
	}
	if err := waitHTTP(ctx, "the webhook", "http://"+w.HealthAddr+"/readyz", 2*time.Minute, log, exited(addonWebhook)); err != nil {
		return nil, errors.Join(err, l.Cluster.StopAddon(addonWebhook), l.deleteWebhookConfig(InstalledWebhookConfigName))
	}
	in.WebhookURL = w.URL
	started(addonWebhook, pid, log, w.URL)

	// An agent per node.
	files, err := l.AgentFiles(ctx)
	if err != nil {
		return nil, err
	}
	for i := 1; i <= l.Cluster.Nodes(); i++ {
		n := l.Cluster.Node(i)
		pid, log, err := l.Cluster.StartAddon(cluster.Addon{Name: addonAgent(i), Bin: migrator, Args: []string{"agent"}, Node: i, Env: agentEnv(n, in.ImageRepo, files, l.CRIUPath())})
		if err != nil {
			return nil, err
		}
		if err := waitAgent(ctx, n, files, log, exited(addonAgent(i))); err != nil {
			return nil, err
		}
		started(addonAgent(i), pid, log, n.IP+":"+strconv.Itoa(AgentPort))
	}

	// The controller.
	pid, log, err = l.Cluster.StartAddon(cluster.Addon{Name: addonController, Bin: migrator, Args: []string{"controller"}, Env: append([]string{
		"KUBECONFIG=" + l.Cluster.Kubeconfig(),
		"MS2M_IMAGE_REPO=" + in.ImageRepo,
		"MS2M_AGENT_PORT=" + strconv.Itoa(AgentPort),
		"MS2M_AGENT_TOKEN=" + AgentToken,
		"MS2M_AGENT_CA_FILE=" + files.CA,
		"MS2M_AGENT_SERVER_NAME=" + AgentServerName,
		"MS2M_STATUS_KEY=" + SigningKey, // the webhook's MS2M_WEBHOOK_SIGNING_KEY
		// Out of a cluster there is no namespace to default to.
		"MS2M_LEADER_ELECTION_NAMESPACE=kube-system",
		"MS2M_HEALTH_ADDR=" + installedControlHealth,
		"MS2M_METRICS_ADDR=" + installedControlMetrics,
		"MS2M_LOG_LEVEL=debug",
	}, o.ControllerEnv...)})
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, "the controller", "http://"+installedControlHealth+"/readyz", time.Minute, log, exited(addonController)); err != nil {
		return nil, err
	}
	started(addonController, pid, log, "health http://"+installedControlHealth+", metrics http://"+installedControlMetrics+"/metrics")
	l.installed = true
	return in, nil
}

// ExampleManifest is a Deployment of one Go sample consumer on node 1 that
// opted in with the annotation alone, as YAML for kubectl apply: what a
// user tries a migration on. It reads queue name from the broker, with
// 50 ms of work per message.
func (l *Lab) ExampleManifest(name string) ([]byte, error) {
	p, err := l.Pod(Consumer{Name: name, Queue: name, Node: l.NodeName(1), WorkMS: 50})
	if err != nil {
		return nil, err
	}
	one := int32(1)
	d := appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: p.Labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: p.Labels, Annotations: p.Annotations}, Spec: p.Spec},
		},
	}
	return yaml.Marshal(d)
}
