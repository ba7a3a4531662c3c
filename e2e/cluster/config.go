package cluster

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// The files a node reads are rendered by the pure functions below, so that
// their content is tested without starting anything.

// containerdConfig is node n's containerd configuration: its own root, state
// and socket under the node's folder, CRIU enabled for checkpoint and
// restore-via-create, Debian's runc with cgroupfs and its own root, the locally built pause
// image pinned, CNI from the node's own conf dir, network namespaces kept
// under the state dir (so they never land in /run/netns), NRI off (it would
// open a socket shared by every containerd on the machine), and registry
// hosts from the node's certs.d. It stays at configuration version 3,
// which containerd 2.3 migrates (it logs "Configuration migrated from
// version 3" at start): there the ttrpc socket follows [grpc] address,
// while a version 4 file would need its own per-node
// io.containerd.server.v1.ttrpc address, or every node would share the
// default one. The CRI keys are the same in both versions.
func containerdConfig(n nodeLayout) string {
	q := strconv.Quote
	var b strings.Builder
	fmt.Fprintf(&b, `version = 3
root = %s
state = %s
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = %s

[plugins."io.containerd.internal.v1.opt"]
  path = %s

[plugins."io.containerd.cri.v1.runtime"]
  enable_criu = true
  enable_experimental_restore_via_create = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        Root = %s
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = %s
    max_conf_num = 1

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %s
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = %s
`, q(n.containerdRoot()), q(n.containerdState()), q(n.containerdSock()), q(n.containerdOpt()),
		q(n.runcRoot()), q(n.cniConfDir()), q(PauseImage), q(n.registryHosts()))
	return b.String()
}

// crioConfig is node n's CRI-O configuration (RuntimeCRIO), CRIOConfig
// with the node's folders and the cluster's pause image.
func crioConfig(n nodeLayout, binDir string) string {
	return CRIOConfig(CRIOPaths{Dir: n.crioDir(), Sock: n.crioSock(), CNIConfDir: n.cniConfDir(), BinDir: binDir, PauseImage: crioPauseImage()})
}

// CRIOPaths place one CRI-O's files.
type CRIOPaths struct {
	Dir        string // storage, state and logs go below it
	Sock       string // the CRI socket
	CNIConfDir string // the CNI configuration it reads
	BinDir     string // has crio/pinns (make crio-bin)
	PauseImage string // the sandbox image
}

// CRIOConfig is a crio.conf that keeps CRI-O's storage (overlay), state,
// logs and socket where p says; Debian's runc
// with cgroupfs and its own root, monitored by Debian's conmon, in the
// pod's cgroup; pinns from binDir; CRIU support on, which in CRI-O 1.34.0
// turns on checkpoint and restore alike (later patch releases add
// [crio.checkpoint_restore] container_level_enabled, whose default,
// checkpoint_only, restores nothing); the sandbox image from the
// cluster's registry; no infra container for pods whose PID namespace is
// per container (the kubelet's default), since the infra container's
// oom_score_adj of -998 needs CAP_SYS_RESOURCE; CNI from the node's own
// conf dir; NRI off (its socket is machine-wide). The signature policy
// is not set here: a namespaced one makes every restore fail, so the
// policy comes from $HOME/.config/containers (the node's crioHome), and
// the registry's plain HTTP from --insecure-registry (no crio.conf key in
// 1.34).
func CRIOConfig(p CRIOPaths) string {
	q := strconv.Quote
	d := p.Dir
	return fmt.Sprintf(`[crio]
root = %s
runroot = %s
storage_driver = "overlay"
log_dir = %s
version_file = %s
clean_shutdown_file = %s

[crio.api]
listen = %s
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
drop_infra_ctr = true
enable_criu_support = true
pinns_path = %s
namespaces_dir = %s
container_exits_dir = %s
container_attach_socket_dir = %s

[crio.runtime.runtimes.runc]
runtime_path = "/usr/sbin/runc"
runtime_root = %s
runtime_type = "oci"
monitor_path = "/usr/bin/conmon"

[crio.image]
pause_image = %s

[crio.network]
network_dir = %s
plugin_dirs = ["/usr/lib/cni"]

[crio.nri]
enable_nri = false
`, q(filepath.Join(d, "storage")), q(filepath.Join(d, "run", "storage")), q(filepath.Join(d, "pods")),
		q(filepath.Join(d, "run", "version")), q(filepath.Join(d, "clean.shutdown")), q(p.Sock),
		q(filepath.Join(p.BinDir, "crio", "pinns")), q(filepath.Join(d, "run", "ns")), q(filepath.Join(d, "run", "exits")),
		q(filepath.Join(d, "run", "attach")), q(filepath.Join(d, "run", "runc")), q(p.PauseImage), q(p.CNIConfDir))
}

// crioPauseImage is the sandbox image of CRI-O nodes: PauseImage's
// build, pushed to the cluster's registry (CRI-O cannot import a tarball).
func crioPauseImage() string { return hostAddr(RegistryPort) + "/ms2m/pause:3.10" }

// CRIOPolicy is a containers/image signature policy that accepts every
// image (the cluster's images are unsigned), for
// $HOME/.config/containers/policy.json in CRI-O's environment.
const CRIOPolicy = `{"default":[{"type":"insecureAcceptAnything"}]}` + "\n"

// registryHostsTOML tells containerd to pull from the cluster's registry
// over plain HTTP. It goes to certs.d/<HostIP:RegistryPort>/hosts.toml.
func registryHostsTOML() string { return plainHTTPHostsTOML(hostAddr(RegistryPort)) }

// plainHTTPHostsTOML tells containerd to pull from the registry at addr
// over plain HTTP.
func plainHTTPHostsTOML(addr string) string {
	u := "http://" + addr
	return fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", u, u)
}

// cniConfList is node i's pod network: a bridge cni0 inside the node's
// namespace that is the pods' gateway, host-local addresses from the node's
// pod subnet (kept in the node's folder), and no masquerading, since there
// is no iptables; the host and the other nodes route the pod subnets back.
func cniConfList(i int, ipamDir string) ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       NodeName(i),
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      "cni0",
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": ipamDir,
					"ranges":  []any{[]any{map[string]any{"subnet": PodCIDR(i)}}},
					"routes":  []any{map[string]any{"dst": "0.0.0.0/0"}},
				},
			},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// kubeletConfig is node n's KubeletConfiguration. The kubelet authenticates
// callers by client certificate from the cluster CA and asks the apiserver
// whether they may (the apiserver's own kubelet client is in
// system:masters); pods go under the node's own cgroup root; eviction
// thresholds are low, because all nodes share one disk and one memory; and
// pods get no DNS (resolvConf ""), since nothing serves it.
func kubeletConfig(n nodeLayout, caFile, runtimeSock string) string {
	q := strconv.Quote
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %s
containerRuntimeEndpoint: %s
podLogsDir: %s
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %s
authorization:
  mode: Webhook
failSwapOn: false
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%%"
  imagefs.available: "1%%"
  nodefs.inodesFree: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: ""
serializeImagePulls: false
clusterDomain: cluster.local
featureGates:
  ContainerCheckpoint: true
`, q(cgroupRoot(n.i)), q("unix://"+runtimeSock), q(n.podLogs()), q(NodeIP(n.i)), q(caFile))
}
