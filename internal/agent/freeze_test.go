package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const (
	testPod = "6f27835e-716f-4424-902e-152e7b208c77"
	testCtr = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

// fakeNode lays out a cgroup v1 freezer folder for one container with one
// process of two threads, and their /proc status files.
func fakeNode(t *testing.T) (FreezeWatch, string, func(freezer string, states ...string)) {
	t.Helper()
	root := t.TempDir()
	w := FreezeWatch{CgroupRoot: filepath.Join(root, "cg"), ProcRoot: filepath.Join(root, "proc"), Poll: time.Millisecond}
	dir := filepath.Join(w.CgroupRoot, "freezer", "node-1", "kubepods", "besteffort", "pod"+testPod, testCtr)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(w.CgroupRoot, "freezer", "node-1", "kubepods", "besteffort", "podother", testCtr+"x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte("42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	set := func(freezer string, states ...string) {
		if err := os.WriteFile(filepath.Join(dir, "freezer.state"), []byte(freezer+"\n"), 0o644); err != nil {
			t.Error(err) // set may run off the test goroutine: no Fatal
		}
		for i, st := range states {
			task := filepath.Join(w.ProcRoot, "42", "task", string(rune('a'+i)))
			if err := os.MkdirAll(task, 0o755); err != nil {
				t.Error(err) // set may run off the test goroutine: no Fatal
			}
			tracer := "0"
			if strings.HasPrefix(st, "t") {
				tracer = "777"
			}
			if err := os.WriteFile(filepath.Join(task, "status"), []byte("Name:\tapp\nState:\t"+st+"\nTracerPid:\t"+tracer+"\n"), 0o644); err != nil {
				t.Error(err) // set may run off the test goroutine: no Fatal
			}
		}
	}
	set("THAWED", "S (sleeping)", "R (running)")
	return w, dir, set
}

func TestFreezeState(t *testing.T) {
	type state struct {
		Frozen, Thawed bool
		By             string
	}
	for _, tc := range []struct {
		name    string
		freezer string
		states  []string
		want    state
	}{
		{"running", "THAWED", []string{"S (sleeping)", "R (running)"}, state{false, true, "ptrace"}},
		{"freezing is not frozen", "FREEZING", []string{"S (sleeping)", "R (running)"}, state{false, false, "freezer.state"}},
		{"frozen cgroup", "FROZEN", []string{"S (sleeping)", "R (running)"}, state{true, false, "freezer.state"}},
		{"one thread still runs", "THAWED", []string{"t (tracing stop)", "R (running)"}, state{false, false, "ptrace"}},
		{"every thread seized", "THAWED", []string{"t (tracing stop)", "t (tracing stop)"}, state{true, false, "ptrace"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, dir, set := fakeNode(t)
			set(tc.freezer, tc.states...)
			var got state
			var err error
			got.Frozen, got.Thawed, got.By, err = w.State(dir)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("State (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFindCgroup(t *testing.T) {
	w, dir, _ := fakeNode(t)
	got, err := w.FindCgroup(testPod, testCtr)
	if err != nil || got != dir {
		t.Errorf("FindCgroup = %q, %v; want %q", got, err, dir)
	}
	if _, err := w.FindCgroup(testPod, "../../etc"); err == nil {
		t.Error("FindCgroup took a path as a container ID")
	}
	if _, err := w.FindCgroup("another-pod", testCtr); err == nil {
		t.Error("FindCgroup found a container under another pod")
	}
}

// TestWatchFreeze: the agent's watch is in place when WatchFreeze
// returns; it ends once the container freezes, then once it thaws (its
// tasks free of the tracer), and with an error when it never freezes.
func TestWatchFreeze(t *testing.T) {
	w, _, set := fakeNode(t)
	c, _, _, _ := setup(t, func(cfg *Config) { cfg.Freeze = w })
	ctx := t.Context()
	watch := func(state string, timeout time.Duration) func() error {
		t.Helper()
		wait, err := c.WatchFreeze(ctx, "node-1", testPod, testCtr, state, timeout)
		if err != nil {
			t.Fatal(err)
		}
		return wait
	}

	if err := watch(Frozen, 20*time.Millisecond)(); err == nil || !strings.Contains(err.Error(), "not frozen") {
		t.Errorf("a watch of a running container = %v, want a timeout", err)
	}
	wait := watch(Frozen, 10*time.Second)
	done := make(chan error, 1)
	go func() { done <- wait() }()
	select {
	case err := <-done:
		t.Fatalf("the watch ended (%v) before the freeze", err)
	case <-time.After(30 * time.Millisecond): // it must still be waiting
	}
	set("FROZEN")
	if err := <-done; err != nil {
		t.Errorf("the watch after the freeze: %v", err)
	}
	set("THAWED", "t (tracing stop)", "t (tracing stop)")
	if err := watch(Thawed, 20*time.Millisecond)(); err == nil {
		t.Error("a thawed watch ended while the tasks are seized")
	}
	set("THAWED", "S (sleeping)", "S (sleeping)")
	if err := watch(Thawed, time.Second)(); err != nil {
		t.Errorf("a thawed watch of a running container: %v", err)
	}
	if _, err := c.WatchFreeze(ctx, "node-1", "no-such-pod", testCtr, Frozen, time.Second); err == nil || !strings.Contains(err.Error(), "no cgroup") {
		t.Errorf("WatchFreeze of an unknown container = %v", err)
	}
}
