package cluster

import (
	"fmt"
	"path/filepath"
	"strconv"
)

// Names and addresses of the cluster's network. They are fixed, so only one
// cluster can be up on a machine at a time; Up refuses a second one.
const (
	// BridgeName is the host bridge the nodes' veths are enslaved to.
	BridgeName = "ms2m0"
	// HostIP is the host's address on the bridge: the apiserver, the
	// registry and the broker forwarders listen on it.
	HostIP = "10.77.0.1"
	// HostPrefix is the bridge network's prefix length.
	HostPrefix = 24
	// APIServerPort is the kube-apiserver's secure port on HostIP.
	APIServerPort = 6443
	// RegistryPort is the image registry's port on HostIP.
	RegistryPort = 5000
	// AMQPPort and StreamPort are the broker's ports, forwarded from HostIP
	// to loopback.
	AMQPPort   = 5672
	StreamPort = 5552
	// NATSPort is the NATS server's, forwarded from HostIP to loopback too.
	NATSPort = 4222

	// DefaultStateDir holds everything a cluster writes unless
	// Options.StateDir says otherwise.
	DefaultStateDir = "/var/tmp/ms2m-cluster"
	// PauseImage is the sandbox image containerd is pinned to. It is built
	// locally and imported into every node, never pulled.
	PauseImage = "registry.k8s.io/pause:3.10"

	etcdClientPort = 23790
	etcdPeerPort   = 23800
	kcmPort        = 10357 // kube-controller-manager's secure port, on loopback
	schedulerPort  = 10359 // kube-scheduler's secure port, on loopback
	serviceCIDR    = "10.96.0.0/24"
	podCIDRs       = "10.88.0.0/16" // every node's pod subnet lies in it
	maxNodes       = 9
)

// NodeName is the Kubernetes name, the network namespace and the hostname
// of node i (1-based).
func NodeName(i int) string { return "ms2m-node-" + strconv.Itoa(i) }

// NodeIP is node i's address on the bridge.
func NodeIP(i int) string { return "10.77.0." + strconv.Itoa(10+i) }

// PodCIDR is node i's pod subnet.
func PodCIDR(i int) string { return fmt.Sprintf("10.88.%d.0/24", i) }

// hostVeth is the host end of node i's veth pair; the node end is eth0.
func hostVeth(i int) string { return "ms2m-veth" + strconv.Itoa(i) }

// cgroupRoot is the cgroup under which node i's kubelet puts its pods, in
// every hierarchy.
func cgroupRoot(i int) string { return "/" + NodeName(i) }

func netnsPath(i int) string { return "/run/netns/" + NodeName(i) }

// layout names every path under the state folder.
type layout struct{ dir string }

func (l layout) path(p ...string) string { return filepath.Join(append([]string{l.dir}, p...)...) }

func (l layout) pki(name string) string         { return l.path("pki", name) }
func (l layout) log(name string) string         { return l.path("logs", name+".log") }
func (l layout) pid(name string) string         { return l.path("run", name+".pid") }
func (l layout) kubeconfig() string             { return l.path("kubeconfig") }
func (l layout) record() string                 { return l.path("cluster.json") }
func (l layout) etcdData() string               { return l.path("etcd") }
func (l layout) registryDir() string            { return l.path("registry") }
func (l layout) pauseTarball() string           { return l.path("images", "pause.tar") }
func (l layout) helperBinary() string           { return l.path("bin", "ms2m-cluster") }
func (l layout) node(i int) nodeLayout          { return nodeLayout{dir: l.path(NodeName(i)), i: i} }
func (l layout) compKubeconfig(n string) string { return l.path("kubeconfigs", n+".kubeconfig") }

// nodeLayout names every path of one node.
type nodeLayout struct {
	dir string
	i   int
}

func (n nodeLayout) path(p ...string) string { return filepath.Join(append([]string{n.dir}, p...)...) }

func (n nodeLayout) containerdConfig() string { return n.path("containerd.toml") }
func (n nodeLayout) containerdSock() string   { return n.path("containerd.sock") }
func (n nodeLayout) containerdRoot() string   { return n.path("containerd", "root") }
func (n nodeLayout) containerdState() string  { return n.path("containerd", "state") }
func (n nodeLayout) containerdOpt() string    { return n.path("containerd", "opt") }
func (n nodeLayout) runcRoot() string         { return n.path("containerd", "runc") }
func (n nodeLayout) crioConfig() string       { return n.path("crio.conf") }
func (n nodeLayout) crioSock() string         { return n.path("crio.sock") }
func (n nodeLayout) crioDir() string          { return n.path("crio") }
func (n nodeLayout) crioHome() string         { return n.path("crio", "home") }
func (n nodeLayout) cniConfDir() string       { return n.path("cni", "net.d") }
func (n nodeLayout) cniIPAMDir() string       { return n.path("cni", "ipam") }
func (n nodeLayout) registryHosts() string    { return n.path("certs.d") }
func (n nodeLayout) kubeletConfig() string    { return n.path("kubelet.yaml") }
func (n nodeLayout) kubeletKubeconfig() string {
	return n.path("kubelet.kubeconfig")
}
func (n nodeLayout) kubeletRoot() string  { return n.path("kubelet") }
func (n nodeLayout) kubeletCerts() string { return n.path("kubelet-pki") }
func (n nodeLayout) podLogs() string      { return n.path("pod-logs") }
func (n nodeLayout) tmp() string          { return n.path("tmp") }

// component names, used for pid files and logs.
const (
	compEtcd      = "etcd"
	compAPIServer = "kube-apiserver"
	compKCM       = "kube-controller-manager"
	compScheduler = "kube-scheduler"
	compHost      = "host-services"
)

func compContainerd(i int) string { return NodeName(i) + "-containerd" }
func compCRIO(i int) string       { return NodeName(i) + "-crio" }
func compKubelet(i int) string    { return NodeName(i) + "-kubelet" }
func compKubeProxy(i int) string  { return NodeName(i) + "-kube-proxy" }

// compRuntime is node i's container runtime component.
func compRuntime(runtime string, i int) string {
	if runtime == RuntimeCRIO {
		return compCRIO(i)
	}
	return compContainerd(i)
}

// kubeProxyHealthPort is kube-proxy's health port on its node's address.
const kubeProxyHealthPort = 10256
