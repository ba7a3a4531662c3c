package main

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildPause builds this command the way the image build does.
func buildPause(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, msg)
	}
	return out
}

// startPause starts bin and returns once it has set up its signal handling.
func startPause(t *testing.T, bin string, attr *syscall.SysProcAttr) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.SysProcAttr = attr
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pause: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil || !strings.Contains(line, "waiting") {
		t.Fatalf("pause said %q, %v; want its ready line", line, err)
	}
	go func() { // drain the rest so the exit message never blocks
		buf := make([]byte, 512)
		for {
			if _, err := stderr.Read(buf); err != nil {
				return
			}
		}
	}()
	return cmd
}

func waitExit(t *testing.T, cmd *exec.Cmd, within time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		t.Fatalf("pause did not exit within %v", within)
		return nil
	}
}

func TestStatic(t *testing.T) {
	f, err := elf.Open(buildPause(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("pause is dynamically linked")
		}
	}
}

func TestExitsZeroOnSignal(t *testing.T) {
	bin := buildPause(t)
	tests := map[string]struct {
		sig    syscall.Signal
		newPID bool
	}{
		"SIGTERM":              {sig: syscall.SIGTERM},
		"SIGINT":               {sig: syscall.SIGINT},
		"SIGTERM as PID 1":     {sig: syscall.SIGTERM, newPID: true},
		"SIGCHLD is no reason": {sig: syscall.SIGCHLD},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var attr *syscall.SysProcAttr
			if tc.newPID {
				attr = newPIDNamespace(t)
			}
			cmd := startPause(t, bin, attr)
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			if tc.sig == syscall.SIGCHLD {
				time.Sleep(100 * time.Millisecond) // nothing to wait on: it must stay up
				if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
					t.Fatalf("pause exited on SIGCHLD: %v", err)
				}
				if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			}
			if err := waitExit(t, cmd, 5*time.Second); err != nil {
				t.Fatalf("pause exited with %v, want status 0", err)
			}
		})
	}
}

// TestReapsOrphansAsPID1 starts pause as PID 1 of a new PID namespace,
// orphans a process into that namespace, and checks that when the orphan
// exits it does not stay a zombie.
func TestReapsOrphansAsPID1(t *testing.T) {
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		t.Skip("nsenter not found")
	}
	cmd := startPause(t, buildPause(t), newPIDNamespace(t))
	pausePID := cmd.Process.Pid

	// nsenter forks a shell into the namespace; the shell starts a sleep
	// and exits, so the kernel hands the sleep to the namespace's PID 1.
	orphan := exec.Command(nsenter, "-t", strconv.Itoa(pausePID), "-p", "--", "/bin/sh", "-c", "sleep 1 </dev/null >/dev/null 2>&1 & exit 0")
	if msg, err := orphan.CombinedOutput(); err != nil {
		t.Fatalf("nsenter: %v\n%s", err, msg)
	}
	var child int
	deadline := time.Now().Add(3 * time.Second)
	for child == 0 && time.Now().Before(deadline) {
		child = firstChild(pausePID)
		time.Sleep(20 * time.Millisecond)
	}
	if child == 0 {
		t.Fatal("no orphan was handed to pause")
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		state, ppid := procState(child)
		if state == "" || ppid != pausePID {
			break // reaped
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d still has state %s under pause after the deadline", child, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(t, cmd, 5*time.Second); err != nil {
		t.Fatalf("pause exited with %v", err)
	}
}

func newPIDNamespace(t *testing.T) *syscall.SysProcAttr {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a new PID namespace needs root")
	}
	return &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
}

// firstChild returns the host PID of a child of parent, or 0.
func firstChild(parent int) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid := procState(pid); ppid == parent {
			return pid
		}
	}
	return 0
}

// procState returns the state letter and parent of pid, or "" if it is gone.
func procState(pid int) (state string, ppid int) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return "", 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "State":
			state, _, _ = strings.Cut(v, " ")
		case "PPid":
			ppid, _ = strconv.Atoi(v)
		}
	}
	return state, ppid
}
