package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
)

// viaReplay is a consumer behind a target sidecar that replays a replay log.
const viaReplay path = "replay"

const (
	replayPrefetch = 100
	// replayWriteBatch is how many records one Write to the replay log takes
	// while the bench fills it.
	replayWriteBatch = 1000
)

// noProperties is an AMQP basic property list with no property set: the
// 16-bit flags, all zero.
var noProperties = []byte{0, 0}

// replayThroughput runs the replay case: per round, a direct run that drains
// a pre-filled queue of m messages, then a replay run that drains a replay
// log of m records through a target sidecar.
func (b *bench) replayThroughput(ctx context.Context, m int) (*replayResult, error) {
	res := &replayResult{Messages: m, BodyBytes: throughputBody, Prefetch: replayPrefetch}
	for r := 1; r <= b.o.rounds; r++ {
		for _, p := range []path{direct, viaReplay} {
			progress("replay throughput", "round", fmt.Sprintf("%d/%d", r, b.o.rounds), "path", p, "messages", m)
			if p == direct {
				rate, _, _, err := b.throughputRun(ctx, direct, replayPrefetch, m)
				if err != nil {
					return nil, fmt.Errorf("replay throughput, round %d, direct: %w", r, err)
				}
				progress("  done", "msgs_per_s", fmt.Sprintf("%.0f", rate))
				res.DirectMsgsPerSec = append(res.DirectMsgsPerSec, rate)
				continue
			}
			run, err := b.replayRun(ctx, m)
			if err != nil {
				return nil, fmt.Errorf("replay throughput, round %d, replay: %w", r, err)
			}
			progress("  done", "msgs_per_s", fmt.Sprintf("%.0f", run.MsgsPerSec),
				"msgs_per_s_from_sidecar_start", fmt.Sprintf("%.0f", run.MsgsPerSecFromStart), "sidecar_start_ms", fmtMs(run.SidecarStartMs))
			res.Replay = append(res.Replay, run)
		}
	}
	res.DirectMedian = median(res.DirectMsgsPerSec)
	rates, fromStart := make([]float64, len(res.Replay)), make([]float64, len(res.Replay))
	for i, run := range res.Replay {
		rates[i], fromStart[i] = run.MsgsPerSec, run.MsgsPerSecFromStart
	}
	res.ReplayMedian = median(rates)
	res.ReplayFromStartMedian = median(fromStart)
	res.Ratio = res.ReplayMedian / res.DirectMedian
	return res, nil
}

// replayRun writes m delivery records for a fresh, empty queue into a fresh
// replay log, starts a target sidecar that replays IDs 1 to m, and times one
// consumer (prefetch 100, one manual ack per message) behind it until it has
// received m deliveries. The clock runs from basic.consume to the ack of
// the last one, as for direct runs; it also reports the rate from the call
// that starts the sidecar, which includes opening the log.
func (b *bench) replayRun(ctx context.Context, m int) (replayRound, error) {
	q, err := b.newQueue()
	if err != nil {
		return replayRound{}, err
	}
	defer b.deleteQueue(q)
	logName := b.newLogName()
	defer b.deleteLog(logName)
	if err := b.writeLog(ctx, logName, q, m); err != nil {
		return replayRound{}, err
	}

	cfg := b.sidecarConfig(logName)
	cfg.ReplayStart, cfg.ReplayCutoff = "0", strconv.Itoa(m)
	t0 := time.Now()
	target, err := b.startSidecar(ctx, cfg, sidecar.Options{})
	if err != nil {
		return replayRound{}, err
	}
	defer target.close()
	started := time.Since(t0)
	elapsed, err := drain(ctx, target.url, q, replayPrefetch, m)
	if err != nil {
		return replayRound{}, err
	}
	total := time.Since(t0)
	rs := target.Proxy().State().Replay
	if rs == nil || rs.Replayed != uint64(m) || rs.LastReplayedID != uint64(m) {
		return replayRound{}, fmt.Errorf("the target sidecar reports %+v after the consumer got %d deliveries, want %d replayed up to ID %d", rs, m, m, m)
	}
	return replayRound{
		MsgsPerSec:          float64(m) / elapsed.Seconds(),
		MsgsPerSecFromStart: float64(m) / total.Seconds(),
		SidecarStartMs:      ms(started),
	}, nil
}

// writeLog fills the replay log logName with m delivery records for queue,
// IDs 1 to m, each with a 100-byte body, as a source sidecar would have
// written them.
func (b *bench) writeLog(ctx context.Context, logName, queue string, m int) error {
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	l, err := shadowqueue.OpenStream(octx, shadowqueue.StreamOptions{
		URI: b.o.streamURI, Name: logName, MaxAge: time.Hour, MaxBytes: 256 << 20,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return fmt.Errorf("open the replay log %s to fill it: %w", logName, err)
	}
	defer l.Close()
	body := bytes.Repeat([]byte("x"), throughputBody)
	now := time.Now()
	batch := make([]shadowqueue.Record, 0, replayWriteBatch)
	for id := 1; id <= m; id++ {
		batch = append(batch, shadowqueue.Record{
			Kind: shadowqueue.KindDelivery, ID: uint64(id), Time: now,
			Queue: queue, RoutingKey: queue, ConsumerTag: "ms2m-bench",
			Properties: noProperties, Body: body,
		})
		if len(batch) < replayWriteBatch && id < m {
			continue
		}
		if err := l.Write(ctx, batch); err != nil {
			return fmt.Errorf("fill the replay log %s, records %d to %d: %w", logName, batch[0].ID, id, err)
		}
		batch = batch[:0]
	}
	return nil
}
