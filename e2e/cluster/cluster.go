package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Options configure a cluster. The zero value asks for the defaults.
type Options struct {
	// Nodes is how many nodes to run, 1 to 9. Default 2.
	Nodes int
	// StateDir holds everything the cluster writes. Default DefaultStateDir.
	StateDir string
	// RepoDir is the repository's root; default: found upwards from the
	// working directory.
	RepoDir string
	// BinDir has k8s/, containerd/ and criu/ as the Makefile builds them.
	// Default RepoDir/bin.
	BinDir string
	// Helper is an executable with the `serve-host -state DIR` subcommand
	// (hack/cluster). Default: hack/cluster built into the state folder.
	Helper string
	// Log receives progress lines. Default: discarded.
	Log io.Writer
	// Timeout bounds each wait in Up (apiserver ready, nodes Ready).
	// Default 3 minutes.
	Timeout time.Duration
	// WaitForNetwork makes Up wait, until its context ends, while another
	// cluster owns the network (ErrNetworkInUse), instead of failing at
	// once. Test packages that each bring up a cluster set it, because
	// go test runs packages in parallel.
	WaitForNetwork bool
	// Runtime is the nodes' container runtime: RuntimeContainerd (the
	// default) or RuntimeCRIO; or one per node, comma-separated, node i
	// running the i-th ("containerd,crio": node-1 containerd, node-2
	// CRI-O), a mixed cluster. A list of one runtime is that runtime.
	Runtime string
}

// The nodes' container runtimes (Options.Runtime).
const (
	// RuntimeContainerd: containerd 2.3 from bin/containerd, restore
	// through CreateContainer on.
	RuntimeContainerd = "containerd"
	// RuntimeCRIO: CRI-O 1.34 from bin/crio (make crio-bin) with
	// Debian's conmon, CRIU support on.
	RuntimeCRIO = "crio"
)

func (o Options) withDefaults() Options {
	if o.Nodes == 0 {
		o.Nodes = 2
	}
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	if abs, err := filepath.Abs(o.StateDir); err == nil {
		o.StateDir = abs
	}
	if o.RepoDir == "" {
		o.RepoDir = findRepo()
	}
	if o.BinDir == "" && o.RepoDir != "" {
		o.BinDir = filepath.Join(o.RepoDir, "bin")
	}
	if abs, err := filepath.Abs(o.BinDir); err == nil {
		o.BinDir = abs
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Timeout == 0 {
		o.Timeout = 3 * time.Minute
	}
	if o.Runtime == "" {
		o.Runtime = RuntimeContainerd
	}
	if rts, err := nodeRuntimes(o.Runtime, o.Nodes); err == nil {
		o.Runtime = runtimeSpec(rts)
	}
	return o
}

// nodeRuntimes is each node's runtime by spec (Options.Runtime): one
// runtime for every node, or one per node. Preflight reports an error.
func nodeRuntimes(spec string, nodes int) ([]string, error) {
	names := strings.Split(spec, ",")
	for i, n := range names {
		names[i] = strings.TrimSpace(n)
		if _, known := runtimeBinaries[names[i]]; !known {
			return nil, fmt.Errorf("unknown node runtime %q in %q", names[i], spec)
		}
	}
	if len(names) == 1 {
		for len(names) < nodes {
			names = append(names, names[0])
		}
		return names, nil
	}
	if len(names) != nodes {
		return nil, fmt.Errorf("%q names %d runtimes for %d nodes", spec, len(names), nodes)
	}
	return names, nil
}

// runtimeSpec is the Options.Runtime of nodes that run rts: the runtime
// if they all run the same one, else the list.
func runtimeSpec(rts []string) string {
	for _, r := range rts {
		if r != rts[0] {
			return strings.Join(rts, ",")
		}
	}
	if len(rts) == 0 {
		return RuntimeContainerd
	}
	return rts[0]
}

// hasRuntime says whether one of rts is runtime.
func hasRuntime(rts []string, runtime string) bool {
	for _, r := range rts {
		if r == runtime {
			return true
		}
	}
	return false
}

// findRepo walks up from the working directory to the folder whose go.mod
// declares this module.
func findRepo() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/ms2m/ms2m\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// record is what a running cluster remembers in STATE/cluster.json, so that
// down and status need nothing but the state folder.
type record struct {
	Nodes  int    `json:"nodes"`
	BinDir string `json:"binDir"`
	// Runtime is Options.Runtime; "" in a record from before it: containerd.
	Runtime string `json:"runtime,omitempty"`
	// NodeRuntimes is each node's runtime, node i's at i-1; none in a
	// record from before mixed clusters: Runtime's for every node.
	NodeRuntimes []string `json:"nodeRuntimes,omitempty"`
}

// runtime is the record's runtime, containerd if it names none.
func (r record) runtime() string {
	if r.Runtime == "" {
		return RuntimeContainerd
	}
	return r.Runtime
}

// runtimeOf is node i's runtime (1-based). A node the record does not
// list (Down looks at every possible node) runs the record's runtime if
// that is one, else containerd.
func (r record) runtimeOf(i int) string {
	if i >= 1 && i <= len(r.NodeRuntimes) {
		return r.NodeRuntimes[i-1]
	}
	if rt := r.runtime(); !strings.Contains(rt, ",") {
		return rt
	}
	return RuntimeContainerd
}

// runtimes is every node's runtime.
func (r record) runtimes() []string {
	rts := make([]string, r.Nodes)
	for i := range rts {
		rts[i] = r.runtimeOf(i + 1)
	}
	return rts
}

// NodeInfo describes one node as tests need it.
type NodeInfo struct {
	Name          string // Kubernetes node name, network namespace and hostname
	IP            string // InternalIP, on the bridge
	PodCIDR       string // the node's pod subnet
	KubeletRoot   string // the kubelet's --root-dir
	CheckpointDir string // where the kubelet writes checkpoint archives
	// KubeletCert is the kubelet's self-signed serving certificate (made
	// at its first start, for the node's name): what a caller of the
	// kubelet checks it against.
	KubeletCert string
	// Runtime is the node's container runtime: RuntimeContainerd or
	// RuntimeCRIO.
	Runtime string
	// RuntimeSock is the runtime's CRI socket (containerd's or CRI-O's),
	// the kubelet's containerRuntimeEndpoint.
	RuntimeSock string
	// RuntimeConfig is the runtime's configuration file (containerd's
	// config.toml, CRI-O's crio.conf), which the agents' preflight reads.
	RuntimeConfig string
	// ContainerdSock is containerd's socket, for ctr -a; "" on a CRI-O
	// node.
	ContainerdSock string
	// ContainerdConfig is containerd's config.toml; "" on a CRI-O node.
	ContainerdConfig string
	// RuntimeStateDir is where the runtime keeps its containers' work
	// folders (the CRIU logs of their checkpoints and restores).
	RuntimeStateDir string
	Netns           string // /run/netns/<Name>
}

// Cluster is a running local cluster.
type Cluster struct {
	l        layout
	nodes    int
	bin      string
	runtimes []string // node i's at i-1
	log      io.Writer
	rest     *rest.Config
}

// Runtime is the nodes' container runtime, RuntimeContainerd or
// RuntimeCRIO; on a mixed cluster the list of each node's
// (Options.Runtime). Node(i).Runtime is node i's.
func (c *Cluster) Runtime() string { return runtimeSpec(c.runtimes) }

// runtimeOf is node i's runtime.
func (c *Cluster) runtimeOf(i int) string {
	if i >= 1 && i <= len(c.runtimes) {
		return c.runtimes[i-1]
	}
	return RuntimeContainerd
}

// Kubeconfig is the path of the admin kubeconfig (group system:masters).
func (c *Cluster) Kubeconfig() string { return c.l.kubeconfig() }

// RESTConfig returns a copy of the admin client configuration.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.rest) }

// StateDir is the folder that holds the cluster's state.
func (c *Cluster) StateDir() string { return c.l.dir }

// Nodes is the number of nodes.
func (c *Cluster) Nodes() int { return c.nodes }

// Node describes node i, 1-based.
func (c *Cluster) Node(i int) NodeInfo {
	n := c.l.node(i)
	info := NodeInfo{
		Name:          NodeName(i),
		IP:            NodeIP(i),
		PodCIDR:       PodCIDR(i),
		KubeletRoot:   n.kubeletRoot(),
		CheckpointDir: filepath.Join(n.kubeletRoot(), "checkpoints"),
		KubeletCert:   filepath.Join(n.kubeletCerts(), "kubelet.crt"),
		Runtime:       c.runtimeOf(i),
		RuntimeSock:   runtimeSock(c.runtimeOf(i), n),
		Netns:         netnsPath(i),
	}
	if c.runtimeOf(i) == RuntimeCRIO {
		info.RuntimeConfig = n.crioConfig()
		info.RuntimeStateDir = filepath.Join(n.crioDir(), "run", "storage")
	} else {
		info.RuntimeConfig = n.containerdConfig()
		info.ContainerdSock, info.ContainerdConfig = n.containerdSock(), n.containerdConfig()
		info.RuntimeStateDir = n.containerdState()
	}
	return info
}

// runtimeSock is node n's CRI socket for runtime.
func runtimeSock(runtime string, n nodeLayout) string {
	if runtime == RuntimeCRIO {
		return n.crioSock()
	}
	return n.containerdSock()
}

// APIServer is the apiserver's URL.
func (c *Cluster) APIServer() string { return "https://" + hostAddr(APIServerPort) }

// RegistryAddr is the image registry's address, the same for the host, the
// nodes and the pods. containerd pulls from it over plain HTTP.
func (c *Cluster) RegistryAddr() string { return hostAddr(RegistryPort) }

// PlainHTTPRegistry has every node's containerd pull from the registry at
// addr (host:port, on HostIP: a test's own) over plain HTTP, as from the
// cluster's registry: a hosts.toml in each node's registry folder, which
// containerd reads at each pull. The returned func removes them.
func (c *Cluster) PlainHTTPRegistry(addr string) (undo func() error, err error) {
	if hasRuntime(c.runtimes, RuntimeCRIO) {
		return nil, fmt.Errorf("PlainHTTPRegistry: CRI-O nodes take plain-HTTP registries from their --insecure-registry flags only (the cluster's registry)")
	}
	var dirs []string
	undo = func() error {
		var errs []error
		for _, d := range dirs {
			errs = append(errs, os.RemoveAll(d))
		}
		return errors.Join(errs...)
	}
	for i := 1; i <= c.nodes; i++ {
		d := filepath.Join(c.l.node(i).registryHosts(), addr)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, errors.Join(err, undo())
		}
		dirs = append(dirs, d)
		if err := os.WriteFile(filepath.Join(d, "hosts.toml"), []byte(plainHTTPHostsTOML(addr)), 0o644); err != nil {
			return nil, errors.Join(err, undo())
		}
	}
	return undo, nil
}

// BrokerAMQPAddr is where pods reach RabbitMQ's AMQP port.
func (c *Cluster) BrokerAMQPAddr() string { return hostAddr(AMQPPort) }

// NATSAddr is where pods reach the NATS server.
func (c *Cluster) NATSAddr() string { return hostAddr(NATSPort) }

// BrokerStreamAddr is where pods reach RabbitMQ's stream port.
func (c *Cluster) BrokerStreamAddr() string { return hostAddr(StreamPort) }

// ImportImage imports an image tarball (docker-archive or OCI archive) into
// node i's containerd, where the kubelet's pods can use it with
// imagePullPolicy Never or IfNotPresent.
func (c *Cluster) ImportImage(i int, tarball string) error {
	if c.runtimeOf(i) == RuntimeCRIO {
		return fmt.Errorf("import %s into %s: CRI-O nodes import no tarballs; push the image to the cluster's registry", tarball, NodeName(i))
	}
	return importImage(c.bin, c.l.node(i), tarball)
}

// PullImage pulls ref into node i's containerd from the cluster's registry
// (plain HTTP), where the kubelet's pods find it. A restore from a
// checkpoint image needs this: containerd (2.2 and 2.3) pulls the
// checkpoint's base image (the original container's image, as
// name@digest) with its default resolver, which ignores the node's
// registry configuration and speaks only HTTPS to 10.77.0.1:5000, so the
// base image must be on the target node already, under that name@digest.
func (c *Cluster) PullImage(ctx context.Context, i int, ref string) error {
	if c.runtimeOf(i) == RuntimeCRIO {
		return criPull(ctx, c.l.node(i).crioSock(), ref)
	}
	ctr := filepath.Join(c.bin, "containerd", "ctr")
	out, err := exec.CommandContext(ctx, ctr, "-a", c.l.node(i).containerdSock(), "-n", "k8s.io", "images", "pull", "--plain-http", ref).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pull %s into %s: %w: %s", ref, NodeName(i), err, lastLine(string(out)))
	}
	return nil
}

func importImage(bin string, n nodeLayout, tarball string) error {
	ctr := filepath.Join(bin, "containerd", "ctr")
	if _, err := run(ctr, "-a", n.containerdSock(), "-n", "k8s.io", "images", "import", tarball); err != nil {
		return fmt.Errorf("import %s into %s: %w", tarball, NodeName(n.i), err)
	}
	return nil
}

// Down takes the cluster down; see the package function Down.
func (c *Cluster) Down() error {
	return Down(Options{StateDir: c.l.dir, Log: c.log})
}

// progress prints timed progress lines.
type progress struct {
	w     io.Writer
	start time.Time
	mu    sync.Mutex
}

func (p *progress) say(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "[%5.1fs] %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
}

// lock serializes up and down across processes: the network names are
// global, so there is one lock for the machine. It is an abstract unix
// socket, which leaves no file behind and is released when its holder
// exits, however it exits.
func lock(ctx context.Context) (func(), error) {
	for {
		ln, err := net.Listen("unix", "@ms2m-cluster.lock")
		if err == nil {
			return func() { ln.Close() }, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("take the cluster lock: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for another ms2m cluster up or down to finish: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Up brings a cluster up, or returns the one that is already up in the
// same state folder. A cluster that is only partly up is taken down first.
// On failure Up leaves what it started running for inspection, says which
// log to read, and a Down cleans it all away.
func Up(ctx context.Context, opts Options) (*Cluster, error) {
	opts = opts.withDefaults()
	p := &progress{w: opts.Log, start: time.Now()}
	if err := Preflight(opts); err != nil {
		return nil, err
	}
	l := layout{dir: opts.StateDir}
	if err := os.MkdirAll(l.dir, 0o755); err != nil {
		return nil, err
	}
	var said time.Time
	for {
		c, err := upLocked(ctx, opts, l, p)
		if !errors.Is(err, ErrNetworkInUse) || !opts.WaitForNetwork {
			return c, err
		}
		if time.Since(said) > 30*time.Second {
			p.say("waiting for the network: %v", err)
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (gave up waiting: %w)", err, ctx.Err())
		case <-time.After(2 * time.Second):
		}
	}
}

func upLocked(ctx context.Context, opts Options, l layout, p *progress) (*Cluster, error) {
	unlock, err := lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()

	if rec, err := readRecord(l); err == nil {
		c, err := attach(l, rec, opts.Log)
		if err == nil {
			var down []string
			for _, comp := range components(rec) {
				if _, ok := running(l, comp); !ok {
					down = append(down, comp)
				}
			}
			apiErr := c.apiReady(ctx)
			switch {
			case len(down) > 0:
				p.say("cluster in %s is only partly up (not running: %s); taking it down first", l.dir, strings.Join(down, ", "))
			case apiErr != nil:
				p.say("cluster in %s runs but its apiserver is not ready (%v); taking it down first", l.dir, apiErr)
			case rec.Nodes != opts.Nodes:
				p.say("cluster in %s has %d nodes, %d asked for; taking it down first", l.dir, rec.Nodes, opts.Nodes)
			case runtimeSpec(rec.runtimes()) != opts.Runtime:
				p.say("cluster in %s runs %s, %s asked for; taking it down first", l.dir, runtimeSpec(rec.runtimes()), opts.Runtime)
			default:
				p.say("cluster already up (%d nodes, state %s); kubeconfig %s", rec.Nodes, l.dir, c.Kubeconfig())
				continueKubelets(l, rec.Nodes)
				return c, nil
			}
		}
		if err := downLocked(l, p, opts.BinDir); err != nil {
			return nil, fmt.Errorf("taking down the old cluster: %w", err)
		}
	} else if leftovers(l) {
		p.say("leftovers of an earlier cluster in %s; taking them down first", l.dir)
		if err := downLocked(l, p, opts.BinDir); err != nil {
			return nil, fmt.Errorf("taking down the leftovers: %w", err)
		}
	}

	if err := claimNetwork(l); err != nil {
		return nil, err
	}
	c, err := up(ctx, l, opts, p)
	if err != nil {
		return nil, err
	}
	p.say("cluster up: %d nodes; kubeconfig %s", opts.Nodes, c.Kubeconfig())
	return c, nil
}

func components(rec record) []string {
	comps := []string{compEtcd, compAPIServer, compKCM, compScheduler, compHost}
	for i := 1; i <= rec.Nodes; i++ {
		comps = append(comps, compRuntime(rec.runtimeOf(i), i), compKubelet(i), compKubeProxy(i))
	}
	return comps
}

func readRecord(l layout) (record, error) {
	var rec record
	b, err := os.ReadFile(l.record())
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("%s: %w", l.record(), err)
	}
	return rec, nil
}

// Attach returns the cluster that is up in opts.StateDir, without changing
// anything.
func Attach(opts Options) (*Cluster, error) {
	opts = opts.withDefaults()
	l := layout{dir: opts.StateDir}
	rec, err := readRecord(l)
	if err != nil {
		return nil, fmt.Errorf("no cluster in %s (%w); start one with: go run ./hack/cluster up", l.dir, err)
	}
	return attach(l, rec, opts.Log)
}

func attach(l layout, rec record, log io.Writer) (*Cluster, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", l.kubeconfig())
	if err != nil {
		return nil, fmt.Errorf("read kubeconfig %s: %w", l.kubeconfig(), err)
	}
	// No cfg.Timeout: client-go would send it as every request's "timeout"
	// query parameter, which the kubelet's checkpoint endpoint, reached
	// through the node proxy, reads as its own (whole seconds) and rejects.
	if log == nil {
		log = io.Discard
	}
	return &Cluster{l: l, nodes: rec.Nodes, bin: rec.BinDir, runtimes: rec.runtimes(), log: log, rest: cfg}, nil
}

func (c *Cluster) apiReady(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(c.rest)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	return err
}

// up starts everything, in an order that overlaps the slow parts: the
// control plane first (etcd and the apiserver take seconds), then while
// it starts the host services, the containerds and the image imports, then
// the controllers and the kubelets.
func up(ctx context.Context, l layout, opts Options, p *progress) (*Cluster, error) {
	if err := wipeRuntime(l); err != nil {
		return nil, err
	}
	// The previous cluster's logs stay one round, in logs.prev.
	os.RemoveAll(l.path("logs.prev"))
	if err := os.Rename(l.path("logs"), l.path("logs.prev")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, d := range []string{"run", "logs", "bin", "images", "kubeconfigs", l.etcdData(), l.registryDir()} {
		if err := os.MkdirAll(l.path(d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := recordHostPaths(l); err != nil {
		return nil, err
	}
	rts, err := nodeRuntimes(opts.Runtime, opts.Nodes)
	if err != nil {
		return nil, err
	}
	rec := record{Nodes: opts.Nodes, BinDir: opts.BinDir, Runtime: opts.Runtime, NodeRuntimes: rts}
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(l.record(), b, 0o644); err != nil {
		return nil, err
	}
	if err := ensurePKI(l, opts.Nodes); err != nil {
		return nil, err
	}
	if err := writeNodeFiles(l, opts, rts); err != nil {
		return nil, err
	}
	p.say("state, certificates and configs ready in %s", l.dir)
	if err := setupNetwork(opts.Nodes); err != nil {
		return nil, err
	}
	if hasRuntime(rts, RuntimeCRIO) {
		if err := mountHugetlb(l); err != nil {
			return nil, err
		}
	}
	if err := setupCgroups(opts.Nodes); err != nil {
		return nil, err
	}
	p.say("network up: bridge %s %s/%d, %d node namespaces", BridgeName, HostIP, HostPrefix, opts.Nodes)

	k8s := func(name string) string { return filepath.Join(opts.BinDir, "k8s", name) }
	if _, err := start(l, process{name: compEtcd, bin: k8s("etcd"), args: etcdArgs(l)}); err != nil {
		return nil, err
	}
	if _, err := start(l, process{name: compAPIServer, bin: k8s("kube-apiserver"), args: apiserverArgs(l)}); err != nil {
		return nil, err
	}
	c, err := attach(l, rec, opts.Log)
	if err != nil {
		return nil, err
	}

	// While the apiserver starts: host services, containerds, images.
	// Whatever way up returns, both goroutines have finished by then, so
	// nothing starts behind a caller's Down.
	helper, pause := make(chan error, 1), make(chan error, 1)
	var helperErr, pauseErr error
	helperDone, pauseDone := false, false
	go func() { helper <- startHelper(ctx, l, opts, p) }()
	go func() { pause <- ensurePauseImage(ctx, l, opts) }()
	defer func() {
		if !helperDone {
			<-helper //nolint:errcheck // drained on an early return, whose own error is reported
		}
		if !pauseDone {
			<-pause //nolint:errcheck // drained on an early return, whose own error is reported
		}
	}()
	// A node's components keep their temporary files in the node's folder:
	// containerd mounts a checkpoint image on a temporary folder to restore
	// from it and leaves it mounted, and there Down finds it.
	nodeEnv := func(i int) []string {
		return []string{
			"PATH=" + filepath.Join(opts.BinDir, "criu") + ":" + filepath.Join(opts.BinDir, "containerd") + ":" + strings.TrimPrefix(baseEnv()[0], "PATH="),
			"TMPDIR=" + l.node(i).tmp(),
		}
	}
	for i := 1; i <= opts.Nodes; i++ {
		if _, err := start(l, runtimeProcess(l, opts.BinDir, rts[i-1], i, nodeEnv(i))); err != nil {
			return nil, err
		}
	}
	for i := 1; i <= opts.Nodes; i++ {
		sock, comp := runtimeSock(rts[i-1], l.node(i)), compRuntime(rts[i-1], i)
		if err := waitAlive(ctx, l, 30*time.Second, func() bool { return socketAnswers(sock) }, comp); err != nil {
			return nil, fmt.Errorf("%s of %s did not open %s: %w", rts[i-1], NodeName(i), sock, withLogs(err, l, comp))
		}
	}
	p.say("%s up on %d nodes", opts.Runtime, opts.Nodes)
	pauseErr, pauseDone = <-pause, true
	if pauseErr != nil {
		return nil, pauseErr
	}
	if hasRuntime(rts, RuntimeCRIO) {
		// CRI-O pulls its sandbox image from the registry.
		helperErr, helperDone = <-helper, true
		if helperErr != nil {
			return nil, helperErr
		}
		if err := pushPauseImage(ctx, l); err != nil {
			return nil, err
		}
		p.say("pause image pushed to %s", crioPauseImage())
	}
	if hasRuntime(rts, RuntimeContainerd) {
		for i := 1; i <= opts.Nodes; i++ {
			if rts[i-1] != RuntimeContainerd {
				continue
			}
			if err := importImage(opts.BinDir, l.node(i), l.pauseTarball()); err != nil {
				return nil, err
			}
		}
		p.say("pause image imported into every containerd node")
	}

	if err := waitAlive(ctx, l, opts.Timeout, func() bool { return c.apiReady(ctx) == nil }, compEtcd, compAPIServer); err != nil {
		return nil, fmt.Errorf("kube-apiserver not ready at %s: %w", c.APIServer(), withLogs(err, l, compAPIServer))
	}
	p.say("kube-apiserver ready at %s", c.APIServer())
	if _, err := start(l, process{name: compKCM, bin: k8s("kube-controller-manager"), args: kcmArgs(l)}); err != nil {
		return nil, err
	}
	if _, err := start(l, process{name: compScheduler, bin: k8s("kube-scheduler"), args: schedulerArgs(l)}); err != nil {
		return nil, err
	}
	for i := 1; i <= opts.Nodes; i++ {
		// Every kubelet on this host clears /var/lib/kubelet/device-plugins
		// and listens on kubelet.sock there. Two doing it at once can fail
		// with "address already in use" (seen once in CI), so each starts
		// after the one before has listened.
		if isSocket(devicePluginSocket) {
			os.Remove(devicePluginSocket)
		}
		if _, err := start(l, process{name: compKubelet(i), bin: k8s("kubelet"), args: kubeletArgs(l, i), netns: NodeName(i), env: nodeEnv(i)}); err != nil {
			return nil, err
		}
		waitSocket(ctx, devicePluginSocket, 20*time.Second)
	}
	if !helperDone {
		helperErr, helperDone = <-helper, true
		if helperErr != nil {
			return nil, helperErr
		}
	}

	cs, err := kubernetes.NewForConfig(c.rest)
	if err != nil {
		return nil, err
	}
	for i := 1; i <= opts.Nodes; i++ {
		name := NodeName(i)
		err := waitAlive(ctx, l, opts.Timeout, func() bool {
			node, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			return err == nil && nodeReady(node)
		}, compRuntime(rts[i-1], i), compKubelet(i))
		if err != nil {
			return nil, fmt.Errorf("node %s not Ready: %w", name, withLogs(err, l, compKubelet(i), compRuntime(rts[i-1], i)))
		}
		p.say("node %s Ready (%s, %s, pods %s)", name, NodeIP(i), rts[i-1], PodCIDR(i))
	}
	// kube-proxy reads its node's object, so it starts once the node is
	// registered; it is healthy once it has programmed the Services.
	for i := 1; i <= opts.Nodes; i++ {
		if _, err := start(l, process{name: compKubeProxy(i), bin: k8s("kube-proxy"), args: kubeProxyArgs(l, i), netns: NodeName(i), env: nodeEnv(i)}); err != nil {
			return nil, err
		}
	}
	for i := 1; i <= opts.Nodes; i++ {
		health := fmt.Sprintf("http://%s:%d/healthz", NodeIP(i), kubeProxyHealthPort)
		if err := waitAlive(ctx, l, opts.Timeout, func() bool { return httpOK(health) }, compKubeProxy(i)); err != nil {
			return nil, fmt.Errorf("kube-proxy of %s not healthy at %s: %w", NodeName(i), health, withLogs(err, l, compKubeProxy(i)))
		}
	}
	p.say("kube-proxy up on %d nodes (nftables; services %s)", opts.Nodes, serviceCIDR)
	// Pods are admitted once their namespace's service account exists, and
	// their token volume is mounted once the root CA config map does.
	err = waitAlive(ctx, l, opts.Timeout, func() bool {
		_, err1 := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		_, err2 := cs.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err1 == nil && err2 == nil
	}, compKCM)
	if err != nil {
		return nil, fmt.Errorf("default service account or kube-root-ca.crt never appeared: %w", withLogs(err, l, compKCM))
	}
	p.say("controllers ready (default service account and root CA published)")
	return c, nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitFor polls cond every 100 ms until it holds, d passes or ctx ends.
func waitFor(ctx context.Context, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// waitAlive is waitFor that gives up at once when one of the components it
// depends on has exited.
func waitAlive(ctx context.Context, l layout, d time.Duration, cond func() bool, comps ...string) error {
	var dead string
	err := waitFor(ctx, d, func() bool {
		for _, comp := range comps {
			if _, ok := running(l, comp); !ok {
				dead = comp
				return true
			}
		}
		return cond()
	})
	if err == nil && dead != "" {
		return &exitedError{comp: dead, log: l.log(dead)}
	}
	return err
}

// exitedError says a component exited while Up waited on it, with the end
// of its log.
type exitedError struct{ comp, log string }

func (e *exitedError) Error() string {
	return fmt.Sprintf("%s exited\n--- last lines of %s:\n%s", e.comp, e.log, tail(e.log, 30))
}

// withLogs adds the last lines of the components' logs to a timeout, the
// likely reason for which is in them. An exitedError has its log already.
func withLogs(err error, l layout, comps ...string) error {
	var ee *exitedError
	if errors.As(err, &ee) {
		return err
	}
	var b strings.Builder
	for _, comp := range comps {
		fmt.Fprintf(&b, "\n--- last lines of %s:\n%s", l.log(comp), tail(l.log(comp), 30))
	}
	return fmt.Errorf("%w%s", err, b.String())
}

func socketAnswers(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// wipeRuntime removes what a previous cluster left in the state folder,
// keeping the certificates, the built helper and images, and the logs.
func wipeRuntime(l layout) error {
	if errs := unmountAll(l.dir); len(errs) > 0 {
		return errors.Join(errs...)
	}
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return err
	}
	keep := map[string]bool{"pki": true, "bin": true, "images": true, "logs": true, "logs.prev": true, "cluster.json": true}
	for _, e := range ents {
		if keep[e.Name()] {
			continue
		}
		if e.Name() == "run" {
			// keep the record of host folders Up found missing
			continue
		}
		if err := os.RemoveAll(l.path(e.Name())); err != nil {
			return fmt.Errorf("clean %s: %w", l.path(e.Name()), err)
		}
	}
	return nil
}

// runtimeProcess is node i's container runtime, in the node's network
// namespace. CRI-O gets the node's own HOME, where containers/image finds
// the signature policy, the cluster's registry as a plain-HTTP one, and
// a drop-in folder of its own (none of the host's).
func runtimeProcess(l layout, binDir, runtime string, i int, env []string) process {
	n := l.node(i)
	if runtime == RuntimeCRIO {
		return process{name: compCRIO(i), bin: filepath.Join(binDir, "crio", "crio"),
			args: []string{"--config", n.crioConfig(), "--config-dir", filepath.Join(n.crioDir(), "crio.conf.d"),
				"--insecure-registry", hostAddr(RegistryPort), "--log-level", "info"},
			netns: NodeName(i), env: append(env, "HOME="+n.crioHome())}
	}
	return process{name: compContainerd(i), bin: filepath.Join(binDir, "containerd", "containerd"),
		args: []string{"--config", n.containerdConfig()}, netns: NodeName(i), env: env}
}

// writeNodeFiles writes each node's runtime, CNI, registry and kubelet
// configuration; node i runs rts[i-1].
func writeNodeFiles(l layout, opts Options, rts []string) error {
	for i := 1; i <= opts.Nodes; i++ {
		n := l.node(i)
		for _, d := range []string{n.cniConfDir(), n.cniIPAMDir(), n.kubeletRoot(), n.kubeletCerts(), n.podLogs(), n.tmp(),
			filepath.Join(n.registryHosts(), hostAddr(RegistryPort))} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		cni, err := cniConfList(i, n.cniIPAMDir())
		if err != nil {
			return err
		}
		files := map[string][]byte{
			filepath.Join(n.cniConfDir(), "10-ms2m.conflist"): cni,
			n.kubeletConfig(): []byte(kubeletConfig(n, l.pki("ca.crt"), runtimeSock(rts[i-1], n))),
		}
		if rts[i-1] == RuntimeCRIO {
			files[n.crioConfig()] = []byte(crioConfig(n, opts.BinDir))
			files[filepath.Join(n.crioHome(), ".config", "containers", "policy.json")] = []byte(CRIOPolicy)
			for _, d := range []string{filepath.Join(n.crioHome(), ".config", "containers"), filepath.Join(n.crioDir(), "crio.conf.d")} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					return err
				}
			}
		} else {
			files[n.containerdConfig()] = []byte(containerdConfig(n))
			files[filepath.Join(n.registryHosts(), hostAddr(RegistryPort), "hosts.toml")] = []byte(registryHostsTOML())
		}
		for path, data := range files {
			if err := os.WriteFile(path, data, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

func etcdArgs(l layout) []string {
	client := "http://127.0.0.1:" + strconv.Itoa(etcdClientPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(etcdPeerPort)
	return []string{
		"--name=ms2m", "--data-dir=" + l.etcdData(),
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=ms2m=" + peer,
		"--listen-metrics-urls=", // none
		"--unsafe-no-fsync",      // a throwaway test cluster: speed over durability
		"--log-level=warn",
	}
}

func apiserverArgs(l layout) []string {
	return []string{
		"--etcd-servers=http://127.0.0.1:" + strconv.Itoa(etcdClientPort),
		"--bind-address=" + HostIP, "--advertise-address=" + HostIP, "--secure-port=" + strconv.Itoa(APIServerPort),
		"--tls-cert-file=" + l.pki("apiserver.crt"), "--tls-private-key-file=" + l.pki("apiserver.key"),
		"--client-ca-file=" + l.pki("ca.crt"),
		"--requestheader-client-ca-file=" + l.pki("front-proxy-ca.crt"),
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-key-file=" + l.pki("sa.pub"),
		"--service-account-signing-key-file=" + l.pki("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=" + serviceCIDR,
		"--allow-privileged=true",
		// The kubernetes Service's endpoints (HostIP:6443), which
		// kube-proxy routes in-cluster clients to.
		"--endpoint-reconciler-type=lease",
		// The API server calls webhooks and aggregated APIs at their
		// endpoints' pod IPs, which the host routes to the nodes, rather
		// than at a ClusterIP, which only the nodes' kube-proxy knows.
		"--enable-aggregator-routing=true",
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-client-certificate=" + l.pki(idKubeletClient.file+".crt"),
		"--kubelet-client-key=" + l.pki(idKubeletClient.file+".key"),
		"--profiling=false",
	}
}

func kcmArgs(l layout) []string {
	kc := l.compKubeconfig(compKCM)
	return []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(kcmPort),
		"--service-account-private-key-file=" + l.pki("sa.key"),
		"--root-ca-file=" + l.pki("ca.crt"),
		"--cluster-signing-cert-file=" + l.pki("ca.crt"), "--cluster-signing-key-file=" + l.pki("ca.key"),
		"--use-service-account-credentials=true",
		"--service-cluster-ip-range=" + serviceCIDR,
		"--cluster-name=ms2m",
		"--leader-elect=false",
		"--profiling=false",
	}
}

func schedulerArgs(l layout) []string {
	kc := l.compKubeconfig(compScheduler)
	return []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(schedulerPort),
		"--leader-elect=false",
		"--profiling=false",
	}
}

func kubeletArgs(l layout, i int) []string {
	n := l.node(i)
	return []string{
		"--config=" + n.kubeletConfig(),
		"--kubeconfig=" + n.kubeletKubeconfig(),
		"--root-dir=" + n.kubeletRoot(),
		"--cert-dir=" + n.kubeletCerts(),
		"--hostname-override=" + NodeName(i),
		"--node-ip=" + NodeIP(i),
		"--v=1",
	}
}

// kubeProxyArgs run kube-proxy on node i in nftables mode. Traffic to a
// ClusterIP from outside the pod network is masqueraded, and kube-proxy
// leaves the kernel's conntrack limits alone (a node shares the host's).
func kubeProxyArgs(l layout, i int) []string {
	return []string{
		"--kubeconfig=" + l.compKubeconfig(idKubeProxy.file),
		"--hostname-override=" + NodeName(i),
		"--proxy-mode=nftables",
		"--cluster-cidr=" + podCIDRs,
		"--conntrack-max-per-core=0",
		"--healthz-bind-address=" + NodeIP(i) + ":" + strconv.Itoa(kubeProxyHealthPort),
		"--metrics-bind-address=127.0.0.1:10249",
		"--v=1",
	}
}

// httpOK says whether a GET of url answers 200 within a second.
func httpOK(url string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// startHelper starts the detached host-services process and waits until
// the registry answers on HostIP.
func startHelper(ctx context.Context, l layout, opts Options, p *progress) error {
	bin, err := ensureHelper(ctx, l, opts)
	if err != nil {
		return err
	}
	if _, err := start(l, process{name: compHost, bin: bin, args: []string{"serve-host", "-state", l.dir}}); err != nil {
		return err
	}
	err = waitFor(ctx, 30*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", hostAddr(RegistryPort), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	if err != nil {
		return fmt.Errorf("host services: registry not answering on %s: %w\n--- last lines of %s:\n%s",
			hostAddr(RegistryPort), err, l.log(compHost), tail(l.log(compHost), 30))
	}
	p.say("host services up: registry %s, broker forwarders %s, %s and %s (NATS)", hostAddr(RegistryPort), hostAddr(AMQPPort), hostAddr(StreamPort), hostAddr(NATSPort))
	return nil
}

// Status is what `status` prints.
type Status struct {
	StateDir   string
	Kubeconfig string
	APIServer  string
	APIReady   bool
	Components []ComponentStatus
	Nodes      []NodeStatus
}

// ComponentStatus is one process of the cluster.
type ComponentStatus struct {
	Name    string
	PID     int
	Running bool
	Log     string
}

// NodeStatus is one node as the apiserver sees it.
type NodeStatus struct {
	NodeInfo
	Registered bool
	Ready      bool
}

// GetStatus reports the cluster in opts.StateDir.
func GetStatus(ctx context.Context, opts Options) (Status, error) {
	opts = opts.withDefaults()
	l := layout{dir: opts.StateDir}
	rec, err := readRecord(l)
	if errors.Is(err, os.ErrNotExist) {
		return Status{StateDir: l.dir}, fmt.Errorf("no cluster is up in %s; start one with: go run ./hack/cluster up -state %s", l.dir, l.dir)
	} else if err != nil {
		return Status{StateDir: l.dir}, err
	}
	st := Status{StateDir: l.dir, Kubeconfig: l.kubeconfig(), APIServer: "https://" + hostAddr(APIServerPort)}
	for _, comp := range append(components(rec), addons(l)...) {
		pid, ok := running(l, comp)
		st.Components = append(st.Components, ComponentStatus{Name: comp, PID: pid, Running: ok, Log: l.log(comp)})
	}
	c, err := attach(l, rec, nil)
	if err != nil {
		return st, err
	}
	st.APIReady = c.apiReady(ctx) == nil
	var cs *kubernetes.Clientset
	if st.APIReady {
		cs, _ = kubernetes.NewForConfig(c.rest)
	}
	for i := 1; i <= rec.Nodes; i++ {
		ns := NodeStatus{NodeInfo: c.Node(i)}
		if cs != nil {
			node, err := cs.CoreV1().Nodes().Get(ctx, NodeName(i), metav1.GetOptions{})
			if err == nil {
				ns.Registered, ns.Ready = true, nodeReady(node)
			} else if !apierrors.IsNotFound(err) {
				return st, err
			}
		}
		st.Nodes = append(st.Nodes, ns)
	}
	return st, nil
}

// devicePluginSocket is where every kubelet on a host listens for device
// plugins; the path is fixed.
const devicePluginSocket = "/var/lib/kubelet/device-plugins/kubelet.sock"

// isSocket reports whether path is a Unix socket.
func isSocket(path string) bool {
	st, err := os.Lstat(path)
	return err == nil && st.Mode()&fs.ModeSocket != 0
}

// waitSocket waits up to limit for a Unix socket at path. It gives up
// quietly: a kubelet that never listens is reported by the Ready wait.
func waitSocket(ctx context.Context, path string, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if isSocket(path) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
