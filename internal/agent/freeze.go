package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Freeze states a FreezeWatch waits for.
const (
	// Frozen: the container's tasks can no longer run: its freezer cgroup
	// reads FROZEN (cgroup v1 freezer.state, or "frozen 1" in cgroup v2's
	// cgroup.events), or every thread of it is in a tracing stop under a
	// tracer (CRIU seizes the tasks it dumps). From then until the dump
	// ends, nothing the app has not read yet reaches its memory.
	Frozen = "frozen"
	// Thawed: not frozen any more (or no task left). Waited for after
	// Frozen, it marks the end of CRIU's dump.
	Thawed = "thawed"
	// Dumped: CRIU has dumped the container: its tasks were seen under
	// CRIU's tracer (a process outside the container), and later every
	// one of them was free of any tracer. CRIU lets the tasks go only once
	// it has written their memory, so the image holds nothing they do
	// from then on. The runtime may keep them frozen for a while after
	// (containerd pauses the task for its whole checkpoint, the root
	// filesystem's archive included); see FreezeWatch.WaitDump's thaw.
	Dumped = "dumped"
)

// criuName is the name CRIU's process goes by: its comm, or a word of its
// command line (a wrapper that starts it through a private ld.so leaves
// the loader as comm and argv[0], and CRIU's path among the arguments).
const criuName = "criu"

// FreezeWatch finds a container's cgroup and its tasks on the node. The
// zero value looks in /sys/fs/cgroup and /proc.
type FreezeWatch struct {
	CgroupRoot string        // default /sys/fs/cgroup
	ProcRoot   string        // default /proc
	Poll       time.Duration // default 2 ms
	// Runtime resumes a paused container (WaitDump's thaw); nil: the
	// agent cannot thaw.
	Runtime Resumer

	// polled, if set, hears after each poll of WaitDump whether CRIU was
	// seen yet (tests sequence their fake node by it).
	polled func(seized bool)
}

// Resumer resumes a container the runtime paused (ContainerdResumer,
// OCIResumer; NodeResumer picks the node's).
type Resumer interface {
	Resume(ctx context.Context, containerID string) error
}

// FreezeResult is what a wait saw.
type FreezeResult struct {
	State string    `json:"state"` // Frozen or Thawed
	At    time.Time `json:"at"`    // when the agent first saw it
	By    string    `json:"by"`    // what showed it: freezer.state, cgroup.events, ptrace, no tasks
	Polls int       `json:"polls"`
	// Dumped only: when CRIU was first seen tracing the tasks; whether
	// the agent had the runtime resume the container (asked to, and it
	// was still frozen); else, when asked to, why not.
	Seized     time.Time `json:"seized,omitzero"`
	ThawedByUs bool      `json:"thawed,omitempty"`
	NoThaw     string    `json:"noThaw,omitempty"`
}

// CRIU is how long CRIU held the tasks, as a Dumped wait saw it (0 for
// other states).
func (r FreezeResult) CRIU() time.Duration {
	if r.State != Dumped || r.Seized.IsZero() {
		return 0
	}
	return r.At.Sub(r.Seized)
}

// ErrFreezeTimeout is returned when the state was not seen in time.
var ErrFreezeTimeout = errors.New("the container did not reach the state in time")

func (w FreezeWatch) roots() (cg, proc string, poll time.Duration) {
	cg, proc, poll = w.CgroupRoot, w.ProcRoot, w.Poll
	if cg == "" {
		cg = "/sys/fs/cgroup"
	}
	if proc == "" {
		proc = "/proc"
	}
	if poll <= 0 {
		poll = 2 * time.Millisecond
	}
	return cg, proc, poll
}

// FindCgroup returns the container's cgroup folder: in the v1 freezer
// hierarchy if there is one, else in the unified one. The folder's name
// holds the container ID (cgroupfs: <id> for containerd, crio-<id> for
// CRI-O; systemd: cri-containerd-<id>.scope, crio-<id>.scope), below a
// folder that names the pod's UID. CRI-O's conmon for the container has a
// cgroup that names the ID too (crio-conmon-<id>), which is not the
// container's.
func (w FreezeWatch) FindCgroup(podUID, containerID string) (string, error) {
	if len(containerID) < 12 || strings.ContainsAny(containerID, "/.") || podUID == "" || strings.ContainsAny(podUID, "/.") {
		return "", fmt.Errorf("pod UID %q and container ID %q: want a UID and a runtime's container ID (64 hex digits)", podUID, containerID)
	}
	cg, _, _ := w.roots()
	uidDash, uidUnder := podUID, strings.ReplaceAll(podUID, "-", "_")
	for _, root := range []string{filepath.Join(cg, "freezer"), filepath.Join(cg, "unified"), cg} {
		if _, err := os.Stat(root); err != nil {
			continue
		}
		var found string
		errFound := errors.New("found")
		// The walk ends with errFound or nil; found is its result.
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if strings.Count(strings.TrimPrefix(p, root), "/") > 8 {
				return fs.SkipDir
			}
			if strings.Contains(d.Name(), containerID) && !strings.Contains(d.Name(), "conmon") {
				parent := filepath.Dir(p)
				if strings.Contains(parent, uidDash) || strings.Contains(parent, uidUnder) {
					found = p
					return errFound
				}
			}
			return nil
		})
		if found != "" {
			return found, nil
		}
	}
	return "", fmt.Errorf("no cgroup of container %s of pod %s under %s: %w", containerID, podUID, cg, fs.ErrNotExist)
}

// State reads whether the tasks of cgroup dir are frozen now, and what
// showed it; thawed is whether they are free of any freeze and of any
// tracer (CRIU detaches from them when its dump ends).
func (w FreezeWatch) State(dir string) (frozen, thawed bool, by string, err error) {
	_, proc, _ := w.roots()
	if b, err := os.ReadFile(filepath.Join(dir, "freezer.state")); err == nil && strings.TrimSpace(string(b)) != "THAWED" {
		// FREEZING is not frozen yet: a task may still run.
		return strings.TrimSpace(string(b)) == "FROZEN", false, "freezer.state", nil
	}
	if b, err := os.ReadFile(filepath.Join(dir, "cgroup.events")); err == nil && slices.Contains(strings.Split(string(b), "\n"), "frozen 1") {
		return true, false, "cgroup.events", nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return false, false, "", fmt.Errorf("cgroup %s: %w", dir, err)
	}
	pids := strings.Fields(string(b))
	if len(pids) == 0 {
		return false, true, "no tasks", nil
	}
	allStopped, anyTraced := true, false
	for _, pid := range pids {
		if _, err := strconv.Atoi(pid); err != nil {
			return false, false, "", fmt.Errorf("cgroup %s: pid %q", dir, pid)
		}
		tasks, err := os.ReadDir(filepath.Join(proc, pid, "task"))
		if err != nil {
			allStopped = false // gone since
			continue
		}
		for _, t := range tasks {
			st, err := os.ReadFile(filepath.Join(proc, pid, "task", t.Name(), "status"))
			if err != nil {
				allStopped = false
				continue
			}
			stopped, traced := taskState(string(st))
			allStopped = allStopped && stopped && traced
			anyTraced = anyTraced || traced
		}
	}
	if allStopped {
		return true, false, "ptrace", nil
	}
	return false, !anyTraced, "ptrace", nil
}

// taskState reads a /proc status: whether the task is in a tracing stop,
// and whether it has a tracer.
func taskState(status string) (stopped, traced bool) {
	for _, l := range strings.Split(status, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "State":
			stopped = strings.HasPrefix(v, "t")
		case "TracerPid":
			traced = v != "" && v != "0"
		}
	}
	return stopped, traced
}

// Wait polls cgroup dir until it is in state (Frozen or Thawed), for at
// most timeout.
func (w FreezeWatch) Wait(ctx context.Context, dir, state string, timeout time.Duration) (FreezeResult, error) {
	if state != Frozen && state != Thawed {
		return FreezeResult{}, fmt.Errorf("state %q: want %s or %s", state, Frozen, Thawed)
	}
	_, _, poll := w.roots()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for n := 1; ; n++ {
		frozen, thawed, by, err := w.State(dir)
		if err != nil {
			return FreezeResult{}, err
		}
		if (state == Frozen && frozen) || (state == Thawed && thawed) {
			return FreezeResult{State: state, At: time.Now(), By: by, Polls: n}, nil
		}
		select {
		case <-ctx.Done():
			return FreezeResult{Polls: n}, fmt.Errorf("not %s after %s (%d polls of %s): %w", state, timeout, n, dir, ErrFreezeTimeout)
		case <-tick.C:
		}
	}
}

// trace is who traces a container's tasks at one poll.
type trace struct {
	tasks    int    // threads read
	complete bool   // every thread of every process was read
	byCRIU   bool   // some thread is traced by CRIU from outside the container
	traced   bool   // some thread is traced, by anyone
	other    string // a tracer that is not CRIU, for the error
}

// traceOf reads the tracer of every thread in cgroup dir.
func (w FreezeWatch) traceOf(dir string) (trace, error) {
	_, proc, _ := w.roots()
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return trace{}, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	pids := strings.Fields(string(b))
	inside := make(map[string]bool, len(pids))
	for _, pid := range pids {
		if _, err := strconv.Atoi(pid); err != nil {
			return trace{}, fmt.Errorf("cgroup %s: pid %q", dir, pid)
		}
		inside[pid] = true
	}
	tr := trace{complete: true}
	for _, pid := range pids {
		tasks, err := os.ReadDir(filepath.Join(proc, pid, "task"))
		if err != nil {
			tr.complete = false // gone since
			continue
		}
		for _, t := range tasks {
			st, err := os.ReadFile(filepath.Join(proc, pid, "task", t.Name(), "status"))
			if err != nil {
				tr.complete = false
				continue
			}
			tr.tasks++
			tracer := statusField(string(st), "TracerPid")
			if tracer == "" || tracer == "0" {
				continue
			}
			tr.traced = true
			if !tr.byCRIU {
				ok, who := w.isCRIU(tracer, inside)
				tr.byCRIU = ok
				if !ok && tr.other == "" {
					tr.other = who
				}
			}
		}
	}
	return tr, nil
}

// isCRIU says whether thread tid, a tracer, is CRIU: a process outside
// the container (inside holds the container's processes; a tenant can
// name its own process criu, but cannot put it outside its cgroup) whose
// comm, or a word of whose command line, is criu (see criuName). If not,
// who says what it is.
func (w FreezeWatch) isCRIU(tid string, inside map[string]bool) (ok bool, who string) {
	_, proc, _ := w.roots()
	if _, err := strconv.Atoi(tid); err != nil {
		return false, "tracer " + tid
	}
	st, err := os.ReadFile(filepath.Join(proc, tid, "status"))
	if err != nil {
		return false, "tracer " + tid + " (gone)"
	}
	tgid, name := statusField(string(st), "Tgid"), statusField(string(st), "Name")
	if tgid == "" || inside[tgid] {
		return false, fmt.Sprintf("tracer %s (%s) inside the container", tid, name)
	}
	if name == criuName {
		return true, ""
	}
	cmd, err := os.ReadFile(filepath.Join(proc, tgid, "cmdline"))
	if err != nil {
		return false, fmt.Sprintf("tracer %s (%s)", tid, name)
	}
	words := strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
	for _, word := range words[:min(len(words), 8)] {
		if filepath.Base(word) == criuName {
			return true, ""
		}
	}
	return false, fmt.Sprintf("tracer %s (%s: %.80q)", tid, name, strings.Join(words, " "))
}

// statusField is field k of a /proc status file ("" if absent).
func statusField(status, k string) string {
	for _, l := range strings.Split(status, "\n") {
		if key, v, ok := strings.Cut(l, ":"); ok && key == k {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// frozenNow reads whether cgroup dir's freezer holds its tasks (v1
// freezer.state FROZEN, or v2 cgroup.freeze 1), and the file that says so.
func frozenNow(dir string) (frozen bool, file string) {
	if b, err := os.ReadFile(filepath.Join(dir, "freezer.state")); err == nil {
		return strings.TrimSpace(string(b)) != "THAWED", "freezer.state"
	}
	if b, err := os.ReadFile(filepath.Join(dir, "cgroup.freeze")); err == nil {
		return strings.TrimSpace(string(b)) == "1", "cgroup.freeze"
	}
	return false, ""
}

// WaitDump polls cgroup dir, container id's, until CRIU has dumped its
// tasks (Dumped: seen traced by CRIU, then, at one poll that read every
// thread, traced by nobody), for at most timeout. With thawIt, it then
// resumes the container through the runtime (w.Runtime) if its cgroup is
// still frozen: the runtime paused it for its checkpoint and would resume
// it only once the whole checkpoint is written (see ARCHITECTURE.md,
// "Thaw after the dump", for when that is safe). The caller decides
// whether it is; the agent only makes sure CRIU is done.
func (w FreezeWatch) WaitDump(ctx context.Context, dir, id string, thawIt bool, timeout time.Duration) (FreezeResult, error) {
	_, _, poll := w.roots()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(poll)
	defer tick.Stop()
	var seized time.Time
	var other string
	for n := 1; ; n++ {
		tr, err := w.traceOf(dir)
		if err != nil {
			return FreezeResult{Polls: n}, err
		}
		if tr.other != "" {
			other = tr.other
		}
		switch {
		case tr.tasks == 0 && tr.complete:
			return FreezeResult{Polls: n}, fmt.Errorf("cgroup %s has no tasks left: the container ended before CRIU's dump was seen", dir)
		case seized.IsZero() && tr.byCRIU:
			seized = time.Now()
		case !seized.IsZero() && tr.complete && !tr.traced:
			res := FreezeResult{State: Dumped, At: time.Now(), By: "ptrace", Polls: n, Seized: seized}
			if !thawIt {
				return res, nil
			}
			if frozen, _ := frozenNow(dir); !frozen {
				res.NoThaw = "the cgroup was not frozen after the dump"
				return res, nil
			}
			if w.Runtime == nil {
				res.NoThaw = "the agent has no runtime to resume the container through"
				return res, nil
			}
			if err := w.Runtime.Resume(ctx, id); err != nil {
				res.NoThaw = err.Error()
				return res, nil
			}
			res.ThawedByUs = true
			return res, nil
		}
		if w.polled != nil {
			w.polled(!seized.IsZero())
		}
		select {
		case <-ctx.Done():
			what := "CRIU never traced its tasks"
			if other != "" {
				what += "; seen: " + other
			}
			if !seized.IsZero() {
				what = "CRIU did not let its tasks go"
			}
			return FreezeResult{Polls: n}, fmt.Errorf("not dumped after %s (%d polls of %s; %s): %w", timeout, n, dir, what, ErrFreezeTimeout)
		case <-tick.C:
		}
	}
}
