package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// median returns the middle of v (the mean of the two middles for an even
// count), 0 for none.
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	switch n := len(s); {
	case n == 0:
		return 0
	case n%2 == 1:
		return s[n/2]
	default:
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// percentile returns the nearest-rank p-th percentile of v (0 < p <= 100),
// 0 for none.
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// summary is one path's figures at one setting, against direct.
type summary struct {
	Path string
	// Median msg/s over the rounds.
	Median float64
	// P95ChunkMs is the 95th percentile, over every chunk of every round,
	// of the time one chunk of messages took: the slow stretches of a drain.
	P95ChunkMs float64
	// Ratios are this path's msg/s over direct's, round by round (rounds
	// without both are left out); empty for direct itself.
	Ratios []float64
	// Rounds counts this path's rounds.
	Rounds int
	// BenchCPUUs and ServerCPUUs are the medians of the rounds' CPU time
	// per message (µs) of the bench process and of the nats-server.
	BenchCPUUs, ServerCPUUs float64
	// LogServerCPUUs is the median of the log server's (0: none).
	LogServerCPUUs float64
}

// MedianRatio is the median of the per-round ratios.
func (s summary) MedianRatio() float64 { return median(s.Ratios) }

// summarize returns, for each path in paths that has results at setting
// key, its summary; ratios pair a round with direct's round of the same
// number.
func summarize(results []result, key string, paths []string) []summary {
	direct := map[int]float64{}
	for _, r := range results {
		if r.key() == key && r.Path == pathDirect {
			direct[r.Round] = r.MsgPerS
		}
	}
	var out []summary
	for _, p := range paths {
		s := summary{Path: p}
		var rates, chunks, benchCPU, serverCPU, logCPU []float64
		for _, r := range results {
			if r.key() != key || r.Path != p {
				continue
			}
			s.Rounds++
			rates = append(rates, r.MsgPerS)
			benchCPU, serverCPU = append(benchCPU, r.BenchCPUUs), append(serverCPU, r.ServerCPUUs)
			logCPU = append(logCPU, r.LogServerCPUUs)
			chunks = append(chunks, r.ChunkMs...)
			if d, ok := direct[r.Round]; ok && p != pathDirect && d > 0 {
				s.Ratios = append(s.Ratios, r.MsgPerS/d)
			}
		}
		if s.Rounds == 0 {
			continue
		}
		s.Median, s.P95ChunkMs = median(rates), percentile(chunks, 95)
		s.BenchCPUUs, s.ServerCPUUs, s.LogServerCPUUs = median(benchCPU), median(serverCPU), median(logCPU)
		out = append(out, s)
	}
	return out
}

// verdict is PASS when the median of the per-round ratios reaches goal,
// MISS otherwise, and "—" without ratios.
func verdict(ratios []float64, goal float64) string {
	switch {
	case len(ratios) == 0:
		return "—"
	case median(ratios) >= goal:
		return "PASS"
	default:
		return "MISS"
	}
}

// pct formats a ratio as a percentage with one decimal.
func pct(r float64) string { return strconv.FormatFloat(100*r, 'f', 1, 64) + "%" }

// pcts formats ratios as percentages, comma-separated.
func pcts(rs []float64) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = pct(r)
	}
	return strings.Join(s, ", ")
}

// goals are the issue's: a path's msg/s against direct's.
var goals = map[string]float64{pathSidecar: 0.95, pathReplay: 0.80}

// markdownTable renders the summaries of one setting as a Markdown table.
func markdownTable(setting string, ss []summary) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", setting)
	b.WriteString("| path | rounds | msg/s, median | p95 time per chunk (ms) | CPU µs/msg, bench / server | vs direct, median of rounds | per round | goal | result |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---|---|---|\n")
	for _, s := range ss {
		vs, goal, res := "—", "—", "—"
		if s.Path != pathDirect {
			vs = pct(s.MedianRatio())
			if g, ok := goals[s.Path]; ok {
				goal, res = "≥ "+pct(g), verdict(s.Ratios, g)
			}
		}
		per := pcts(s.Ratios)
		if per == "" {
			per = "—"
		}
		cpu := fmt.Sprintf("%.1f / %.1f", s.BenchCPUUs, s.ServerCPUUs)
		if s.LogServerCPUUs > 0 {
			cpu += fmt.Sprintf(" + log server %.1f", s.LogServerCPUUs)
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.1f | %s | %s | %s | %s | %s |\n", s.Path, s.Rounds, s.Median, s.P95ChunkMs, cpu, vs, per, goal, res)
	}
	return b.String()
}

// parseLoad reads the 1-minute load average from /proc/loadavg's text.
func parseLoad(s string) (float64, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, fmt.Errorf("loadavg %q: no fields", s)
	}
	return strconv.ParseFloat(f[0], 64)
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parseWindows reads a comma-separated list of positive numbers.
func parseWindows(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q: want positive numbers, comma-separated", s)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%q: want at least one window", s)
	}
	return out, nil
}

// parsePaths reads the paths to run, in the order they run in a round:
// replay replays the log the sidecar path wrote in the same round, so it
// needs sidecar before it.
func parsePaths(s string) ([]string, error) {
	want := map[string]bool{}
	for _, p := range splitList(s) {
		switch p {
		case pathDirect, pathRelay, pathSidecar, pathReplay:
			want[p] = true
		default:
			return nil, fmt.Errorf("-paths: unknown path %q (want direct, relay, sidecar, replay)", p)
		}
	}
	if want[pathReplay] && !want[pathSidecar] {
		return nil, fmt.Errorf("-paths=%s: replay replays the log the sidecar path writes; add sidecar", s)
	}
	var out []string
	for _, p := range []string{pathDirect, pathRelay, pathSidecar, pathReplay} {
		if want[p] {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-paths=%q: name at least one path", s)
	}
	return out, nil
}
