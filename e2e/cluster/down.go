package cluster

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Down takes the cluster in opts.StateDir down and removes what Up made:
// the addons (StartAddon), the kubelets, the pods' containers and tasks (through each node's
// containerd), the containerds and any shim or container process left in
// a node's cgroups, the control plane and the host services; every mount
// under the state folder, deepest first; the node namespaces (and with them
// the kubelets' firewall rules, the pod bridges and the pod veths), the
// host veths, the bridge and the host routes; the per-node cgroup trees;
// the kubelet's log symlinks and CNI cache entries that point at this
// cluster; and the host folders Up found missing, if they are empty. It
// keeps the certificates, the built images and helper, and the logs.
//
// It never touches what it did not create: processes are matched by pid
// file and executable, and the network and cgroups are removed only when
// this state folder owns them. Down of a cluster that is not up does
// nothing and returns nil.
func Down(opts Options) error {
	opts = opts.withDefaults()
	l := layout{dir: opts.StateDir}
	if _, err := os.Stat(l.dir); err != nil {
		return nil
	}
	unlock, err := lock(context.Background())
	if err != nil {
		return err
	}
	defer unlock()
	return downLocked(l, &progress{w: opts.Log, start: time.Now()}, opts.BinDir)
}

// leftovers reports whether an earlier cluster in l left pid files or the
// network behind without its record (a down that failed half way).
func leftovers(l layout) bool {
	if owner() == l.dir {
		return true
	}
	pids, _ := filepath.Glob(l.path("run", "*.pid"))
	return len(pids) > 0
}

// downLocked does Down's work under the lock. bin is the binaries folder
// to use if the cluster's record is gone.
func downLocked(l layout, p *progress, fallbackBin string) error {
	rec, _ := readRecord(l)
	bin := rec.BinDir
	if bin == "" {
		bin = fallbackBin
	}
	var errs []error
	note := func(es ...error) {
		for _, e := range es {
			if e != nil {
				errs = append(errs, e)
			}
		}
	}

	note(stopAddons(l))
	for i := 1; i <= maxNodes; i++ {
		note(stop(l, compKubeProxy(i), 10*time.Second), stop(l, compKubelet(i), 10*time.Second))
	}
	for i := 1; i <= maxNodes; i++ {
		n := l.node(i)
		if rec.runtimeOf(i) == RuntimeCRIO {
			if _, ok := running(l, compCRIO(i)); ok {
				if k := removeCRIOPods(n.crioSock()); k > 0 {
					p.say("%s: removed %d pod sandboxes", NodeName(i), k)
				}
			}
			note(stop(l, compCRIO(i), 10*time.Second))
			note(killLeftovers(bin, l, i)...)
			continue
		}
		var ids []string
		if _, ok := running(l, compContainerd(i)); ok && bin != "" {
			ids = removeContainers(bin, n)
			if len(ids) > 0 {
				p.say("%s: removed %d containers", NodeName(i), len(ids))
			}
		}
		note(stop(l, compContainerd(i), 10*time.Second))
		note(killLeftovers(bin, l, i)...)
		removeShimSockets(n, ids)
	}
	for _, comp := range []string{compKCM, compScheduler, compAPIServer, compEtcd, compHost} {
		note(stop(l, comp, 10*time.Second))
	}
	p.say("processes stopped")

	note(unmountAll(l.dir)...)
	if owner() == l.dir {
		hostErrs := teardownNetwork()
		for i := 1; i <= maxNodes; i++ {
			hostErrs = append(hostErrs, removeCgroupsRetry(i)...)
		}
		if len(hostErrs) == 0 {
			// The hugetlb hierarchy a CRI-O cluster mounted goes once the
			// nodes' cgroups in it are gone.
			if err := unmountHugetlb(l); err != nil {
				hostErrs = append(hostErrs, err)
			}
		}
		note(hostErrs...)
		if len(hostErrs) == 0 {
			// Only now: while anything is left, this cluster still owns it,
			// and the next down retries.
			if err := os.Remove(ownerFile); err != nil && !errors.Is(err, os.ErrNotExist) {
				note(err)
			}
			p.say("network, namespaces and cgroups removed")
		}
	}
	note(cleanHostPaths(l)...)
	note(wipeRuntime(l))
	if len(errs) > 0 {
		// The record stays, so that the next down or up tries again.
		return fmt.Errorf("cluster down left something behind: %w", errors.Join(errs...))
	}
	for _, f := range []string{l.record(), l.path("run", "created-host-paths")} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	p.say("cluster down (state kept in %s: certificates, images, logs)", l.dir)
	return nil
}

// removeContainers kills every task and removes every container in every
// namespace of a node's containerd, and returns them as "namespace/id".
func removeContainers(bin string, n nodeLayout) []string {
	ctr := func(args ...string) ([]string, bool) {
		// stdout only: ctr warns about cgroup v1 on stderr.
		out, err := exec.Command(filepath.Join(bin, "containerd", "ctr"), append([]string{"-a", n.containerdSock(), "--timeout", "10s"}, args...)...).Output()
		return strings.Fields(string(out)), err == nil
	}
	var removed []string
	namespaces, _ := ctr("namespaces", "ls", "-q")
	for _, ns := range namespaces {
		tasks, _ := ctr("-n", ns, "tasks", "ls", "-q")
		for _, t := range tasks {
			ctr("-n", ns, "tasks", "kill", "-a", "-s", "SIGKILL", t)
		}
		for _, t := range tasks {
			ctr("-n", ns, "tasks", "delete", "-f", t)
		}
		containers, _ := ctr("-n", ns, "containers", "ls", "-q")
		for _, c := range containers {
			if _, ok := ctr("-n", ns, "containers", "delete", c); ok {
				removed = append(removed, ns+"/"+c)
			}
		}
	}
	return removed
}

// removeCRIOPods stops and removes every pod sandbox (and with them their
// containers) of the CRI-O at sock, and returns how many it removed.
func removeCRIOPods(sock string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0
	}
	defer conn.Close()
	rt := cri.NewRuntimeServiceClient(conn)
	l, err := rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return 0
	}
	removed := 0
	for _, sb := range l.Items {
		rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: sb.Id}) //nolint:errcheck // the removal says whether it went
		if _, err := rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err == nil {
			removed++
		}
	}
	return removed
}

// removeShimSockets removes the sockets of the shims that served the
// given containers, if the shims left them behind. containerd puts them
// all in /run/containerd/s, named by a hash of its own socket's path, the
// namespace and the shim's id, so they can be told apart from those of any
// other containerd on the machine.
func removeShimSockets(n nodeLayout, ids []string) {
	for _, id := range ids {
		base := filepath.Join(n.containerdSock(), id)
		for _, p := range []string{base, filepath.Join(base, "debug")} {
			sock := filepath.Join("/run/containerd/s", fmt.Sprintf("%x", sha256.Sum256([]byte(p))))
			if st, err := os.Lstat(sock); err == nil && st.Mode()&os.ModeSocket != 0 {
				os.Remove(sock)
			}
		}
	}
}

// killLeftovers kills what may outlive node i's containerd: shims started
// for its socket, and any process in its cgroup tree.
func killLeftovers(bin string, l layout, i int) []error {
	sock := l.node(i).containerdSock()
	shim := filepath.Join(bin, "containerd", "containerd-shim-runc-v2")
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || bin == "" || !pidRuns(pid, shim) {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		for _, arg := range strings.Split(string(cmdline), "\x00") {
			if arg == sock {
				pids = append(pids, pid)
			}
		}
	}
	if owner() == l.dir {
		pids = append(pids, cgroupProcs(i)...)
	}
	var errs []error
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("kill leftover pid %d of %s: %w", pid, NodeName(i), err))
		}
	}
	for _, pid := range pids {
		waitGone(pid, 5*time.Second)
	}
	return errs
}

// removeCgroupsRetry removes node i's cgroups, retrying for a few seconds
// while the last processes in them finish exiting.
func removeCgroupsRetry(i int) []error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		errs := removeCgroups(i)
		if len(errs) == 0 || time.Now().After(deadline) {
			return errs
		}
		time.Sleep(100 * time.Millisecond)
	}
}
