package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/ociimage"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestChartInstalledInPods installs ms2m with the Helm chart on the
// suite's cluster, as a user does (images built and pushed as `make images
// push` does, `helm upgrade --install --wait`), so that everything runs in
// pods: the webhook behind its Service, the controller reaching the API
// server through the kubernetes Service and kube-proxy, an agent per node
// from the DaemonSet. An unmodified Go consumer opted in by annotation is
// injected by the chart's webhook and migrated by the chart's controller
// through the chart's agents, with its state exact. It uninstalls the
// chart at the end. (`go run ./hack/cluster up --with-ms2m -install chart`
// and `make e2e` run the whole suite against such an installation.)
func TestChartInstalledInPods(t *testing.T) {
	l := needLab(t, "it installs the chart on the suite's own cluster")
	if _, err := os.Stat(filepath.Join(l.Opts.RepoDir, "bin", "helm")); err != nil {
		testenv.Missing(t, "bin/helm", "make helm-bin")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Minute)
	defer cancel()
	in, err := l.InstallChart(ctx)
	t.Cleanup(func() {
		if err := l.UninstallChart(context.WithoutCancel(t.Context())); err != nil {
			t.Errorf("uninstall the chart: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// The webhook, the controller and an agent on each node, every one on
	// the node the scheduler picked and Running (helm --wait saw them
	// ready).
	agents := map[string]bool{}
	var webhook, controllers int
	for _, c := range in.Components {
		p, err := l.Client.CoreV1().Pods(lab.ChartNamespace).Get(ctx, c.Name, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s: %v, phase %v", c.Name, err, p.Status.Phase)
			continue
		}
		switch p.Labels["app.kubernetes.io/component"] {
		case "agent":
			agents[p.Spec.NodeName] = true
		case "webhook":
			webhook++
		case "controller":
			controllers++
		}
	}
	if len(agents) != l.Cluster.Nodes() || webhook != 1 || controllers != 1 {
		t.Fatalf("pods: agents on %v, %d webhook, %d controller; want an agent on each of %d nodes and one of each", agents, webhook, controllers, l.Cluster.Nodes())
	}
	// The nodes pulled each of ms2m's images by its tag, which names an
	// image index, as a release's does: the index has this host's platform,
	// and each image in it fits its platform.
	for _, ref := range l.ChartImageRefs() {
		in, err := ociimage.Inspect(ctx, ref, ociimage.PushOptions{Insecure: true})
		if err != nil {
			t.Fatal(err)
		}
		if !in.Index {
			t.Errorf("%s is one image %s, not an image index", ref, in.Digest)
		}
		var host bool
		for _, e := range in.Entries {
			if err := e.Check(); err != nil {
				t.Errorf("%s: %v", ref, err)
			}
			host = host || e.Platform.Equals(ociimage.HostPlatform())
		}
		if !host {
			t.Errorf("%s: no %s image among %+v", ref, ociimage.HostPlatform(), in.Entries)
		}
	}

	name := testenv.UniqueName("chart")
	src, err := l.StartConsumer(ctx, lab.Consumer{Name: name, Queue: name, Node: l.NodeName(1), WorkMS: 50})
	if err != nil {
		t.Fatal(err)
	}
	if !hasSidecar(src) {
		t.Fatalf("the chart's webhook did not inject %s: containers %v", src.Name, containerNames(src))
	}
	if got := sidecarEnvSecret(src, "MS2M_CONTROL_TOKEN"); got != "ms2m-control" {
		t.Errorf("the sidecar reads its control token from Secret %q, want the chart's ms2m-control", got)
	}
	prod := produce(t, src, name, 10, 150, 20)
	annotate(t, ctx, l, name, map[string]any{contract.AnnotationMigrateTo: l.NodeName(2)})
	target, st := waitMigrated(t, ctx, l, name, src)
	t.Cleanup(func() { l.DeletePods(context.WithoutCancel(t.Context()), name, target.Name) })
	t.Logf("migration %s by the chart's controller: %s; phases %+v", st.Name, st.Message, st.Report.Phases)
	if target.Spec.NodeName != l.NodeName(2) || st.Report == nil || st.Report.Downtime <= 0 {
		t.Errorf("target %s on %s with status %+v", target.Name, target.Spec.NodeName, st)
	}
	waitEvent(t, ctx, l, target, contract.ReasonMigrationSucceeded)
	expectExact(t, ctx, prod, target)
}

func hasSidecar(p *corev1.Pod) bool {
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		if c.Name == inject.SidecarName {
			return true
		}
	}
	return false
}

func containerNames(p *corev1.Pod) []string {
	var names []string
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		names = append(names, c.Name)
	}
	return names
}

// sidecarEnvSecret is the Secret the sidecar's variable name is read from.
func sidecarEnvSecret(p *corev1.Pod, name string) string {
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		if c.Name != inject.SidecarName {
			continue
		}
		for _, e := range c.Env {
			if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				return e.ValueFrom.SecretKeyRef.Name
			}
		}
	}
	return ""
}
