package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestDrainPoints: the sweep runs each point once, the limit sweep's
// points grouped by limit so that ms2m is re-installed once per limit.
func TestDrainPoints(t *testing.T) {
	for name, tc := range map[string]struct {
		o    drainBenchOptions
		want []drainPoint
	}{
		"defaults": {
			o:    drainBenchOptions{consumers: []int{1, 4, 8, 16}, limits: []int{1, 2, 4}, atLimit: 2, atCount: 8},
			want: []drainPoint{{8, 1}, {1, 2}, {4, 2}, {8, 2}, {16, 2}, {8, 4}},
		},
		"the sweeps' limit not among the limits": {
			o:    drainBenchOptions{consumers: []int{1, 8}, limits: []int{1, 4}, atLimit: 2, atCount: 8},
			want: []drainPoint{{8, 1}, {8, 4}, {1, 2}, {8, 2}},
		},
		"one point": {
			o:    drainBenchOptions{consumers: []int{4}, limits: []int{2}, atLimit: 2, atCount: 4},
			want: []drainPoint{{4, 2}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.o.points()); diff != "" {
				t.Errorf("points (-want +got):\n%s", diff)
			}
		})
	}
}

func drainSynth(n, limit int, drainMs float64, gaps ...float64) drainResult {
	r := drainResult{drainPoint: drainPoint{n, limit}, Round: 1, DrainMs: drainMs}
	for i := range n {
		g := gaps[i%len(gaps)]
		r.Pods = append(r.Pods, drainPod{App: "a", Node: "ms2m-node-2", Strategy: "ms2m", TotalMs: 10000, DowntimeMs: 5, ProcessingGapMs: &g,
			Produced: 100, Count: 100, HashOK: true})
	}
	return r
}

// TestDrainReport: medians and p95 over the pods of the good drains only,
// the goal misses on a failed drain or a wrong hash, and the files: two
// figures, the CSV with a row per pod, the section, and -from writes the
// same section again.
func TestDrainReport(t *testing.T) {
	res := drainResults{Command: "go -C hack/bench run . drain", Rate: 10, WorkMs: 50, Warmup: 30, AtLimit: 2, AtCount: 4, Drains: []drainResult{
		drainSynth(1, 2, 20000, 300),
		drainSynth(4, 2, 40000, 100, 200, 300, 400),
		drainSynth(4, 1, 70000, 100),
	}}
	bad := drainSynth(4, 2, 90000, 5000)
	bad.Pods[3].HashOK, bad.Pods[3].Error = false, "count 99"
	res.Drains = append(res.Drains, bad)
	res.Summary = drainSummary(res.Drains)
	res.Goals = drainGoals(res)
	checkVerdicts(t, res.Goals, map[string]string{"every drain ends by itself with every consumer moved and exact": "MISS"})
	var at42 drainStat
	for _, st := range res.Summary {
		if st.drainPoint == (drainPoint{4, 2}) {
			at42 = st
		}
	}
	if at42.Drains != 2 || at42.OK != 1 || at42.Drain.Median != 40000 || at42.GapPods != 4 || at42.Gap.Median != 250 || at42.Gap.P95 != 400 {
		t.Errorf("4 consumers at limit 2: %+v, want the good drain's 40 s and its gaps (median 250, p95 400)", at42)
	}

	o := drainBenchOptions{out: filepath.Join(t.TempDir(), "out")}
	if err := writeDrain(o, &res); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range res.Files {
		names = append(names, filepath.Base(f))
	}
	if diff := cmp.Diff([]string{"time-vs-consumers-limit-2.png", "time-vs-limit-4-consumers.png"}, names); diff != "" {
		t.Errorf("figures (-want +got):\n%s", diff)
	}
	csv, err := os.ReadFile(filepath.Join(o.out, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if rows := strings.Count(string(csv), "\n"); rows != 1+1+4+4+4 {
		t.Errorf("results.csv has %d lines, want a header and a row per pod (13)", rows)
	}
	md, err := os.ReadFile(filepath.Join(o.out, "section.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "| 4 | 2 | 1 of 2 (0) | 40.00 |") {
		t.Errorf("section.md lacks the row of 4 consumers at limit 2:\n%s", md)
	}
	o2 := drainBenchOptions{out: filepath.Join(t.TempDir(), "again"), from: filepath.Join(o.out, "results.json")}
	if err := drainAgain(o2); err != nil {
		t.Fatal(err)
	}
	md2, err := os.ReadFile(filepath.Join(o2.out, "section.md"))
	if err != nil {
		t.Fatal(err)
	}
	if string(md2) != string(md) {
		t.Errorf("-from wrote another section:\n%s\nwant\n%s", md2, md)
	}
}
