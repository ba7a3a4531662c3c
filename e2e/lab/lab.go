package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ms2m/ms2m/e2e/cluster"
	nodeagent "github.com/ms2m/ms2m/internal/agent"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/ociimage"
	"github.com/ms2m/ms2m/internal/ociimage/debianpy"
)

const (
	// SigningKey is the controller's signing key on the lab: the lab's
	// webhook restores only what it signed, and every controller and
	// migration the lab runs signs with it.
	SigningKey = "lab-signing-key-0123456789abcdef"
	// BrokerUser and BrokerPassword are the broker user hack/setup.sh
	// makes: guest may only connect over loopback, and pods are not on it.
	BrokerUser     = "ms2m"
	BrokerPassword = "ms2m-test"
	// Namespace is where the lab's pods go.
	Namespace = "default"
)

// Lab is a local cluster with the images and the Secret in place.
type Lab struct {
	Cluster *cluster.Cluster
	Opts    cluster.Options
	Client  kubernetes.Interface
	// Images are refs as the nodes pull them: "sidecar", "consumer" and,
	// when the host has Debian's python3-pika, "consumer-python".
	Images map[string]string
	Inject inject.Config
	// Registry is where the images go and the nodes pull them from
	// (host:port); BrokerAMQP is where pods reach the broker, NATSAddr
	// the NATS server.
	Registry, BrokerAMQP, NATSAddr string
	// Kubeconfig is the admin kubeconfig's path.
	Kubeconfig string
	// External is set for a cluster that the lab did not make (External):
	// ms2m is installed in it, Cluster is nil, and only what goes through
	// the Kubernetes API, the registry and the broker is at hand.
	External bool
	nodes    []string // an external cluster's, to migrate between
	log      io.Writer
	// webhook is the real admission webhook, when StartWebhook ran it
	// (webhook.go).
	webhook *Webhook
	// chart is set while InstallChart's release is installed (chart.go).
	chart bool
	// installed is set once Install has run ms2m as the cluster's addons
	// (install.go).
	installed bool
	// resumers are the nodes' runtimes' resumers (WatchDump's thaw), by
	// node name: each finds its runtime once, as an agent's does.
	resumers sync.Map
}

// Start brings the cluster up (or attaches to one that is up) and puts the
// images and the Secret in place. opts.RepoDir must be the repository.
func Start(ctx context.Context, opts cluster.Options) (*Lab, error) {
	if opts.BinDir == "" {
		opts.BinDir = filepath.Join(opts.RepoDir, "bin")
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if err := cluster.Preflight(opts); err != nil {
		return nil, err
	}
	if err := CRIUConfig(); err != nil {
		return nil, err
	}
	c, err := cluster.Up(ctx, opts)
	if err != nil {
		return nil, err
	}
	l := &Lab{Cluster: c, Opts: opts, Images: map[string]string{}, log: opts.Log,
		Registry: c.RegistryAddr(), BrokerAMQP: c.BrokerAMQPAddr(), NATSAddr: c.NATSAddr(), Kubeconfig: c.Kubeconfig()}
	if l.Client, err = kubernetes.NewForConfig(c.RESTConfig()); err != nil {
		return l, err
	}
	if err := l.dropStaleWebhook(ctx); err != nil { // webhook.go
		return l, err
	}
	if err := l.pushImages(ctx, "sidecar", "consumer", "consumer-python", "consumer-nats"); err != nil {
		return l, err
	}
	// Each sidecar reaches the replay logs as its namespace's own broker
	// user (Secret ms2m-broker-user), never a shared one.
	l.Inject = inject.Config{
		SidecarImage: l.Images["sidecar"],
		BrokerUsers:  true,
		StreamURI:    inject.BrokerUserStreamURI,
		ControlToken: inject.SecretKey{Name: "ms2m", Key: "control-token"},
		RestoreKey:   []byte(SigningKey),
		// NATS apps' sidecars keep their logs on the host's nats-server.
		NATSURL: inject.SecretKey{Name: "ms2m-nats", Key: "nats-url"},

		CheckpointRepository: l.ImageRepo(),
	}
	if err := l.ProvisionBrokerUser(ctx, Namespace, c.BrokerStreamAddr()); err != nil {
		return l, err
	}
	for name, data := range map[string]map[string]string{
		"ms2m":      {"control-token": ControlToken(Namespace)},
		"ms2m-nats": {"nats-url": "nats://" + c.NATSAddr()},
	} {
		_, err = l.Client.CoreV1().Secrets(Namespace).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			StringData: data,
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil // a cluster that stayed up
		}
		if err != nil {
			return l, err
		}
	}
	return l, nil
}

// Down stops the lab's webhook, if it runs, and takes the cluster down. It
// does nothing to an external cluster.
func (l *Lab) Down() error {
	if l.External {
		return nil
	}
	return errors.Join(l.StopWebhook(), cluster.Down(l.Opts))
}

// CRIUPath is the nodes' criu, the one their runtime runs (bin/criu).
func (l *Lab) CRIUPath() string { return filepath.Join(l.Opts.BinDir, "criu", "criu") }

// ImageRepo is where checkpoint images go in the lab's registry.
func (l *Lab) ImageRepo() string { return l.Registry + "/ms2m/checkpoints" }

// pushImages builds and pushes the images named (of "sidecar", "consumer"
// and "consumer-python") to l.Registry. The Python consumer's is skipped,
// with a line in the log, when this host lacks Debian's python3-pika.
func (l *Lab) pushImages(ctx context.Context, images ...string) error {
	t0 := time.Now()
	want := map[string]bool{}
	for _, img := range images {
		want[img] = true
	}
	for img, pkg := range map[string]string{"sidecar": "cmd/sidecar", "consumer": "examples/consumer", "consumer-nats": "examples/consumer-nats"} {
		if !want[img] {
			continue
		}
		bin, err := BuildStatic(l.Opts.RepoDir, pkg)
		if err != nil {
			return err
		}
		im, err := ociimage.App(ociimage.AppOptions{Binaries: []string{bin}})
		if err != nil {
			return fmt.Errorf("image %s: %w", img, err)
		}
		if err := l.push(ctx, img, im); err != nil {
			return err
		}
	}
	if want["consumer-python"] {
		if err := l.pushPython(ctx); err != nil {
			return err
		}
	}
	fmt.Fprintf(l.log, "lab: images built and pushed in %s\n", time.Since(t0).Round(time.Millisecond))
	return nil
}

// pushPython pushes the Python consumer's image: Debian's python3 with pika
// from this host, and the script.
func (l *Lab) pushPython(ctx context.Context) error {
	fo, err := debianpy.Options("pika")
	if err != nil {
		fmt.Fprintf(l.log, "lab: no Python consumer image (%v)\n", err)
		return nil
	}
	script, err := os.ReadFile(filepath.Join(l.Opts.RepoDir, "examples", "consumer-python", "consumer.py"))
	if err != nil {
		return err
	}
	fo.Files = append(fo.Files, ociimage.File{Path: "/app/consumer.py", Data: script})
	fo.Entrypoint = []string{"/usr/bin/python3", "/app/consumer.py"}
	fo.WorkingDir = "/app"
	im, err := ociimage.Files(fo)
	if err != nil {
		return fmt.Errorf("image consumer-python: %w", err)
	}
	return l.push(ctx, "consumer-python", im)
}

func (l *Lab) push(ctx context.Context, img string, im v1.Image) error {
	ref := l.Registry + "/ms2m/" + img + ":lab"
	if err := ociimage.Push(ctx, im, ref, ociimage.PushOptions{Insecure: true}); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	l.Images[img] = ref
	return nil
}

// CRIUConfig writes CRIU's configuration for runc: /etc/criu/runc.conf,
// whose options override the ones runc passes, with tcp-close, so that a
// container with TCP connections can be checkpointed and restored on
// another node (it finds them closed and reconnects), and the nftables
// network lock, because there is no iptables; and /etc/criu/default.conf,
// which every CRIU reads first, with skip-in-flight, so that a connection
// the app has not accepted yet (a probe or a client dialling its listener
// at the freeze) does not fail the dump: the dialler sees it reset, and
// the app never had it. Real nodes need the same (docs/install.md). It
// refuses to change a file with other contents.
func CRIUConfig() error {
	for _, f := range []struct{ path, want string }{
		{"/etc/criu/runc.conf", "tcp-close\nnetwork-lock nftables\n"},
		{"/etc/criu/default.conf", "skip-in-flight\n"},
	} {
		if b, err := os.ReadFile(f.path); err == nil {
			if string(b) != f.want {
				return fmt.Errorf("%s exists with other options (%q); the lab needs %q", f.path, b, f.want)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(f.path, []byte(f.want), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// BuildStatic builds a static linux/amd64 binary of the main package pkg
// (relative to root) for an image.
func BuildStatic(root, pkg string) (string, error) {
	dir, err := os.MkdirTemp("", "ms2m-lab-bin-")
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./"+pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", pkg, err, b)
	}
	return out, nil
}

// Admit does to a pod what the webhook does, for this cluster that runs
// none.
func (l *Lab) Admit(p *corev1.Pod) (*corev1.Pod, error) {
	res, err := inject.Inject(inject.Input{Pod: p}, l.Inject)
	if err != nil {
		return nil, err
	}
	if res.Pod == nil {
		return nil, fmt.Errorf("not injected: %s", strings.Join(res.Skipped, "; "))
	}
	return res.Pod, nil
}

// Agent returns a node agent that works from the host.
func (l *Lab) Agent() migrate.NodeAgent { return agent{l} }

// Env returns the migrate.Env for this lab. While the lab's webhook runs,
// Admit is nil: the webhook turns the target pod into a restore.
func (l *Lab) Env(progress func(phase string, took time.Duration)) migrate.Env {
	env := migrate.Env{
		Client:     l.Client,
		Agent:      l.Agent(),
		ImageRepo:  l.ImageRepo(),
		Admit:      l.Admit,
		SigningKey: []byte(SigningKey),
		Progress:   progress,
	}
	if l.WebhookRunning() {
		env.Admit = nil
	}
	return env
}

// agent does the node agent's work from the host: the nodes' kubelet
// folders are host folders, so archives are right there, and each node's
// containerd socket is too.
type agent struct{ l *Lab }

func (agent) BuildCheckpointImage(ctx context.Context, node, archive, container, ref string) (string, error) {
	img, err := ociimage.Checkpoint(archive, container)
	if err != nil {
		return "", err
	}
	if err := ociimage.Push(ctx, img, ref, ociimage.PushOptions{Insecure: true}); err != nil {
		return "", err
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return "", err
	}
	return tag.Context().Digest(d.String()).String(), nil
}

// ReadLog returns the last 64 KiB of a file on node: node folders are host
// folders here.
func (agent) ReadLog(ctx context.Context, node, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	if len(b) > 64<<10 {
		b = b[len(b)-64<<10:]
	}
	return string(b), nil
}

// RestoreLog returns the last 64 KiB of CRIU's log of the restore of
// container id on node: runc writes restore.log into the container's
// work folder, which containerd's runc shim keeps in the node's
// containerd root folder, and CRI-O in its storage's run folder.
func (a agent) RestoreLog(ctx context.Context, node, id string) (string, error) {
	if len(id) != 64 || strings.Trim(id, "0123456789abcdef") != "" {
		return "", fmt.Errorf("container ID %q: want 64 hex digits", id)
	}
	if n, ok := a.node(node); ok && n.Runtime == cluster.RuntimeCRIO {
		return a.ReadLog(ctx, node, filepath.Join(n.RuntimeStateDir, "overlay-containers", id, "userdata", "restore.log"))
	}
	return a.ReadLog(ctx, node, filepath.Join(a.l.Cluster.StateDir(), node, "containerd", "root", "io.containerd.runtime.v2.task", "k8s.io", id, "restore.log"))
}

// WatchFreeze watches a container's cgroup and tasks from the host, as
// the node's agent would: the nodes' cgroups are host cgroups here.
func (agent) WatchFreeze(ctx context.Context, node, podUID, containerID, state string, timeout time.Duration) (func() error, error) {
	var w nodeagent.FreezeWatch
	dir, err := w.FindCgroup(podUID, containerID)
	if err != nil {
		return nil, err
	}
	return func() error {
		_, err := w.Wait(ctx, dir, state, timeout)
		return err
	}, nil
}

// WatchDump watches a container's tasks from the host until CRIU has
// dumped them, and with thaw thaws its cgroup, as the node's agent would
// (GET /v1/freeze?state=dumped&thaw=true).
func (a agent) WatchDump(ctx context.Context, node, podUID, containerID string, thaw bool, timeout time.Duration) (func() (bool, string, time.Duration, error), error) {
	var w nodeagent.FreezeWatch
	// The node's runtime resumes the container paused for its
	// checkpoint: containerd through its task API, CRI-O's OCI runtime
	// (runc) by its resume, where the node's crio.conf says.
	if n, ok := a.node(node); ok {
		r, _ := a.l.resumers.LoadOrStore(node, &nodeagent.NodeResumer{Endpoint: n.RuntimeSock, Config: []string{n.RuntimeConfig}})
		res := r.(*nodeagent.NodeResumer)
		// Before the checkpoint call, not at the thaw; the thaw says
		// why if it still cannot find it.
		_ = res.Prepare(ctx)
		w.Runtime = res
	}
	dir, err := w.FindCgroup(podUID, containerID)
	if err != nil {
		return nil, err
	}
	return func() (bool, string, time.Duration, error) {
		res, err := w.WaitDump(ctx, dir, containerID, thaw, timeout)
		return res.ThawedByUs, res.NoThaw, res.CRIU(), err
	}, nil
}

// node is the lab cluster's node of that name.
func (a agent) node(name string) (cluster.NodeInfo, bool) {
	for i := 1; i <= a.l.Cluster.Nodes(); i++ {
		if n := a.l.Cluster.Node(i); n.Name == name {
			return n, true
		}
	}
	return cluster.NodeInfo{}, false
}

// PullImage pulls ref into node's containerd with ctr, over plain HTTP,
// with auth's username and password when given (ctr takes them in its
// arguments, which only a test on one host may do); into a CRI-O node's
// storage through CRI, as the kubelet pulls.
func (a agent) PullImage(ctx context.Context, node, ref string, auth *contract.RegistryAuth) error {
	for i := 1; i <= a.l.Cluster.Nodes(); i++ {
		n := a.l.Cluster.Node(i)
		if n.Name != node {
			continue
		}
		if n.Runtime == cluster.RuntimeCRIO {
			return nodeagent.CRIPuller{Endpoint: n.RuntimeSock}.Pull(ctx, ref, auth)
		}
		ctr := filepath.Join(a.l.Opts.BinDir, "containerd", "ctr")
		args := []string{"-a", n.ContainerdSock, "-n", "k8s.io", "images", "pull", "--plain-http"}
		if auth != nil {
			args = append(args, "--user", auth.Username+":"+auth.Password)
		}
		out, err := exec.CommandContext(ctx, ctr, append(args, ref)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images pull %s on %s: %v: %s", ref, node, err, out)
		}
		return nil
	}
	return fmt.Errorf("no node %s", node)
}

// ErrNoImage is returned for a consumer whose image the lab could not build.
var ErrNoImage = errors.New("no such image in the lab")

// ControlToken is the sidecars' control token in namespace ns: derived from
// the lab's signing key, as the webhook writes it and the controller
// computes it.
func ControlToken(ns string) string { return control.TokenFor([]byte(SigningKey), ns) }
