package cluster_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/internal/ociimage"
	"github.com/ms2m/ms2m/internal/testenv"
)

// TestRealCluster brings up two real nodes, runs a pod pinned to node 2
// and one the scheduler places (its image pulled from the cluster's
// registry), checkpoints the running container through the apiserver's
// node proxy, restores it on the other node from a checkpoint image in the
// registry, and takes everything down again, checking that nothing is
// left.
func TestRealCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real cluster")
	}
	opts := cluster.Options{
		Nodes:          2,
		StateDir:       envOr("MS2M_E2E_STATE", "/var/tmp/ms2m-cluster-e2e"),
		RepoDir:        testenv.ModuleRoot(t),
		Log:            &testLog{t: t},
		WaitForNetwork: true,
	}
	var pe *cluster.PreconditionError
	if err := cluster.Preflight(opts); errors.As(err, &pe) {
		testenv.Missing(t, "what a real cluster needs: "+err.Error(), "the fix under each item above; `make node-bin criu node-setup` covers most")
	} else if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	downDone := false
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("MS2M_E2E_KEEP") != "" {
			t.Logf("MS2M_E2E_KEEP is set: the cluster stays up for inspection; take it down with: go run ./hack/cluster down -state %s", opts.StateDir)
			return
		}
		if !downDone {
			if err := cluster.Down(opts); err != nil {
				t.Errorf("down after failure: %v", err)
			}
		}
	})

	t0 := time.Now()
	c, err := cluster.Up(ctx, opts)
	if err != nil {
		t.Fatalf("up: %v", err)
	}
	t.Logf("TIMING up with 2 nodes Ready: %.1fs", time.Since(t0).Seconds())

	cs, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}

	// A tiny image of our own, pushed to the cluster's registry: the
	// scheduled pod's node pulls it over the bridge.
	probe := buildStatic(t, "e2e/cluster/testdata/probe")
	img, err := ociimage.App(ociimage.AppOptions{Binaries: []string{probe}})
	if err != nil {
		t.Fatal(err)
	}
	probeRef := c.RegistryAddr() + "/e2e/probe:v1"
	if err := ociimage.Push(ctx, img, probeRef, ociimage.PushOptions{Insecure: true}); err != nil {
		t.Fatal(err)
	}

	ns := "default"
	pinned := pod("pinned", cluster.PauseImage, corev1.PullNever, nil)
	pinned.Spec.NodeName = c.Node(2).Name
	// The kubernetes Service's ClusterIP, the first of the service range:
	// only the node's kube-proxy routes it (to the apiserver).
	kubeService := "10.96.0.1:443"
	probeArgs := []string{hostPort(c.APIServer()), kubeService}
	brokerUp := dialOK("127.0.0.1:5672")
	if brokerUp {
		probeArgs = append(probeArgs, c.BrokerAMQPAddr())
	} else {
		t.Log("RabbitMQ is not on 127.0.0.1:5672; the pod will not check the AMQP forwarder")
	}
	scheduled := pod("scheduled", probeRef, corev1.PullAlways, probeArgs)
	// CRIU reads the rlimits of the process it dumps, which needs the same
	// uid or CAP_SYS_RESOURCE, and root on this machine lacks the latter:
	// a container running as another user cannot be checkpointed here
	// ("Can't get rlimit 0: Operation not permitted").
	root := int64(0)
	scheduled.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: &root, RunAsGroup: &root}

	t1 := time.Now()
	for _, p := range []*corev1.Pod{pinned, scheduled} {
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s: %v", p.Name, err)
		}
	}
	running := map[string]*corev1.Pod{}
	for _, name := range []string{"pinned", "scheduled"} {
		p := waitRunning(ctx, t, cs, ns, name)
		running[name] = p
		t.Logf("TIMING pod %s Running on %s (%s) after %.1fs", name, p.Spec.NodeName, p.Status.PodIP, time.Since(t1).Seconds())
	}
	if got := running["pinned"].Spec.NodeName; got != c.Node(2).Name {
		t.Errorf("pinned pod runs on %s, want %s", got, c.Node(2).Name)
	}
	for name, p := range running {
		if !podIPInNode(c, p) {
			t.Errorf("pod %s has IP %s, outside its node %s's pod subnet", name, p.Status.PodIP, p.Spec.NodeName)
		}
	}

	// The probe reports what it could reach from inside the pod.
	wantLines := []string{"ok " + hostPort(c.APIServer()), "ok " + kubeService, "count 1 "}
	if brokerUp {
		wantLines = append(wantLines, "ok "+c.BrokerAMQPAddr())
	}
	var logs string
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && !containsAll(logs, wantLines) {
		b, _ := cs.CoreV1().Pods(ns).GetLogs("scheduled", &corev1.PodLogOptions{}).DoRaw(ctx)
		logs = string(b)
		time.Sleep(200 * time.Millisecond)
	}
	if !containsAll(logs, wantLines) {
		t.Fatalf("probe log lacks %q:\n%s", wantLines, logs)
	}

	// Checkpoint the probe through the apiserver's node proxy.
	before := countsIn(t, cs, ns, "scheduled")
	if len(before) == 0 {
		t.Fatal("the probe logged no count before its checkpoint")
	}
	atCheckpoint := before[len(before)-1]
	node := running["scheduled"].Spec.NodeName
	t2 := time.Now()
	raw, err := cs.CoreV1().RESTClient().Post().
		AbsPath("/api/v1/nodes", node, "proxy", "checkpoint", ns, "scheduled", "probe").
		Param("timeout", "60").DoRaw(ctx)
	if err != nil {
		t.Fatalf("checkpoint through nodes/%s/proxy: %v: %s", node, err, raw)
	}
	t.Logf("TIMING checkpoint of scheduled/probe on %s: %.2fs", node, time.Since(t2).Seconds())
	var res struct{ Items []string }
	if err := json.Unmarshal(raw, &res); err != nil || len(res.Items) != 1 {
		t.Fatalf("checkpoint answer %s: %v", raw, err)
	}
	var info cluster.NodeInfo
	for i := 1; i <= c.Nodes(); i++ {
		if c.Node(i).Name == node {
			info = c.Node(i)
		}
	}
	archive := res.Items[0]
	if filepath.Dir(archive) != info.CheckpointDir {
		t.Errorf("archive %s is not in %s's checkpoint folder %s", archive, node, info.CheckpointDir)
	}
	if st, err := os.Stat(archive); err != nil || st.Size() == 0 {
		t.Fatalf("checkpoint archive: %v", err)
	} else {
		t.Logf("checkpoint archive %s (%d KiB)", archive, st.Size()>>10)
	}

	// Restore it on the other node from a checkpoint image in the
	// registry: the counter goes on where it was.
	ckpt, err := ociimage.Checkpoint(archive, "probe")
	if err != nil {
		t.Fatal(err)
	}
	ckptRef := c.RegistryAddr() + "/e2e/probe-checkpoint:v1"
	if err := ociimage.Push(ctx, ckpt, ckptRef, ociimage.PushOptions{Insecure: true}); err != nil {
		t.Fatal(err)
	}
	restored := pod("restored", ckptRef, corev1.PullAlways, nil)
	restored.Spec.SecurityContext = scheduled.Spec.SecurityContext
	target := 1
	if node == c.Node(1).Name {
		target = 2
	}
	restored.Spec.NodeName = c.Node(target).Name
	t4 := time.Now()
	// containerd pulls the checkpoint's base image without the node's
	// registry configuration; it must be on the target already.
	probeDigest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.PullImage(ctx, target, c.RegistryAddr()+"/e2e/probe@"+probeDigest.String()); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, restored, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(ctx, t, cs, ns, "restored")
	t.Logf("TIMING restored pod Running on %s after %.1fs (base image and checkpoint image pulled from the registry)", restored.Spec.NodeName, time.Since(t4).Seconds())
	// The restored process goes on counting with the token the original
	// drew at start. (containerd restores the container's log too, so the
	// restored log begins with the original's lines.)
	var last probeCount
	deadline = time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if counts := countsIn(t, cs, ns, "restored"); len(counts) > 0 {
			last = counts[len(counts)-1]
			if last.n > atCheckpoint.n {
				break
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if last.n <= atCheckpoint.n || last.token != atCheckpoint.token {
		t.Fatalf("restored probe is at %+v; want it past %+v, with the same token, as a restore and not a fresh start", last, atCheckpoint)
	}
	t.Logf("restored probe goes on counting: count %d with the original's token (count %d before the checkpoint)", last.n, atCheckpoint.n)

	// Down, and nothing may be left.
	st, err := cluster.GetStatus(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, comp := range st.Components {
		if !comp.Running {
			t.Errorf("component %s is not running before down", comp.Name)
		}
		pids = append(pids, comp.PID)
	}
	pids = append(pids, nodeProcs(t)...)
	t3 := time.Now()
	downDone = true
	if err := c.Down(); err != nil {
		t.Fatalf("down: %v", err)
	}
	t.Logf("TIMING down: %.1fs", time.Since(t3).Seconds())
	checkNothingLeft(t, opts.StateDir, pids)

	// A second down is a no-op.
	if err := cluster.Down(opts); err != nil {
		t.Errorf("second down: %v", err)
	}
}

func pod(name, image string, pull corev1.PullPolicy, args []string) *corev1.Pod {
	grace := int64(2)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "probe", Image: image, ImagePullPolicy: pull, Args: args,
			}},
		},
	}
}

func waitRunning(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var p *corev1.Pod
	for time.Now().Before(deadline) {
		var err error
		p, err = cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			return p
		}
		time.Sleep(100 * time.Millisecond)
	}
	events, _ := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	var b strings.Builder
	for _, e := range events.Items {
		fmt.Fprintf(&b, "\n  %s %s: %s", e.Type, e.Reason, e.Message)
	}
	t.Fatalf("pod %s not Running after 2m (phase %s); events:%s", name, p.Status.Phase, b.String())
	return nil
}

// probeCount is one "count N TOKEN" line of a probe.
type probeCount struct {
	n     int
	token string
}

// countsIn returns the count lines a probe pod logged.
func countsIn(t *testing.T, cs kubernetes.Interface, ns, name string) []probeCount {
	t.Helper()
	b, err := cs.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(t.Context())
	if err != nil {
		t.Fatalf("logs of %s: %v", name, err)
	}
	var counts []probeCount
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "count" {
			continue
		}
		if n, err := strconv.Atoi(f[1]); err == nil {
			counts = append(counts, probeCount{n, f[2]})
		}
	}
	return counts
}

func podIPInNode(c *cluster.Cluster, p *corev1.Pod) bool {
	for i := 1; i <= c.Nodes(); i++ {
		if c.Node(i).Name != p.Spec.NodeName {
			continue
		}
		_, subnet, _ := net.ParseCIDR(c.Node(i).PodCIDR)
		return subnet.Contains(net.ParseIP(p.Status.PodIP))
	}
	return false
}

// nodeProcs lists the processes in the nodes' cgroups: containers and pause.
func nodeProcs(t *testing.T) []int {
	var pids []int
	matches, _ := filepath.Glob("/sys/fs/cgroup/pids/ms2m-node-*")
	for _, m := range matches {
		// The walk function never fails, so neither does the walk.
		_ = filepath.Walk(m, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Name() == "cgroup.procs" {
				b, _ := os.ReadFile(p)
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						pids = append(pids, pid)
					}
				}
			}
			return nil
		})
	}
	if len(pids) == 0 {
		t.Error("no process found in the nodes' cgroups before down; are pods running under the per-node cgroup roots?")
	}
	return pids
}

func checkNothingLeft(t *testing.T, state string, pids []int) {
	t.Helper()
	out, _ := exec.Command("ip", "netns", "list").CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		// The cluster's own namespaces; a simulated cluster of another
		// test process (ms2m-sim-*) may run beside it and is not ours.
		if strings.HasPrefix(line, "ms2m-") && !strings.HasPrefix(line, "ms2m-sim-") {
			t.Errorf("network namespace left: %s", line)
		}
	}
	for _, link := range []string{cluster.BridgeName, "ms2m-veth1", "ms2m-veth2"} {
		if _, err := os.Stat("/sys/class/net/" + link); err == nil {
			t.Errorf("link %s left", link)
		}
	}
	if out, _ := exec.Command("ip", "route", "show", "10.88.0.0/16").CombinedOutput(); len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("host routes to pod subnets left: %s", out)
	}
	for _, pid := range pids {
		if alive(pid) {
			cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			t.Errorf("pid %d still alive: %s", pid, bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}))
		}
	}
	f, _ := os.Open("/proc/self/mountinfo")
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		// The mount point, or what is mounted (a bind from the state
		// folder mounted elsewhere, as containerd does to restore).
		if len(fields) > 4 && (strings.HasPrefix(fields[4], state+"/") || strings.HasPrefix(fields[3], state+"/")) {
			t.Errorf("mount left: %s on %s", fields[3], fields[4])
		}
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/ms2m-node-*"); len(m) > 0 {
		t.Errorf("cgroups left: %v", m)
	}
	if _, err := os.Stat("/run/ms2m-cluster.owner"); err == nil {
		t.Error("/run/ms2m-cluster.owner left")
	}
}

func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(st, ')')
	return i < 0 || i+2 >= len(st) || st[i+2] != 'Z'
}

// buildStatic builds a main package of this module as a static binary, as
// image binaries must be.
func buildStatic(t *testing.T, pkg string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, "./"+pkg)
	cmd.Dir = testenv.ModuleRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, b)
	}
	return out
}

func hostPort(url string) string { return strings.TrimPrefix(url, "https://") }

func dialOK(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// testLog sends the cluster's progress lines to t.Log.
type testLog struct {
	t  *testing.T
	mu sync.Mutex
}

func (w *testLog) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
