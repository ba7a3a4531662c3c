package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ms2m/ms2m/e2e/cluster"
	"github.com/ms2m/ms2m/e2e/lab"
	"github.com/ms2m/ms2m/e2e/lab/journal"
	"github.com/ms2m/ms2m/internal/contract"
	"github.com/ms2m/ms2m/internal/inject"
	"github.com/ms2m/ms2m/internal/migrate"
)

// migrationSpec is one migration of a fresh consumer between the nodes.
type migrationSpec struct {
	strategy contract.Strategy
	rate     float64 // the producer's, msg/s
	// warmup is how long the consumer consumes before the migration;
	// producerFor how long the producer sends in all.
	warmup, producerFor time.Duration
	// statefulSet makes the consumer a StatefulSet's pod (the lab's
	// webhook must run); otherwise it is a plain pod.
	statefulSet bool
	replayMax   time.Duration       // T_replay_max for ms2m-cutoff; 0 is the default
	cutoff      contract.CutoffRule // ms2m-cutoff's rule; "" is the default
	stateMiB    int                 // extra state in the consumer's memory (STATE_MB); 0 for none
	pullAhead   bool                // migrate.Plan.PullAhead
}

// migrate starts a fresh consumer on node 1 and a producer at spec.rate,
// migrates the consumer to node 2 by spec.strategy once it has consumed
// for the warm-up, waits for the producer to finish and the target to
// process everything, and compares the target's hash with the
// producer's. Each consumer's journal (GET /folds) is read as it stops
// serving, for the processing gap, the worst latency and the lost and
// repeated messages. A failed migration, a wrong hash or a skipped
// redelivery is reported in the round; an error is returned only when the
// bench could not run the migration at all.
func (n *nodeLab) migrate(ctx context.Context, b *bench, l *lab.Lab, producerBin string, spec migrationSpec) (m migrationRound, err error) {
	began := time.Now()
	defer func() { m.WallMs = ms(time.Since(began)) }()
	name := fmt.Sprintf("bench-%s-%d", shortName(spec.strategy), time.Now().UnixNano()%1e9)
	plan := migrate.Plan{
		Name: fmt.Sprintf("m%d", time.Now().UnixNano()%1e9), Namespace: lab.Namespace, Pod: name, Container: "app",
		TargetNode: cluster.NodeName(2), TargetPod: name + "-target", Strategy: spec.strategy, ReplayMax: spec.replayMax,
		Cutoff: spec.cutoff, PullAhead: spec.pullAhead,
	}
	// The queue and the replay log are deleted after the migration, or
	// by the bench's close if it is interrupted.
	b.mu.Lock()
	b.queues[name] = true
	b.mu.Unlock()
	defer b.deleteQueue(name)
	pods := []string{plan.Pod, plan.TargetPod}
	if spec.statefulSet {
		plan.Pod, plan.TargetPod = name+"-0", ""
		pods = []string{plan.Pod, plan.Name + "-shadow"}
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if spec.statefulSet {
			if err := l.DeleteWorkload(cctx, lab.StatefulSet, name); err != nil {
				progress("  could not delete the StatefulSet", "err", err)
			}
		}
		if err := l.DeletePods(cctx, pods...); err != nil {
			progress("  could not delete the consumer pods", "err", err)
		}
		removeNodeImages(cctx, l, 2, "/ms2m/checkpoints")
	}()

	consumer := lab.Consumer{Name: name, Queue: name, Node: cluster.NodeName(1), WorkMS: strategyWorkMS, Image: "consumer", ReadOnlyRoot: true, StateMiB: spec.stateMiB}
	var src *corev1.Pod
	if spec.statefulSet {
		src, err = startStatefulSet(ctx, l, consumer)
	} else {
		src, err = l.StartConsumer(ctx, consumer)
	}
	if err != nil {
		return m, fmt.Errorf("start the consumer pod %s: %w", name, err)
	}
	if log := inject.LogName(src); log != "" {
		b.mu.Lock()
		b.logs[log] = true
		b.mu.Unlock()
		defer b.deleteLog(log)
	}

	count := int(math.Ceil(spec.rate * spec.producerFor.Seconds()))
	prod, err := lab.StartProducer(producerBin, name, spec.rate, count)
	if err != nil {
		return m, fmt.Errorf("start the producer: %w", err)
	}
	producerEnds := time.Now().Add(spec.producerFor)
	defer prod.Stop()
	first, err := waitConsumed(ctx, src, 1, time.Minute)
	if err != nil {
		return m, err
	}
	if err := sleepCtx(ctx, time.Until(first.Add(spec.warmup))); err != nil {
		return m, err
	}
	if st, err := lab.GetAppState(src); err == nil {
		m.CountAtStart = st.Count
	}
	m.StartedAfterMs = ms(time.Since(first))

	// Each consumer's journal is read when it has stopped for good and
	// before it is deleted; the time that takes (a few ms) falls into the
	// next phase.
	journals := l.NewJournals(src, plan)
	phaseEnd := map[string]time.Time{}
	migrationBegan := time.Now()
	rep, err := migrate.Run(ctx, l.Env(func(phase string, took time.Duration) {
		phaseEnd[phase] = time.Now()
		progress("  phase", "name", phase, "took", took.Round(time.Millisecond))
		journals.AfterPhase(ctx, phase)
	}), plan)
	migrationEnded := time.Now()
	m.Report = rep
	for _, h := range []*migrate.HoldTimings{rep.Hold, rep.ShadowHold} {
		if h != nil {
			r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
			progress("  hold", "held", r(h.Held), "quiesce", r(h.Quiesce), "toFreeze", r(h.ToFreeze), "dump", r(h.Dump), "criu", r(h.CRIU), "afterDump", r(h.AfterDump), "call", r(h.Call), "resumedAtFreeze", h.AtFreeze, "thawedAtDump", h.ThawedAtDump, "thawFallback", h.ThawFallback)
		}
	}
	m.TotalMs, m.SwitchMs = ms(rep.Total), ms(rep.Downtime)
	for _, p := range rep.Phases {
		m.Phases = append(m.Phases, phaseMedian{Name: p.Name, MedianMs: ms(p.Took)})
	}
	m.Groups = phaseGroups(rep, phaseEnd)
	m.RestoreSteps = restoreSplit(l.Cluster.StateDir(), rep, phaseEnd["restore"])
	if h := rep.Handover; h != nil && !h.LastReplayed.IsZero() && h.LastReplayed.After(h.StopStarted) {
		m.ReplayAfterStopMs = ms(h.LastReplayed.Sub(h.StopStarted))
	}
	m.ProducerOutlasted = producerEnds.After(time.Now())
	if rep.Archive != "" {
		defer os.Remove(rep.Archive)
	}
	if err != nil {
		if ctx.Err() != nil {
			return m, err
		}
		m.Error = "migration failed: " + err.Error()
		return m, nil
	}
	if spec.cutoff != "" && rep.Cutoff != spec.cutoff {
		m.Error = fmt.Sprintf("the migrator ran the %q cutoff rule, not %q: its report is not that series'", rep.Cutoff, spec.cutoff)
		return m, nil
	}

	pctx, cancel := context.WithTimeout(ctx, spec.producerFor+2*time.Minute)
	defer cancel()
	want, err := prod.Wait(pctx)
	if err != nil {
		return m, err
	}
	m.Produced, m.WantHash = want.Count, want.Hash
	target, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, rep.TargetPod, metav1.GetOptions{})
	if err != nil {
		m.Error = "the target pod: " + err.Error()
		return m, nil
	}
	got := lab.WaitFor(target, want, strategySettle)
	m.Count, m.Hash, m.Reconnects, m.SkippedRedeliveries = got.Count, got.Hash, got.Reconnects, got.Skipped
	m.HashOK = got.Count == want.Count && got.Hash == want.Hash
	if !m.HashOK {
		m.Error = fmt.Sprintf("hash mismatch: the restored consumer has count %d hash %.12s, the producer sent %d with hash %.12s", got.Count, got.Hash, want.Count, want.Hash)
	}
	if got.Skipped > 0 && m.Error == "" {
		m.Error = fmt.Sprintf("the restored consumer skipped %d redeliveries: a duplicate the hash does not show", got.Skipped)
	}
	journals.Target(target)
	all, err := journals.All()
	if err != nil {
		m.Error = strings.TrimPrefix(m.Error+"; "+err.Error(), "; ")
		return m, nil
	}
	j := judgeJournals(all, want.Count)
	m.WorstLatencyMs, m.Lost, m.Duplicated, m.Missing = &j.worstMs, &j.lost, &j.duplicated, j.missing
	gap := journal.ProcessingGap(all, journal.SendTimes(all), migrationBegan, migrationEnded)
	gapMs, startMs := ms(gap.Duration()), ms(gap.Start.Sub(migrationBegan))
	m.ProcessingGapMs, m.ProcessingGapStartMs = &gapMs, &startMs
	return m, nil
}

func shortName(s contract.Strategy) string {
	switch s {
	case contract.StrategyMS2M:
		return "ms2m"
	case contract.StrategyMS2MCutoff:
		return "cut"
	case contract.StrategyStopAndCopy:
		return "sc"
	case contract.StrategyStatefulSet:
		return "sts"
	case contract.StrategyStatefulSetShadow:
		return "shadow"
	}
	return "m"
}

// journalVerdict is what the consumers' journals say.
type journalVerdict struct {
	worstMs          float64
	lost, duplicated int
	// missing: the first lost IDs, each with the index of the earliest
	// journal that has it (-1: none), as "journal N" or "none".
	missing map[int64]string
}

// maxMissing bounds journalVerdict.missing.
const maxMissing = 20

// judgeJournals reads the journals of the consumers that served in turn
// (the last one the final target's, holding the whole state). A message's
// latency is that of its first processing, in the earliest journal that
// has it: a later instance restored from a checkpoint replays messages
// that an earlier one had already processed, long after they were sent,
// and no user waited for that. Lost and duplicated are counted in the
// final state against the producer's 1..produced.
func judgeJournals(journals [][]lab.Fold, produced int) journalVerdict {
	var v journalVerdict
	first := map[int64]float64{}
	for _, j := range journals {
		for _, f := range j {
			if _, seen := first[f.ID]; !seen {
				first[f.ID] = f.LatencyMS
			}
		}
	}
	for _, l := range first {
		v.worstMs = max(v.worstMs, l)
	}
	if len(journals) == 0 {
		return v
	}
	times := map[int64]int{}
	for _, f := range journals[len(journals)-1] {
		times[f.ID]++
	}
	for id := int64(1); id <= int64(produced); id++ {
		switch c := times[id]; {
		case c == 0:
			v.lost++
			if len(v.missing) < maxMissing {
				if v.missing == nil {
					v.missing = map[int64]string{}
				}
				v.missing[id] = "none"
				for i, j := range journals[:len(journals)-1] {
					if slices.ContainsFunc(j, func(f lab.Fold) bool { return f.ID == id }) {
						v.missing[id] = fmt.Sprintf("journal %d", i)
						break
					}
				}
			}
		case c > 1:
			v.duplicated += c - 1
		}
		delete(times, id)
	}
	for _, c := range times { // ids the producer never sent
		v.duplicated += c
	}
	return v
}

// startStatefulSet creates a StatefulSet of one replica whose pod is c's,
// injected by the lab's webhook, as e2e/owners_test.go does, and waits
// until its pod runs.
func startStatefulSet(ctx context.Context, l *lab.Lab, c lab.Consumer) (*corev1.Pod, error) {
	p, err := l.Pod(c)
	if err != nil {
		return nil, err
	}
	one := int32(1)
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: lab.Namespace},
		Spec: appsv1.StatefulSetSpec{
			Replicas: &one, ServiceName: c.Name,
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: p.Labels, Annotations: p.Annotations}, Spec: p.Spec},
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": c.Name}},
		},
	}
	if _, err := l.Client.AppsV1().StatefulSets(lab.Namespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create StatefulSet %s: %w", c.Name, err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := l.Client.CoreV1().Pods(lab.Namespace).Get(ctx, c.Name+"-0", metav1.GetOptions{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("StatefulSet %s made no pod within 2 minutes", c.Name)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
	pod, err := migrate.WaitRunning(ctx, l.Client, lab.Namespace, c.Name+"-0", time.Until(deadline))
	if err != nil {
		return nil, err
	}
	if _, ok := pod.Annotations[contract.AnnotationStatus]; !ok {
		return nil, fmt.Errorf("the webhook did not inject the StatefulSet's pod %s", pod.Name)
	}
	return pod, nil
}

// The paper's phase groups (its Figs 12-14), in stacking order. prepare is
// ours: the preconditions and pulling the app's image on the target node.
var phaseGroupNames = []string{"prepare", "checkpoint", "image", "restore", "replay", "handover", "finalise"}

// phaseGroupOf maps the Report's phase names to the groups; the replay
// and handover phases are split by handoverSplit.
var phaseGroupOf = map[string]string{
	"preconditions": "prepare", "prepare target": "prepare",
	"quiesce": "checkpoint", "checkpoint": "checkpoint", "resume": "checkpoint",
	"shadow quiesce": "checkpoint", "shadow checkpoint": "checkpoint", "shadow resume": "checkpoint",
	"image": "image", "shadow image": "image",
	"restore": "restore", "shadow restore": "restore",
	"stop": "handover", "finalise": "finalise",
}

// phaseGroups sums rep's phases into the groups, in ms. A handover phase
// (ms2m's "replay and handover", statefulset-shadow's two) is split at the
// target's last replayed delivery, or at the source's stop if nothing was
// left to replay after it: replay before, the stop and the switch after.
// A "switch" phase waits for the restored target to replay to the cutoff
// and switch: replay for statefulset, handover for stop-and-copy (which
// replays nothing).
func phaseGroups(rep migrate.Report, phaseEnd map[string]time.Time) map[string]float64 {
	g := map[string]float64{}
	for _, p := range rep.Phases {
		took := ms(p.Took)
		switch p.Name {
		case "replay and handover", "shadow handover", "handover":
			h := rep.Handover
			if p.Name == "handover" {
				h = rep.ShadowHandover
			}
			replay := took
			if h != nil {
				replay = took - ms(h.Downtime)
				if end, ok := phaseEnd[p.Name]; ok {
					cut := h.StopStarted
					if h.LastReplayed.After(cut) {
						cut = h.LastReplayed
					}
					replay = ms(cut.Sub(end.Add(-p.Took)))
				}
				replay = min(max(replay, 0), took)
			}
			g["replay"] += replay
			g["handover"] += took - replay
		case "switch":
			if rep.Strategy == contract.StrategyStopAndCopy {
				g["handover"] += took
			} else {
				g["replay"] += took
			}
		default:
			name, ok := phaseGroupOf[p.Name]
			if !ok {
				name = "other"
			}
			g[name] += took
		}
	}
	return g
}
