package agent

import (
	"context"
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
	os.MkdirAll(dir, 0o755)
	os.MkdirAll(filepath.Join(w.CgroupRoot, "freezer", "node-1", "kubepods", "besteffort", "podother", testCtr+"x"), 0o755)
	os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte("42\n"), 0o644)
	set := func(freezer string, states ...string) {
		os.WriteFile(filepath.Join(dir, "freezer.state"), []byte(freezer+"\n"), 0o644)
		for i, st := range states {
			task := filepath.Join(w.ProcRoot, "42", "task", string(rune('a'+i)))
			os.MkdirAll(task, 0o755)
			tracer := "0"
			if strings.HasPrefix(st, "t") {
				tracer = "777"
			}
			os.WriteFile(filepath.Join(task, "status"), []byte("Name:\tapp\nState:\t"+st+"\nTracerPid:\t"+tracer+"\n"), 0o644)
		}
	}
	set("THAWED", "S (sleeping)", "R (running)")
	return w, dir, set
}

func TestFreezeState(t *testing.T) {
	for _, tc := range []struct {
		name    string
		freezer string
		states  []string
		want    bool
		by      string
	}{
		{"running", "THAWED", []string{"S (sleeping)", "R (running)"}, false, ""},
		{"freezing is not frozen", "FREEZING", []string{"S (sleeping)", "R (running)"}, false, ""},
		{"frozen cgroup", "FROZEN", []string{"S (sleeping)", "R (running)"}, true, "freezer.state"},
		{"one thread still runs under the tracer", "THAWED", []string{"t (tracing stop)", "R (running)"}, false, ""},
		{"every thread seized", "THAWED", []string{"t (tracing stop)", "t (tracing stop)"}, true, "ptrace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, dir, set := fakeNode(t)
			set(tc.freezer, tc.states...)
			frozen, by, err := w.State(dir)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]any{tc.want, tc.by}, []any{frozen, by}); diff != "" {
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

// TestWaitFreeze: the agent's endpoint answers once the container freezes,
// then once it thaws, and 504 when it never freezes.
func TestWaitFreeze(t *testing.T) {
	w, _, set := fakeNode(t)
	c, _, _, _ := setup(t, func(cfg *Config) { cfg.Freeze = w })
	ctx := context.Background()

	if _, err := c.WaitFreeze(ctx, "node-1", testPod, testCtr, Frozen, 20*time.Millisecond); err == nil || !strings.Contains(err.Error(), "not frozen") {
		t.Errorf("WaitFreeze on a running container = %v, want a timeout", err)
	}
	done := make(chan FreezeResult, 1)
	go func() {
		res, err := c.WaitFreeze(ctx, "node-1", testPod, testCtr, Frozen, 10*time.Second)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	select {
	case res := <-done:
		t.Fatalf("WaitFreeze answered %+v before the freeze", res)
	case <-time.After(30 * time.Millisecond): // it must still be waiting
	}
	freezeAt := time.Now()
	set("FROZEN")
	res := <-done
	if res.State != Frozen || res.By != "freezer.state" || res.At.Before(freezeAt) {
		t.Errorf("WaitFreeze = %+v, want frozen by freezer.state after %v", res, freezeAt)
	}
	set("THAWED", "t (tracing stop)", "t (tracing stop)")
	if res, err := c.WaitFreeze(ctx, "node-1", testPod, testCtr, Thawed, 20*time.Millisecond); err == nil {
		t.Errorf("WaitFreeze(thawed) while the tasks are seized = %+v, want a timeout", res)
	}
	set("THAWED", "S (sleeping)", "S (sleeping)")
	if res, err := c.WaitFreeze(ctx, "node-1", testPod, testCtr, Thawed, time.Second); err != nil || res.State != Thawed {
		t.Errorf("WaitFreeze(thawed) = %+v, %v", res, err)
	}
	if _, err := c.WaitFreeze(ctx, "node-1", "no-such-pod", testCtr, Frozen, time.Second); err == nil || !strings.Contains(err.Error(), "no cgroup") {
		t.Errorf("WaitFreeze of an unknown container = %v", err)
	}
}
