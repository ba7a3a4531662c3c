package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/sidecar"
)

const (
	// handoverWork is each consumer's processing time per message, so that
	// a consumer processes handoverServiceRate messages per second.
	handoverWork        = 50 * time.Millisecond
	handoverServiceRate = int(time.Second / handoverWork)
	handoverPrefetch    = 10
	// handoverCatchUp bounds the wait for the target's replay lag to reach
	// -handover-max-lag: past it, the source is stopped anyway.
	handoverCatchUp = 10 * time.Second
	// handoverSwitchTimeout bounds the wait for the target to switch to the
	// primary queue after the stop.
	handoverSwitchTimeout = 30 * time.Second
	// handoverAfter is how long the producer goes on after the handover, so
	// that the target consumes the primary queue.
	handoverAfter = 2 * time.Second
	// handoverFinish bounds the wait, after the producer's last message, for
	// the target to process every message; handoverQuiet is how long no
	// further delivery (a duplicate) may come after that.
	handoverFinish = 30 * time.Second
	handoverQuiet  = 300 * time.Millisecond
	// handoverSteady bounds the wait, after the warm-up, for both consumers
	// to have caught up; past it, the handover starts anyway.
	handoverSteady = 30 * time.Second
)

// handover runs the handover case: per round, one handover at each rate.
// The rates take turns, so that a noisy stretch of the machine hurts them
// alike.
func (b *bench) handover(ctx context.Context) (*handoverResult, error) {
	res := &handoverResult{
		WorkMs: ms(handoverWork), Prefetch: handoverPrefetch, WarmupSeconds: b.o.handoverWarmup.Seconds(),
		AfterSeconds: handoverAfter.Seconds(), MaxLag: b.o.handoverMaxLag,
	}
	for _, rate := range b.o.handoverRates {
		res.Rates = append(res.Rates, handoverRate{RateMsgsPerSec: rate})
	}
	for r := 1; r <= b.o.handoverRounds; r++ {
		for i, rate := range b.o.handoverRates {
			progress("handover", "rate_msgs_per_s", rate, "round", fmt.Sprintf("%d/%d", r, b.o.handoverRounds),
				"warmup", b.o.handoverWarmup, "after", handoverAfter)
			round, err := b.handoverRound(ctx, rate)
			if err != nil {
				return nil, fmt.Errorf("handover at %g msg/s, round %d: %w", rate, r, err)
			}
			progress("  done", "downtime_ms", fmtMs(round.DowntimeMs), "stop_ms", fmtMs(round.StopMs),
				"stop_to_first_primary_ms", fmtOptMs(round.StopToFirstPrimaryMs), "handover_call_ms", fmtMs(round.CallMs),
				"steady_wait_ms", fmtMs(round.SteadyWaitMs), "backlog_at_stop", round.BacklogAtStop, "target_behind_at_stop", round.TargetBehindAtStop, "source_last_ack_ms", fmtMs(round.SourceLastAckMs), "target_cutoff_ack_ms", fmtOptMs(round.TargetCutoffAckMs),
				"cutoff", round.CutoffID, "lag_at_stop", round.LagAtStop, "produced", round.Produced,
				"lost", round.Lost, "duplicated", round.Duplicated, "exact", round.Exact)
			res.Rates[i].Rounds = append(res.Rates[i].Rounds, round)
		}
	}
	for i := range res.Rates {
		res.Rates[i].summarise()
	}
	return res, nil
}

// handoverRound runs one handover at rate msg/s: a source sidecar and a
// target sidecar in replay mode on one fresh replay log, a consumer behind
// each, and a producer straight to the broker. After the warm-up, once both
// consumers have caught up, it hands over with control.Handover, lets the
// producer go on for handoverAfter, waits until the target has processed
// every message, and checks that each was processed exactly once.
func (b *bench) handoverRound(ctx context.Context, rate float64) (handoverRound, error) {
	q, err := b.newQueue()
	if err != nil {
		return handoverRound{}, err
	}
	defer b.deleteQueue(q)
	logName := b.newLogName()
	defer b.deleteLog(logName)

	source, err := b.startSidecar(ctx, b.sidecarConfig(logName), sidecar.Options{})
	if err != nil {
		return handoverRound{}, fmt.Errorf("source: %w", err)
	}
	defer source.close()
	cfg := b.sidecarConfig(logName)
	cfg.ReplayStart, cfg.ReplayCutoff = "0", "marker"
	target, err := b.startSidecar(ctx, cfg, sidecar.Options{})
	if err != nil {
		return handoverRound{}, fmt.Errorf("target: %w", err)
	}
	defer target.close()

	srcApp, err := startApp(ctx, source.url, q, "ms2m-bench-source-app")
	if err != nil {
		return handoverRound{}, fmt.Errorf("the source's consumer: %w", err)
	}
	defer srcApp.close()
	dstApp, err := startApp(ctx, target.url, q, "ms2m-bench-target-app")
	if err != nil {
		return handoverRound{}, fmt.Errorf("the target's consumer: %w", err)
	}
	defer dstApp.close()
	prod, err := startProducer(ctx, b.directURL, q, rate)
	if err != nil {
		return handoverRound{}, err
	}
	defer prod.finish()

	// A random part of one publish interval on top of the warm-up puts the
	// stop at a random point of the producer's cycle: whether the source's
	// app is busy when it stops (and the stop waits for it) then happens as
	// often as in a real migration.
	phase := rand.N(time.Duration(float64(time.Second) / rate))
	if err := sleepCtx(ctx, b.o.handoverWarmup+phase); err != nil {
		return handoverRound{}, err
	}
	steadyFor, steady, err := waitSteady(ctx, prod, srcApp, dstApp)
	if err != nil {
		return handoverRound{}, err
	}
	hctx, cancel := context.WithTimeout(ctx, handoverCatchUp+handoverSwitchTimeout+10*time.Second)
	defer cancel()
	t0 := time.Now()
	tm, err := control.Handover(hctx, source.endpoint(), target.endpoint(), control.HandoverOptions{
		MaxLag: b.o.handoverMaxLag, Deadline: t0.Add(handoverCatchUp), SwitchTimeout: handoverSwitchTimeout,
	})
	call := time.Since(t0)
	if err != nil {
		return handoverRound{}, err
	}
	if err := sleepCtx(ctx, handoverAfter); err != nil {
		return handoverRound{}, err
	}
	produced, err := prod.finish()
	if err != nil {
		return handoverRound{}, err
	}
	if err := dstApp.waitFor(ctx, produced); err != nil {
		return handoverRound{}, fmt.Errorf("the target's consumer: %w (cutoff %d, %d produced)", err, tm.CutoffID, produced)
	}
	srcIDs, srcAt, srcErr := srcApp.close()
	dstIDs, dstAt, dstErr := dstApp.close()
	if err := errors.Join(srcErr, dstErr); err != nil {
		return handoverRound{}, err
	}
	sentAt := prod.sentTimes()

	round := handoverRound{
		Produced: produced, CutoffID: tm.CutoffID, LagAtStop: tm.LagAtStop,
		DowntimeMs: ms(tm.Downtime), StopMs: ms(tm.Stopped.Sub(tm.StopStarted)), CallMs: ms(call),
		SteadyWaitMs: ms(steadyFor), Steady: steady, Timings: tm,
	}
	if !tm.LastReplayed.IsZero() {
		round.StopToLastReplayedMs = new(ms(tm.LastReplayed.Sub(tm.StopStarted)))
	}
	// Handover returns at the switch; a first primary delivery after that is
	// in the target's state now.
	rs := target.Proxy().State().Replay
	if rs != nil && rs.FirstPrimaryAt != nil {
		round.StopToFirstPrimaryMs = new(ms(rs.FirstPrimaryAt.Sub(tm.StopStarted)))
	}
	replayed := 0
	if rs != nil {
		replayed = int(rs.Replayed)
	}
	round.check(srcIDs, dstIDs, replayed)
	round.explain(sentAt, srcAt, dstIDs, dstAt)
	return round, nil
}

// explain fills in where the downtime went: the source's backlog and how
// far the target's app was behind the cutoff when the stop started, when
// the source's app acked its last message (the stop waits for that), and
// when the target's app acked the replayed cutoff message (the switch
// waits for that).
func (r *handoverRound) explain(sentAt, srcAt []time.Time, dstIDs []uint64, dstAt []time.Time) {
	stop := r.Timings.StopStarted
	sent := 0
	for _, t := range sentAt {
		if t.Before(stop) {
			sent++
		}
	}
	done := 0
	for _, t := range srcAt {
		if t.Before(stop) {
			done++
		}
	}
	r.BacklogAtStop = sent - done
	replayedBefore := 0
	for _, t := range dstAt {
		if t.Before(stop) {
			replayedBefore++
		}
	}
	r.TargetBehindAtStop = int(r.CutoffID) - replayedBefore
	if len(srcAt) > 0 {
		r.SourceLastAckMs = ms(srcAt[len(srcAt)-1].Sub(stop))
	}
	if i := slices.Index(dstIDs, r.CutoffID); i >= 0 && r.CutoffID > 0 {
		r.TargetCutoffAckMs = new(ms(dstAt[i].Sub(stop)))
	}
}

// check fills in the exactness figures. The target's app starts empty, so
// it must process every message 1..Produced exactly once: first the
// source's deliveries up to the cutoff, replayed from the log in the order
// the source processed them, then the primary queue.
func (r *handoverRound) check(srcIDs, dstIDs []uint64, replayed int) {
	r.SourceProcessed, r.TargetProcessed, r.TargetReplayed = len(srcIDs), len(dstIDs), replayed
	replayed = min(replayed, len(dstIDs))
	r.TargetPrimary = len(dstIDs) - replayed
	r.Lost, r.Duplicated = lostAndDuplicated(dstIDs, r.Produced)
	// The source's share and the target's share after the cutoff, together.
	split := append(slices.Clone(srcIDs), dstIDs[replayed:]...)
	r.SplitLost, r.SplitDuplicated = lostAndDuplicated(split, r.Produced)
	for i := range max(replayed, len(srcIDs)) {
		if i >= replayed || i >= len(srcIDs) || dstIDs[i] != srcIDs[i] {
			r.ReplayMismatches++
		}
	}
	r.Exact = r.Lost == 0 && r.Duplicated == 0 && r.SplitLost == 0 && r.SplitDuplicated == 0 &&
		r.ReplayMismatches == 0 && uint64(r.SourceProcessed) == r.CutoffID &&
		r.SourceProcessed+r.TargetPrimary == r.Produced
}

// lostAndDuplicated counts, in ids, the messages 1..n missing and the
// processings beyond the first of each (an ID outside 1..n counts as a
// duplicate).
func lostAndDuplicated(ids []uint64, n int) (lost, duplicated int) {
	seen := make([]int, n+1)
	for _, id := range ids {
		if id < 1 || id > uint64(n) {
			duplicated++
			continue
		}
		seen[id]++
	}
	for _, c := range seen[1:] {
		switch {
		case c == 0:
			lost++
		case c > 1:
			duplicated += c - 1
		}
	}
	return lost, duplicated
}

// app is a consumer like examples/consumer at WORK_MS=50, PREFETCH=10: it
// takes one delivery at a time, works for 50 ms, notes the message ID and
// acks. A delivery it is working on when it closes is not acked.
type app struct {
	conn   *amqp.Connection
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	ids     []uint64    // processed, in order; 0 for a message without a numeric ID
	at      []time.Time // when each was processed (just before its ack)
	lastAt  time.Time
	changed chan struct{} // closed and replaced on every processed message
	err     error
}

func startApp(ctx context.Context, url, queue, name string) (*app, error) {
	conn, err := dial(url, name)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Qos(handoverPrefetch, 0, false)
	}
	ctx, cancel := context.WithCancel(ctx)
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
	}
	if err != nil {
		cancel()
		conn.Close()
		return nil, fmt.Errorf("consume from %s: %w", queue, err)
	}
	a := &app{conn: conn, cancel: cancel, done: make(chan struct{}), changed: make(chan struct{})}
	go a.run(ctx, deliveries)
	return a, nil
}

func (a *app) run(ctx context.Context, deliveries <-chan amqp.Delivery) {
	defer close(a.done)
	work := time.NewTimer(0)
	defer work.Stop()
	for {
		var d amqp.Delivery
		var ok bool
		select {
		case <-ctx.Done():
			return
		case d, ok = <-deliveries:
		}
		if !ok {
			return
		}
		work.Reset(handoverWork)
		select {
		case <-ctx.Done():
			return
		case <-work.C:
		}
		id, _ := strconv.ParseUint(d.MessageId, 10, 64)
		a.mu.Lock()
		a.lastAt = time.Now()
		a.ids = append(a.ids, id)
		a.at = append(a.at, a.lastAt)
		close(a.changed)
		a.changed = make(chan struct{})
		a.mu.Unlock()
		if err := d.Ack(false); err != nil {
			a.mu.Lock()
			a.err = fmt.Errorf("ack message %q: %w", d.MessageId, err)
			a.mu.Unlock()
			return
		}
	}
}

// waitSteady waits until the source's consumer has at most one published
// message left to process and the target's consumer is at most one message
// behind it: the target has caught up. control.Handover's own wait counts
// replayed messages handed to the target's app, not processed by it. It
// gives up, reporting steady false, after handoverSteady.
func waitSteady(ctx context.Context, p *producer, src, dst *app) (time.Duration, bool, error) {
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		sent, s, d := p.sent(), src.processed(), dst.processed()
		if sent-s <= 1 && s-d <= 1 {
			return time.Since(start), true, nil
		}
		if time.Since(start) > handoverSteady {
			progress("  not caught up; handing over anyway", "published", sent, "source_processed", s, "target_processed", d)
			return time.Since(start), false, nil
		}
		select {
		case <-ctx.Done():
			return 0, false, context.Cause(ctx)
		case <-tick.C:
		}
	}
}

// processed returns how many messages the app has processed.
func (a *app) processed() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.ids)
}

// waitFor waits until the app has processed n distinct message IDs and then
// nothing more for handoverQuiet, or fails after handoverFinish.
func (a *app) waitFor(ctx context.Context, n int) error {
	deadline := time.NewTimer(handoverFinish)
	defer deadline.Stop()
	for {
		a.mu.Lock()
		distinct := len(a.ids)
		if distinct >= n {
			distinct = countDistinct(a.ids)
		}
		quietFor, changed, err := time.Since(a.lastAt), a.changed, a.err
		a.mu.Unlock()
		if err != nil {
			return err
		}
		wait := time.Duration(-1) // until the next message
		if distinct >= n {
			if quietFor >= handoverQuiet {
				return nil
			}
			wait = handoverQuiet - quietFor
		}
		var timeout <-chan time.Time
		if wait >= 0 {
			timeout = time.After(wait)
		}
		select {
		case <-changed:
		case <-timeout:
		case <-a.done:
			return errors.New("its deliveries stopped")
		case <-deadline.C:
			return fmt.Errorf("processed %d distinct messages of %d in %s after the producer stopped", distinct, n, handoverFinish)
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// close stops the app and closes its connection; it returns the IDs it
// processed, when, and the error it stopped on, if any.
func (a *app) close() ([]uint64, []time.Time, error) {
	a.cancel()
	<-a.done
	a.conn.Close()
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.ids), slices.Clone(a.at), a.err
}

func countDistinct(ids []uint64) int {
	seen := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		seen[id] = true
	}
	return len(seen)
}

// producer publishes straight to the broker at a steady rate, message i
// (from 1) with message ID i, each confirmed before the next.
type producer struct {
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
	n        atomic.Int64
	sentAt   []time.Time // message i+1 was confirmed at sentAt[i]; read after finish
	err      error
}

func startProducer(ctx context.Context, url, queue string, rate float64) (*producer, error) {
	conn, err := dial(url, "ms2m-bench-producer")
	if err != nil {
		return nil, fmt.Errorf("connect the producer: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("open the producer's channel with publisher confirms: %w", err)
	}
	p := &producer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer conn.Close()
		p.err = p.run(ctx, ch, queue, rate)
	}()
	return p, nil
}

func (p *producer) run(ctx context.Context, ch *amqp.Channel, queue string, rate float64) error {
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	slot := time.NewTimer(0)
	defer slot.Stop()
	for i := 1; ; i++ {
		slot.Reset(time.Until(start.Add(time.Duration(i-1) * interval)))
		select {
		case <-p.stop:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-slot.C:
		}
		id := strconv.Itoa(i)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{MessageId: id, Body: []byte(id)})
		if err != nil {
			return fmt.Errorf("publish message %d: %w", i, err)
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("the broker did not confirm message %d (ok=%v): %w", i, ok, err)
		}
		p.sentAt = append(p.sentAt, time.Now())
		p.n.Store(int64(i))
	}
}

// sent returns how many messages the broker has confirmed so far.
func (p *producer) sent() int { return int(p.n.Load()) }

// sentTimes returns when each message was published; call it after finish.
func (p *producer) sentTimes() []time.Time { return p.sentAt }

// finish stops the producer and returns how many messages the broker
// confirmed.
func (p *producer) finish() (int, error) {
	p.stopOnce.Do(func() { close(p.stop) })
	<-p.done
	return p.sent(), p.err
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

func fmtOptMs(v *float64) string {
	if v == nil {
		return "–"
	}
	return fmtMs(*v)
}
