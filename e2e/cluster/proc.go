package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is one long-running component. Its pid file names the pid and
// the executable, so that a stale pid file (after a reboot, say) never gets
// another program killed.
type process struct {
	name  string   // component name: pid file and log file
	bin   string   // absolute path of the executable
	args  []string // arguments after bin
	netns string   // network namespace to start in; "" for the host's
	env   []string // added to a minimal environment
}

// start launches p detached: in a session of its own (setsid), with stdin
// from /dev/null and stdout and stderr appended to its log, inside its
// network namespace through nsenter (not `ip netns exec`, which also makes
// a mount namespace, and CRIU's dumps hang in one). The child is reaped in
// the background if it dies while this process lives.
func start(l layout, p process) (int, error) {
	logf, err := os.OpenFile(l.log(p.name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "\n==== %s: starting %s %s\n", time.Now().Format(time.RFC3339), p.bin, strings.Join(p.args, " "))
	argv := append([]string{p.bin}, p.args...)
	if p.netns != "" {
		argv = append([]string{"nsenter", "--net=/run/netns/" + p.netns, "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(baseEnv(), p.env...)
	cmd.Dir = l.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", p.name, err)
	}
	pid := cmd.Process.Pid
	exited := make(chan struct{})
	go func() {
		cmd.Wait() //nolint:errcheck // reaps the child; its exit is seen through the pid file
		close(exited)
	}()
	if p.netns != "" {
		// Until nsenter has exec'd the component, the pid runs nsenter,
		// and running() would call the component dead.
		deadline := time.After(5 * time.Second)
	wait:
		for !pidRuns(pid, p.bin) {
			select {
			case <-exited:
				break wait
			case <-deadline:
				break wait
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	if err := os.WriteFile(l.pid(p.name), []byte(fmt.Sprintf("%d %s\n", pid, p.bin)), 0o644); err != nil {
		cmd.Process.Kill()
		return 0, err
	}
	return pid, nil
}

// baseEnv is the environment every component starts with: a fixed PATH
// (the node components add CRIU's and containerd's folders in front) and
// nothing of the caller's, so a developer's proxy or kubeconfig settings
// never leak into the cluster.
func baseEnv() []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}
}

// running returns the pid of component name if its pid file names a live
// process that still runs the recorded executable.
func running(l layout, name string) (int, bool) {
	b, err := os.ReadFile(l.pid(name))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, false
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil || pid <= 1 {
		return 0, false
	}
	return pid, pidRuns(pid, f[1])
}

// pidRuns reports whether pid is alive (not a zombie) and runs bin.
func pidRuns(pid int, bin string) bool {
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return false
	}
	exe = strings.TrimSuffix(exe, " (deleted)")
	if rb, err := filepath.EvalSymlinks(bin); err == nil {
		bin = rb
	}
	if exe != bin {
		return false
	}
	return !isZombie(pid)
}

func isZombie(pid int) bool {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the command name, which is in parentheses and may
	// itself contain spaces or parentheses.
	i := bytes.LastIndexByte(st, ')')
	if i < 0 || i+2 >= len(st) {
		return true
	}
	return st[i+2] == 'Z'
}

// stop ends component name, if it runs: SIGTERM, then SIGKILL after grace.
// It removes the pid file.
func stop(l layout, name string, grace time.Duration) error {
	pid, ok := running(l, name)
	defer os.Remove(l.pid(name))
	if !ok {
		return nil
	}
	return terminate(pid, grace)
}

// terminate sends SIGTERM to pid and waits up to grace for it to go, then
// sends SIGKILL and waits a little more.
func terminate(pid int, grace time.Duration) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return err
	}
	if waitGone(pid, grace) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return fmt.Errorf("pid %d outlived SIGTERM by %v, and SIGKILL failed: %w", pid, grace, err)
	}
	if waitGone(pid, 5*time.Second) {
		return nil
	}
	return fmt.Errorf("pid %d did not exit after SIGKILL", pid)
}

func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if syscall.Kill(pid, 0) != nil || isZombie(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// run executes a short command and returns its combined output, with the
// command line in the error.
func run(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// tail returns the last n lines of file, for error messages.
func tail(file string, n int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
