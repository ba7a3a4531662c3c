package cluster

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/ms2m/ms2m/internal/agent"
)

func TestAddresses(t *testing.T) {
	tests := map[string]struct {
		i                                    int
		wantName, wantIP, wantCIDR, wantVeth string
	}{
		"first":  {1, "ms2m-node-1", "10.77.0.11", "10.88.1.0/24", "ms2m-veth1"},
		"second": {2, "ms2m-node-2", "10.77.0.12", "10.88.2.0/24", "ms2m-veth2"},
		"last":   {maxNodes, "ms2m-node-9", "10.77.0.19", "10.88.9.0/24", "ms2m-veth9"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := []string{NodeName(tc.i), NodeIP(tc.i), PodCIDR(tc.i), hostVeth(tc.i)}
			want := []string{tc.wantName, tc.wantIP, tc.wantCIDR, tc.wantVeth}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
			if len(hostVeth(tc.i)) > 15 {
				t.Errorf("interface name %q is longer than Linux allows", hostVeth(tc.i))
			}
		})
	}
}

func TestContainerdConfig(t *testing.T) {
	n := layout{dir: "/s"}.node(2)
	got := containerdConfig(n)
	for _, want := range []string{
		`root = "/s/ms2m-node-2/containerd/root"`,
		`state = "/s/ms2m-node-2/containerd/state"`,
		`address = "/s/ms2m-node-2/containerd.sock"`,
		`enable_criu = true`,
		`enable_experimental_restore_via_create = true`,
		`restrict_oom_score_adj = true`,
		`netns_mounts_under_state_dir = true`,
		`BinaryName = "/usr/sbin/runc"`,
		`SystemdCgroup = false`,
		`Root = "/s/ms2m-node-2/containerd/runc"`,
		`conf_dir = "/s/ms2m-node-2/cni/net.d"`,
		`sandbox = "registry.k8s.io/pause:3.10"`,
		`config_path = "/s/ms2m-node-2/certs.d"`,
		`disabled_plugins = ["io.containerd.nri.v1.nri"]`,
		`path = "/s/ms2m-node-2/containerd/opt"`,
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("containerd config lacks %q:\n%s", want, got)
		}
	}
	// The agents' preflight reads the same file (MS2M_AGENT_RUNTIME_CONFIG):
	// restore is on even where containerd's default is off.
	if rs := agent.RuntimeSettings("containerd", "2.3.4", []string{got}); rs.Restore == nil || !*rs.Restore {
		t.Errorf("the agent reads restore as %v in the node's containerd config (note %q), want on", rs.Restore, rs.Note)
	}
}

func TestRegistryHosts(t *testing.T) {
	want := "server = \"http://10.77.0.1:5000\"\n\n[host.\"http://10.77.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
	if diff := cmp.Diff(want, registryHostsTOML()); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

func TestCNIConfList(t *testing.T) {
	b, err := cniConfList(3, "/s/ipam")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Name    string `json:"name"`
		Plugins []struct {
			Type      string `json:"type"`
			Bridge    string `json:"bridge"`
			IsGateway bool   `json:"isGateway"`
			IPMasq    bool   `json:"ipMasq"`
			IPAM      struct {
				Type    string                `json:"type"`
				DataDir string                `json:"dataDir"`
				Ranges  [][]map[string]string `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	p := got.Plugins[0]
	summary := []any{got.Name, p.Type, p.Bridge, p.IsGateway, p.IPMasq, p.IPAM.Type, p.IPAM.DataDir, p.IPAM.Ranges[0][0]["subnet"]}
	want := []any{"ms2m-node-3", "bridge", "cni0", true, false, "host-local", "/s/ipam", "10.88.3.0/24"}
	if diff := cmp.Diff(want, summary); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

func TestKubeletConfig(t *testing.T) {
	n := layout{dir: "/s"}.node(1)
	var got map[string]any
	if err := yaml.Unmarshal([]byte(kubeletConfig(n, "/s/pki/ca.crt", runtimeSock(RuntimeContainerd, n))), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"kind":                     "KubeletConfiguration",
		"failCgroupV1":             false,
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               "/ms2m-node-1",
		"containerRuntimeEndpoint": "unix:///s/ms2m-node-1/containerd.sock",
		"podLogsDir":               "/s/ms2m-node-1/pod-logs",
		"address":                  "10.77.0.11",
		"failSwapOn":               false,
		"resolvConf":               "",
		"featureGates":             map[string]any{"ContainerCheckpoint": true},
		"authorization":            map[string]any{"mode": "Webhook"},
	}
	for k, w := range want {
		if diff := cmp.Diff(w, got[k]); diff != "" {
			t.Errorf("%s (-want +got)\n%s", k, diff)
		}
	}
	if got["evictionHard"].(map[string]any)["nodefs.available"] != "1%" {
		t.Errorf("evictionHard = %v, want low thresholds", got["evictionHard"])
	}
}

// TestCRIOConfig holds a CRI-O node's crio.conf to what the node agent's
// preflight reads as checkpoint and restore on, and to the node's folder.
func TestCRIOConfig(t *testing.T) {
	n := layout{dir: "/s"}.node(2)
	text := crioConfig(n, "/repo/bin")
	kv := agent.ParseTOMLish(text)
	for k, want := range map[string]string{
		"crio.api.listen":                         "/s/ms2m-node-2/crio.sock",
		"crio.root":                               "/s/ms2m-node-2/crio/storage",
		"crio.storage_driver":                     "overlay",
		"crio.runtime.cgroup_manager":             "cgroupfs",
		"crio.runtime.drop_infra_ctr":             "true",
		"crio.runtime.pinns_path":                 "/repo/bin/crio/pinns",
		"crio.runtime.runtimes.runc.monitor_path": "/usr/bin/conmon",
		"crio.image.pause_image":                  "10.77.0.1:5000/ms2m/pause:3.10",
		"crio.network.network_dir":                "/s/ms2m-node-2/cni/net.d",
		"crio.nri.enable_nri":                     "false",
	} {
		if kv[k] != want {
			t.Errorf("%s = %q, want %q", k, kv[k], want)
		}
	}
	s := agent.RuntimeSettings("cri-o", "1.34.0", []string{text})
	if s.Checkpoint == nil || !*s.Checkpoint || s.Restore == nil || !*s.Restore {
		t.Errorf("the agent reads checkpoint %v, restore %v from the node's crio.conf; want both on", s.Checkpoint, s.Restore)
	}
	var k map[string]any
	if err := yaml.Unmarshal([]byte(kubeletConfig(n, "/s/pki/ca.crt", runtimeSock(RuntimeCRIO, n))), &k); err != nil {
		t.Fatal(err)
	}
	if got := k["containerRuntimeEndpoint"]; got != "unix:///s/ms2m-node-2/crio.sock" {
		t.Errorf("the kubelet of a CRI-O node talks to %v", got)
	}
}

func TestPKI(t *testing.T) {
	l := layout{dir: t.TempDir()}
	if err := ensurePKI(l, 2); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(l.pki("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	// A second run keeps what is there.
	if err := ensurePKI(l, 2); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(l.pki("ca.crt"))
	if string(before) != string(after) {
		t.Error("a second ensurePKI replaced the CA")
	}
	c, err := loadOrCreateCA(l.pki("ca"), "ms2m-cluster-ca")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []identity{idAdmin, idKubeletClient, idKCM, idScheduler, idKubeProxy, idNode(1), idNode(2)} {
		cert, _, _, err := loadPair(l.pki(id.file+".crt"), l.pki(id.file+".key"))
		if err != nil {
			t.Fatalf("%s: %v", id.cn, err)
		}
		if err := cert.CheckSignatureFrom(c.cert); err != nil {
			t.Errorf("%s not signed by the CA: %v", id.cn, err)
		}
		got := []any{cert.Subject.CommonName, cert.Subject.Organization}
		if diff := cmp.Diff([]any{id.cn, id.groups}, got); diff != "" {
			t.Errorf("%s subject (-want +got)\n%s", id.file, diff)
		}
	}
	srv, _, _, err := loadPair(l.pki("apiserver.crt"), l.pki("apiserver.key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{HostIP, "127.0.0.1", "kubernetes.default.svc"} {
		if err := srv.VerifyHostname(host); err != nil {
			t.Errorf("apiserver certificate: %v", err)
		}
	}
	for _, f := range []string{l.kubeconfig(), l.compKubeconfig(compKCM), l.compKubeconfig(compScheduler), l.node(2).kubeletKubeconfig(), l.pki("sa.key"), l.pki("sa.pub")} {
		if _, err := os.Stat(f); err != nil {
			t.Error(err)
		}
	}
}

func TestUnescapeMount(t *testing.T) {
	if got, want := unescapeMount(`/a\040b/c\011d`), "/a b/c\td"; got != want {
		t.Errorf("unescapeMount = %q, want %q", got, want)
	}
}

func TestPidRuns(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if !pidRuns(os.Getpid(), exe) {
		t.Error("pidRuns(self, own executable) = false")
	}
	if pidRuns(os.Getpid(), "/bin/true") {
		t.Error("pidRuns(self, /bin/true) = true; a pid file must not match another program")
	}
}
