package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
)

// memorySynth is a good run of s at mib MiB whose checkpoint, image and
// restore phases take moved ms in all, with CRIU's dump seen as dump ms
// (none for 0).
func memorySynth(s contract.Strategy, mib int, moved, dump float64) memoryRun {
	r := memoryRun{Strategy: s, StateMiB: mib, Rate: 10, migrationRound: synthRun(s, 10, 5000+moved, 4, 100, 0).migrationRound}
	r.Groups = map[string]float64{"checkpoint": moved / 4, "image": moved / 4, "restore": moved / 2}
	if dump > 0 {
		r.Report.Hold = &migrate.HoldTimings{CRIU: time.Duration(dump * float64(time.Millisecond))}
	}
	return r
}

// TestMemoryGoals: growth that keeps its ms per MiB is linear, growth
// whose ms per MiB doubles is not; the checkpoint is judged against
// CRIU's dump where the agent saw it; a failed run misses exactness.
func TestMemoryGoals(t *testing.T) {
	var runs []memoryRun
	for _, mib := range []int{10, 100, 1000} {
		runs = append(runs,
			memorySynth(contract.StrategyMS2M, mib, 1000+10*float64(mib), 20+float64(mib)), // linear; checkpoint (250+2.5/MiB) within 3× the dump
			memorySynth(contract.StrategyStopAndCopy, mib, 1000+float64(mib*mib)/50, 0),    // quadratic
		)
	}
	res := memoryResults{Sizes: []int{1000, 10, 100}, Strategies: memoryStrategies, Runs: runs}
	res.Summary = memorySummary(res.Runs)
	res.Goals = memoryGoals(res)
	checkVerdicts(t, res.Goals, map[string]string{
		"ms2m checkpoint + image + restore linear in state size (medians)":          "PASS",
		"stop-and-copy checkpoint + image + restore linear in state size (medians)": "MISS",
		"ms2m checkpoint phase against CRIU's own dump at 10 MiB (medians)":         "MISS", // 275 ms against 30 ms
		"ms2m checkpoint phase against CRIU's own dump at 1000 MiB (medians)":       "PASS", // 2750 ms against 1020 ms
		"every migration exact: lost and duplicated messages":                       "PASS",
	})

	bad := memorySynth(contract.StrategyMS2M, 100, 1, 0)
	bad.HashOK, bad.Error = false, "hash mismatch"
	res.Runs = append(res.Runs, bad)
	res.Summary = memorySummary(res.Runs)
	res.Goals = memoryGoals(res)
	checkVerdicts(t, res.Goals, map[string]string{"every migration exact: lost and duplicated messages": "MISS"})
	if st, _ := memoryStatOf(res.Summary, contract.StrategyMS2M, 100); st.Runs != 2 || st.OK != 1 || st.Moved != 2000 {
		t.Errorf("ms2m at 100 MiB: %+v, want 1 of 2 runs good and the good one's 2000 ms", st)
	}
}

// TestMemoryReport: the files, the CSV's columns and the section, and
// -from writes the same section again from results.json.
func TestMemoryReport(t *testing.T) {
	var runs []memoryRun
	for _, mib := range []int{10, 100, 1000} {
		runs = append(runs, memorySynth(contract.StrategyMS2M, mib, 1000+10*float64(mib), 400), memorySynth(contract.StrategyStopAndCopy, mib, 900+10*float64(mib), 0))
	}
	o := memoryOptions{out: filepath.Join(t.TempDir(), "out")}
	res := memoryResults{Command: "go -C hack/bench run . memory", Sizes: []int{10, 100, 1000}, Strategies: memoryStrategies, Rate: 10, WorkMs: 50, Runs: runs}
	res.Summary = memorySummary(res.Runs)
	res.Goals = memoryGoals(res)
	if err := writeMemory(o, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Files) != 4 {
		t.Errorf("figures %v, want time-vs-state and phases for each of the two strategies", res.Files)
	}
	for _, f := range res.Files {
		if !strings.Contains(f, "time-vs-state-") && !strings.Contains(f, "phases-") {
			t.Errorf("figure %s: want it named for the state axis", f)
		}
	}
	csv, err := os.ReadFile(filepath.Join(o.out, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(csv), "run,state_mib,strategy,pull_ahead,rate_msgs_per_s,ok,total_ms,processing_gap_ms,switch_ms,prepare_ms,checkpoint_ms,image_ms,restore_ms,") ||
		strings.Count(string(csv), "\n") != len(runs)+1 {
		t.Errorf("results.csv:\n%s", csv)
	}
	md, err := os.ReadFile(filepath.Join(o.out, "section.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| ms2m | 1000 | 1 of 1 | 16.00 |", "| 104 |", "| 400 |", "**PASS** ms2m checkpoint + image + restore linear"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("section.md lacks %q:\n%s", want, md)
		}
	}
	again := memoryOptions{out: filepath.Join(t.TempDir(), "again"), from: filepath.Join(o.out, "results.json")}
	if err := memoryAgain(again); err != nil {
		t.Fatal(err)
	}
	md2, err := os.ReadFile(filepath.Join(again.out, "section.md"))
	if err != nil {
		t.Fatal(err)
	}
	if string(md2) != string(md) {
		t.Errorf("-from wrote another section:\n%s\nwant:\n%s", md2, md)
	}
}

func TestParseMemoryFlags(t *testing.T) {
	o, err := parseMemoryFlags([]string{"-sizes", "1000,10,100,10", "-strategies", "ms2m"})
	if err != nil || len(o.sizes) != 3 || o.sizes[0] != 10 || o.sizes[2] != 1000 || len(o.strategies) != 1 {
		t.Errorf("parseMemoryFlags = %+v, %v; want sizes 10,100,1000 and ms2m", o, err)
	}
	for _, bad := range [][]string{{"-sizes", "x"}, {"-sizes", "-1"}, {"-strategies", "statefulset"}, {"-rate", "20"}, {"-runs", "0"}, {"-pull-ahead", "maybe"}, {"extra"}} {
		if _, err := parseMemoryFlags(bad); err == nil {
			t.Errorf("parseMemoryFlags(%q): want an error", bad)
		}
	}
}

// TestMemoryParts: the parts' medians and what was not measured, the
// restore's containerd steps, and the pull ahead side by side.
func TestMemoryParts(t *testing.T) {
	d := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	var runs []memoryRun
	for i, ahead := range []bool{false, false, true} {
		r := memorySynth(contract.StrategyMS2M, 100, 4000, 100)
		r.PullAhead = ahead
		r.Groups["restore"] = 2000 - 600*float64(map[bool]int{true: 1}[ahead])
		p := &migrate.Parts{Call: d(900), CRIUDump: d(100), Image: d(1000), Restore: d(r.Groups["restore"]), Pull: d(600), CRIURestore: d(200 + float64(i)*100)}
		if ahead {
			p.Pull, p.PulledAhead = 0, d(650)
		}
		r.Report.Parts = p
		r.RestoreSteps = &targetSteps{ToSandboxMs: 400, SandboxMs: 100, SidecarMs: 200, ProbesMs: 700, PullMs: 600, CreateMs: 50, StartMs: 250, ReadyMs: 100}
		runs = append(runs, r)
	}
	sc := memorySynth(contract.StrategyStopAndCopy, 100, 4000, 0)
	sc.Report.Parts = &migrate.Parts{Call: d(1000), Image: d(1000), Restore: d(2000), CRIURestore: d(300),
		Unmeasured: []string{migrate.PartCRIUDump + ": the node agent cannot watch for the dump", migrate.PartPull + ": no Pulled Event"}}
	runs = append(runs, sc)
	res := memoryResults{Command: "go -C hack/bench run . memory -pull-ahead both", Sizes: []int{100}, Strategies: memoryStrategies, Rate: 10, WorkMs: 50, Runs: runs}
	res.Summary = memorySummary(res.Runs)
	md := memoryMarkdown(res)
	for _, want := range []string{
		// ms2m without: checkpoint phase 1000, quiesce + resume 100, call 900, dump 100, rest 800, image 1000, restore 2000, pull 600, CRIU 250 (median of 200 and 300), rest 1150
		"| ms2m | 100 | 2 | 1,000 | 100 | 900 | 100 | 800 | 1,000 | 2,000 | 600 | 250 | not measured | 1,150 |",
		"| ms2m (pull ahead) | 100 | 1 | 1,000 | 100 | 900 | 100 | 800 | 1,000 | 1,400 | 0 | 400 | 650 | 1,000 |",
		"| stop-and-copy | 100 | 1 | 1,000 | 0 | 1,000 | not measured | not measured | 1,000 | 2,000 | not measured | 300 | not measured | not measured |",
		"| ms2m | 100 | 2 | 400 | 100 | 200 | 700 | 600 | 50 | 250 | 100 |",
		"| ms2m | 100 | 2 / 1 | 2,000 | 1,400 | 0.7× |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("section lacks %q:\n%s", want, md)
		}
	}
}
