package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/ociimage"
	"github.com/ms2m/ms2m/internal/testenv"
)

// world is the cluster and what every test puts on it, made once per test
// binary and taken down by TestMain.
type world struct {
	c      *cluster.Cluster
	opts   cluster.Options
	cs     kubernetes.Interface
	images map[string]string // "sidecar", "consumer": refs as the nodes pull them
	inject inject.Config
}

const (
	controlToken = "e2e-control-token"
	brokerUser   = "ms2m" // hack/setup.sh creates it; guest may only use loopback
	brokerPass   = "ms2m-test"
)

var (
	worldOnce sync.Once
	theWorld  *world
	worldErr  error
	missing   *cluster.PreconditionError
)

func TestMain(m *testing.M) {
	code := m.Run()
	if theWorld != nil && os.Getenv("MS2M_E2E_KEEP") != "" {
		fmt.Fprintf(os.Stderr, "e2e: MS2M_E2E_KEEP is set: the cluster stays up (kubeconfig %s); take it down with: go run ./hack/cluster down -state %s\n", theWorld.c.Kubeconfig(), theWorld.opts.StateDir)
	} else if theWorld != nil {
		if err := cluster.Down(theWorld.opts); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: cluster down: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// needWorld returns the shared world, bringing it up on first use.
func needWorld(t *testing.T) *world {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a real cluster")
	}
	testenv.WatchdogFor(t, 15*time.Minute)
	testenv.RequireBroker(t)
	worldOnce.Do(func() { theWorld, worldErr = newWorld(t) })
	if missing != nil {
		testenv.Missing(t, "what a real cluster needs: "+missing.Error(), "the fix under each item above; `make node-bin criu node-setup` covers most")
	}
	if worldErr != nil {
		t.Fatalf("bring up the local cluster: %v", worldErr)
	}
	return theWorld
}

func newWorld(t *testing.T) (*world, error) {
	opts := cluster.Options{
		Nodes:          2,
		StateDir:       envOr("MS2M_E2E_STATE", "/var/tmp/ms2m-e2e"),
		RepoDir:        testenv.ModuleRoot(t),
		BinDir:         filepath.Join(testenv.ModuleRoot(t), "bin"),
		Log:            os.Stderr,
		WaitForNetwork: true,
	}
	if err := cluster.Preflight(opts); errors.As(err, &missing) {
		return nil, err
	} else if err != nil {
		return nil, err
	}
	if err := criuConfig(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := cluster.Up(ctx, opts)
	if err != nil {
		cluster.Down(opts)
		return nil, err
	}
	w := &world{c: c, opts: opts, images: map[string]string{}}
	theWorld = w // TestMain takes it down from here on
	if w.cs, err = kubernetes.NewForConfig(c.RESTConfig()); err != nil {
		return w, err
	}
	for name, pkg := range map[string]string{"sidecar": "cmd/sidecar", "consumer": "examples/consumer"} {
		bin, err := buildStatic(testenv.ModuleRoot(t), pkg)
		if err != nil {
			return w, err
		}
		img, err := ociimage.App(ociimage.AppOptions{Binaries: []string{bin}})
		if err != nil {
			return w, fmt.Errorf("image %s: %w", name, err)
		}
		ref := c.RegistryAddr() + "/ms2m/" + name + ":e2e"
		if err := ociimage.Push(ctx, img, ref, ociimage.PushOptions{Insecure: true}); err != nil {
			return w, fmt.Errorf("push %s: %w", ref, err)
		}
		w.images[name] = ref
	}
	w.inject = inject.Config{
		SidecarImage: w.images["sidecar"],
		StreamURI:    inject.SecretKey{Name: "ms2m", Key: "stream-uri"},
		ControlToken: inject.SecretKey{Name: "ms2m", Key: "control-token"},
	}
	_, err = w.cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "ms2m"},
		StringData: map[string]string{
			"stream-uri":    fmt.Sprintf("rabbitmq-stream://%s:%s@%s/", brokerUser, brokerPass, c.BrokerStreamAddr()),
			"control-token": controlToken,
		},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		err = nil // a cluster kept up by MS2M_E2E_KEEP
	}
	return w, err
}

// criuConfig writes runc's CRIU configuration file, which overrides the
// options runc passes: --tcp-close, so that a container with TCP
// connections can be checkpointed and restored on another node (it sees
// them closed and reconnects), and the nftables network lock, because
// there is no iptables. Real nodes need the same (docs/install.md).
func criuConfig() error {
	const path = "/etc/criu/runc.conf"
	want := "tcp-close\nnetwork-lock nftables\n"
	if b, err := os.ReadFile(path); err == nil {
		if string(b) != want {
			return fmt.Errorf("%s exists with other options (%q); the e2e tests need %q", path, b, want)
		}
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(want), 0o644)
}

// buildStatic builds a static linux/amd64 binary of pkg for an image.
func buildStatic(root, pkg string) (string, error) {
	dir, err := os.MkdirTemp("", "ms2m-e2e-bin-")
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

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// admit does what the webhook does to a pod, for this cluster that runs
// none: the test writes pod specs by hand, as the webhook will.
func (w *world) admit(p *corev1.Pod) (*corev1.Pod, error) {
	res, err := inject.Inject(inject.Input{Pod: p}, w.inject)
	if err != nil {
		return nil, err
	}
	if res.Pod == nil {
		return nil, fmt.Errorf("not injected: %s", strings.Join(res.Skipped, "; "))
	}
	return res.Pod, nil
}

// localAgent does the node agent's work from the host: the nodes' kubelet
// folders are host folders, so archives are right there, and each node's
// containerd socket is too.
type localAgent struct{ w *world }

func (localAgent) BuildCheckpointImage(ctx context.Context, node, archive, container, ref string) (string, error) {
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

func (a localAgent) PullImage(ctx context.Context, node, ref string) error {
	for i := 1; i <= a.w.c.Nodes(); i++ {
		n := a.w.c.Node(i)
		if n.Name != node {
			continue
		}
		ctr := filepath.Join(a.w.opts.BinDir, "containerd", "ctr")
		out, err := exec.CommandContext(ctx, ctr, "-a", n.ContainerdSock, "-n", "k8s.io", "images", "pull", "--plain-http", ref).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images pull %s on %s: %v: %s", ref, node, err, out)
		}
		return nil
	}
	return fmt.Errorf("no node %s", node)
}
