package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// throughputBody is the size of each pre-filled message.
const throughputBody = 100

// throughput runs the consumer-throughput case at one prefetch: per round, a
// direct run and then a sidecar run, each draining a fresh queue of n
// messages.
func (b *bench) throughput(ctx context.Context, prefetch, n int) (throughputResult, error) {
	res := throughputResult{Prefetch: prefetch, Messages: n, BodyBytes: throughputBody}
	for r := 1; r <= b.o.rounds; r++ {
		for _, p := range paths {
			progress("consumer throughput", "prefetch", prefetch, "round", fmt.Sprintf("%d/%d", r, b.o.rounds), "path", p, "messages", n)
			rate, gw, brokerUs, err := b.throughputRun(ctx, p, prefetch, n)
			if err != nil {
				return res, fmt.Errorf("consumer throughput at prefetch %d, round %d, %s: %w", prefetch, r, p, err)
			}
			if p == direct {
				progress("  done", "msgs_per_s", fmt.Sprintf("%.0f", rate), "broker_cpu_us_per_msg", fmt.Sprintf("%.1f", brokerUs))
				res.DirectMsgsPerSec = append(res.DirectMsgsPerSec, rate)
				res.DirectBrokerUsPerMsg = append(res.DirectBrokerUsPerMsg, brokerUs)
			} else {
				res.SidecarBrokerUsPerMsg = append(res.SidecarBrokerUsPerMsg, brokerUs)
				progress("  done", "msgs_per_s", fmt.Sprintf("%.0f", rate), "broker_cpu_us_per_msg", fmt.Sprintf("%.1f", brokerUs),
					"acks_that_waited_for_the_log", pct(float64(gw.AcksWaited)/float64(n)), "mean_wait_ms", fmtMs(gw.meanMs()),
					"log_writes", gw.LogWrites, "records_per_write", fmt.Sprintf("%.1f", gw.recordsPerWrite()),
					"acks_coalesced", pct(float64(gw.AcksCoalesced)/float64(n)))
				res.SidecarMsgsPerSec = append(res.SidecarMsgsPerSec, rate)
				res.SidecarGateWaits = append(res.SidecarGateWaits, gw)
			}
		}
	}
	res.DirectMedian = median(res.DirectMsgsPerSec)
	res.SidecarMedian = median(res.SidecarMsgsPerSec)
	res.Ratio = res.SidecarMedian / res.DirectMedian
	return res, nil
}

// throughputRun pre-fills a fresh queue with n messages straight to the
// broker, then times one consumer on path p draining it, and returns its
// messages per second and the broker's CPU time per message over the drain
// (0 if the broker is not a local process). The clock runs from
// basic.consume to the ack of the last message. Afterwards it checks that every ack reached the broker and,
// through the sidecar, that every delivery was teed; for the sidecar it
// also returns how many acks had to wait for the replay log.
func (b *bench) throughputRun(ctx context.Context, p path, prefetch, n int) (float64, gateWait, float64, error) {
	q, err := b.newQueue()
	if err != nil {
		return 0, gateWait{}, 0, err
	}
	defer b.deleteQueue(q)
	if err := b.fill(ctx, q, n, bytes.Repeat([]byte("x"), throughputBody)); err != nil {
		return 0, gateWait{}, 0, err
	}
	var teedBefore uint64
	var gwBefore gateWait
	if p == viaSidecar {
		teedBefore = b.teedIDs()
		if gwBefore, err = b.gateWaits(ctx); err != nil {
			return 0, gateWait{}, 0, err
		}
	}
	cpu0, cpuOK := brokerCPU()
	elapsed, err := drain(ctx, b.url(p), q, prefetch, n)
	cpu1, _ := brokerCPU()
	if err != nil {
		return 0, gateWait{}, 0, err
	}
	if err := b.waitDrained(ctx, q); err != nil {
		return 0, gateWait{}, 0, err
	}
	var gw gateWait
	if p == viaSidecar {
		if teed := b.teedIDs() - teedBefore; teed != uint64(n) {
			return 0, gateWait{}, 0, fmt.Errorf("the sidecar teed %d deliveries into the replay log, want %d", teed, n)
		}
		after, err := b.gateWaits(ctx)
		if err != nil {
			return 0, gateWait{}, 0, err
		}
		gw = gateWait{AcksWaited: after.AcksWaited - gwBefore.AcksWaited, WaitSeconds: after.WaitSeconds - gwBefore.WaitSeconds,
			LogWrites: after.LogWrites - gwBefore.LogWrites, LogRecords: after.LogRecords - gwBefore.LogRecords,
			AcksCoalesced: after.AcksCoalesced - gwBefore.AcksCoalesced}
	}
	brokerUs := 0.0
	if cpuOK {
		brokerUs = (cpu1 - cpu0) * 1e6 / float64(n)
	}
	return float64(n) / elapsed.Seconds(), gw, brokerUs, nil
}

// gateWait is how many app acks the sidecar held until the replay log
// confirmed their deliveries, and their total wait; and the writes to the
// log and the records they carried (the broker's work for the log is per
// write).
type gateWait struct {
	AcksWaited  uint64  `json:"acksWaited"`
	WaitSeconds float64 `json:"waitSeconds"`
	LogWrites   uint64  `json:"logWrites"`
	LogRecords  uint64  `json:"logRecords"`
	// AcksCoalesced is the app acks that went upstream inside a later
	// cumulative ack.
	AcksCoalesced uint64 `json:"acksCoalesced"`
}

// recordsPerWrite is the mean batch the log was written in.
func (g gateWait) recordsPerWrite() float64 {
	if g.LogWrites == 0 {
		return 0
	}
	return float64(g.LogRecords) / float64(g.LogWrites)
}

func (g gateWait) meanMs() float64 {
	if g.AcksWaited == 0 {
		return 0
	}
	return g.WaitSeconds * 1000 / float64(g.AcksWaited)
}

// drain consumes n messages from queue at url with manual acks, acking
// each one on its own as a typical app does, and returns how long that took.
// It closes its connection before it returns.
func drain(ctx context.Context, url, queue string, prefetch, n int) (time.Duration, error) {
	conn, err := dial(url, "ms2m-bench-consumer")
	if err != nil {
		return 0, fmt.Errorf("connect the consumer: %w", err)
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return 0, fmt.Errorf("set prefetch %d: %w", prefetch, err)
	}

	start := time.Now()
	deliveries, err := ch.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("consume from %s: %w", queue, err)
	}
	stall := time.NewTimer(stallTimeout)
	defer stall.Stop()
	for got := 0; got < n; {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return 0, fmt.Errorf("the deliveries stopped after %d of %d: %w", got, n, closeReason(closed))
			}
			if err := d.Ack(false); err != nil {
				return 0, fmt.Errorf("ack delivery %d: %w", got+1, err)
			}
			got++
			stall.Reset(stallTimeout)
		case <-stall.C:
			return 0, fmt.Errorf("no delivery for %s after %d of %d", stallTimeout, got, n)
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
	}
	return time.Since(start), nil
}

// closeReason says why a connection closed, if it did.
func closeReason(closed <-chan *amqp.Error) error {
	select {
	case e := <-closed:
		if e != nil {
			return e
		}
	default:
	}
	return errors.New("the channel closed")
}
