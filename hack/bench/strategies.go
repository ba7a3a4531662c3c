package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/migrate"
)

const (
	// strategyWorkMS is the consumer's work per message: μ = 20 msg/s, the
	// paper's setting.
	strategyWorkMS      = 50
	strategyServiceRate = 1000 / strategyWorkMS
	// strategyAfter is how long the producer goes on after the warm-up:
	// through the migration (a few seconds) and some time after it, so
	// that the target also consumes from the primary queue.
	strategyAfter = 15 * time.Second
	// strategySettle bounds the wait, once the producer is done, for the
	// target to have processed everything.
	strategySettle = 90 * time.Second
	// goalDowntimeRatio: ms2m's switch time at most 1% of stop-and-copy's.
	goalDowntimeRatio = 0.01
)

// strategiesResult is the strategies part: per rate, ms2m and
// stop-and-copy migrations of the same consumer between two real nodes.
type strategiesResult struct {
	Rounds          int            `json:"rounds"`
	WorkMs          int            `json:"workMsPerMessage"`
	Prefetch        int            `json:"prefetch"`
	WarmupSeconds   float64        `json:"warmupSeconds"`
	ProducerSeconds float64        `json:"producerSeconds"`
	Order           string         `json:"order"`
	Env             nodeEnv        `json:"env"`
	Rates           []strategyRate `json:"rates"`
}

type strategyRate struct {
	RateMsgsPerSec float64 `json:"rateMsgsPerSec"`
	// The processing gap (the downtime as the consumer sees it) over the
	// rounds that succeeded: mean, median, p95.
	MS2MGap spread `json:"ms2mProcessingGapMs"`
	SCGap   spread `json:"stopAndCopyProcessingGapMs"`
	// Medians over the rounds that succeeded. The downtime fields are the
	// switch time (Report.Downtime), under their earlier JSON names.
	MS2MDowntimeMs float64          `json:"ms2mDowntimeMedianMs"`
	SCDowntimeMs   float64          `json:"stopAndCopyDowntimeMedianMs"`
	MS2MTotalMs    float64          `json:"ms2mTotalMedianMs"`
	SCTotalMs      float64          `json:"stopAndCopyTotalMedianMs"`
	DowntimeRatio  float64          `json:"downtimeRatio"` // MS2MDowntimeMs / SCDowntimeMs
	GoalMet        bool             `json:"goalMet"`
	Failed         int              `json:"failed"` // migrations with an error or a wrong hash
	MS2MPhases     []phaseMedian    `json:"ms2mPhaseMedians"`
	SCPhases       []phaseMedian    `json:"stopAndCopyPhaseMedians"`
	MS2M           []migrationRound `json:"ms2m"`
	StopAndCopy    []migrationRound `json:"stopAndCopy"`
}

type phaseMedian struct {
	Name     string  `json:"name"`
	MedianMs float64 `json:"medianMs"`
}

// migrationRound is one migration.
type migrationRound struct {
	Round   int     `json:"round"`
	First   bool    `json:"ranFirst"` // before the other strategy's migration of the same round
	TotalMs float64 `json:"totalMs"`
	// SwitchMs is the migrator's Report.Downtime: the source's stop to
	// the target's consume of the primary queue, from sidecar clocks. Its
	// JSON name is the one earlier results files have.
	SwitchMs float64 `json:"downtimeMs"`
	// ProcessingGapMs is the downtime as the consumer sees it: the
	// longest interval overlapping the migration in which no instance
	// finished a message while one was waiting (journal.ProcessingGap),
	// and ProcessingGapStartMs when it began, from the migration's start.
	// Nil when the journals were not read (earlier results files).
	ProcessingGapMs      *float64      `json:"processingGapMs,omitempty"`
	ProcessingGapStartMs *float64      `json:"processingGapStartMs,omitempty"`
	Phases               []phaseMedian `json:"phasesMs"` // one each; MedianMs is the phase's time
	// StartedAfterMs is when the migration started, from the consumer's
	// first processed message; CountAtStart what it had processed by then.
	StartedAfterMs float64 `json:"startedAfterMs"`
	CountAtStart   int     `json:"countAtStart"`
	// The producer's messages and hash, and the restored consumer's.
	Produced   int    `json:"produced"`
	WantHash   string `json:"wantHash"`
	Count      int    `json:"count"`
	Hash       string `json:"hash"`
	HashOK     bool   `json:"hashOk"`
	Reconnects int    `json:"reconnects"`
	// SkippedRedeliveries counts redeliveries the restored consumer
	// dropped as already folded (a message ID at or below its last). The
	// consumers skip none unless told to (SKIP_REDELIVERIES), so anything
	// but 0 is a hidden duplicate and fails the round.
	SkippedRedeliveries int            `json:"skippedRedeliveries"`
	Error               string         `json:"error,omitempty"`
	Report              migrate.Report `json:"report"`
	// What `hack/bench paper` adds (migration.go): the whole round's wall
	// time, the phases in the paper's groups, the replay after the
	// source's stop, whether the producer still sent when the migration
	// ended, and, from the consumers' journals, the worst latency of a
	// message's first processing and the lost and repeated messages.
	WallMs float64            `json:"wallMs,omitempty"`
	Groups map[string]float64 `json:"phaseGroupsMs,omitempty"`
	// RestoreSteps split the restore phase by node 2's containerd log
	// (parts.go); nil where a line was not found.
	RestoreSteps      *targetSteps `json:"restoreSteps,omitempty"`
	ReplayAfterStopMs float64      `json:"replayAfterStopMs,omitempty"`
	ProducerOutlasted bool         `json:"producerOutlastedMigration,omitempty"`
	WorstLatencyMs    *float64     `json:"worstLatencyMs,omitempty"`
	Lost              *int         `json:"lost,omitempty"`
	Duplicated        *int         `json:"duplicated,omitempty"`
	// Missing says, for the first lost messages, which earlier consumer's
	// journal has them ("journal N", 0 the source, in the order the
	// consumers served) or "none": where to look.
	Missing map[int64]string `json:"missing,omitempty"`
}

func (m migrationRound) ok() bool { return m.Error == "" && m.HashOK }

// strategies runs the strategies part.
func (n *nodeLab) strategies(ctx context.Context, b *bench) (*strategiesResult, error) {
	l, err := n.get(ctx)
	if err != nil {
		return nil, err
	}
	producer, err := n.binary("examples/producer")
	if err != nil {
		return nil, err
	}
	res := &strategiesResult{
		Rounds: n.o.strategyRounds, WorkMs: strategyWorkMS, Prefetch: 1,
		WarmupSeconds: n.o.strategyWarmup.Seconds(), ProducerSeconds: (n.o.strategyWarmup + strategyAfter).Seconds(),
		Order: "per round, each rate in turn; within a round and rate ms2m and stop-and-copy take turns going first, alternating pair by pair",
		Env:   *n.env,
	}
	for _, rate := range n.o.strategyRates {
		res.Rates = append(res.Rates, strategyRate{RateMsgsPerSec: rate})
	}
	pair := 0
	for r := 1; r <= n.o.strategyRounds; r++ {
		for i, rate := range n.o.strategyRates {
			order := []contract.Strategy{contract.StrategyMS2M, contract.StrategyStopAndCopy}
			if pair%2 == 1 {
				slices.Reverse(order)
			}
			pair++
			for k, s := range order {
				progress("strategies: migrate", "strategy", s, "rate_msgs_per_s", rate, "round", fmt.Sprintf("%d/%d", r, n.o.strategyRounds))
				m, err := n.migration(ctx, b, l, producer, s, rate)
				if err != nil {
					return nil, err // the bench itself failed, not the migration
				}
				m.Round, m.First = r, k == 0
				if m.ok() {
					gap := "?"
					if m.ProcessingGapMs != nil {
						gap = fmtMs(*m.ProcessingGapMs)
					}
					progress("  done", "strategy", s, "processing_gap_ms", gap, "switch_ms", fmtMs(m.SwitchMs), "total_ms", fmtMs(m.TotalMs),
						"count", m.Count, "hash_ok", m.HashOK, "reconnects", m.Reconnects)
				} else {
					progress("  ERROR", "strategy", s, "rate_msgs_per_s", rate, "round", r, "error", m.Error)
				}
				if s == contract.StrategyMS2M {
					res.Rates[i].MS2M = append(res.Rates[i].MS2M, m)
				} else {
					res.Rates[i].StopAndCopy = append(res.Rates[i].StopAndCopy, m)
				}
			}
		}
	}
	for i := range res.Rates {
		res.Rates[i].summarise()
	}
	return res, nil
}

func (s *strategyRate) summarise() {
	med := func(rs []migrationRound) (down, total float64, gap spread, phases []phaseMedian) {
		var ds, ts, gs []float64
		byName := map[string][]float64{}
		var names []string
		for _, m := range rs {
			if !m.ok() {
				s.Failed++
				continue
			}
			ds, ts = append(ds, m.SwitchMs), append(ts, m.TotalMs)
			if m.ProcessingGapMs != nil {
				gs = append(gs, *m.ProcessingGapMs)
			}
			for _, p := range m.Phases {
				if _, seen := byName[p.Name]; !seen {
					names = append(names, p.Name)
				}
				byName[p.Name] = append(byName[p.Name], p.MedianMs)
			}
		}
		for _, name := range names {
			phases = append(phases, phaseMedian{Name: name, MedianMs: median(byName[name])})
		}
		return median(ds), median(ts), spreadOf(gs), phases
	}
	s.MS2MDowntimeMs, s.MS2MTotalMs, s.MS2MGap, s.MS2MPhases = med(s.MS2M)
	s.SCDowntimeMs, s.SCTotalMs, s.SCGap, s.SCPhases = med(s.StopAndCopy)
	if s.SCDowntimeMs > 0 {
		s.DowntimeRatio = s.MS2MDowntimeMs / s.SCDowntimeMs
	}
	s.GoalMet = s.Failed == 0 && len(s.MS2M) > 0 && len(s.StopAndCopy) > 0 && s.SCDowntimeMs > 0 && s.DowntimeRatio <= goalDowntimeRatio
}

// migration is one migration of the strategies part: a plain pod, the
// part's warm-up, and the producer for the warm-up and strategyAfter.
func (n *nodeLab) migration(ctx context.Context, b *bench, l *lab.Lab, producerBin string, s contract.Strategy, rate float64) (migrationRound, error) {
	return n.migrate(ctx, b, l, producerBin, migrationSpec{
		strategy: s, rate: rate, warmup: n.o.strategyWarmup, producerFor: n.o.strategyWarmup + strategyAfter,
	})
}

// waitConsumed waits until the consumer in pod has processed n messages,
// and returns when it saw that (polled every 50 ms).
func waitConsumed(ctx context.Context, pod *corev1.Pod, n int, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		st, err := lab.GetAppState(pod)
		if err == nil && st.Count >= n {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("the consumer in pod %s processed %d of %d messages within %s (last error: %v)", pod.Name, st.Count, n, timeout, err)
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return time.Time{}, err
		}
	}
}
