package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
)

// exampleName names the example consumer's Deployment and queue.
const exampleName = "example"

// upWithMS2M brings the cluster up with ms2m running on it, and says how to
// use it.
func upWithMS2M(ctx context.Context, opts cluster.Options, chart bool) error {
	if opts.RepoDir = cluster.FindRepo(); opts.RepoDir == "" {
		return fmt.Errorf("--with-ms2m builds ms2m from the repository: run it from inside the repository (go run ./hack/cluster up --with-ms2m)")
	}
	// The sidecars reach the broker through the host services' forwarders;
	// without one, every injected pod would fail to start.
	for _, addr := range []string{"127.0.0.1:5672", "127.0.0.1:5552"} {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return fmt.Errorf("--with-ms2m needs RabbitMQ with its stream plugin and the broker user %s on this host, and %s does not answer (%v); run `make setup`", lab.BrokerUser, addr, err)
		}
		c.Close()
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	l, err := lab.Start(ctx, opts)
	if err != nil {
		if l != nil && l.Cluster != nil {
			return fmt.Errorf("%w\nthe cluster stays up for inspection; take it down with: go run ./hack/cluster down -state %s", err, l.Cluster.StateDir())
		}
		return err
	}
	install := l.Install
	if chart {
		install = l.InstallChart
	}
	in, err := install(ctx)
	if err != nil {
		return fmt.Errorf("install ms2m: %w\nthe cluster stays up for inspection; take it down with: go run ./hack/cluster down -state %s", err, l.Cluster.StateDir())
	}
	example := filepath.Join(l.Cluster.StateDir(), "ms2m", "example.yaml")
	manifest, err := l.ExampleManifest(exampleName)
	if err != nil {
		return err
	}
	if err := os.WriteFile(example, manifest, 0o644); err != nil {
		return err
	}
	printUsage(l, in, example)
	return nil
}

func printUsage(l *lab.Lab, in *lab.Installed, example string) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	registration := lab.InstalledWebhookConfigName + " (every namespace but kube-system and ms2m-system)"
	secrets := "Secrets " + lab.Namespace + "/ms2m-broker-user, ms2m  the namespace's own broker user (" + lab.BrokerUserPrefix + lab.Namespace + ", only its replay logs) and the control token, which injected sidecars read"
	if in.Chart {
		secrets = "Secrets " + lab.Namespace + "/ms2m-broker-user, ms2m-control  the namespace's own broker user (" + lab.BrokerUserPrefix + lab.Namespace + ", made by the lab) and the control token (made by the chart), which injected sidecars read"
		fmt.Printf("\nms2m runs on the cluster, in pods of the Helm release %s/%s (values %s):\n\n", lab.ChartNamespace, lab.ChartRelease, in.Values)
		fmt.Fprintln(w, "  POD\tNODE\tIP\tLOG")
		for _, c := range in.Components {
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", c.Name, c.Node, c.Addr, c.Log)
		}
		registration = lab.ChartWebhookConfigName + " (namespace " + lab.Namespace + ")"
	} else {
		fmt.Printf("\nms2m runs on the cluster (host processes; `status` lists them, `down` stops them):\n\n")
		fmt.Fprintln(w, "  COMPONENT\tPID\tSERVES\tLOG")
		for _, c := range in.Components {
			fmt.Fprintf(w, "  %s\t%d\t%s\t%s\n", c.Name, c.PID, c.Addr, c.Log)
		}
	}
	w.Flush()
	fmt.Printf(`
  webhook registration  MutatingWebhookConfiguration %s
  sidecar image         %s
  consumer images       %s, %s
  %s
  checkpoint images     %s
  node agents' token    %s

Try it:

  export KUBECONFIG=%s
  kubectl apply -f %s        # an unmodified Go consumer on %s, opted in by %s: "true"
  go run ./examples/producer -queue %s -rate 10 -count 600 &
  kubectl annotate pod -l app=%s %s=%s
  go run ./cmd/migrator status        # phase, strategy, total time and downtime; add <ns>/<pod> for the phases
  kubectl get pods -o wide -l app=%s  # the pod now runs on %s, owned by the Deployment's ReplicaSet

or by the CLI, with live phases:

  MS2M_AGENT_TOKEN=%s MS2M_AGENT_CA_FILE=%s MS2M_AGENT_SERVER_NAME=%s MS2M_STATUS_KEY=%s go run ./cmd/migrator migrate %s/<pod> --to %s --image-repo %s

The e2e suite against this cluster:  make e2e KUBECONFIG=%s
Take it all down:                    go run ./hack/cluster down -state %s
`,
		registration, l.Images["sidecar"], l.Images["consumer"], imageOr(l, "consumer-python"), secrets,
		in.ImageRepo, lab.AgentToken,
		l.Kubeconfig, example, l.NodeName(1), contract.AnnotationInject, exampleName, exampleName, contract.AnnotationMigrateTo, l.NodeName(2),
		exampleName, l.NodeName(2),
		lab.AgentToken, filepath.Join(l.Cluster.StateDir(), "agent", "ca.crt"), lab.AgentServerName, lab.SigningKey, lab.Namespace, l.NodeName(2), in.ImageRepo,
		l.Kubeconfig, l.Cluster.StateDir())
}

func imageOr(l *lab.Lab, img string) string {
	if ref, ok := l.Images[img]; ok {
		return ref
	}
	return "(no " + img + " image: this host lacks Debian's python3-pika)"
}
