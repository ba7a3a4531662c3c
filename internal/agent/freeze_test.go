package agent

import (
	"context"
	"errors"
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

// TestFindCgroupCRIO: on a CRI-O node (cgroupfs, conmon in the pod's
// cgroup) the container's cgroup is crio-<id>, beside its conmon's
// crio-conmon-<id>, which sorts first and is not it.
func TestFindCgroupCRIO(t *testing.T) {
	root := t.TempDir()
	pod := filepath.Join(root, "freezer", "ms2m-node-1", "kubepods", "besteffort", "pod"+testPod)
	id := "f" + strings.Repeat("0", 63)
	for _, d := range []string{"crio-conmon-" + id, "crio-" + id} {
		if err := os.MkdirAll(filepath.Join(pod, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	got, err := FreezeWatch{CgroupRoot: root}.FindCgroup(testPod, id)
	if want := filepath.Join(pod, "crio-"+id); err != nil || got != want {
		t.Errorf("FindCgroup = %q, %v; want %q", got, err, want)
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

// TestWatchDump: a dump watch ends only once CRIU, a process outside the
// container, was seen tracing the app and then every thread was free of
// it; with thaw it then thaws the still frozen cgroup, and not before.
// A tracer inside the container (the tenant's own), or one that is not
// CRIU, never counts as the dump.
func TestWatchDump(t *testing.T) {
	const criuPid, tenantPid = "777", "42"
	type step struct {
		tracer  string // of both threads; "0": none
		freezer string
	}
	for _, tc := range []struct {
		name       string
		criuName   string // comm of pid 777
		criuArgv0  string
		thaw       bool
		steps      []step
		wantErr    string
		wantThawed bool
		wantNoThaw string
		wantState  string // freezer.state at the end
		runtime    string // "": a runtime that resumes; "none"; else its error
	}{
		{name: "paused, dumped, thawed", criuName: "criu", thaw: true,
			steps:      []step{{"0", "FROZEN"}, {criuPid, "THAWED"}, {"0", "FROZEN"}},
			wantThawed: true, wantState: "THAWED"},
		{name: "criu through its ld.so", criuName: "ld-linux-x86-64", criuArgv0: "/lib/ld-linux-x86-64.so.2\x00--argv0\x00criu", thaw: true,
			steps:      []step{{"0", "FROZEN"}, {criuPid, "THAWED"}, {"0", "FROZEN"}},
			wantThawed: true, wantState: "THAWED"},
		{name: "no thaw asked", criuName: "criu",
			steps:     []step{{"0", "FROZEN"}, {criuPid, "THAWED"}, {"0", "FROZEN"}},
			wantState: "FROZEN"},
		{name: "not frozen after the dump", criuName: "criu", thaw: true,
			steps:      []step{{criuPid, "THAWED"}, {"0", "THAWED"}},
			wantNoThaw: "not frozen", wantState: "THAWED"},
		{name: "the runtime refuses", criuName: "criu", thaw: true, runtime: "container not paused",
			steps:      []step{{"0", "FROZEN"}, {criuPid, "THAWED"}, {"0", "FROZEN"}},
			wantNoThaw: "container not paused", wantState: "FROZEN"},
		{name: "no runtime", criuName: "criu", thaw: true, runtime: "none",
			steps:      []step{{"0", "FROZEN"}, {criuPid, "THAWED"}, {"0", "FROZEN"}},
			wantNoThaw: "no runtime", wantState: "FROZEN"},
		{name: "never traced", criuName: "criu", thaw: true,
			steps:   []step{{"0", "FROZEN"}},
			wantErr: "CRIU never traced", wantState: "FROZEN"},
		{name: "traced by the tenant", criuName: "criu", thaw: true,
			steps:   []step{{"0", "FROZEN"}, {tenantPid, "FROZEN"}, {"0", "FROZEN"}},
			wantErr: "CRIU never traced", wantState: "FROZEN"},
		{name: "traced by another tool", criuName: "gdb", thaw: true,
			steps:   []step{{"0", "FROZEN"}, {criuPid, "FROZEN"}, {"0", "FROZEN"}},
			wantErr: "CRIU never traced", wantState: "FROZEN"},
		{name: "still seized", criuName: "criu", thaw: true,
			steps:   []step{{"0", "FROZEN"}, {criuPid, "THAWED"}},
			wantErr: "did not let its tasks go", wantState: "THAWED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, dir, _ := fakeNode(t)
			switch tc.runtime {
			case "":
				w.Runtime = fakeRuntime{t, dir, nil}
			case "none":
			default:
				w.Runtime = fakeRuntime{t, dir, errors.New(tc.runtime)}
			}
			write := func(p, s string) {
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Error(err) // may run off the test goroutine: no Fatal
				}
				if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
					t.Error(err)
				}
			}
			write(filepath.Join(w.ProcRoot, criuPid, "status"), "Name:\t"+tc.criuName+"\nTgid:\t"+criuPid+"\n")
			write(filepath.Join(w.ProcRoot, criuPid, "cmdline"), tc.criuArgv0+"\x00swrk\x003\x00")
			write(filepath.Join(w.ProcRoot, tenantPid, "status"), "Name:\tcriu\nTgid:\t"+tenantPid+"\n")
			set := func(s step) {
				write(filepath.Join(dir, "freezer.state"), s.freezer+"\n")
				for _, th := range []string{"a", "b"} {
					state := "S (sleeping)"
					if s.tracer != "0" {
						state = "t (tracing stop)"
					}
					write(filepath.Join(w.ProcRoot, tenantPid, "task", th, "status"), "Name:\tapp\nState:\t"+state+"\nTracerPid:\t"+s.tracer+"\n")
				}
			}
			// Each step is seen by at least two polls before the next.
			polls := make(chan bool, 1)
			w.polled = func(seized bool) {
				select {
				case polls <- seized:
				default:
				}
			}
			set(tc.steps[0])
			done := make(chan struct{})
			var res FreezeResult
			var err error
			go func() {
				defer close(done)
				timeout := 10 * time.Second
				if tc.wantErr != "" {
					timeout = 500 * time.Millisecond
				}
				res, err = w.WaitDump(t.Context(), dir, testCtr, tc.thaw, timeout)
			}()
		steps:
			for _, s := range tc.steps[1:] {
				for range 2 {
					select {
					case <-polls:
					case <-done:
						break steps
					}
				}
				set(s)
			}
			<-done
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("WaitDump = %+v, %v; want an error with %q", res, err, tc.wantErr)
				}
			case err != nil:
				t.Fatalf("WaitDump: %v", err)
			default:
				if res.State != Dumped || res.Seized.IsZero() || !res.At.After(res.Seized) {
					t.Errorf("WaitDump = %+v, want dumped after seized", res)
				}
				if res.ThawedByUs != tc.wantThawed || !strings.Contains(res.NoThaw, tc.wantNoThaw) {
					t.Errorf("WaitDump thawed %v (%q), want %v (%q)", res.ThawedByUs, res.NoThaw, tc.wantThawed, tc.wantNoThaw)
				}
			}
			b, rerr := os.ReadFile(filepath.Join(dir, "freezer.state"))
			if rerr != nil {
				t.Fatal(rerr)
			}
			if got := strings.TrimSpace(string(b)); got != tc.wantState {
				t.Errorf("freezer.state = %s, want %s", got, tc.wantState)
			}
		})
	}
}

// TestWatchDumpHTTP: GET /v1/freeze?state=dumped&thaw=true through the
// client: the agent thaws the cgroup once CRIU let the tasks go; thaw
// with another state is refused.
func TestWatchDumpHTTP(t *testing.T) {
	w, dir, set := fakeNode(t)
	if err := os.MkdirAll(filepath.Join(w.ProcRoot, "777"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.ProcRoot, "777", "status"), []byte("Name:\tcriu\nTgid:\t777\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	polls := make(chan bool, 1)
	w.polled = func(seized bool) {
		select {
		case polls <- seized:
		default:
		}
	}
	w.Runtime = fakeRuntime{t, dir, nil}
	c, _, _, _ := setup(t, func(cfg *Config) { cfg.Freeze = w })
	set("FROZEN", "S (sleeping)", "S (sleeping)")
	wait, err := c.WatchDump(t.Context(), "node-1", testPod, testCtr, true, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	<-polls
	set("THAWED", "t (tracing stop)", "t (tracing stop)")
	for seized := false; !seized; seized = <-polls {
	}
	set("FROZEN", "S (sleeping)", "S (sleeping)")
	thawed, noThaw, criu, err := wait()
	if err != nil || !thawed || criu <= 0 {
		t.Fatalf("WatchDump: thawed %v (%s), CRIU %v, %v; want thawed after a while of CRIU", thawed, noThaw, criu, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "freezer.state")); strings.TrimSpace(string(b)) != "THAWED" {
		t.Errorf("freezer.state = %q after the agent's thaw", b)
	}
	if _, err := c.watch(t.Context(), "node-1", testPod, testCtr, Frozen, true, time.Second); err == nil {
		t.Error("thaw=true with state=frozen was accepted")
	}
}

// fakeRuntime resumes the fake node's container as runc would: it thaws
// the freezer cgroup; or it fails with err.
type fakeRuntime struct {
	t   *testing.T
	dir string
	err error
}

func (r fakeRuntime) Resume(_ context.Context, id string) error {
	if id != testCtr {
		r.t.Errorf("resumed container %q, want %q", id, testCtr)
	}
	if r.err != nil {
		return r.err
	}
	return os.WriteFile(filepath.Join(r.dir, "freezer.state"), []byte("THAWED\n"), 0o644)
}
