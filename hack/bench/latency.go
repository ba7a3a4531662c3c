package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	latencyRate         = 1000 // messages per second
	latencyRateInterval = time.Second / latencyRate
	latencyPrefetch     = 100
	// latencyWarmup is published before the measured duration of each
	// round, and its messages are not counted.
	latencyWarmup = 500 * time.Millisecond
	// latencyGrace is how long the consumer may take, after the last
	// publish, to receive the rest.
	latencyGrace = 10 * time.Second
)

// epoch anchors nowNanos to the monotonic clock, so that a wall-clock step
// during a round cannot distort a latency.
var epoch = time.Now()

// nowNanos is the time in Unix nanoseconds, read from the monotonic clock.
func nowNanos() int64 { return epoch.UnixNano() + int64(time.Since(epoch)) }

// latency runs the latency case: per round, a direct round and then a
// sidecar round. Each path's percentiles are computed over the samples of
// all its rounds pooled; each round's own percentiles are kept too.
func (b *bench) latency(ctx context.Context, d time.Duration) (*latencyResult, error) {
	res := &latencyResult{
		RateMsgsPerSec: latencyRate, Prefetch: latencyPrefetch,
		DurationSeconds: d.Seconds(), WarmupSeconds: latencyWarmup.Seconds(),
		Method: "pooled: percentiles over the samples of all rounds of a path (nearest rank); medianOfRounds: the median, field by field, of the per-round percentiles; the goal is judged on medianOfRounds",
	}
	pooled := map[path][]time.Duration{}
	for r := 1; r <= b.o.rounds; r++ {
		for _, p := range paths {
			progress("latency at 1000 msg/s", "round", fmt.Sprintf("%d/%d", r, b.o.rounds), "path", p, "duration", d+latencyWarmup)
			lat, err := b.latencyRound(ctx, p, d)
			if err != nil {
				return nil, fmt.Errorf("latency, round %d, %s: %w", r, p, err)
			}
			pc := percentilesOf(lat)
			progress("  done", "p50_ms", fmtMs(pc.P50Ms), "p99_ms", fmtMs(pc.P99Ms), "max_ms", fmtMs(pc.MaxMs))
			pooled[p] = append(pooled[p], lat...)
			if p == direct {
				res.Direct.Rounds = append(res.Direct.Rounds, pc)
			} else {
				res.Sidecar.Rounds = append(res.Sidecar.Rounds, pc)
			}
		}
	}
	for _, lp := range []*latencyPath{&res.Direct, &res.Sidecar} {
		lp.MedianOfRounds = medianOfRounds(lp.Rounds)
	}
	res.Direct.Pooled = percentilesOf(pooled[direct])
	res.Sidecar.Pooled = percentilesOf(pooled[viaSidecar])
	res.AddedP99Ms = res.Sidecar.MedianOfRounds.P99Ms - res.Direct.MedianOfRounds.P99Ms
	res.AddedP99PooledMs = res.Sidecar.Pooled.P99Ms - res.Direct.Pooled.P99Ms
	return res, nil
}

// latencyRound runs one round on path p: a consumer (prefetch 100, manual
// ack) on a fresh queue, reached over p, and a publisher straight to the
// broker, paced at 1000 msg/s for the warm-up and then d. Each body is the
// send time in Unix nanoseconds; the latency is the receive time minus
// that. It returns the latencies after the warm-up.
func (b *bench) latencyRound(ctx context.Context, p path, d time.Duration) ([]time.Duration, error) {
	q, err := b.newQueue()
	if err != nil {
		return nil, err
	}
	defer b.deleteQueue(q)

	cconn, err := dial(b.url(p), "ms2m-bench-latency-consumer")
	if err != nil {
		return nil, fmt.Errorf("connect the consumer: %w", err)
	}
	defer cconn.Close()
	cch, err := cconn.Channel()
	if err != nil {
		return nil, err
	}
	if err := cch.Qos(latencyPrefetch, 0, false); err != nil {
		return nil, err
	}
	deliveries, err := cch.ConsumeWithContext(ctx, q, "", false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consume from %s: %w", q, err)
	}

	pconn, err := dial(b.directURL, "ms2m-bench-latency-publisher")
	if err != nil {
		return nil, fmt.Errorf("connect the publisher: %w", err)
	}
	defer pconn.Close()
	pch, err := pconn.Channel()
	if err != nil {
		return nil, err
	}

	warm := int(latencyWarmup / latencyRateInterval)
	n := warm + int(d/latencyRateInterval)
	rctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	type received struct {
		lat []time.Duration
		err error
	}
	done := make(chan received, 1)
	go func() {
		lat, err := receive(rctx, deliveries, n)
		done <- received{lat, err}
	}()

	if err := publishPaced(ctx, pch, q, n); err != nil {
		stop(err)
		<-done
		return nil, err
	}
	grace := time.AfterFunc(latencyGrace, func() {
		stop(fmt.Errorf("not every message arrived within %s of the last publish", latencyGrace))
	})
	defer grace.Stop()
	got := <-done
	if got.err != nil {
		return nil, got.err
	}
	return got.lat[warm:], nil
}

// publishPaced publishes n timestamped messages to queue, the i-th at
// start+i/rate. One that falls behind its slot is sent at once; the
// timestamp is taken just before each publish.
func publishPaced(ctx context.Context, ch *amqp.Channel, queue string, n int) error {
	start := time.Now()
	for i := range n {
		if wait := time.Until(start.Add(time.Duration(i) * latencyRateInterval)); wait > 0 {
			time.Sleep(wait)
		}
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		body := binary.BigEndian.AppendUint64(make([]byte, 0, 8), uint64(nowNanos()))
		if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: body}); err != nil {
			return fmt.Errorf("publish message %d of %d: %w", i+1, n, err)
		}
	}
	return nil
}

// receive takes n deliveries, acking each, and returns their latencies in
// the order they arrived.
func receive(ctx context.Context, deliveries <-chan amqp.Delivery, n int) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, n)
	for len(lat) < n {
		select {
		case d, ok := <-deliveries:
			now := nowNanos()
			if !ok {
				return nil, fmt.Errorf("the deliveries stopped after %d of %d", len(lat), n)
			}
			if len(d.Body) != 8 {
				return nil, fmt.Errorf("delivery %d has a %d-byte body, want an 8-byte timestamp", len(lat)+1, len(d.Body))
			}
			lat = append(lat, time.Duration(now-int64(binary.BigEndian.Uint64(d.Body))))
			if err := d.Ack(false); err != nil {
				return nil, fmt.Errorf("ack delivery %d: %w", len(lat), err)
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("received %d of %d: %w", len(lat), n, context.Cause(ctx))
		}
	}
	return lat, nil
}

// percentilesOf summarises latencies by nearest rank.
func percentilesOf(lat []time.Duration) percentiles {
	if len(lat) == 0 {
		return percentiles{}
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(math.Ceil(float64(len(s))*q)) - 1
		return ms(s[max(0, min(i, len(s)-1))])
	}
	return percentiles{
		Samples: len(s),
		P50Ms:   at(0.50), P90Ms: at(0.90), P99Ms: at(0.99), P999Ms: at(0.999),
		MaxMs: ms(s[len(s)-1]),
	}
}

// medianOfRounds is the median of each percentile across rounds.
func medianOfRounds(rounds []percentiles) percentiles {
	field := func(f func(percentiles) float64) float64 {
		xs := make([]float64, len(rounds))
		for i, r := range rounds {
			xs[i] = f(r)
		}
		return median(xs)
	}
	var samples int
	for _, r := range rounds {
		samples += r.Samples
	}
	return percentiles{
		Samples: samples,
		P50Ms:   field(func(p percentiles) float64 { return p.P50Ms }),
		P90Ms:   field(func(p percentiles) float64 { return p.P90Ms }),
		P99Ms:   field(func(p percentiles) float64 { return p.P99Ms }),
		P999Ms:  field(func(p percentiles) float64 { return p.P999Ms }),
		MaxMs:   field(func(p percentiles) float64 { return p.MaxMs }),
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
