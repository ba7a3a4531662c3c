package lab

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
)

const (
	// ChartNamespace and ChartRelease are where InstallChart installs the
	// chart, and as what.
	ChartNamespace = "ms2m-system"
	ChartRelease   = "ms2m"
	// ChartWebhookConfigName is the chart's MutatingWebhookConfiguration
	// for release ChartRelease.
	ChartWebhookConfigName = ChartRelease + "-webhook"
	// chartImageTag tags the images InstallChart builds and pushes.
	chartImageTag = "lab"
	// chartImages are the images InstallChart builds and pushes.
	chartImages = "webhook,sidecar,migrator"
	// PlatformsEnv names the platforms InstallChart builds ms2m's images
	// for (`images build -platforms`). Unset: the host's only, as an index
	// of one image, which the nodes resolve as they do the release's
	// index of two; linux/amd64,linux/arm64 doubles the Go builds (see
	// docs/install.md).
	PlatformsEnv = "MS2M_E2E_PLATFORMS"
	// chartAgentTokenSecret holds AgentToken, so that the tests and the
	// CLI know the agents' token.
	chartAgentTokenSecret = "ms2m-lab-agent-token"
)

// InstallChart installs ms2m on the lab's cluster with the Helm chart, as
// a user installs it, and waits until it is ready: it builds the webhook,
// sidecar and migrator images the way `make images` does, pushes them to
// the cluster's registry the way `make push` does, and runs `helm upgrade
// --install` of charts/ms2m with the values that describe this cluster
// (chartValues). Everything then runs in pods: the webhook (a Deployment
// behind a Service, which the API server calls at its pod's IP), the
// controller (a Deployment, reaching the API server through the kubernetes
// Service and each node's kube-proxy) and an agent per node (a DaemonSet on
// the nodes' host network). It first stops what Install runs, if it runs,
// so that the two never serve side by side.
func (l *Lab) InstallChart(ctx context.Context) (*Installed, error) {
	if l.Cluster == nil {
		return nil, fmt.Errorf("install the chart: the lab has no local cluster")
	}
	if rt := l.Cluster.Runtime(); strings.Contains(rt, ",") {
		return nil, fmt.Errorf("install the chart: the cluster's nodes run different runtimes (%s), and the chart's agent DaemonSet takes one runtime socket for every node; install ms2m as host processes (-install host)", rt)
	}
	helm := filepath.Join(l.Opts.RepoDir, "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		return nil, fmt.Errorf("install the chart: no %s; build it with `make helm-bin`", helm)
	}
	dir := filepath.Join(l.Cluster.StateDir(), "ms2m")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := l.uninstallHostProcesses(ctx); err != nil {
		return nil, err
	}

	t0 := time.Now()
	imagesDir := filepath.Join(dir, "images")
	platforms := cmp.Or(os.Getenv(PlatformsEnv), "host")
	if err := l.run(ctx, "go", "run", "./hack/images", "build", "-o", imagesDir, "-tag", chartImageTag, "-only", chartImages, "-platforms", platforms); err != nil {
		return nil, err
	}
	if err := l.run(ctx, "go", "run", "./hack/images", "push", "-registry", l.Registry, "-insecure", "-from", imagesDir, "-only", chartImages); err != nil {
		return nil, err
	}
	fmt.Fprintf(l.log, "lab: chart images for %s built and pushed to %s in %s\n", platforms, l.Registry, time.Since(t0).Round(time.Millisecond))

	if err := l.chartPrerequisites(ctx); err != nil {
		return nil, err
	}
	values := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(values, []byte(chartValues(l.Cluster.StateDir(), l.Registry, l.ImageRepo(), l.Cluster.Runtime())), 0o644); err != nil {
		return nil, err
	}
	t1 := time.Now()
	if err := l.run(ctx, helm, "upgrade", "--install", ChartRelease, "charts/ms2m",
		"--namespace", ChartNamespace, "--values", values, "--kubeconfig", l.Kubeconfig,
		"--wait", "--timeout", "5m"); err != nil {
		return nil, fmt.Errorf("%w\n(the pods: kubectl --kubeconfig %s -n %s get pods -o wide; their logs: kubectl logs)", err, l.Kubeconfig, ChartNamespace)
	}
	l.chart = true
	fmt.Fprintf(l.log, "lab: chart %s installed in %s (namespace %s, values %s)\n", ChartRelease, time.Since(t1).Round(time.Millisecond), ChartNamespace, values)
	if err := l.waitCABundle(ctx, ChartWebhookConfigName); err != nil {
		return nil, err
	}

	in := &Installed{ImageRepo: l.ImageRepo(), Chart: true, Values: values}
	pods, err := l.Client.CoreV1().Pods(ChartNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		in.Components = append(in.Components, InstalledComponent{
			Name: p.Name, Node: p.Spec.NodeName, Addr: p.Status.PodIP,
			Log: fmt.Sprintf("kubectl -n %s logs %s", ChartNamespace, p.Name),
		})
	}
	in.WebhookURL = "service " + ChartNamespace + "/" + ChartWebhookConfigName
	return in, nil
}

// ChartImageRefs are the images InstallChart pushes, as the nodes pull
// them: each an image index.
func (l *Lab) ChartImageRefs() []string {
	var refs []string
	for _, n := range strings.Split(chartImages, ",") {
		refs = append(refs, l.Registry+"/ms2m/"+n+":"+chartImageTag)
	}
	return refs
}

// chartValues are the chart's values for the local cluster under state,
// with its registry: the images in that registry and checkpoint images in
// its repository checkpoints,
// over plain HTTP, workloads in Namespace with their own broker user (the
// lab's, brokerUsers.provision=manual) and the namespace's control token
// written by the webhook, the lab's agent token, and the
// agent's folders per node ($(NODE_NAME)), since the nodes share this
// host's filesystem; the agent checks its kubelet against the kubelet's
// own self-signed certificate, in the node's folder too. The runtime's
// socket and work folders are containerd's or, on CRI-O nodes, CRI-O's.
func chartValues(state, registry, checkpoints, runtime string) string {
	node := filepath.Join(state, "$(NODE_NAME)")
	sock, workDir := filepath.Join(node, "containerd.sock"), filepath.Join(node, "containerd", "state")
	if runtime == cluster.RuntimeCRIO {
		sock, workDir = filepath.Join(node, "crio.sock"), filepath.Join(node, "crio", "run", "storage")
	}
	return fmt.Sprintf(`# Written by the e2e lab (InstallChart) for the local cluster in %[1]s.
image:
  registry: %[2]q
  tag: %[3]q
  pullPolicy: Always
workloadNamespaces: [%[4]s]
# The lab provisions the namespace's broker user itself (Start), as an
# operator with migrator broker-users would.
brokerUsers:
  provision: manual
  streamAddress: %[5]q
secrets:
  create: true
webhook:
  sidecar:
    image:
      pullPolicy: Always
migrator:
  checkpointRepository: %[6]q
  controller:
    replicas: 1
    logLevel: debug
agent:
  checkpointDir: %[7]q
  runtimeEndpoint: %[8]q
  criuLogDirs: [%[9]q]
  kubelet:
    caFile: %[11]q
  token:
    existingSecret: %[10]s
  registry:
    insecure: true
  logLevel: debug
`, state, registry, chartImageTag, Namespace,
		fmt.Sprintf("rabbitmq-stream://%s:%d/", cluster.HostIP, cluster.StreamPort),
		checkpoints,
		filepath.Join(node, "kubelet", "checkpoints"), "unix://"+sock,
		workDir, chartAgentTokenSecret,
		filepath.Join(node, "kubelet-pki", "kubelet.crt"))
}

// chartPrerequisites makes the release namespace and the Secret with the
// agents' token.
func (l *Lab) chartPrerequisites(ctx context.Context) error {
	_, err := l.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ChartNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", ChartNamespace, err)
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: chartAgentTokenSecret, Namespace: ChartNamespace},
		StringData: map[string]string{"token": AgentToken},
	}
	_, err = l.Client.CoreV1().Secrets(ChartNamespace).Create(ctx, sec, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = l.Client.CoreV1().Secrets(ChartNamespace).Update(ctx, sec, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("the agents' token Secret %s/%s: %w", ChartNamespace, chartAgentTokenSecret, err)
	}
	return nil
}

// waitCABundle waits until the webhook has set the caBundle of its
// registration (the self-signed bootstrap does it once it serves): before
// that the API server cannot call it.
func (l *Lab) waitCABundle(ctx context.Context, name string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		m, err := l.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
		if err == nil && len(m.Webhooks) > 0 && len(m.Webhooks[0].ClientConfig.CABundle) > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the webhook never set the caBundle of MutatingWebhookConfiguration %s (%v); see kubectl -n %s logs deploy/%s", name, err, ChartNamespace, ChartWebhookConfigName)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// UninstallChart removes the chart's release, if there is one, and waits
// until its pods are gone.
func (l *Lab) UninstallChart(ctx context.Context) error {
	helm := filepath.Join(l.Opts.RepoDir, "bin", "helm")
	if err := l.run(ctx, helm, "uninstall", ChartRelease, "--namespace", ChartNamespace, "--kubeconfig", l.Kubeconfig,
		"--ignore-not-found", "--wait", "--timeout", "2m"); err != nil {
		return err
	}
	l.chart = false
	return nil
}

// uninstallHostProcesses stops what Install started and removes its
// webhook registration.
func (l *Lab) uninstallHostProcesses(ctx context.Context) error {
	names := []string{addonWebhook, addonController}
	for i := 1; i <= l.Cluster.Nodes(); i++ {
		names = append(names, addonAgent(i))
	}
	for _, n := range names {
		if err := l.Cluster.StopAddon(n); err != nil {
			return fmt.Errorf("stop %s: %w", n, err)
		}
	}
	if l.chartInstalled(ctx) {
		return nil // the registration of the same name is the chart's
	}
	return l.deleteWebhookConfig(InstalledWebhookConfigName)
}

// chartInstalled says whether the chart's webhook registration exists: a
// MutatingWebhookConfiguration ChartWebhookConfigName that Helm manages
// (Install's registration has the same name, and no such label).
func (l *Lab) chartInstalled(ctx context.Context) bool {
	m, err := l.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, ChartWebhookConfigName, metav1.GetOptions{})
	return err == nil && m.Labels["app.kubernetes.io/managed-by"] == "Helm"
}

// run runs a command in the repository and returns its output with the
// error.
func (l *Lab) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = l.Opts.RepoDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, lastLines(string(out), 40))
	}
	return nil
}
