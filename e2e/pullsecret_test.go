package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
	"github.com/ms2m/ms2m/internal/ociimage"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestMigrationFromAPrivateRegistry migrates, through the real agents, a
// consumer whose image is in a registry that requires authentication: a
// registry in the test process, on the host's bridge address, behind HTTP
// basic authentication with a password made for the run. The pod names a
// kubernetes.io/dockerconfigjson Secret in imagePullSecrets: the kubelet
// pulls the source's image with it, and the target node's agent pre-pulls
// the same image (name@digest, a digest made for the run, so no node has
// it) with the credentials the migrator read from that Secret. The
// migration is exact; the target node pulled with the credentials; no
// agent logged them.
func TestMigrationFromAPrivateRegistry(t *testing.T) {
	l := needLab(t, "it serves a registry on the host's bridge address and configures the nodes to pull from it")
	agents, err := l.StartAgents(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agents.Stop)
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()

	// The private registry, and the nodes' containerd told to speak plain
	// HTTP to it (its credentials come from the pod only).
	secret := make([]byte, 16)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	user, pass := "puller", "pw-"+hex.EncodeToString(secret)
	regLog := filepath.Join(t.TempDir(), "registry.log")
	lf, err := os.Create(regLog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lf.Close() })
	reg, err := ociimage.ServeRegistry(net.JoinHostPort(cluster.HostIP, "0"), t.TempDir(),
		ociimage.WithBasicAuth(user, pass), ociimage.WithRequestLog(slog.New(slog.NewJSONHandler(lf, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	undo, err := l.Cluster.PlainHTTPRegistry(reg.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := undo(); err != nil {
			t.Errorf("remove the nodes' hosts.toml for %s: %v", reg.Addr(), err)
		}
	})

	// The Go consumer's image, with a label of this run: a manifest digest
	// no node has pulled under any name.
	podName := testenv.UniqueName("private")
	from, err := nameRef(l.Images["consumer"])
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(from, remote.WithContext(ctx))
	if err != nil {
		t.Fatalf("read the consumer's image %s: %v", from, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg := cf.Config.DeepCopy()
	if cfg.Labels == nil {
		cfg.Labels = map[string]string{}
	}
	cfg.Labels["io.ms2m.e2e.run"] = podName
	if img, err = mutate.Config(img, *cfg); err != nil {
		t.Fatal(err)
	}
	privRef := reg.Addr() + "/private/consumer:" + podName
	to, err := nameRef(privRef)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(to, img, remote.WithContext(ctx), remote.WithAuth(&authn.Basic{Username: user, Password: pass})); err != nil {
		t.Fatalf("push %s: %v", privRef, err)
	}
	if _, err := remote.Image(to, remote.WithContext(ctx)); err == nil || !strings.Contains(err.Error(), "UNAUTHORIZED") {
		t.Fatalf("an anonymous pull of %s: %v, want UNAUTHORIZED", privRef, err)
	}

	// The pod's pull secret, in its namespace.
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	ps := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: podName + "-pull", Namespace: lab.Namespace}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: fmt.Appendf(nil, `{"auths":{%q:{"username":%q,"password":%q,"auth":%q}}}`, reg.Addr(), user, pass, auth)}}
	if _, err := l.Client.CoreV1().Secrets(lab.Namespace).Create(ctx, ps, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.Client.CoreV1().Secrets(lab.Namespace).Delete(context.WithoutCancel(t.Context()), ps.Name, metav1.DeleteOptions{})
	})

	src, err := l.StartConsumer(ctx, lab.Consumer{Name: podName, Queue: podName, Node: cluster.NodeName(1), WorkMS: 50, Mutate: func(p *corev1.Pod) {
		p.Spec.Containers[0].Image = privRef
		p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: ps.Name}}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.DeletePods(context.WithoutCancel(t.Context()), podName, podName+"-target") })
	var base string
	for _, cs := range src.Status.ContainerStatuses {
		if cs.Name == "app" {
			base = cs.ImageID
		}
	}
	if !strings.HasPrefix(base, reg.Addr()+"/private/consumer@sha256:") {
		t.Fatalf("the source's app runs image %q, want one from %s", base, reg.Addr())
	}
	prod := produce(t, src, podName, 10, 100, 10)

	plan := migrate.Plan{Name: fmt.Sprintf("p%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: podName, Container: "app",
		TargetNode: cluster.NodeName(2), TargetPod: podName + "-target", Strategy: contract.StrategyMS2M}
	env := l.Env(func(phase string, took time.Duration) { t.Logf("phase %-20s %v", phase, took.Round(time.Millisecond)) })
	if env.Agent, err = l.AgentClient(ctx); err != nil {
		t.Fatal(err)
	}
	rep, err := migrate.Run(ctx, env, plan)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Logf("from a private registry: total %v, switch %v", rep.Total.Round(time.Millisecond), rep.Downtime.Round(time.Millisecond))
	target, err := migrate.WaitRunning(ctx, l.Client, lab.Namespace, plan.TargetPod, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	expectExact(t, ctx, prod, target)

	// The target node's agent pulled the image with the pod's secret, and
	// the registry let the target node in.
	b, err := os.ReadFile(agents.Log(cluster.NodeName(2)))
	if err != nil {
		t.Fatal(err)
	}
	var pulled bool
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"msg":"image pulled"`) && strings.Contains(line, base) && strings.Contains(line, `"withPullSecret":true`) {
			pulled = true
		}
	}
	if !pulled {
		t.Errorf("the agent on %s logged no pull of %s with a pull secret:\n%s", cluster.NodeName(2), base, b)
	}
	rl, err := os.ReadFile(regLog)
	if err != nil {
		t.Fatal(err)
	}
	var fromTarget bool
	for _, line := range strings.Split(string(rl), "\n") {
		if strings.Contains(line, `"remote":"`+cluster.NodeIP(2)+`:`) && strings.Contains(line, "/manifests/sha256:") && strings.Contains(line, `"status":200`) {
			fromTarget = true
		}
	}
	if !fromTarget {
		t.Errorf("the registry served the target node %s no manifest; its log:\n%s", cluster.NodeIP(2), rl)
	}
	// No agent logged the credentials.
	for i := 1; i <= l.Cluster.Nodes(); i++ {
		b, err := os.ReadFile(agents.Log(cluster.NodeName(i)))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{pass, auth} {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("the agent on %s logged the pull secret's credentials", cluster.NodeName(i))
			}
		}
	}
}

// nameRef parses ref, a registry that speaks plain HTTP.
func nameRef(ref string) (name.Reference, error) { return name.ParseReference(ref, name.Insecure) }
