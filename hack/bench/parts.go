package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/internal/migrate"
)

// The checkpoint and restore phases in their parts (issue 27): what the
// migrator's Report.Parts holds (the kubelet's call, CRIU's dump as the
// node agent saw it, the image's build and push, the kubelet's pull of
// the checkpoint image by its Pulled Event, CRIU's restore by its
// restore.log), and, on the bench's local cluster only, the target's
// restore as node 2's containerd log stamps it.

// targetSteps split a copy migration's restore phase (the target's create
// call until the migrator saw it ready) by node 2's containerd log, ms.
type targetSteps struct {
	// ToSandboxMs: the create call (with the webhook's admission), the
	// scheduling and the kubelet's sync, until containerd starts the pod
	// sandbox; SandboxMs: the sandbox.
	ToSandboxMs float64 `json:"toSandboxMs"`
	SandboxMs   float64 `json:"sandboxMs"`
	// SidecarMs: the sidecar's pull, create and start; ProbesMs: from
	// its start until the kubelet pulls the app's image, that is until
	// the sidecar's startup probe passed.
	SidecarMs float64 `json:"sidecarMs"`
	ProbesMs  float64 `json:"sidecarProbesMs"`
	// PullMs: containerd's pull of the checkpoint image; CreateMs:
	// CreateContainer of the app (containerd unpacks the checkpoint);
	// StartMs: StartContainer (runc's restore, CRIU's within it);
	// ReadyMs: from there until the migrator saw the pod ready.
	PullMs   float64 `json:"pullMs"`
	CreateMs float64 `json:"createMs"`
	StartMs  float64 `json:"startMs"`
	ReadyMs  float64 `json:"readyMs"`
}

// splitRestore is targetSteps of a containerd log for the target pod's
// restore from image, which began at began and was seen ready at ended;
// nil if a line is missing (the log rotated, another pod interleaved).
func splitRestore(log, target, image string, began, ended time.Time) *targetSteps {
	ts := markerTimes(log, began,
		[]string{`RunPodSandbox for name:\"` + target + `\"`},
		[]string{`RunPodSandbox for name:\"` + target + `\"`, "returns sandbox id"},
		[]string{"StartContainer for", "returns successfully"},
		[]string{`PullImage \"` + image + `\"`},
		[]string{`PullImage \"` + image + `\"`, "returns image reference"},
		[]string{"CreateContainer within sandbox", `for name:\"app\"`, "returns container id"},
		[]string{"StartContainer for", "returns successfully"})
	if ts == nil || ended.Before(ts[6]) {
		return nil
	}
	return &targetSteps{
		ToSandboxMs: ms(ts[0].Sub(began)), SandboxMs: ms(ts[1].Sub(ts[0])), SidecarMs: ms(ts[2].Sub(ts[1])), ProbesMs: ms(ts[3].Sub(ts[2])),
		PullMs: ms(ts[4].Sub(ts[3])), CreateMs: ms(ts[5].Sub(ts[4])), StartMs: ms(ts[6].Sub(ts[5])), ReadyMs: ms(ended.Sub(ts[6])),
	}
}

// restoreSplit reads node 2's containerd log for the restore phase of
// rep, which ended at ended (the bench's clock, the log's too).
func restoreSplit(stateDir string, rep migrate.Report, ended time.Time) *targetSteps {
	var took time.Duration
	for _, p := range rep.Phases {
		if p.Name == "restore" {
			took = p.Took
		}
	}
	if took <= 0 || ended.IsZero() || rep.Image == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(stateDir, "logs", cluster.NodeName(2)+"-containerd.log"))
	if err != nil {
		return nil
	}
	return splitRestore(string(b), rep.TargetPod, rep.Image, ended.Add(-took), ended)
}

// partsMs is a run's Report.Parts in ms; nil where a part was not
// measured.
type partsMs struct {
	Call, CRIUDump, CallRest, Image, Restore, Pull, CRIURestore, RestoreRest *float64
}

func partsOfRun(p *migrate.Parts) partsMs {
	var out partsMs
	if p == nil {
		return out
	}
	opt := func(d time.Duration, ok bool) *float64 {
		if !ok {
			return nil
		}
		v := ms(d)
		return &v
	}
	out.Call, out.Image, out.Restore = opt(p.Call, p.Call > 0), opt(p.Image, p.Image > 0), opt(p.Restore, p.Restore > 0)
	out.CRIUDump = opt(p.CRIUDump, p.CRIUDump > 0)
	out.CallRest = opt(p.CallRest())
	out.Pull = opt(p.Pull, !hasUnmeasured(p, migrate.PartPull))
	out.CRIURestore = opt(p.CRIURestore, p.CRIURestore > 0)
	out.RestoreRest = opt(p.RestoreRest())
	return out
}

func hasUnmeasured(p *migrate.Parts, part string) bool {
	for _, u := range p.Unmeasured {
		if len(u) > len(part) && u[:len(part)+1] == part+":" {
			return true
		}
	}
	return false
}

// partName is one column of the parts: its CSV and JSON name and its
// table heading.
type partName struct{ col, head string }

// partNames are the checkpoint's and the restore's parts, in order.
var partNames = []partName{
	{"checkpoint_phase", "checkpoint phase"},
	{"sidecar_calls", "quiesce + resume"},
	{"kubelet_call", "kubelet call"},
	{"criu_dump", "CRIU dump"},
	{"call_rest", "call − dump"},
	{"image_build_push", "image build + push"},
	{"restore_phase", "restore phase"},
	{"image_pull", "image pull"},
	{"criu_restore", "CRIU restore"},
	{"pulled_ahead", "agent's pull ahead"},
	{"restore_rest", "restore − pull − CRIU"},
}

// stepNames are targetSteps, in order.
var stepNames = []partName{
	{"to_sandbox", "create → sandbox"},
	{"sandbox", "sandbox"},
	{"sidecar", "sidecar pull + start"},
	{"sidecar_probes", "sidecar probes"},
	{"pull", "image pull"},
	{"create", "CreateContainer (unpack)"},
	{"start", "StartContainer (runc + CRIU restore)"},
	{"ready", "→ ready"},
}

// runParts are r's parts that were measured, by partNames' col.
func runParts(r memoryRun) map[string]float64 {
	out := map[string]float64{}
	p := partsOfRun(r.Report.Parts)
	put := func(col string, v *float64) {
		if v != nil {
			out[col] = *v
		}
	}
	if r.Groups != nil {
		out["checkpoint_phase"], out["restore_phase"] = r.Groups["checkpoint"], r.Groups["restore"]
		if p.Call != nil {
			out["sidecar_calls"] = max(r.Groups["checkpoint"]-*p.Call, 0)
		}
	}
	put("kubelet_call", p.Call)
	put("criu_dump", p.CRIUDump)
	put("call_rest", p.CallRest)
	put("image_build_push", p.Image)
	put("image_pull", p.Pull)
	put("criu_restore", p.CRIURestore)
	put("restore_rest", p.RestoreRest)
	if pp := r.Report.Parts; pp != nil && pp.PulledAhead > 0 {
		out["pulled_ahead"] = ms(pp.PulledAhead)
	}
	return out
}

func stepValues(s targetSteps) map[string]float64 {
	return map[string]float64{"to_sandbox": s.ToSandboxMs, "sandbox": s.SandboxMs, "sidecar": s.SidecarMs, "sidecar_probes": s.ProbesMs,
		"pull": s.PullMs, "create": s.CreateMs, "start": s.StartMs, "ready": s.ReadyMs}
}

// markdownParts writes the parts' and the restore steps' tables.
func markdownParts(w func(string, ...any), stats []memoryStat) {
	cells := func(vals map[string]float64, names []partName) string {
		var sb []byte
		for _, p := range names {
			v, ok := vals[p.col]
			c := "not measured"
			if ok {
				c = fmtMs0(v)
			}
			sb = append(sb, " | "+c...)
		}
		return string(sb)
	}
	heads := func(names []partName) (string, string) {
		h, sep := "", ""
		for _, p := range names {
			h += " | " + p.head
			sep += "|---:"
		}
		return h, sep
	}
	h, sep := heads(partNames)
	w("\nThe checkpoint and restore phases in their parts (medians over the good runs, ms; `Report.Parts`): the kubelet's checkpoint call; CRIU's dump within it as the node agent's dump watch saw it (ms2m's watch thaws the app at the dump; stop-and-copy's only watches); the call's rest (kubelet and containerd hops, runc's and CRIU's setup, the root filesystem's diff, the archive); quiesce + resume, the sidecar calls around the call (ms2m); the image's build and push by the agent; the restore phase (the target's create call until the migrator saw it ready); the kubelet's pull of the checkpoint image by its Pulled Event; CRIU's restore by the last stamp of its restore.log; and the restore's rest.\n\n")
	w("| strategy | state (MiB) | runs%s |\n|---|---:|---:%s|\n", h, sep)
	for _, st := range stats {
		runs := 0
		for _, n := range st.PartRuns {
			runs = max(runs, n)
		}
		w("| %s | %d | %d%s |\n", st.name(), st.StateMiB, runs, cells(st.Parts, partNames))
	}
	h, sep = heads(stepNames)
	w("\nThe restore phase by node 2's containerd log (medians, ms; the bench reads it, the migrator does not): the create call, admission, scheduling and the kubelet's sync until the pod sandbox starts; the sandbox; the sidecar's pull, create and start; its startup probe until the kubelet pulls the app's image; that pull; CreateContainer of the app (containerd unpacks the checkpoint); StartContainer (runc's restore, CRIU's within it); until the migrator saw the pod ready.\n\n")
	w("| strategy | state (MiB) | runs%s |\n|---|---:|---:%s|\n", h, sep)
	for _, st := range stats {
		w("| %s | %d | %d%s |\n", st.name(), st.StateMiB, st.StepRuns, cells(st.Steps, stepNames))
	}
}

// name is st's strategy, and whether its migrations pulled ahead.
func (st memoryStat) name() string {
	if st.PullAhead {
		return string(st.Strategy) + " (pull ahead)"
	}
	return string(st.Strategy)
}

// markdownPullAhead compares, per strategy and size that ran both ways,
// the restore phase and the total without and with the pull ahead.
func markdownPullAhead(w func(string, ...any), stats []memoryStat) {
	var rows []string
	for _, off := range stats {
		if off.PullAhead || off.OK == 0 {
			continue
		}
		for _, on := range stats {
			if !on.PullAhead || on.Strategy != off.Strategy || on.StateMiB != off.StateMiB || on.OK == 0 {
				continue
			}
			rOff, rOn := off.Groups["restore"], on.Groups["restore"]
			rows = append(rows, fmt.Sprintf("| %s | %d | %d / %d | %s | %s | %s | %s | %s | %s |", off.Strategy, off.StateMiB, off.OK, on.OK,
				fmtMs0(rOff), fmtMs0(rOn), ratio(rOn, rOff), fmtS(off.Total.Median), fmtS(on.Total.Median), ratio(on.Total.Median, off.Total.Median)))
		}
	}
	if len(rows) == 0 {
		return
	}
	w("\nThe pull ahead side by side (medians over the good runs; each migration ran once without and once with it, in turn): the restore phase and the whole migration, and with / without.\n\n")
	w("| strategy | state (MiB) | good runs (without / with) | restore without (ms) | restore with (ms) | with / without | total without (s) | total with (s) | with / without |\n")
	w("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		w("%s\n", r)
	}
}
