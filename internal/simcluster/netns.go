package simcluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The simulated nodes' network is one /24 of 10.78.0.0/16 per cluster: the
// host side of the veth pair is .1, nodes and pods get addresses from .2
// on. Each cluster claims a /24 that no other route of the host's
// namespace covers, so that clusters of test processes running at once
// (two packages, or two checkouts on one machine) never share a subnet:
// with two routes to one /24, the API server's proxy reaches the other
// cluster's kubelet, which knows none of this cluster's pods. 10.78.0.0/16
// lies outside the local cluster's (e2e/cluster) networks, so that both
// can run at once.
const (
	subnetBase = "10.78."
	maxAddrs   = 200 // pods of a test package's whole run, also those of namespaces still going away
	// subnetLock serializes the claims of the processes of one machine.
	subnetLock = "ms2m-simcluster-subnet.lock"
)

// netns is a network namespace with one veth pair into the host's, and a
// pool of addresses on its side.
type netns struct {
	name, hostIf string
	owner        *os.File // ownerLock(name), held while the namespace lives
	prefix       string   // "10.78.N.", the subnet's first three octets
	mu           sync.Mutex
	free         []string
}

// newNetns creates the namespace and the pair, and puts every pool address
// on the namespace's side. The caller deletes it with close.
func newNetns() (*netns, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("simulated nodes need root (a network namespace with a veth pair)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("simulated nodes need iproute2's ip: apt-get install iproute2 (make node-setup installs it)")
	}
	id := fmt.Sprintf("%d", os.Getpid()%100000)
	n := &netns{name: "ms2m-sim-" + id, hostIf: "ms2msim" + id}
	unlock, err := lockSubnets()
	if err != nil {
		return nil, err
	}
	defer unlock()
	removeStale()
	if n.owner, err = holdOwner(n.name); err != nil {
		return nil, err
	}
	if n.prefix, err = freeSubnet(); err != nil {
		n.owner.Close()
		return nil, err
	}
	hostAddr := n.prefix + "1"
	steps := [][]string{
		{"netns", "add", n.name},
		{"link", "add", n.hostIf, "type", "veth", "peer", "name", "eth0", "netns", n.name},
		{"addr", "add", hostAddr + "/24", "dev", n.hostIf},
		{"link", "set", n.hostIf, "up"},
		{"-n", n.name, "link", "set", "lo", "up"},
		{"-n", n.name, "link", "set", "eth0", "up"},
	}
	var batch strings.Builder // the pods' addresses, in one ip run
	for i := 2; i < 2+maxAddrs; i++ {
		a := n.prefix + fmt.Sprint(i)
		fmt.Fprintf(&batch, "addr add %s/24 dev eth0\n", a)
		n.free = append(n.free, a)
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			_ = n.close() // best effort: the failed step is what to report
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out)))
		}
	}
	cmd := exec.Command("ip", "-n", n.name, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = n.close()
		return nil, fmt.Errorf("ip -n %s -batch (the pods' %d addresses): %v: %s", n.name, maxAddrs, err, strings.TrimSpace(string(out)))
	}
	return n, nil
}

// lockSubnets takes the machine-wide lock under which a cluster picks its
// subnet and routes it, and returns its release.
func lockSubnets() (func(), error) {
	path := filepath.Join(os.TempDir(), subnetLock)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the simulated clusters' subnet lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil // closing the file releases the lock
}

// freeSubnet returns the first "10.78.N." whose /24 holds no route of this
// network namespace (the API server's, which proxies to the nodes).
func freeSubnet() (string, error) {
	out, err := exec.Command("ip", "-4", "route", "show", "table", "all").Output()
	if err != nil {
		return "", fmt.Errorf("ip -4 route show table all: %w", err)
	}
	return pickSubnet(routed(string(out)))
}

// routed reads the destinations out of `ip -4 route show` lines.
func routed(out string) []*net.IPNet {
	var taken []*net.IPNet
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		// A route starts with its destination, or with its type (local,
		// broadcast, unreachable...) and then its destination.
		dst := f[0]
		if dst != "default" && dst[0] >= 'a' && dst[0] <= 'z' && len(f) > 1 {
			dst = f[1]
		}
		if !strings.Contains(dst, "/") {
			dst += "/32"
		}
		if _, nw, err := net.ParseCIDR(dst); err == nil {
			taken = append(taken, nw)
		}
	}
	return taken
}

// pickSubnet returns the first "10.78.N." whose /24 holds no route of
// taken. A broader route (10.0.0.0/8, the default route) does not count: the
// cluster's /24 is more specific and takes the traffic to its addresses.
func pickSubnet(taken []*net.IPNet) (string, error) {
	for i := 0; i < 256; i++ {
		prefix := subnetBase + strconv.Itoa(i) + "."
		_, cand, _ := net.ParseCIDR(prefix + "0/24")
		free := true
		for _, t := range taken {
			if ones, _ := t.Mask.Size(); ones < 24 {
				continue
			}
			if cand.Contains(t.IP) {
				free = false
				break
			}
		}
		if free {
			return prefix, nil
		}
	}
	return "", fmt.Errorf("simulated nodes: every /24 of %s0.0/16 is routed already: take down the stale ms2m-sim-* network namespaces (ip netns list)", subnetBase)
}

// take returns a free address of the pool.
func (n *netns) take() (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.free) == 0 {
		return "", fmt.Errorf("simulated nodes: all %d addresses of %s0/24 are taken", maxAddrs, n.prefix)
	}
	a := n.free[0]
	n.free = n.free[1:]
	return a, nil
}

// give returns an address to the pool.
func (n *netns) give(a string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.free = append(n.free, a)
}

// listen opens a TCP listener on addr inside the namespace. Only the
// listening socket lives there: connections are accepted and served from
// any goroutine, and dials out of this process stay in the host's namespace.
func (n *netns) listen(addr string) (net.Listener, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open this thread's network namespace: %w", err)
	}
	defer unix.Close(self)
	target, err := unix.Open("/run/netns/"+n.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", n.name, err)
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("enter network namespace %s: %w", n.name, err)
	}
	ln, lerr := net.Listen("tcp", addr)
	if err := unix.Setns(self, unix.CLONE_NEWNET); err != nil {
		// This thread is in the wrong namespace now: it must never run
		// anything else, so it is left locked and dies with its goroutine.
		runtime.LockOSThread()
		if ln != nil {
			ln.Close()
		}
		return nil, fmt.Errorf("leave network namespace %s: %w", n.name, err)
	}
	if lerr != nil {
		return nil, fmt.Errorf("listen on %s in network namespace %s: %w", addr, n.name, lerr)
	}
	return ln, nil
}

func (n *netns) close() error {
	var errs []string
	if out, err := exec.Command("ip", "link", "del", n.hostIf).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find") {
		errs = append(errs, fmt.Sprintf("ip link del %s: %s", n.hostIf, strings.TrimSpace(string(out))))
	}
	if out, err := exec.Command("ip", "netns", "del", n.name).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
		errs = append(errs, fmt.Sprintf("ip netns del %s: %s", n.name, strings.TrimSpace(string(out))))
	}
	if n.owner != nil {
		os.Remove(n.owner.Name())
		n.owner.Close()
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// ownerLock is the file that the process that made namespace name keeps
// locked (flock) while it lives: whatever the process is (a test binary,
// the soak), a namespace whose lock nobody holds is stale.
func ownerLock(name string) string { return filepath.Join(os.TempDir(), name+".owner.lock") }

func holdOwner(name string) (*os.File, error) {
	f, err := os.OpenFile(ownerLock(name), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("the simulated nodes' owner lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return f, nil
}

// ownerAlive says whether namespace name's owner lock is held by a live
// process; known is false for a namespace without one (made by an older
// build), which processAlive judges instead.
func ownerAlive(name string) (alive, known bool) {
	f, err := os.OpenFile(ownerLock(name), os.O_RDWR, 0)
	if err != nil {
		return false, false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return true, true
	}
	os.Remove(f.Name())
	return false, true
}

// removeStale takes down the namespaces (and their host veths) of earlier
// runs whose process is gone: a test binary killed by its timeout cannot
// clean up, and a second route into the subnet would take the traffic.
func removeStale() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "ms2m-sim-") {
			continue
		}
		id := strings.TrimPrefix(f[0], "ms2m-sim-")
		if alive, known := ownerAlive(f[0]); known {
			if alive {
				continue
			}
		} else if pid, err := strconv.Atoi(id); err == nil && pid == os.Getpid()%100000 {
			// This PID's, from a run that died: ours now.
		} else if err == nil && processAlive(pid) {
			continue
		}
		_ = exec.Command("ip", "link", "del", "ms2msim"+id).Run()
		_ = exec.Command("ip", "netns", "del", f[0]).Run()
	}
}

// processAlive reports whether a process with pid (or, as the names keep
// it, pid modulo 100000) runs a test binary.
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), ".test")
}
