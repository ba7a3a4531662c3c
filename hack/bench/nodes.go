package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
)

// The parts that run on a local cluster of real nodes (e2e/cluster): the
// kubelet's checkpoint API, containerd, runc and CRIU.
const (
	partCRIU       = "criu"       // checkpoint and restore time against resident memory, on the cluster and with raw CRIU
	partStrategies = "strategies" // downtime and total time of ms2m against stop-and-copy, migrating a consumer between nodes
)

// nodeOptions are the flags of the cluster parts.
type nodeOptions struct {
	stateDir       string
	nodes          int // the cluster's nodes; 0 is 2
	criuRounds     int
	criuMB         []int // ballast sizes, MiB
	criuBig        bool  // run the big sizes whatever the free memory
	strategyRounds int
	strategyRates  []float64 // msg/s
	strategyWarmup time.Duration
}

// nodeFlags holds the flag values of the cluster parts until they are
// checked.
type nodeFlags struct {
	o     nodeOptions
	mb    *string
	rates *string
}

// registerNodeFlags adds the cluster parts' flags to fs.
func registerNodeFlags(fs *flag.FlagSet) *nodeFlags {
	f := &nodeFlags{}
	fs.StringVar(&f.o.stateDir, "cluster-state", "/var/tmp/ms2m-bench", "state folder of the local cluster that the criu and strategies parts bring up and take down")
	fs.IntVar(&f.o.criuRounds, "criu-rounds", 3, "rounds per ballast size in the criu part; each round checkpoints and restores on the cluster and with raw CRIU, in alternating order")
	f.mb = fs.String("criu-mb", "8,96,1000", "comma-separated ballast sizes in MiB for the criu part (the Go runtime adds about 2 MiB of resident memory)")
	fs.BoolVar(&f.o.criuBig, "criu-big", false, fmt.Sprintf("run ballast sizes of %d MiB or more even when the machine has %d GiB or less available", bigBallastMB, bigNeedsGiB))
	fs.IntVar(&f.o.strategyRounds, "strategy-rounds", 3, "migrations per strategy and rate in the strategies part")
	f.rates = fs.String("strategy-rates", "4,10,16", fmt.Sprintf("comma-separated producer rates for the strategies part, msg/s (the consumer processes %d msg/s)", strategyServiceRate))
	fs.DurationVar(&f.o.strategyWarmup, "strategy-warmup", 10*time.Second, "how long the consumer consumes before each migration starts")
	return f
}

// options checks the flags; -quick cuts the rounds to 1 where they were
// not set explicitly.
func (f *nodeFlags) options(fs *flag.FlagSet, quick bool) (nodeOptions, error) {
	o := f.o
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if quick && !set["criu-rounds"] {
		o.criuRounds = 1
	}
	if quick && !set["strategy-rounds"] {
		o.strategyRounds = 1
	}
	if o.criuRounds < 1 || o.strategyRounds < 1 {
		return o, errors.New("-criu-rounds and -strategy-rounds must be at least 1")
	}
	if o.strategyWarmup < time.Second || o.strategyWarmup > 10*time.Minute {
		return o, fmt.Errorf("-strategy-warmup=%s: want 1s to 10m", o.strategyWarmup)
	}
	for s := range strings.SplitSeq(*f.mb, ",") {
		mb, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || mb < 0 || mb > 16<<10 {
			return o, fmt.Errorf("-criu-mb=%q: %q is not a size in MiB from 0 to 16384", *f.mb, s)
		}
		o.criuMB = append(o.criuMB, mb)
	}
	for s := range strings.SplitSeq(*f.rates, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || r <= 0 || r >= strategyServiceRate {
			return o, fmt.Errorf("-strategy-rates=%q: %q is not a rate above 0 and below %d msg/s, what the consumer processes", *f.rates, s, strategyServiceRate)
		}
		o.strategyRates = append(o.strategyRates, r)
	}
	if abs, err := filepath.Abs(o.stateDir); err == nil {
		o.stateDir = abs
	}
	return o, nil
}

// nodeLab is the local cluster that the cluster parts share. It comes up
// on first use and goes down at the end of the run, on failure and Ctrl-C
// too.
type nodeLab struct {
	o       nodeOptions
	repo    string
	opts    cluster.Options
	started bool
	lab     *lab.Lab
	env     *nodeEnv
	bins    map[string]string // main package → static binary
}

func newNodeLab(o nodeOptions) *nodeLab { return &nodeLab{o: o, bins: map[string]string{}} }

// get brings the cluster up, or returns it.
func (n *nodeLab) get(ctx context.Context) (*lab.Lab, error) {
	if n.lab != nil {
		return n.lab, nil
	}
	repo, err := repoRoot(ctx)
	if err != nil {
		return nil, err
	}
	n.repo = repo
	nodes := n.o.nodes
	if nodes == 0 {
		nodes = 2
	}
	n.opts = cluster.Options{
		Nodes:    nodes,
		StateDir: n.o.stateDir,
		RepoDir:  repo,
		BinDir:   filepath.Join(repo, "bin"),
		Log:      prefixWriter{"bench: cluster: "},
		// Another cluster (a test run, say) may own the network; wait
		// for it rather than fail.
		WaitForNetwork: true,
	}
	progress("bringing up the local cluster (waits while another cluster owns the network)", "state", n.o.stateDir)
	t0 := time.Now()
	n.started = true
	l, err := lab.Start(ctx, n.opts)
	if err != nil {
		var pe *cluster.PreconditionError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("the criu and strategies parts need a local cluster of real nodes: %w (`make node-setup node-bin criu k8s-bin` installs and builds it all)", err)
		}
		return nil, fmt.Errorf("bring up the local cluster in %s: %w", n.o.stateDir, err)
	}
	n.lab = l
	env := nodeEnvOf(ctx, n.opts.BinDir, nodes)
	n.env = &env
	progress("local cluster up", "took", time.Since(t0).Round(100*time.Millisecond), "kubeconfig", l.Cluster.Kubeconfig())
	return l, nil
}

// binary builds a main package of this repository as a static binary,
// once.
func (n *nodeLab) binary(pkg string) (string, error) {
	if b, ok := n.bins[pkg]; ok {
		return b, nil
	}
	b, err := lab.BuildStatic(n.repo, pkg)
	if err != nil {
		return "", err
	}
	n.bins[pkg] = b
	return b, nil
}

// down takes the cluster down if get tried to bring it up, and removes
// the binaries it built.
func (n *nodeLab) down() error {
	for _, b := range n.bins {
		os.RemoveAll(filepath.Dir(b))
	}
	if !n.started {
		return nil
	}
	progress("taking the local cluster down", "state", n.o.stateDir)
	if err := cluster.Down(n.opts); err != nil {
		return fmt.Errorf("take the local cluster down (retry with `go run ./hack/cluster down -state %s`): %w", n.o.stateDir, err)
	}
	return nil
}

// nodeEnv describes the nodes' software and the machine's memory.
type nodeEnv struct {
	Nodes           int    `json:"nodes"`
	Kubelet         string `json:"kubelet"`
	Containerd      string `json:"containerd"`
	Runc            string `json:"runc"`
	CRIU            string `json:"criu"`
	MemTotalMiB     int    `json:"memTotalMiB"`
	MemAvailableMiB int    `json:"memAvailableMiBAtStart"`
}

func nodeEnvOf(ctx context.Context, bin string, nodes int) nodeEnv {
	total, avail := meminfoMiB()
	return nodeEnv{
		Nodes:           nodes,
		Kubelet:         command(ctx, filepath.Join(bin, "k8s", "kubelet"), "--version"),
		Containerd:      command(ctx, filepath.Join(bin, "containerd", "containerd"), "--version"),
		Runc:            command(ctx, "runc", "--version"),
		CRIU:            command(ctx, filepath.Join(bin, "criu", "criu"), "--version"),
		MemTotalMiB:     total,
		MemAvailableMiB: avail,
	}
}

// meminfoMiB returns MemTotal and MemAvailable from /proc/meminfo in MiB,
// or zeros.
func meminfoMiB() (total, available int) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		kib, _ := strconv.Atoi(fs[1])
		switch fs[0] {
		case "MemTotal:":
			total = kib / 1024
		case "MemAvailable:":
			available = kib / 1024
		}
	}
	return total, available
}

// repoRoot is the folder of this module's go.mod.
func repoRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(out))
	if err != nil || gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("find the repository: run the bench from inside it (go env GOMOD says %q: %v)", gomod, err)
	}
	return filepath.Dir(gomod), nil
}

// prefixWriter writes each line to stderr behind a prefix.
type prefixWriter struct{ prefix string }

func (w prefixWriter) Write(p []byte) (int, error) {
	for line := range strings.Lines(string(p)) {
		fmt.Fprint(os.Stderr, w.prefix+line)
	}
	return len(p), nil
}

// createAndWaitRunning creates pod and returns it once its phase is Running
// with every container running, and how long that took from the create
// call. It watches the pod rather than polling, so the time is as fine as
// the kubelet's status updates.
func createAndWaitRunning(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, timeout time.Duration) (*corev1.Pod, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pods := cs.CoreV1().Pods(pod.Namespace)
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", pod.Name).String()})
	if err != nil {
		return nil, 0, fmt.Errorf("watch pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	defer w.Stop()
	t0 := time.Now()
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, 0, fmt.Errorf("create pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	var last *corev1.Pod
	for {
		select {
		case <-ctx.Done():
			return last, 0, fmt.Errorf("pod %s/%s not running after %s: %s", pod.Namespace, pod.Name, timeout, podSummary(last))
		case ev, ok := <-w.ResultChan():
			if !ok {
				return last, 0, fmt.Errorf("pod %s/%s: the watch ended before it ran: %s", pod.Namespace, pod.Name, podSummary(last))
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod || ev.Type == watch.Deleted {
				continue
			}
			last = p
			if why := podFailed(p); why != "" {
				return p, 0, fmt.Errorf("pod %s/%s: %s", pod.Namespace, pod.Name, why)
			}
			if podRunning(p) {
				return p, time.Since(t0), nil
			}
		}
	}
}

func podRunning(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running == nil {
			return false
		}
	}
	return true
}

// podFailed returns why pod cannot run, if that is certain.
func podFailed(p *corev1.Pod) string {
	if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
		return "phase " + string(p.Status.Phase) + ": " + podSummary(p)
	}
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil {
			switch w.Reason {
			case "CreateContainerError", "CreateContainerConfigError", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff", "RunContainerError":
				return fmt.Sprintf("container %s: %s: %s", c.Name, w.Reason, w.Message)
			}
		}
	}
	return ""
}

func podSummary(p *corev1.Pod) string {
	if p == nil {
		return "never seen"
	}
	parts := []string{"phase " + string(p.Status.Phase)}
	for _, c := range p.Status.ContainerStatuses {
		switch {
		case c.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("%s waiting (%s: %s)", c.Name, c.State.Waiting.Reason, c.State.Waiting.Message))
		case c.State.Terminated != nil:
			parts = append(parts, fmt.Sprintf("%s terminated (%s, exit %d)", c.Name, c.State.Terminated.Reason, c.State.Terminated.ExitCode))
		case c.State.Running != nil:
			parts = append(parts, c.Name+" running")
		}
	}
	return strings.Join(parts, "; ")
}

// containerImage is the image a container of pod runs, as name@digest.
func containerImage(p *corev1.Pod, container string) string {
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == container {
			return strings.TrimPrefix(c.ImageID, "docker-pullable://")
		}
	}
	return ""
}

// removeNodeImages removes from node i's containerd every image whose name
// contains repo, and lets containerd collect their content: checkpoint
// images are as large as the app's memory. It reports what it could not
// remove as a progress line only.
func removeNodeImages(ctx context.Context, l *lab.Lab, i int, repo string) {
	ctr := filepath.Join(l.Opts.BinDir, "containerd", "ctr")
	sock := l.Cluster.Node(i).ContainerdSock
	out, err := exec.CommandContext(ctx, ctr, "-a", sock, "-n", "k8s.io", "images", "ls", "-q").Output()
	if err != nil {
		progress("  could not list the node's images", "node", cluster.NodeName(i), "err", err)
		return
	}
	var refs []string
	for ref := range strings.FieldsSeq(string(out)) {
		if strings.Contains(ref, repo) {
			refs = append(refs, ref)
		}
	}
	if len(refs) == 0 {
		return
	}
	args := append([]string{"-a", sock, "-n", "k8s.io", "images", "rm", "--sync"}, refs...)
	if b, err := exec.CommandContext(ctx, ctr, args...).CombinedOutput(); err != nil {
		progress("  could not remove checkpoint images", "node", cluster.NodeName(i), "err", err, "out", strings.TrimSpace(string(b)))
	}
}
