package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ms2m/ms2m/e2e/cluster"
)

// WebhookName is the name of ms2m's webhook inside its
// MutatingWebhookConfiguration, whatever installed it (the chart, Install,
// StartWebhook).
const WebhookName = "pods.ms2m.io"

// ExternalOptions say how to reach a cluster that the lab did not make and
// that has ms2m installed.
type ExternalOptions struct {
	// Kubeconfig is the path of a kubeconfig with rights to create pods,
	// Deployments and StatefulSets in Namespace and to read nodes, Secrets
	// and Events.
	Kubeconfig string
	// RepoDir is the repository, to build the consumer images from.
	RepoDir string
	// Registry is where the consumer images are pushed, over plain HTTP,
	// and the nodes pull them from. Default: the local cluster's,
	// 10.77.0.1:5000.
	Registry string
	// BrokerAMQP is where pods reach RabbitMQ (host:port), as user
	// BrokerUser. Default: the local cluster's, 10.77.0.1:5672.
	BrokerAMQP string
	// Nodes are the nodes to migrate between, source first. Default: the
	// first two Ready nodes by name.
	Nodes []string
	// Log receives progress lines. Default: discarded.
	Log io.Writer
}

// External returns a lab on the cluster of o.Kubeconfig, after checking
// that the API server answers, that ms2m's webhook is registered (so it,
// not the lab, injects pods) and that there are two nodes to migrate
// between, and pushes the consumer images. Its Cluster is nil; Down leaves
// the cluster alone.
func External(ctx context.Context, o ExternalOptions) (*Lab, error) {
	if o.Kubeconfig == "" {
		return nil, errors.New("external cluster: no kubeconfig given")
	}
	if o.Registry == "" {
		o.Registry = net.JoinHostPort(cluster.HostIP, strconv.Itoa(cluster.RegistryPort))
	}
	if o.BrokerAMQP == "" {
		o.BrokerAMQP = net.JoinHostPort(cluster.HostIP, strconv.Itoa(cluster.AMQPPort))
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("external cluster: read kubeconfig %s: %w", o.Kubeconfig, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	l := &Lab{Opts: cluster.Options{RepoDir: o.RepoDir}, Client: cs, Images: map[string]string{}, log: o.Log,
		Registry: o.Registry, BrokerAMQP: o.BrokerAMQP, Kubeconfig: o.Kubeconfig, External: true, nodes: o.Nodes}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(actx); err != nil {
		return nil, fmt.Errorf("external cluster of %s: the API server is not ready: %w", o.Kubeconfig, err)
	}
	if name, err := InstalledWebhook(actx, cs); err != nil {
		return nil, err
	} else if name == "" {
		return nil, fmt.Errorf("external cluster of %s: ms2m is not installed (no MutatingWebhookConfiguration has the webhook %s); install it with `go run ./hack/cluster up --with-ms2m` or the Helm chart (docs/install.md)", o.Kubeconfig, WebhookName)
	}
	if len(l.nodes) == 0 {
		if l.nodes, err = readyNodes(actx, cs); err != nil {
			return nil, err
		}
	}
	if len(l.nodes) < 2 {
		return nil, fmt.Errorf("external cluster of %s: Ready nodes %v; migrations need two", o.Kubeconfig, l.nodes)
	}
	if err := l.pushImages(ctx, "consumer", "consumer-python"); err != nil {
		return nil, err
	}
	return l, nil
}

// InstalledWebhook returns the name of the MutatingWebhookConfiguration
// that registers ms2m's webhook (WebhookName), or "" if none does.
func InstalledWebhook(ctx context.Context, cs kubernetes.Interface) (string, error) {
	mwcs, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("list MutatingWebhookConfigurations: %w", err)
	}
	for _, m := range mwcs.Items {
		for _, w := range m.Webhooks {
			if w.Name == WebhookName && m.Name != WebhookConfigName {
				return m.Name, nil
			}
		}
	}
	return "", nil
}

func readyNodes(ctx context.Context, cs kubernetes.Interface) ([]string, error) {
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the nodes: %w", err)
	}
	var names []string
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable {
			continue
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				names = append(names, n.Name)
			}
		}
	}
	sort.Strings(names)
	return names, nil
}

// NodeName is the i-th node to migrate between (1-based): the local
// cluster's node i, or an external cluster's i-th node.
func (l *Lab) NodeName(i int) string {
	if l.External {
		if i < 1 || i > len(l.nodes) {
			return fmt.Sprintf("no-node-%d", i)
		}
		return l.nodes[i-1]
	}
	return cluster.NodeName(i)
}
