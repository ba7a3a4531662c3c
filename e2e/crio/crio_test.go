package crio

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/internal/ociimage"
)

func repoBin(t *testing.T) string {
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "bin")
}

func TestCheckpointAndRestoreOnCRIO(t *testing.T) {
	if os.Getenv("MS2M_E2E_CRIO") != "1" && os.Getenv("CI") != "true" {
		t.Skip("CRI-O runs with MS2M_E2E_CRIO=1 (or CI=true, as in make test, which builds it) after make crio-bin")
	}
	bin := repoBin(t)
	for _, f := range []string{filepath.Join(bin, "crio", "crio"), filepath.Join(bin, "crio", "pinns"), filepath.Join(bin, "criu", "criu"), "/usr/bin/conmon", "/usr/sbin/runc"} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("CRI-O's test runs, but %v (make crio-bin criu node-setup)", err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cgroup := "/ms2m-crio-test-" + filepath.Base(dir)
	t.Cleanup(func() { removeCgroups(t, cgroup); unmountUnder(t, dir) })

	reg, err := ociimage.ServeRegistry("127.0.0.1:0", filepath.Join(dir, "registry"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	pauseBin := filepath.Join(dir, "pause")
	build := exec.CommandContext(ctx, "go", "build", "-o", pauseBin, "github.com/ms2m/ms2m/hack/pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build pause: %v\n%s", err, out)
	}
	img, err := ociimage.App(ociimage.AppOptions{Binaries: []string{pauseBin}, User: "0:0"})
	if err != nil {
		t.Fatal(err)
	}
	pause := reg.Addr() + "/pause:3.10"
	if err := ociimage.Push(ctx, img, pause, ociimage.PushOptions{Insecure: true}); err != nil {
		t.Fatal(err)
	}

	home := filepath.Join(dir, "home")
	files := map[string]string{
		filepath.Join(dir, "crio.conf"): cluster.CRIOConfig(cluster.CRIOPaths{Dir: dir, Sock: filepath.Join(dir, "crio.sock"),
			CNIConfDir: filepath.Join(dir, "net.d"), BinDir: bin, PauseImage: pause}),
		filepath.Join(home, ".config", "containers", "policy.json"): cluster.CRIOPolicy,
		filepath.Join(dir, "hosts"):                                 "127.0.0.1 localhost\n",
		filepath.Join(dir, "net.d", ".keep"):                        "",
	}
	for p, s := range files {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	logPath := filepath.Join(dir, "crio.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	crio := exec.Command(filepath.Join(bin, "crio", "crio"), "--config", filepath.Join(dir, "crio.conf"),
		"--pause-image", pause, "--insecure-registry", reg.Addr(), "--log-level", "info")
	crio.Stdout, crio.Stderr = logf, logf
	crio.Env = append(os.Environ(), "HOME="+home, "PATH="+filepath.Join(bin, "criu")+":"+os.Getenv("PATH"))
	if err := crio.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		crio.Process.Signal(syscall.SIGTERM) //nolint:errcheck // it may have exited
		crio.Wait()                          //nolint:errcheck // its exit status says nothing more
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("crio log:\n%s", lastLines(string(b), 30))
		}
	})
	sock := filepath.Join(dir, "crio.sock")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rt, im := cri.NewRuntimeServiceClient(conn), cri.NewImageServiceClient(conn)
	for {
		if _, err := rt.Version(ctx, &cri.VersionRequest{}); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("crio did not answer on %s", sock)
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Cleanup(func() { removeSandboxes(t, rt) })

	if _, err := im.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: pause}}); err != nil {
		t.Fatalf("pull %s: %v", pause, err)
	}
	src := runContainer(ctx, t, rt, dir, cgroup, "src", pause)
	archive := filepath.Join(dir, "checkpoint.tar")
	start := time.Now()
	if _, err := rt.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: src, Location: archive}); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	t.Logf("checkpoint took %s", time.Since(start).Round(time.Millisecond))
	cimg, err := ociimage.Checkpoint(archive, "c1")
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.Addr() + "/checkpoint:1"
	if err := ociimage.Push(ctx, cimg, ref, ociimage.PushOptions{Insecure: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := im.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}}); err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	start = time.Now()
	dst := runContainer(ctx, t, rt, dir, cgroup, "dst", ref)
	t.Logf("restore (create and start) took %s", time.Since(start).Round(time.Millisecond))
	// CRI-O starts a container afresh when it does not see a checkpoint,
	// so the proof is its own log line for this container.
	b, _ := os.ReadFile(logPath)
	if !strings.Contains(string(b), "Restored container: "+dst) {
		t.Fatalf("crio did not log %q: the container was not restored from %s", "Restored container: "+dst, ref)
	}
}

// runContainer runs a pod sandbox and one container in it, with the
// namespaces the kubelet asks for by default (no shared PID namespace, so
// CRI-O runs no infra container: the infra container's oom_score_adj of
// -998 needs CAP_SYS_RESOURCE, which root lacks here) and the node's
// network namespace (no CNI needed). The /etc/hosts bind mount is there
// because a restore needs the same bind mounts as the checkpointed
// container, and CRI-O adds one for /etc/hosts.
func runContainer(ctx context.Context, t *testing.T, rt cri.RuntimeServiceClient, dir, cgroup, name, image string) string {
	t.Helper()
	ns := &cri.NamespaceOption{Network: cri.NamespaceMode_NODE, Pid: cri.NamespaceMode_CONTAINER}
	psc := &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: name, Namespace: "default", Uid: name + "-uid"},
		LogDirectory: filepath.Join(dir, "logs", name),
		Linux: &cri.LinuxPodSandboxConfig{CgroupParent: cgroup,
			SecurityContext: &cri.LinuxSandboxSecurityContext{NamespaceOptions: ns}},
	}
	if err := os.MkdirAll(psc.LogDirectory, 0o755); err != nil {
		t.Fatal(err)
	}
	sb, err := rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: psc})
	if err != nil {
		t.Fatalf("sandbox %s: %v", name, err)
	}
	cc := &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: "c1"},
		Image:    &cri.ImageSpec{Image: image, UserSpecifiedImage: image},
		LogPath:  "c1.log",
		Mounts:   []*cri.Mount{{ContainerPath: "/etc/hosts", HostPath: filepath.Join(dir, "hosts")}},
		Linux:    &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{NamespaceOptions: ns}},
	}
	c, err := rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, Config: cc, SandboxConfig: psc})
	if err != nil {
		t.Fatalf("create %s from %s: %v", name, image, err)
	}
	if _, err := rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	st, err := rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: c.ContainerId})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status.State != cri.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("%s is %s, not running", name, st.Status.State)
	}
	return c.ContainerId
}

func removeSandboxes(t *testing.T, rt cri.RuntimeServiceClient) {
	// t.Context() has ended by the time cleanups run.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
	defer cancel()
	l, err := rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		t.Errorf("list sandboxes: %v", err)
		return
	}
	for _, sb := range l.Items {
		if _, err := rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			t.Errorf("stop sandbox %s: %v", sb.Id, err)
		}
		if _, err := rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			t.Errorf("remove sandbox %s: %v", sb.Id, err)
		}
	}
}

// removeCgroups removes the test's cgroup in every v1 hierarchy (and the
// v2 tree), deepest first; the sandboxes' removal emptied them.
func removeCgroups(t *testing.T, cgroup string) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*" + cgroup)
	if d := "/sys/fs/cgroup" + cgroup; isDir(d) {
		roots = append(roots, d)
	}
	for _, root := range roots {
		var dirs []string
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error { //nolint:errcheck // best effort
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil {
				t.Errorf("remove cgroup %s: %v", dirs[i], err)
			}
		}
	}
}

// unmountUnder unmounts whatever is still mounted below dir (deepest
// first), so that a failed run leaves no mounts behind for TempDir's
// removal to trip on; after a clean run there are none.
func unmountUnder(t *testing.T, dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Error(err)
		return
	}
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			mounts = append(mounts, f[4])
		}
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := syscall.Unmount(mounts[i], syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mounts[i], err)
		}
	}
	if len(mounts) > 0 {
		t.Errorf("%d mounts were left below %s", len(mounts), dir)
	}
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
