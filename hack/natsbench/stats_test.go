package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestMedianAndPercentile(t *testing.T) {
	for name, tc := range map[string]struct {
		in             []float64
		wantMedian     float64
		wantP95        float64
		wantP50Nearest float64
	}{
		"none":  {in: nil},
		"one":   {in: []float64{7}, wantMedian: 7, wantP95: 7, wantP50Nearest: 7},
		"odd":   {in: []float64{3, 1, 2}, wantMedian: 2, wantP95: 3, wantP50Nearest: 2},
		"even":  {in: []float64{4, 1, 3, 2}, wantMedian: 2.5, wantP95: 4, wantP50Nearest: 2},
		"20":    {in: seq(20), wantMedian: 10.5, wantP95: 19, wantP50Nearest: 10},
		"100":   {in: seq(100), wantMedian: 50.5, wantP95: 95, wantP50Nearest: 50},
		"equal": {in: []float64{5, 5, 5}, wantMedian: 5, wantP95: 5, wantP50Nearest: 5},
	} {
		t.Run(name, func(t *testing.T) {
			in := append([]float64(nil), tc.in...)
			if got := median(in); got != tc.wantMedian {
				t.Errorf("median = %v, want %v", got, tc.wantMedian)
			}
			if got := percentile(in, 95); got != tc.wantP95 {
				t.Errorf("p95 = %v, want %v", got, tc.wantP95)
			}
			if got := percentile(in, 50); got != tc.wantP50Nearest {
				t.Errorf("p50 = %v, want %v", got, tc.wantP50Nearest)
			}
			if diff := cmp.Diff(tc.in, in); diff != "" {
				t.Errorf("the input was changed (-want +got):\n%s", diff)
			}
		})
	}
}

// seq is 1..n.
func seq(n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(i + 1)
	}
	return out
}

func TestSummarize(t *testing.T) {
	r := func(path string, round int, rate float64, chunks ...float64) result {
		return result{Path: path, Window: 1000, Work: "0s", Spin: "0s", Round: round, MsgPerS: rate, ChunkMs: chunks, BenchCPUUs: rate / 10, ServerCPUUs: 1}
	}
	other := result{Path: pathDirect, Window: 100, Work: "0s", Round: 1, MsgPerS: 1}
	results := []result{
		r(pathDirect, 1, 100, 1, 2), r(pathSidecar, 1, 90, 3), r(pathReplay, 1, 50, 4),
		r(pathDirect, 2, 200, 1), r(pathSidecar, 2, 200, 2), r(pathReplay, 2, 300),
		// Round 3 has no direct run: its rates count, no ratio.
		r(pathSidecar, 3, 10, 9),
		other,
	}
	got := summarize(results, results[0].key(), []string{pathDirect, pathSidecar, pathReplay, "absent"})
	want := []summary{
		{Path: pathDirect, Median: 150, P95ChunkMs: 2, Rounds: 2, BenchCPUUs: 15, ServerCPUUs: 1},
		{Path: pathSidecar, Median: 90, P95ChunkMs: 9, Ratios: []float64{0.9, 1}, Rounds: 3, BenchCPUUs: 9, ServerCPUUs: 1},
		{Path: pathReplay, Median: 175, P95ChunkMs: 4, Ratios: []float64{0.5, 1.5}, Rounds: 2, BenchCPUUs: 17.5, ServerCPUUs: 1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("summarize (-want +got):\n%s", diff)
	}
	if got := got[1].MedianRatio(); got != 0.95 {
		t.Errorf("sidecar median ratio = %v, want 0.95", got)
	}
}

func TestVerdict(t *testing.T) {
	for name, tc := range map[string]struct {
		ratios []float64
		goal   float64
		want   string
	}{
		"none":         {goal: 0.95, want: "—"},
		"at the goal":  {ratios: []float64{0.95}, goal: 0.95, want: "PASS"},
		"median above": {ratios: []float64{0.5, 0.96, 0.99}, goal: 0.95, want: "PASS"},
		"median below": {ratios: []float64{0.94, 0.99, 0.90}, goal: 0.95, want: "MISS"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := verdict(tc.ratios, tc.goal); got != tc.want {
				t.Errorf("verdict(%v, %v) = %q, want %q", tc.ratios, tc.goal, got, tc.want)
			}
		})
	}
}

func TestMarkdownTable(t *testing.T) {
	got := markdownTable("setting", []summary{
		{Path: pathDirect, Median: 1000, P95ChunkMs: 1.25, Rounds: 2, BenchCPUUs: 4, ServerCPUUs: 5.5},
		{Path: pathSidecar, Median: 900, P95ChunkMs: 2, Ratios: []float64{0.9, 0.96}, Rounds: 2},
	})
	for _, want := range []string{
		"| direct | 2 | 1000 | 1.2 | 4.0 / 5.5 | — | — | — | — |",
		"| sidecar | 2 | 900 | 2.0 | 0.0 / 0.0 | 93.0% | 90.0%, 96.0% | ≥ 95.0% | MISS |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

func TestParsers(t *testing.T) {
	if got, err := parseLoad("24.51 20.02 18.00 9/1200 4242\n"); err != nil || got != 24.51 {
		t.Errorf("parseLoad = %v, %v; want 24.51", got, err)
	}
	if _, err := parseLoad(""); err == nil {
		t.Error("parseLoad of nothing: want an error")
	}
	if got, err := parseWindows("100, 1000"); err != nil || !cmp.Equal(got, []int{100, 1000}) {
		t.Errorf("parseWindows = %v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "-1", "10,x", ","} {
		if _, err := parseWindows(bad); err == nil {
			t.Errorf("parseWindows(%q): want an error", bad)
		}
	}
	if got, err := parsePaths("replay,sidecar"); err != nil || !cmp.Equal(got, []string{pathSidecar, pathReplay}) {
		t.Errorf("parsePaths = %v, %v: want sidecar before replay", got, err)
	}
	if got, err := parsePaths("sidecar,relay,direct"); err != nil || !cmp.Equal(got, []string{pathDirect, pathRelay, pathSidecar}) {
		t.Errorf("parsePaths = %v, %v: want direct, relay, sidecar", got, err)
	}
	for _, bad := range []string{"replay", "direct,replay", "direct,bogus", ""} {
		if _, err := parsePaths(bad); err == nil {
			t.Errorf("parsePaths(%q): want an error", bad)
		}
	}
}

func TestChunkMs(t *testing.T) {
	t0 := time.Unix(0, 0)
	got := chunkMs(t0, []time.Time{t0.Add(2 * time.Millisecond), t0.Add(5500 * time.Microsecond)})
	if diff := cmp.Diff([]float64{2, 3.5}, got); diff != "" {
		t.Errorf("chunkMs (-want +got):\n%s", diff)
	}
}

func TestCounterValue(t *testing.T) {
	text := `# HELP ms2m_sidecar_nats_acks_total x
ms2m_sidecar_nats_acks_total 30000
ms2m_sidecar_nats_acks_waited_total 2.9e+04
ms2m_sidecar_other{a="b"} 3
`
	if got, err := counterValue(strings.NewReader(text), "ms2m_sidecar_nats_acks_waited_total"); err != nil || got != 29000 {
		t.Errorf("counterValue = %v, %v; want 29000", got, err)
	}
	if _, err := counterValue(strings.NewReader(text), "ms2m_sidecar_nats_missing"); err == nil {
		t.Error("a missing counter: want an error")
	}
}

func TestStatCPU(t *testing.T) {
	// A command name with a space and a parenthesis; utime 250, stime 50.
	stat := "4242 (nats server) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 100 0 0\n"
	got, err := statCPU(stat)
	if err != nil || got != 3*time.Second {
		t.Errorf("statCPU = %v, %v; want 3s", got, err)
	}
	if _, err := statCPU("4242 (x) S 1"); err == nil {
		t.Error("a short stat: want an error")
	}
}
