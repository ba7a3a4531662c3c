package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Problem is one unmet precondition and how to meet it.
type Problem struct {
	What string // what is missing or wrong
	Fix  string // the command or step that fixes it
}

// PreconditionError lists everything that keeps a cluster from starting. Up
// returns it before it starts or changes anything.
type PreconditionError struct{ Problems []Problem }

func (e *PreconditionError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cannot start a local cluster, %d precondition(s) unmet:", len(e.Problems))
	for _, p := range e.Problems {
		fmt.Fprintf(&b, "\n  - %s\n    fix: %s", p.What, p.Fix)
	}
	return b.String()
}

// binaries are the executables under BinDir, with the make target that
// builds each.
var binaries = []struct{ rel, target string }{
	{"k8s/etcd", "make k8s-bin"},
	{"k8s/kube-apiserver", "make k8s-bin"},
	{"k8s/kube-controller-manager", "make node-bin"},
	{"k8s/kube-scheduler", "make node-bin"},
	{"k8s/kubelet", "make node-bin"},
	{"k8s/kube-proxy", "make node-bin"},
	{"criu/criu", "make criu"},
}

// runtimeBinaries are each runtime's executables under BinDir.
var runtimeBinaries = map[string][]struct{ rel, target string }{
	RuntimeContainerd: {
		{"containerd/containerd", "make node-bin"},
		{"containerd/ctr", "make node-bin"},
		{"containerd/containerd-shim-runc-v2", "make node-bin"},
	},
	RuntimeCRIO: {
		{"crio/crio", "make crio-bin"},
		{"crio/pinns", "make crio-bin"},
	},
}

// Preflight checks everything Up needs, without changing anything: root,
// network namespaces, cgroups, the binaries under BinDir, Debian's runc and
// CNI plugins, and a CRIU that passes `criu check` on this kernel.
func Preflight(opts Options) error {
	opts = opts.withDefaults()
	var ps []Problem
	add := func(what, fix string) { ps = append(ps, Problem{what, fix}) }

	if os.Geteuid() != 0 {
		add("not running as root (uid "+fmt.Sprint(os.Geteuid())+"): the cluster makes network namespaces, mounts and cgroups",
			"run as root, e.g. sudo go run ./hack/cluster up")
		return &PreconditionError{ps} // nothing below can be checked meaningfully
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		add("no network namespace support in this kernel (/proc/self/ns/net)", "use a kernel with CONFIG_NET_NS")
	}
	for _, tool := range []struct{ name, pkg string }{{"ip", "iproute2"}, {"nsenter", "util-linux"}, {"sysctl", "procps"}} {
		if _, err := exec.LookPath(tool.name); err != nil {
			add(tool.name+" is not on PATH", "make node-setup (or apt-get install "+tool.pkg+")")
		}
	}
	if _, err := exec.LookPath("ip"); err == nil {
		if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil {
			add("`ip netns list` fails: "+strings.TrimSpace(string(out)), "use an iproute2 with netns support (make node-setup)")
		}
	}
	if m, err := cgroupMounts(); err != nil || len(m) == 0 {
		add("no cgroup hierarchy is mounted", "mount cgroups (v1 under /sys/fs/cgroup/<controller> or v2 at /sys/fs/cgroup)")
	}

	rts, err := nodeRuntimes(opts.Runtime, opts.Nodes)
	if err != nil {
		add(fmt.Sprintf("the node runtimes: %v", err), fmt.Sprintf("ask for %s or %s, for every node or one per node (%s,%s)", RuntimeContainerd, RuntimeCRIO, RuntimeContainerd, RuntimeCRIO))
	}
	var rtBins []struct{ rel, target string }
	for _, rt := range []string{RuntimeContainerd, RuntimeCRIO} {
		if hasRuntime(rts, rt) {
			rtBins = append(rtBins, runtimeBinaries[rt]...)
		}
	}
	if hasRuntime(rts, RuntimeCRIO) {
		if st, err := os.Stat("/usr/bin/conmon"); err != nil || st.Mode()&0o111 == 0 {
			add("missing /usr/bin/conmon (Debian's conmon, CRI-O's container monitor)", "make node-setup (or apt-get install conmon)")
		}
	}
	missing := map[string][]string{}
	var targets []string
	for _, b := range append(append([]struct{ rel, target string }{}, binaries...), rtBins...) {
		p := filepath.Join(opts.BinDir, b.rel)
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			if len(missing[b.target]) == 0 {
				targets = append(targets, b.target)
			}
			missing[b.target] = append(missing[b.target], p)
		}
	}
	for _, t := range targets {
		add("missing "+strings.Join(missing[t], ", "), t+" (from the repository root)")
	}
	if st, err := os.Stat("/usr/sbin/runc"); err != nil || st.Mode()&0o111 == 0 {
		add("missing /usr/sbin/runc (Debian's runc, which the runtime is configured to use)", "make node-setup (or apt-get install runc)")
	}
	if st, err := os.Stat("/usr/sbin/nft"); err != nil || st.Mode()&0o111 == 0 {
		add("missing /usr/sbin/nft (Debian's nftables, which kube-proxy programs Services with)", "make node-setup (or apt-get install nftables)")
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join("/usr/lib/cni", plugin)); err != nil {
			add("missing CNI plugin /usr/lib/cni/"+plugin, "make node-setup (or apt-get install containernetworking-plugins)")
			break
		}
	}
	criu := filepath.Join(opts.BinDir, "criu", "criu")
	if _, err := os.Stat(criu); err == nil {
		out, err := exec.Command(criu, "check").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Looks good") {
			add(fmt.Sprintf("`%s check` fails on this kernel: %s", criu, lastLine(string(out))),
				"make criu (it installs CRIU >= 4.2 privately; Debian 12's 3.17 and 4.1 do not work on this kernel)")
		}
	}
	// Up builds the host-services helper and the pause image from the
	// repository unless they are given or already built.
	needBuild := opts.Helper == ""
	if _, err := os.Stat((layout{dir: opts.StateDir}).pauseTarball()); err != nil {
		needBuild = true
	}
	if needBuild {
		if _, err := exec.LookPath("go"); err != nil {
			add("go is not on PATH; it builds the host-services helper and the pause image", "put the Go toolchain on PATH")
		}
		if opts.RepoDir == "" {
			add("the repository root was not found from the working directory; it is needed to build the helper and the pause image",
				"run from inside the repository, or set Options.RepoDir")
		}
	}
	// A unix socket path must fit in 108 bytes.
	if sock := (layout{dir: opts.StateDir}).node(maxNodes).containerdSock(); len(sock) > 100 {
		add("the state folder's path is too long for containerd's socket ("+sock+")", "pick a shorter -state folder")
	}
	if opts.Nodes < 1 || opts.Nodes > maxNodes {
		add(fmt.Sprintf("%d nodes asked for", opts.Nodes), fmt.Sprintf("ask for 1 to %d", maxNodes))
	}
	if len(ps) > 0 {
		return &PreconditionError{ps}
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if s == "" {
		return "(no output)"
	}
	return s
}
