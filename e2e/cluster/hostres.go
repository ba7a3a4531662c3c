package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// Host resources: the bridge, the node namespaces and veths, the routes to
// the pod subnets, the per-node cgroup roots, and the few host folders that
// containerd and the kubelet insist on. Each is made only if missing and
// removed only by the cluster that owns the network (see ownerFile).

// ownerFile names the state folder of the cluster that owns the bridge and
// the node namespaces. It lives in /run, so a reboot, which removes all of
// them, removes it too.
const ownerFile = "/run/ms2m-cluster.owner"

// hostPaths are host folders that some component creates when it is
// missing. Up records those that were missing before it ran, and Down
// removes them again if they are empty by then.
var hostPaths = []string{
	"/run/netns",          // ip netns add
	"/run/containerd",     // containerd: shim sockets and fifos, always here
	"/var/log/containers", // kubelet: symlinks to container logs, always here
	"/var/lib/cni",        // CNI's result cache
	"/var/lib/kubelet",    // kubelet: device-plugins/kubelet.sock, always here
	"/run/mount",          // libmount's lock folder, when the kubelet mounts
}

// owner returns the state folder of the cluster that owns the network, or
// "" if none does.
func owner() string {
	b, err := os.ReadFile(ownerFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// ErrNetworkInUse means another cluster (another state folder) owns the
// bridge and the node namespaces.
var ErrNetworkInUse = errors.New("the cluster network is in use")

// claimNetwork makes l's cluster the owner, or says who is.
func claimNetwork(l layout) error {
	switch o := owner(); {
	case o == l.dir:
		return nil
	case o != "":
		return fmt.Errorf("%w: another ms2m cluster owns bridge %s and the ms2m-node-* namespaces, with its state in %s; "+
			"use it (-state %s), or take it down first: go run ./hack/cluster down -state %s", ErrNetworkInUse, BridgeName, o, o, o)
	}
	if linkExists(BridgeName) {
		return fmt.Errorf("bridge %s exists but no ms2m cluster claims it (%s is missing); "+
			"if it is a leftover, delete it with `ip link delete %s` and any ms2m-node-* namespaces with `ip netns delete`", BridgeName, ownerFile, BridgeName)
	}
	for i := 1; i <= maxNodes; i++ {
		if _, err := os.Stat(netnsPath(i)); err == nil {
			return fmt.Errorf("network namespace %s exists but no ms2m cluster claims it; if it is a leftover, delete it with `ip netns delete %s`", NodeName(i), NodeName(i))
		}
	}
	return os.WriteFile(ownerFile, []byte(l.dir+"\n"), 0o644)
}

func linkExists(name string) bool {
	_, err := os.Stat("/sys/class/net/" + name)
	return err == nil
}

// recordHostPaths notes which of hostPaths are missing now; it keeps an
// earlier record, so an `up` after a partial one does not forget.
func recordHostPaths(l layout) error {
	f := l.path("run", "created-host-paths")
	if _, err := os.Stat(f); err == nil {
		return nil
	}
	var missing []string
	for _, p := range hostPaths {
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			missing = append(missing, p)
		}
	}
	return os.WriteFile(f, []byte(strings.Join(missing, "\n")), 0o644)
}

// setupNetwork makes the bridge with the host's address, and for each node
// a namespace whose eth0 is a veth into the bridge, with loopback up, IP
// forwarding on inside it only, and routes to the other nodes' pod subnets;
// the host gets a route to every pod subnet through its node. There is no
// default route in a node: everything a node or pod may talk to is on the
// bridge or in a pod subnet, so anything else fails at once instead of
// leaving the machine.
func setupNetwork(nodes int) error {
	hostCIDR := fmt.Sprintf("%s/%d", HostIP, HostPrefix)
	if !linkExists(BridgeName) {
		if _, err := run("ip", "link", "add", BridgeName, "type", "bridge"); err != nil {
			return err
		}
	}
	steps := [][]string{
		{"ip", "addr", "replace", hostCIDR, "dev", BridgeName},
		{"ip", "link", "set", BridgeName, "up"},
	}
	for i := 1; i <= nodes; i++ {
		ns := NodeName(i)
		if _, err := os.Stat(netnsPath(i)); err != nil {
			steps = append(steps, []string{"ip", "netns", "add", ns})
		}
		if !linkExists(hostVeth(i)) {
			steps = append(steps, []string{"ip", "link", "add", hostVeth(i), "type", "veth", "peer", "name", "eth0", "netns", ns})
		}
		steps = append(steps,
			[]string{"ip", "link", "set", hostVeth(i), "master", BridgeName, "up"},
			[]string{"ip", "-n", ns, "addr", "replace", fmt.Sprintf("%s/%d", NodeIP(i), HostPrefix), "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
			[]string{"nsenter", "--net=" + netnsPath(i), "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"},
			[]string{"ip", "route", "replace", PodCIDR(i), "via", NodeIP(i), "dev", BridgeName},
		)
		for j := 1; j <= nodes; j++ {
			if j != i {
				steps = append(steps, []string{"ip", "-n", ns, "route", "replace", PodCIDR(j), "via", NodeIP(j), "dev", "eth0"})
			}
		}
	}
	for _, s := range steps {
		if _, err := run(s[0], s[1:]...); err != nil {
			return fmt.Errorf("network setup: %w", err)
		}
	}
	return nil
}

// teardownNetwork removes the node namespaces (and with them the kubelets'
// firewall rules and the pod bridges), the veths, the host routes and the
// bridge. It never fails on something already gone.
func teardownNetwork() []error {
	var errs []error
	for i := 1; i <= maxNodes; i++ {
		if _, err := os.Stat(netnsPath(i)); err == nil {
			if _, err := run("ip", "netns", "delete", NodeName(i)); err != nil {
				errs = append(errs, err)
			}
		}
		// The veth usually goes with the namespace, but the kernel may take
		// a moment to remove it.
		if linkExists(hostVeth(i)) {
			if _, err := run("ip", "link", "delete", hostVeth(i)); err != nil && linkExists(hostVeth(i)) {
				errs = append(errs, err)
			}
		}
		if linkExists(BridgeName) {
			run("ip", "route", "delete", PodCIDR(i), "via", NodeIP(i), "dev", BridgeName) //nolint:errcheck // gone with the bridge anyway
		}
	}
	if linkExists(BridgeName) {
		if _, err := run("ip", "link", "delete", BridgeName); err != nil && linkExists(BridgeName) {
			errs = append(errs, err)
		}
	}
	return errs
}

// cgroupMounts lists the mount points of every cgroup hierarchy (v1 and
// v2), from /proc/self/mountinfo.
func cgroupMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		for k, v := range fields {
			if v == "-" && k+1 < len(fields) && (fields[k+1] == "cgroup" || fields[k+1] == "cgroup2") {
				out = append(out, unescapeMount(fields[4]))
			}
		}
	}
	return out, s.Err()
}

// hugetlbMount is where Up mounts cgroup v1's hugetlb hierarchy for CRI-O
// nodes, when the kernel has the controller and nothing mounted it (as
// here). CRI-O sets the hugepage limits the kubelet sends (0 for every
// page size the kernel has) whenever /proc/cgroups lists the controller,
// and runc fails every container without the hierarchy: "cannot set
// hugetlb limit: container could not join or create cgroup". containerd
// leaves the limits out then.
const hugetlbMount = "/sys/fs/cgroup/hugetlb"

// hugetlbRecord is the file that says this cluster mounted hugetlbMount.
func hugetlbRecord(l layout) string { return l.path("run", "mounted-hugetlb") }

// mountHugetlb mounts the hugetlb hierarchy at hugetlbMount if the kernel
// has the controller enabled, cgroups are v1 and no mounted hierarchy has
// it, and records that it did. Whether one is mounted comes from the
// mount table: /proc/cgroups keeps a hierarchy's number for a while after
// its last unmount.
func mountHugetlb(l layout) error {
	b, err := os.ReadFile("/proc/cgroups")
	if err != nil {
		return err
	}
	enabled := false
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "hugetlb" {
			enabled = f[3] == "1"
		}
	}
	var st syscall.Statfs_t
	if !enabled || syscall.Statfs("/sys/fs/cgroup", &st) != nil || st.Type == 0x63677270 { // CGROUP2_SUPER_MAGIC
		return nil
	}
	mounted, err := hugetlbMounted()
	if err != nil || mounted {
		return err
	}
	if err := os.MkdirAll(hugetlbMount, 0o755); err != nil {
		return fmt.Errorf("mount the hugetlb cgroup for CRI-O: %w", err)
	}
	if err := syscall.Mount("cgroup", hugetlbMount, "cgroup", 0, "hugetlb"); err != nil {
		return fmt.Errorf("mount the hugetlb cgroup at %s for CRI-O: %w", hugetlbMount, err)
	}
	return os.WriteFile(hugetlbRecord(l), []byte(hugetlbMount+"\n"), 0o644)
}

// hugetlbMounted says whether a cgroup v1 hierarchy with the hugetlb
// controller is mounted (its super options name it).
func hugetlbMounted() (bool, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		_, after, ok := strings.Cut(line, " - ")
		if f := strings.Fields(after); ok && len(f) >= 3 && f[0] == "cgroup" && slices.Contains(strings.Split(f[2], ","), "hugetlb") {
			return true, nil
		}
	}
	return false, nil
}

// unmountHugetlb undoes mountHugetlb, once the nodes' cgroups are gone.
func unmountHugetlb(l layout) error {
	if _, err := os.Stat(hugetlbRecord(l)); err != nil {
		return nil
	}
	if err := syscall.Unmount(hugetlbMount, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("unmount %s: %w", hugetlbMount, err)
	}
	if err := os.Remove(hugetlbMount); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.Remove(hugetlbRecord(l))
}

// setupCgroups makes node i's cgroup root in every hierarchy; the kubelet
// refuses a cgroupRoot that is missing. A new cpuset starts with no CPUs
// and no memory nodes, so it gets its parent's.
func setupCgroups(nodes int) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	for i := 1; i <= nodes; i++ {
		for _, m := range mounts {
			dir := filepath.Join(m, cgroupRoot(i))
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("cgroup root %s: %w", dir, err)
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				parent, err := os.ReadFile(filepath.Join(m, f))
				if err != nil {
					continue // not the cpuset hierarchy
				}
				if cur, _ := os.ReadFile(filepath.Join(dir, f)); len(strings.TrimSpace(string(cur))) > 0 {
					continue
				}
				if err := os.WriteFile(filepath.Join(dir, f), parent, 0o644); err != nil {
					return fmt.Errorf("cgroup %s/%s: %w", dir, f, err)
				}
			}
		}
	}
	return nil
}

// cgroupProcs returns the pids in node i's cgroup tree (any hierarchy),
// that is every process the node's containers run.
func cgroupProcs(i int) []int {
	mounts, _ := cgroupMounts()
	seen := map[int]bool{}
	var pids []int
	for _, m := range mounts {
		root := filepath.Join(m, cgroupRoot(i))
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error { //nolint:errcheck // best effort
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// removeCgroups removes node i's cgroup tree in every hierarchy, deepest
// first. A cgroup that still has processes cannot be removed; that is an
// error.
func removeCgroups(i int) []error {
	mounts, err := cgroupMounts()
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, m := range mounts {
		root := filepath.Join(m, cgroupRoot(i))
		var dirs []string
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error { //nolint:errcheck // best effort
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(a, b int) bool { return len(dirs[a]) > len(dirs[b]) })
		for _, d := range dirs {
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
			}
		}
	}
	return errs
}

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	majMin string // device
	root   string // the mounted path inside the device's filesystem
	point  string // where it is mounted
}

func readMountinfo() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		out = append(out, mountEntry{majMin: fields[2], root: unescapeMount(fields[3]), point: unescapeMount(fields[4])})
	}
	return out, s.Err()
}

// mountsOf lists, deepest first, the mount points at or below dir, and the
// mount points elsewhere that bind something from inside dir. The latter
// happen: containerd 2.2 mounts a checkpoint image's snapshot on a
// temporary folder to restore from it and leaves it mounted when the
// restore fails after that (2.3.7 unmounts it on every path).
func mountsOf(dir string) ([]string, error) {
	ms, err := readMountinfo()
	if err != nil {
		return nil, err
	}
	// The filesystem dir is on, and dir's path inside it.
	var home mountEntry
	for _, m := range ms {
		if (dir == m.point || strings.HasPrefix(dir, strings.TrimSuffix(m.point, "/")+"/")) && len(m.point) >= len(home.point) {
			home = m
		}
	}
	inner := filepath.Join(home.root, strings.TrimPrefix(dir, home.point))
	var out []string
	for _, m := range ms {
		under := m.point == dir || strings.HasPrefix(m.point, dir+"/")
		from := home.majMin != "" && m.majMin == home.majMin && m.point != home.point &&
			(m.root == inner || strings.HasPrefix(m.root, inner+"/"))
		if under || from {
			out = append(out, m.point)
		}
	}
	sort.SliceStable(out, func(a, b int) bool {
		return strings.Count(out[a], "/") > strings.Count(out[b], "/")
	})
	return out, nil
}

// unmountAll unmounts everything mountsOf(dir) finds, deepest first, each
// as often as it is stacked; what stays busy is detached lazily. An empty
// folder that something from dir was mounted on outside dir is removed.
func unmountAll(dir string) []error {
	var errs []error
	for range 8 {
		mps, err := mountsOf(dir)
		if err != nil {
			return []error{err}
		}
		if len(mps) == 0 {
			return errs
		}
		for _, mp := range mps {
			if err := syscall.Unmount(mp, 0); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
					errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
				}
			}
			if mp != dir && !strings.HasPrefix(mp, dir+"/") {
				_ = syscall.Rmdir(mp) // only if empty
			}
		}
	}
	mps, _ := mountsOf(dir)
	for _, mp := range mps {
		errs = append(errs, fmt.Errorf("still mounted after 8 rounds: %s", mp))
	}
	return errs
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// cleanHostPaths undoes what components left in host folders: the
// kubelet's log symlinks that point into the state folder, CNI cache
// entries of the nodes' networks, and then each folder Up found missing,
// if it is empty now (with empty subfolders).
func cleanHostPaths(l layout) []error {
	var errs []error
	if ents, err := os.ReadDir("/var/log/containers"); err == nil {
		for _, e := range ents {
			p := filepath.Join("/var/log/containers", e.Name())
			if t, err := os.Readlink(p); err == nil && strings.HasPrefix(t, l.dir+"/") {
				if err := os.Remove(p); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	// Result cache entries are named <network>-<sandbox id>-<interface>;
	// containerd also caches its loopback network, "cni-loopback", per
	// sandbox.
	results := "/var/lib/cni/results"
	if ents, err := os.ReadDir(results); err == nil {
		for _, e := range ents {
			name := e.Name()
			if !strings.HasPrefix(name, "ms2m-node-") || !strings.HasSuffix(name, "-eth0") {
				continue
			}
			rest := strings.TrimPrefix(name, "ms2m-node-")
			if _, id, ok := strings.Cut(strings.TrimSuffix(rest, "-eth0"), "-"); ok {
				os.Remove(filepath.Join(results, "cni-loopback-"+id+"-lo"))
			}
			os.Remove(filepath.Join(results, name))
		}
	}
	b, err := os.ReadFile(l.path("run", "created-host-paths"))
	if err != nil {
		return errs
	}
	for _, p := range strings.Fields(string(b)) {
		if p == "/var/lib/kubelet" {
			// The device-plugin socket of whichever kubelet started last.
			if isSocket(devicePluginSocket) {
				os.Remove(devicePluginSocket)
			}
		}
		if p == "/run/netns" {
			// ip netns makes /run/netns a mount point of its own.
			if ents, err := os.ReadDir(p); err == nil && len(ents) == 0 {
				_ = syscall.Unmount(p, syscall.MNT_DETACH) // best effort, like the removal below
			}
		}
		removeEmptyTree(p)
	}
	return errs
}

// removeEmptyTree removes dir if it holds nothing but empty folders.
func removeEmptyTree(dir string) {
	var dirs []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error { //nolint:errcheck // best effort
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	sort.Slice(dirs, func(a, b int) bool { return len(dirs[a]) > len(dirs[b]) })
	for _, d := range dirs {
		_ = syscall.Rmdir(d) // fails, as it should, on a folder that is not empty
	}
}
