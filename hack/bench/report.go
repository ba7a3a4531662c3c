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

	"github.com/ms2m/ms2m/internal/control"
)

// results is everything one run measured; it is written as JSON.
type results struct {
	Date           time.Time `json:"date"`
	Command        string    `json:"command"`
	ElapsedSeconds float64   `json:"elapsedSeconds"`
	// PartSeconds is how long each part that ran took.
	PartSeconds map[string]float64 `json:"partSeconds"`
	Machine     machine            `json:"machine"`
	Settings    settings           `json:"settings"`
	Throughput  []throughputResult `json:"throughput,omitempty"`
	Latency     *latencyResult     `json:"latency,omitempty"`
	Replay      *replayResult      `json:"replay,omitempty"`
	Handover    *handoverResult    `json:"handover,omitempty"`
	CRIU        *criuResult        `json:"criu,omitempty"`
	Strategies  *strategiesResult  `json:"strategies,omitempty"`
	Goals       []goal             `json:"goals"`
}

type machine struct {
	CPUs     int    `json:"cpus"`
	CPUModel string `json:"cpuModel,omitempty"`
	Kernel   string `json:"kernel"`
	RabbitMQ string `json:"rabbitmq"`
	Go       string `json:"go"`
}

type settings struct {
	Parts                 []string  `json:"parts"`
	Rounds                int       `json:"rounds"`
	Order                 string    `json:"order"`
	MsgsPrefetch100       int       `json:"msgsPrefetch100"`
	MsgsPrefetch1         int       `json:"msgsPrefetch1"`
	LatencySeconds        float64   `json:"latencySecondsPerRound"`
	ReplayMsgs            int       `json:"replayMsgs"`
	HandoverRounds        int       `json:"handoverRounds"`
	HandoverRates         []float64 `json:"handoverRatesMsgsPerSec"`
	HandoverWarmupSeconds float64   `json:"handoverWarmupSeconds"`
	HandoverMaxLag        uint64    `json:"handoverMaxLag"`
	Quick                 bool      `json:"quick"`
}

func settingsOf(o options) settings {
	return settings{
		Parts: o.parts, Rounds: o.rounds, Order: "per round: direct, then sidecar or replay (ABAB...); handover: per round, each rate in turn",
		MsgsPrefetch100: o.msgs, MsgsPrefetch1: o.msgsP1, LatencySeconds: o.duration.Seconds(),
		ReplayMsgs: o.replayMsgs, HandoverRounds: o.handoverRounds, HandoverRates: o.handoverRates,
		HandoverWarmupSeconds: o.handoverWarmup.Seconds(), HandoverMaxLag: o.handoverMaxLag, Quick: o.quick,
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
	// DirectBrokerUsPerMsg and SidecarBrokerUsPerMsg are, per round, the
	// broker's CPU time per message over the drain, in µs (empty or 0 when
	// the broker is not a local process).
	DirectBrokerUsPerMsg  []float64 `json:"directBrokerUsPerMsg,omitempty"`
	SidecarBrokerUsPerMsg []float64 `json:"sidecarBrokerUsPerMsg,omitempty"`
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

// replayResult is the replay throughput case: one figure per round and
// path.
type replayResult struct {
	Messages         int           `json:"messages"`
	BodyBytes        int           `json:"bodyBytes"`
	Prefetch         int           `json:"prefetch"`
	DirectMsgsPerSec []float64     `json:"directMsgsPerSec"`
	Replay           []replayRound `json:"replay"`
	DirectMedian     float64       `json:"directMedian"`
	ReplayMedian     float64       `json:"replayMedian"`
	// ReplayFromStartMedian counts from the call that starts the target
	// sidecar instead of from basic.consume.
	ReplayFromStartMedian float64 `json:"replayFromStartMedian"`
	Ratio                 float64 `json:"ratio"` // ReplayMedian / DirectMedian
}

type replayRound struct {
	MsgsPerSec          float64 `json:"msgsPerSec"`          // from basic.consume to the last ack
	MsgsPerSecFromStart float64 `json:"msgsPerSecFromStart"` // from sidecar.Start to the last ack
	SidecarStartMs      float64 `json:"sidecarStartMs"`      // how long sidecar.Start took
}

// handoverResult is the handover case: per rate, one handover per round.
type handoverResult struct {
	WorkMs        float64        `json:"workMsPerMessage"`
	Prefetch      int            `json:"prefetch"`
	WarmupSeconds float64        `json:"warmupSeconds"`
	AfterSeconds  float64        `json:"afterSeconds"` // the producer's run after the handover
	MaxLag        uint64         `json:"maxLag"`
	Rates         []handoverRate `json:"rates"`
}

type handoverRate struct {
	RateMsgsPerSec   float64 `json:"rateMsgsPerSec"`
	DowntimeMedianMs float64 `json:"downtimeMedianMs"`
	DowntimeMaxMs    float64 `json:"downtimeMaxMs"`
	StopMedianMs     float64 `json:"stopMedianMs"`
	// StopToFirstPrimaryMedianMs is over the rounds in which the target got
	// a primary delivery; nil if none did.
	StopToFirstPrimaryMedianMs *float64        `json:"stopToFirstPrimaryMedianMs"`
	CallMedianMs               float64         `json:"handoverCallMedianMs"`
	Lost                       int             `json:"lost"`       // all rounds
	Duplicated                 int             `json:"duplicated"` // all rounds
	ExactRounds                int             `json:"exactRounds"`
	UnsteadyRounds             int             `json:"unsteadyRounds"` // handed over before the consumers caught up
	Rounds                     []handoverRound `json:"rounds"`
}

// handoverRound is one handover. Times are from the sidecars' clocks
// (control.Timings), relative to the start of the source's stop.
type handoverRound struct {
	Produced  int    `json:"produced"`
	CutoffID  uint64 `json:"cutoffId"`
	LagAtStop uint64 `json:"lagAtStop"`
	// DowntimeMs is Timings.Downtime: from the start of the stop until the
	// broker confirmed the target's consume of the primary queue.
	DowntimeMs           float64  `json:"downtimeMs"`
	StopMs               float64  `json:"stopMs"` // until the cutoff marker was durable
	StopToLastReplayedMs *float64 `json:"stopToLastReplayedMs"`
	StopToFirstPrimaryMs *float64 `json:"stopToFirstPrimaryMs"`
	CallMs               float64  `json:"handoverCallMs"` // control.Handover, wall clock, catch-up wait included
	// Where the downtime went: messages published (confirmed) and not yet
	// processed by the source when the stop started, and when the source's
	// app acked its last message and the target's app the replayed cutoff
	// message (bench clock, relative to the stop's start).
	BacklogAtStop      int      `json:"backlogAtStop"`
	TargetBehindAtStop int      `json:"targetBehindAtStop"` // replayed messages up to the cutoff its app had not processed
	SourceLastAckMs    float64  `json:"sourceLastAckMs"`
	TargetCutoffAckMs  *float64 `json:"targetCutoffAckMs"`
	// SteadyWaitMs is how long, after the warm-up, the bench waited for
	// both consumers to catch up before it called control.Handover; Steady
	// is false if they had not within 30 s.
	SteadyWaitMs float64 `json:"steadyWaitMs"`
	Steady       bool    `json:"steady"`
	// Exactness: what each consumer processed, by message ID.
	SourceProcessed  int  `json:"sourceProcessed"`
	TargetProcessed  int  `json:"targetProcessed"`
	TargetReplayed   int  `json:"targetReplayed"`
	TargetPrimary    int  `json:"targetPrimary"`
	Lost             int  `json:"lost"`            // IDs 1..Produced the target never processed
	Duplicated       int  `json:"duplicated"`      // processings by the target beyond the first
	SplitLost        int  `json:"splitLost"`       // the same over the source's and the target's primary share
	SplitDuplicated  int  `json:"splitDuplicated"` // the same
	ReplayMismatches int  `json:"replayMismatches"`
	Exact            bool `json:"exact"`

	Timings control.Timings `json:"timings"`
}

func (h *handoverRate) summarise() {
	var down, stop, call, first []float64
	for _, r := range h.Rounds {
		down, stop, call = append(down, r.DowntimeMs), append(stop, r.StopMs), append(call, r.CallMs)
		if r.StopToFirstPrimaryMs != nil {
			first = append(first, *r.StopToFirstPrimaryMs)
		}
		h.Lost += max(r.Lost, r.SplitLost)
		h.Duplicated += max(r.Duplicated, r.SplitDuplicated)
		if r.Exact {
			h.ExactRounds++
		}
		if !r.Steady {
			h.UnsteadyRounds++
		}
	}
	h.DowntimeMedianMs, h.DowntimeMaxMs = median(down), slices.Max(down)
	h.StopMedianMs, h.CallMedianMs = median(stop), median(call)
	if len(first) > 0 {
		h.StopToFirstPrimaryMedianMs = new(median(first))
	}
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
	goalReplayRatio     = 0.80 // of direct
	goalDowntimeMs      = 100.0
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
	if r := res.Replay; r != nil {
		gs = append(gs, goal{
			Name: "replay throughput at prefetch 100", Target: fmt.Sprintf("≥ %.0f%% of direct", goalReplayRatio*100),
			Measured: pct(r.Ratio), Pass: r.Ratio >= goalReplayRatio,
		})
	}
	if h := res.Handover; h != nil {
		for _, hr := range h.Rates {
			gs = append(gs, goal{
				Name: fmt.Sprintf("handover switch time at %g msg/s (median of %d)", hr.RateMsgsPerSec, len(hr.Rounds)), Target: fmt.Sprintf("≤ %g ms", goalDowntimeMs),
				Measured: fmtMs(hr.DowntimeMedianMs) + " ms", Pass: hr.DowntimeMedianMs <= goalDowntimeMs,
			}, goal{
				Name: fmt.Sprintf("handover exactness at %g msg/s", hr.RateMsgsPerSec), Target: "0 lost, 0 duplicated",
				Measured: fmt.Sprintf("%d lost, %d duplicated; %d of %d rounds exact", hr.Lost, hr.Duplicated, hr.ExactRounds, len(hr.Rounds)),
				Pass:     hr.ExactRounds == len(hr.Rounds),
			})
		}
	}
	return append(gs, nodeGoals(res)...)
}

// markdown is the block to paste into BENCHMARKS.md: the run, then a
// section per part that ran.
func markdown(res results) string {
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	m := res.Machine
	cpu := strconv.Itoa(m.CPUs) + " CPUs"
	if m.CPUModel != "" {
		cpu += " (" + m.CPUModel + ")"
	}
	w("\n### Sidecar bench, %s\n\n", res.Date.Format("2006-01-02"))
	w("- Machine: %s, Linux %s, RabbitMQ %s, %s\n", cpu, m.Kernel, m.RabbitMQ, m.Go)
	w("- Command: `%s` (`make bench` runs it with `$(BENCHFLAGS)`)\n", res.Command)
	took := make([]string, 0, len(res.Settings.Parts))
	for _, p := range res.Settings.Parts {
		took = append(took, p+" "+time.Duration(res.PartSeconds[p]*float64(time.Second)).Round(100*time.Millisecond).String())
	}
	w("- Date: %s; the run took %s (%s)\n", res.Date.Format(time.RFC3339), (time.Duration(res.ElapsedSeconds) * time.Second).Round(time.Second), strings.Join(took, ", "))
	if len(res.Throughput) > 0 || res.Latency != nil {
		markdownOverhead(w, res)
	}
	if res.Replay != nil {
		markdownReplay(w, res.Replay, res.Settings.Rounds)
	}
	if res.Handover != nil {
		markdownHandover(w, res.Handover)
	}
	if res.CRIU != nil {
		markdownCRIU(w, res.CRIU)
	}
	if res.Strategies != nil {
		markdownStrategies(w, res.Strategies)
	}
	return sb.String()
}

func markdownOverhead(w func(string, ...any), res results) {
	w("\n#### Sidecar overhead\n\n")
	w("Method: the same amqp091-go consumer, straight to the broker or through an in-process sidecar (tee to the replay log on, acks held until the log confirms), which shares the machine with the clients and RabbitMQ. ")
	w("Each case alternates direct and sidecar runs, %d round(s) of each. ", res.Settings.Rounds)
	w("Throughput: a fresh queue pre-filled with 100-byte messages, drained with manual acks, one ack per message, timed from basic.consume to the last ack; the median of the rounds. ")
	if l := res.Latency; l != nil {
		w("Latency: a publisher straight to the broker, paced at %d msg/s for %gs after a %gs warm-up, stamps each body with its send time; the consumer (prefetch %d, manual ack) subtracts it from the receive time; p50, p99 and max over all rounds' samples pooled (nearest rank); the goal is judged on the median of the per-round p99s, so that one round hit by a stall of the shared machine does not decide it.",
			l.RateMsgsPerSec, l.DurationSeconds, l.WarmupSeconds, l.Prefetch)
	}
	w("\n\n")
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
		if len(t.DirectBrokerUsPerMsg) > 0 && t.DirectBrokerUsPerMsg[0] > 0 {
			w("- Broker CPU per message over the drain, prefetch %d (µs): direct %s; sidecar %s\n",
				t.Prefetch, joinFloats(t.DirectBrokerUsPerMsg), joinFloats(t.SidecarBrokerUsPerMsg))
		}
	}
	if l := res.Latency; l != nil {
		w("- Latency p50/p99/max (ms): direct %s; sidecar %s (%s samples per path)\n",
			joinLatency(l.Direct.Rounds), joinLatency(l.Sidecar.Rounds), thousands(float64(l.Direct.Pooled.Samples)))
	}
}

func markdownReplay(w func(string, ...any), r *replayResult, rounds int) {
	w("\n#### Replay throughput\n\n")
	w("Method: a target sidecar (replay start 0, cutoff %s) replays a replay log of %s delivery records with %d-byte bodies, written beforehand as a source sidecar writes them, to an amqp091-go consumer (prefetch %d, one manual ack per message), timed from basic.consume to the ack of the %s-th delivery. ",
		thousands(float64(r.Messages)), thousands(float64(r.Messages)), r.BodyBytes, r.Prefetch, thousands(float64(r.Messages)))
	w("Direct: the same consumer drains a queue pre-filled with as many messages of the same size, straight from the broker. ")
	w("%d round(s), each a direct run and then a replay run, with a fresh log, queue and target sidecar; the median of the rounds. ", rounds)
	w("The target starts following the log when it starts, before the consumer connects; \"from sidecar start\" also counts the start (opening the log).\n\n")
	w("| Measure | Direct | Replay | Replay vs direct | Goal | Result |\n")
	w("|---|---:|---:|---:|---|---|\n")
	w("| Consumer throughput, prefetch %d, %s msgs (msg/s) | %s | %s | %s | ≥ %.0f%% of direct | %s |\n",
		r.Prefetch, thousands(float64(r.Messages)), thousands(r.DirectMedian), thousands(r.ReplayMedian), pct(r.Ratio), goalReplayRatio*100, passFail(r.Ratio >= goalReplayRatio))
	w("| The same, replay timed from sidecar start (msg/s) | %s | %s | %s | none (reported) | – |\n",
		thousands(r.DirectMedian), thousands(r.ReplayFromStartMedian), pct(r.ReplayFromStartMedian/r.DirectMedian))
	replay, fromStart, start := make([]float64, len(r.Replay)), make([]float64, len(r.Replay)), make([]string, len(r.Replay))
	for i, run := range r.Replay {
		replay[i], fromStart[i], start[i] = run.MsgsPerSec, run.MsgsPerSecFromStart, fmtMs(run.SidecarStartMs)
	}
	w("\nPer round, in run order (msg/s): direct %s; replay %s; replay/direct within each round %s; replay from sidecar start %s (the start took %s ms)\n",
		joinRates(r.DirectMsgsPerSec), joinRates(replay), joinRatios(r.DirectMsgsPerSec, replay), joinRates(fromStart), strings.Join(start, ", "))
}

func markdownHandover(w func(string, ...any), h *handoverResult) {
	w("\n#### Handover switch time\n\n")
	w("Method: a source sidecar and a target sidecar in replay mode (replay start 0, cutoff from the marker) on one fresh replay log, each in front of a consumer like examples/consumer (prefetch %d, %g ms of work per message, then the ack: %d msg/s at most); ",
		h.Prefetch, h.WorkMs, handoverServiceRate)
	w("a producer straight to the broker publishes at a steady rate λ with publisher confirms, message IDs 1..N. After %gs plus a random part of one publish interval (so that the stop falls at a random point of the producer's cycle), and once both consumers have caught up (the source has at most one published message left, the target's app has processed all but at most one of the source's; `control.Handover`'s lag counts replayed messages handed to the app, not processed), ",
		h.WarmupSeconds)
	w("`control.Handover` (max lag %d) stops the source at a cutoff; the target replays up to it and switches to the primary queue; the producer goes on for %gs. ", h.MaxLag, h.AfterSeconds)
	w("The switch time is `Timings.Downtime`: from the start of the source's stop until the broker confirmed the target's consume of the primary queue (sidecar clocks); no checkpoint is taken here, so there is no freeze to add. ")
	w("Exact: the target (which starts empty) processed every ID 1..N exactly once, the source's share plus the target's share after the cutoff is N with no ID twice, the replayed deliveries are the source's in its order, and the source processed exactly the cutoff ID's count. ")
	w("The rates take turns, round by round.\n\n")
	w("| λ (msg/s) | Rounds | Switch time median (ms) | Switch time max (ms) | Stop → cutoff durable, median (ms) | Stop → first primary delivery, median (ms) | Handover call, median (ms) | Lost / duplicated | Exact rounds | Goal | Result |\n")
	w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, r := range h.Rates {
		w("| %g | %d | %s | %s | %s | %s | %s | %d / %d | %d of %d | median ≤ %g ms, exact | %s |\n",
			r.RateMsgsPerSec, len(r.Rounds), fmtMs(r.DowntimeMedianMs), fmtMs(r.DowntimeMaxMs), fmtMs(r.StopMedianMs),
			fmtOptMs(r.StopToFirstPrimaryMedianMs), fmtMs(r.CallMedianMs), r.Lost, r.Duplicated, r.ExactRounds, len(r.Rounds),
			goalDowntimeMs, passFail(r.DowntimeMedianMs <= goalDowntimeMs && r.ExactRounds == len(r.Rounds)))
	}
	w("\nPer round, in run order: switch time in ms (cutoff ID; at the stop, messages published but not yet processed by the source, and replayed messages up to the cutoff not yet processed by the target; the source app's last ack and the target app's ack of the replayed cutoff message, ms after the stop started; how long the bench waited for both to catch up, ms):\n\n")
	for _, r := range h.Rates {
		parts := make([]string, len(r.Rounds))
		for i, rd := range r.Rounds {
			parts[i] = fmt.Sprintf("%s (%d; %d, %d; %s, %s; %s)", fmtMs(rd.DowntimeMs), rd.CutoffID, rd.BacklogAtStop, rd.TargetBehindAtStop,
				fmtMs(rd.SourceLastAckMs), fmtOptMs(rd.TargetCutoffAckMs), fmtMs(rd.SteadyWaitMs))
			if !rd.Steady {
				parts[i] += " **not caught up**"
			}
		}
		w("- λ = %g msg/s: %s\n", r.RateMsgsPerSec, strings.Join(parts, "; "))
	}
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
		parts[i] = fmt.Sprintf("%s (mean %s ms; %.1f records per log write; %s of acks coalesced)", pct(float64(g.AcksWaited)/float64(n)), fmtMs(g.meanMs()), g.recordsPerWrite(), pct(float64(g.AcksCoalesced)/float64(n)))
	}
	return strings.Join(parts, ", ")
}

func joinFloats(fs []float64) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = fmt.Sprintf("%.1f", f)
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
