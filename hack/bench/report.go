package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// results is everything one run measured; it is written as JSON.
type results struct {
	Date           time.Time          `json:"date"`
	Command        string             `json:"command"`
	ElapsedSeconds float64            `json:"elapsedSeconds"`
	Machine        machine            `json:"machine"`
	Settings       settings           `json:"settings"`
	Throughput     []throughputResult `json:"throughput"`
	Latency        *latencyResult     `json:"latency"`
	Goals          []goal             `json:"goals"`
}

type machine struct {
	CPUs     int    `json:"cpus"`
	CPUModel string `json:"cpuModel,omitempty"`
	Kernel   string `json:"kernel"`
	RabbitMQ string `json:"rabbitmq"`
	Go       string `json:"go"`
}

type settings struct {
	Rounds          int     `json:"rounds"`
	Order           string  `json:"order"`
	MsgsPrefetch100 int     `json:"msgsPrefetch100"`
	MsgsPrefetch1   int     `json:"msgsPrefetch1"`
	LatencySeconds  float64 `json:"latencySecondsPerRound"`
	Quick           bool    `json:"quick"`
}

func settingsOf(o options) settings {
	return settings{
		Rounds: o.rounds, Order: "per round: direct, then sidecar (ABAB...)",
		MsgsPrefetch100: o.msgs, MsgsPrefetch1: o.msgsP1, LatencySeconds: o.duration.Seconds(), Quick: o.quick,
	}
}

// throughputResult is one prefetch's consumer throughput, one figure per
// round and path.
type throughputResult struct {
	Prefetch          int       `json:"prefetch"`
	Messages          int       `json:"messages"`
	BodyBytes         int       `json:"bodyBytes"`
	DirectMsgsPerSec  []float64 `json:"directMsgsPerSec"`
	SidecarMsgsPerSec []float64 `json:"sidecarMsgsPerSec"`
	DirectMedian      float64   `json:"directMedian"`
	SidecarMedian     float64   `json:"sidecarMedian"`
	Ratio             float64   `json:"ratio"` // SidecarMedian / DirectMedian
	// SidecarGateWaits is, per sidecar round, how many acks the sidecar
	// held for the replay log, and how long.
	SidecarGateWaits []gateWait `json:"sidecarGateWaits"`
}

type latencyResult struct {
	RateMsgsPerSec  int         `json:"rateMsgsPerSec"`
	Prefetch        int         `json:"prefetch"`
	DurationSeconds float64     `json:"durationSecondsPerRound"`
	WarmupSeconds   float64     `json:"warmupSecondsPerRound"`
	Method          string      `json:"method"`
	Direct          latencyPath `json:"direct"`
	Sidecar         latencyPath `json:"sidecar"`
	// AddedP99Ms, the goal's measure, compares the medians of the per-round
	// p99s: one round hit by a stall of the (shared, noisy) machine does
	// not decide it. AddedP99PooledMs compares the pooled p99s.
	AddedP99Ms       float64 `json:"addedP99Ms"`
	AddedP99PooledMs float64 `json:"addedP99PooledMs"`
}

type latencyPath struct {
	Pooled         percentiles   `json:"pooled"`
	MedianOfRounds percentiles   `json:"medianOfRounds"`
	Rounds         []percentiles `json:"rounds"`
}

type percentiles struct {
	Samples int     `json:"samples"`
	P50Ms   float64 `json:"p50Ms"`
	P90Ms   float64 `json:"p90Ms"`
	P99Ms   float64 `json:"p99Ms"`
	P999Ms  float64 `json:"p999Ms"`
	MaxMs   float64 `json:"maxMs"`
}

type goal struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Pass     bool   `json:"pass"`
}

const (
	goalThroughputRatio = 0.90 // of direct, at prefetch 100
	goalAddedP99Ms      = 1.0
)

func goals(res results) []goal {
	var gs []goal
	for _, t := range res.Throughput {
		if t.Prefetch == 100 {
			gs = append(gs, goal{
				Name: "consumer throughput at prefetch 100", Target: fmt.Sprintf("≥ %.0f%% of direct", goalThroughputRatio*100),
				Measured: pct(t.Ratio), Pass: t.Ratio >= goalThroughputRatio,
			})
		}
	}
	if l := res.Latency; l != nil {
		gs = append(gs, goal{
			Name: "added p99 latency at 1,000 msg/s (median of per-round p99s)", Target: fmt.Sprintf("≤ %g ms", goalAddedP99Ms),
			Measured: fmtSignedMs(l.AddedP99Ms), Pass: l.AddedP99Ms <= goalAddedP99Ms,
		})
	}
	return gs
}

// markdown is the block to paste into BENCHMARKS.md.
func markdown(res results) string {
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	m := res.Machine
	cpu := strconv.Itoa(m.CPUs) + " CPUs"
	if m.CPUModel != "" {
		cpu += " (" + m.CPUModel + ")"
	}
	w("\n### Sidecar overhead, %s\n\n", res.Date.Format("2006-01-02"))
	w("- Machine: %s, Linux %s, RabbitMQ %s, %s\n", cpu, m.Kernel, m.RabbitMQ, m.Go)
	w("- Command: `%s` (`make bench` runs it with `$(BENCHFLAGS)`)\n", res.Command)
	w("- Date: %s; the run took %s\n", res.Date.Format(time.RFC3339), (time.Duration(res.ElapsedSeconds) * time.Second).Round(time.Second))
	w("- Method: the same amqp091-go consumer, straight to the broker or through an in-process sidecar (tee to the replay log on, acks held until the log confirms), which shares the machine with the clients and RabbitMQ. ")
	w("Each case alternates direct and sidecar runs, %d round(s) of each. ", res.Settings.Rounds)
	w("Throughput: a fresh queue pre-filled with 100-byte messages, drained with manual acks, one ack per message, timed from basic.consume to the last ack; the median of the rounds. ")
	if l := res.Latency; l != nil {
		w("Latency: a publisher straight to the broker, paced at %d msg/s for %gs after a %gs warm-up, stamps each body with its send time; the consumer (prefetch %d, manual ack) subtracts it from the receive time; p50, p99 and max over all rounds' samples pooled (nearest rank); the goal is judged on the median of the per-round p99s, so that one round hit by a stall of the shared machine does not decide it.\n\n",
			l.RateMsgsPerSec, l.DurationSeconds, l.WarmupSeconds, l.Prefetch)
	}

	w("| Measure | Direct | Sidecar | Sidecar vs direct | Goal | Result |\n")
	w("|---|---:|---:|---:|---|---|\n")
	for _, t := range res.Throughput {
		target, result := "none (reported)", "–"
		if t.Prefetch == 100 {
			target, result = fmt.Sprintf("≥ %.0f%% of direct", goalThroughputRatio*100), passFail(t.Ratio >= goalThroughputRatio)
		}
		w("| Consumer throughput, prefetch %d, %s msgs (msg/s) | %s | %s | %s | %s | %s |\n",
			t.Prefetch, thousands(float64(t.Messages)), thousands(t.DirectMedian), thousands(t.SidecarMedian), pct(t.Ratio), target, result)
	}
	if l := res.Latency; l != nil {
		d, s := l.Direct.Pooled, l.Sidecar.Pooled
		dm, sm := l.Direct.MedianOfRounds, l.Sidecar.MedianOfRounds
		w("| Latency p50 at 1,000 msg/s, pooled (ms) | %s | %s | %s | | |\n", fmtMs(d.P50Ms), fmtMs(s.P50Ms), fmtSignedMs(s.P50Ms-d.P50Ms))
		w("| Latency p99 at 1,000 msg/s, pooled (ms) | %s | %s | %s | | |\n", fmtMs(d.P99Ms), fmtMs(s.P99Ms), fmtSignedMs(l.AddedP99PooledMs))
		w("| Latency p99 at 1,000 msg/s, median of rounds (ms) | %s | %s | %s | ≤ %g ms added | %s |\n", fmtMs(dm.P99Ms), fmtMs(sm.P99Ms), fmtSignedMs(l.AddedP99Ms), goalAddedP99Ms, passFail(l.AddedP99Ms <= goalAddedP99Ms))
		w("| Latency max at 1,000 msg/s, pooled (ms) | %s | %s | %s | | |\n", fmtMs(d.MaxMs), fmtMs(s.MaxMs), fmtSignedMs(s.MaxMs-d.MaxMs))
	}

	w("\nPer round, in run order:\n\n")
	for _, t := range res.Throughput {
		w("- Throughput, prefetch %d (msg/s): direct %s; sidecar %s; sidecar/direct within each round %s. Acks the sidecar held for the replay log: %s\n",
			t.Prefetch, joinRates(t.DirectMsgsPerSec), joinRates(t.SidecarMsgsPerSec), joinRatios(t.DirectMsgsPerSec, t.SidecarMsgsPerSec),
			joinGateWaits(t.SidecarGateWaits, t.Messages))
	}
	if l := res.Latency; l != nil {
		w("- Latency p50/p99/max (ms): direct %s; sidecar %s (%s samples per path)\n",
			joinLatency(l.Direct.Rounds), joinLatency(l.Sidecar.Rounds), thousands(float64(l.Direct.Pooled.Samples)))
	}
	return sb.String()
}

// machineInfo describes the machine. The RabbitMQ version comes from
// rabbitmqctl if it answers, else from the AMQP handshake.
func machineInfo(ctx context.Context, serverVersion string) machine {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), CPUModel: cpuModel()}
	m.Kernel = command(ctx, "uname", "-r")
	if m.Kernel == "" {
		b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.RabbitMQ = command(ctx, "rabbitmqctl", "version")
	if m.RabbitMQ == "" && serverVersion != "" {
		m.RabbitMQ = serverVersion + " (from the AMQP handshake)"
	}
	return m
}

// command runs a short command and returns its first line of output, or ""
// if it fails.
func command(ctx context.Context, name string, args ...string) string {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func passFail(ok bool) string {
	if ok {
		return "PASS"
	}
	return "**FAIL**"
}

func pct(r float64) string { return fmt.Sprintf("%.1f%%", r*100) }

func fmtMs(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }

func fmtSignedMs(v float64) string { return fmt.Sprintf("%+.3f ms", v) }

// thousands formats v rounded to an integer, with commas.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func joinRates(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = thousands(x)
	}
	return strings.Join(parts, ", ")
}

func joinRatios(direct, sidecar []float64) string {
	parts := make([]string, min(len(direct), len(sidecar)))
	for i := range parts {
		parts[i] = pct(sidecar[i] / direct[i])
	}
	return strings.Join(parts, ", ")
}

func joinGateWaits(gws []gateWait, n int) string {
	parts := make([]string, len(gws))
	for i, g := range gws {
		parts[i] = fmt.Sprintf("%s (mean %s ms)", pct(float64(g.AcksWaited)/float64(n)), fmtMs(g.meanMs()))
	}
	return strings.Join(parts, ", ")
}

func joinLatency(ps []percentiles) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = fmtMs(p.P50Ms) + "/" + fmtMs(p.P99Ms) + "/" + fmtMs(p.MaxMs)
	}
	return strings.Join(parts, ", ")
}
