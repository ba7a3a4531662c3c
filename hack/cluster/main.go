// Command cluster runs ms2m's local Kubernetes cluster of real nodes (see
// docs/local-cluster.md):
//
//	go run ./hack/cluster up     [-nodes 2] [-state DIR] [--with-ms2m [-install host|chart]]
//	go run ./hack/cluster status [-state DIR]
//	go run ./hack/cluster down   [-state DIR]
//
// `up --with-ms2m` also runs ms2m on it as host processes: the admission
// webhook (registered by URL), `migrator controller` and one `migrator
// agent` per node, with the images and the Secret they need (package lab's
// Install), and prints how to try a migration. `down` stops them too. With
// `-install chart` ms2m runs in pods instead, installed by the Helm chart
// from images built and pushed as `make images push` does (InstallChart).
//
// `serve-host -state DIR` is the detached helper that `up` starts for the
// registry and the broker forwarders; it is not meant to be run by hand.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

const usage = `usage: cluster up|down|status [-nodes N] [-runtime containerd|crio|RUNTIME,RUNTIME...] [-state DIR] [-bin DIR] [--with-ms2m [-install host|chart] (up)]`

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	cmd := args[0]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	nodes := fs.Int("nodes", 2, "number of nodes (up)")
	state := fs.String("state", cluster.DefaultStateDir, "state folder")
	bin := fs.String("bin", "", "folder with k8s/, containerd/ and criu/ (default: the repository's bin/)")
	runtime := fs.String("runtime", cluster.RuntimeContainerd, "the nodes' container runtime (up): containerd, or crio (CRI-O, after make crio-bin); or one per node, comma-separated, node i running the i-th (containerd,crio)")
	withMS2M := fs.Bool("with-ms2m", false, "also run ms2m on the cluster: the webhook, the migrator controller and a node agent per node (up)")
	install := fs.String("install", "host", "with --with-ms2m: how ms2m runs, as host processes (host) or in pods installed by the Helm chart (chart; needs `make helm-bin`)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	opts := cluster.Options{Nodes: *nodes, StateDir: *state, BinDir: *bin, Log: os.Stdout, Runtime: *runtime}
	switch cmd {
	case "up":
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		opts.Helper = exe
		if *install != "host" && *install != "chart" {
			return fmt.Errorf("-install %q: want host or chart", *install)
		}
		if *withMS2M {
			return upWithMS2M(ctx, opts, *install == "chart")
		}
		c, err := cluster.Up(ctx, opts)
		if err != nil {
			return err
		}
		fmt.Printf("\nexport KUBECONFIG=%s\n", c.Kubeconfig())
		return nil
	case "down":
		return cluster.Down(opts)
	case "status":
		return status(ctx, opts)
	case "serve-host":
		log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
		return cluster.ServeHost(ctx, opts.StateDir, log)
	default:
		return errors.New(usage)
	}
}

func status(ctx context.Context, opts cluster.Options) error {
	st, err := cluster.GetStatus(ctx, opts)
	if err != nil {
		return err
	}
	fmt.Printf("state       %s\nkubeconfig  %s\napiserver   %s (ready: %t)\nregistry    %s:%d\nbroker      amqp %s:%d, stream %s:%d (as pods see them)\n\n",
		st.StateDir, st.Kubeconfig, st.APIServer, st.APIReady,
		cluster.HostIP, cluster.RegistryPort, cluster.HostIP, cluster.AMQPPort, cluster.HostIP, cluster.StreamPort)
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "COMPONENT\tPID\tRUNNING\tLOG")
	for _, c := range st.Components {
		name := c.Name
		if a, ok := cluster.AddonName(c.Name); ok {
			name = a + " (ms2m)"
		}
		fmt.Fprintf(w, "%s\t%d\t%t\t%s\n", name, c.PID, c.Running, c.Log)
	}
	if st.APIReady {
		chartPods(ctx, w, st.Kubeconfig)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "NODE\tIP\tPOD CIDR\tREADY\tRUNTIME\tSOCKET\tCHECKPOINTS")
	for _, n := range st.Nodes {
		ready := fmt.Sprint(n.Ready)
		if !n.Registered {
			ready = "not registered"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.IP, n.PodCIDR, ready, n.Runtime, n.RuntimeSock, n.CheckpointDir)
	}
	return w.Flush()
}

// chartPods lists the pods of ms2m's Helm release, when `up --with-ms2m
// -install chart` (or a user) installed it in lab.ChartNamespace.
func chartPods(ctx context.Context, w io.Writer, kubeconfig string) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pods, err := cs.CoreV1().Pods(lab.ChartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=Helm"})
	if err != nil || len(pods.Items) == 0 {
		return
	}
	fmt.Fprintf(w, "\nPOD (ms2m, Helm release %s/%s)\tNODE\tPHASE\tIP\n", lab.ChartNamespace, lab.ChartRelease)
	for _, p := range pods.Items {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.PodIP)
	}
}
