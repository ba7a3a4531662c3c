package cluster

import (
	"encoding/json"
	"fmt"
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
func kubeletConfig(n nodeLayout, caFile string) string {
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
`, q(cgroupRoot(n.i)), q("unix://"+n.containerdSock()), q(n.podLogs()), q(NodeIP(n.i)), q(caFile))
}
