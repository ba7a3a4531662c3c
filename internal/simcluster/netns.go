package simcluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Subnet is the simulated nodes' network: the host side of the veth pair
// is .1, nodes and pods get addresses from .2 on. It lies outside the local
// cluster's (e2e/cluster) networks, so that both can run at once.
const (
	subnetPrefix = "10.78.0."
	hostAddr     = subnetPrefix + "1"
	maxAddrs     = 60
)

// netns is a network namespace with one veth pair into the host's, and a
// pool of addresses on its side.
type netns struct {
	name, hostIf string
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
	removeStale()
	steps := [][]string{
		{"netns", "add", n.name},
		{"link", "add", n.hostIf, "type", "veth", "peer", "name", "eth0", "netns", n.name},
		{"addr", "add", hostAddr + "/24", "dev", n.hostIf},
		{"link", "set", n.hostIf, "up"},
		{"-n", n.name, "link", "set", "lo", "up"},
		{"-n", n.name, "link", "set", "eth0", "up"},
	}
	for i := 2; i < 2+maxAddrs; i++ {
		a := subnetPrefix + fmt.Sprint(i)
		steps = append(steps, []string{"-n", n.name, "addr", "add", a + "/24", "dev", "eth0"})
		n.free = append(n.free, a)
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			n.close()
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return n, nil
}

// take returns a free address of the pool.
func (n *netns) take() (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.free) == 0 {
		return "", fmt.Errorf("simulated nodes: all %d addresses of %s0/24 are taken", maxAddrs, subnetPrefix)
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
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
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
		if pid, err := strconv.Atoi(id); err == nil && pid == os.Getpid()%100000 {
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
