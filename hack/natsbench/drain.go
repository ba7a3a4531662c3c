package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/sidecar"
)

// consumerName is the durable consumer every drain uses.
const consumerName = "bench"

// controlToken guards the bench's own sidecars' control APIs (loopback).
const controlToken = "natsbench"

// drainTimeout bounds one drain.
const drainTimeout = 5 * time.Minute

// switchTimeout bounds the wait for a target to switch to the server
// after the app acked the last replayed message.
const switchTimeout = 30 * time.Second

type bench struct {
	o   options
	url string
	// logURL is the server the sidecars' replay logs go to (url unless
	// -log-server).
	logURL string
	js     jetstream.JetStream
	// serverPID is the nats-server's PID, for its CPU time (0: unknown).
	serverPID int
}

// sourceLog is what a sidecar round leaves for the replay round: the
// stream it drained and the replay log its sidecar wrote, with the last
// record's ID (the replay's cutoff).
type sourceLog struct {
	stream, logName string
	cutoff          uint64
}

// round drains by each path once at ack window w, in order; a replay
// replays the log the sidecar path wrote.
func (b *bench) round(ctx context.Context, w, round int) (out []result, err error) {
	var src *sourceLog
	defer func() {
		if src != nil {
			err = errors.Join(err, b.deleteLog(ctx, src.logName), b.js.DeleteStream(context.WithoutCancel(ctx), src.stream))
		}
	}()
	for _, p := range b.o.paths {
		r := result{Path: p, Window: w, Batch: b.o.batch, Work: b.o.work.String(), Spin: b.o.spin.String(), Round: round, Messages: b.o.messages, Load1: load1()}
		switch p {
		case pathDirect:
			err = b.direct(ctx, w, &r)
		case pathRelay:
			err = b.viaRelay(ctx, w, &r)
		case pathSidecar:
			src, err = b.viaSidecar(ctx, w, &r)
		case pathReplay:
			err = b.viaReplay(ctx, src, &r)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		fmt.Printf("max_ack_pending %5d round %2d %-7s %9.0f msg/s  load %5.2f  cpu µs/msg bench %5.1f server %5.1f", w, round, p, r.MsgPerS, r.Load1, r.BenchCPUUs, r.ServerCPUUs)
		if b.o.logServerPID != 0 {
			fmt.Printf(" log server %5.1f", r.LogServerCPUUs)
		}
		switch p {
		case pathSidecar:
			fmt.Printf("  (acks that waited on the log %d, log writes %d of %d records)", r.AcksWaited, r.LogWrites, r.LogRecords)
		case pathReplay:
			fmt.Printf("  (from the target's start %.0f msg/s)", r.MsgPerSFromStart)
		}
		fmt.Println()
		out = append(out, r)
	}
	return out, nil
}

// fill makes a fresh stream with the bench's messages and a durable pull
// consumer on it with max_ack_pending w, and returns the stream's name.
func (b *bench) fill(ctx context.Context, w int) (string, error) {
	name := fmt.Sprintf("natsbench-%d", time.Now().UnixNano())
	subject := name + ".in"
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.FileStorage}); err != nil {
		return "", err
	}
	body := make([]byte, b.o.size)
	for range b.o.messages {
		if _, err := b.js.PublishAsync(subject, body, jetstream.WithStallWait(time.Minute)); err != nil {
			return name, err
		}
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-ctx.Done():
		return name, ctx.Err()
	}
	_, err := b.js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
		Durable: consumerName, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: w, AckWait: time.Minute,
	})
	return name, err
}

// direct drains a fresh stream straight from the server.
func (b *bench) direct(ctx context.Context, w int, r *result) (err error) {
	stream, err := b.fill(ctx, w)
	if stream != "" {
		defer func() { err = errors.Join(err, b.js.DeleteStream(context.WithoutCancel(ctx), stream)) }()
	}
	if err != nil {
		return err
	}
	return b.consume(ctx, b.url, stream, r, nil)
}

// viaSidecar drains a fresh stream through a source sidecar (the product's
// sidecar.Start, MS2M_BROKER=nats) whose replay log is a fresh JetStream
// stream, and leaves both for the replay path.
func (b *bench) viaSidecar(ctx context.Context, w int, r *result) (src *sourceLog, err error) {
	stream, err := b.fill(ctx, w)
	if err != nil {
		if stream != "" {
			err = errors.Join(err, b.js.DeleteStream(context.WithoutCancel(ctx), stream))
		}
		return nil, err
	}
	src = &sourceLog{stream: stream, logName: stream + "-log"}
	cfg, cleanup, err := b.sidecarConfig(src.logName)
	if err != nil {
		return src, err
	}
	defer cleanup()
	sc, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: quietLogger()})
	if err != nil {
		return src, fmt.Errorf("start the source sidecar: %w", err)
	}
	defer func() { err = errors.Join(err, sc.Close()) }()
	if err := b.consume(ctx, "nats://"+sc.AMQPAddr(), stream, r, nil); err != nil {
		return src, err
	}
	ctl := control.Client{URL: "http://" + sc.ControlAddr(), Token: controlToken}
	// Every ack reached the server (consume flushed them), each after its
	// record was durable (I1), so the log holds every delivery by now.
	st, err := ctl.State(ctx)
	if err != nil {
		return src, err
	}
	if st.Log.ConfirmedID != uint64(b.o.messages) {
		return src, fmt.Errorf("the source sidecar's log has %d deliveries confirmed after %d acks: want exactly %d (a redelivery, or an ack ahead of its record)",
			st.Log.ConfirmedID, b.o.messages, b.o.messages)
	}
	src.cutoff = st.Log.ConfirmedID
	r.LogWrites, r.LogRecords = st.Log.Writes, st.Log.Written
	r.AcksWaited, err = scrapeCounter(ctx, "http://"+sc.ControlAddr()+"/metrics", "ms2m_sidecar_nats_acks_waited_total")
	return src, err
}

// viaReplay drains the log src through a target sidecar that replays IDs
// 1 to src.cutoff into the same unmodified consumer.
func (b *bench) viaReplay(ctx context.Context, src *sourceLog, r *result) (err error) {
	if src == nil {
		return errors.New("no replay log: the sidecar path must run first in the round")
	}
	cfg, cleanup, err := b.sidecarConfig(src.logName)
	if err != nil {
		return err
	}
	defer cleanup()
	cfg.ReplayStart, cfg.ReplayCutoff = "0", strconv.FormatUint(src.cutoff, 10)
	t0 := time.Now()
	sc, err := sidecar.Start(ctx, cfg, sidecar.Options{Logger: quietLogger()})
	if err != nil {
		return fmt.Errorf("start the target sidecar: %w", err)
	}
	defer func() { err = errors.Join(err, sc.Close()) }()
	var total time.Duration
	ctl := control.Client{URL: "http://" + sc.ControlAddr(), Token: controlToken}
	// Untimed, while the app is still connected: the target must have
	// replayed exactly the log, and switch the consumer to the server once
	// the app settled it all.
	switched := func() error {
		total = time.Since(t0)
		return b.waitSwitch(ctx, ctl, src.cutoff)
	}
	if err := b.consume(ctx, "nats://"+sc.AMQPAddr(), src.stream, r, switched); err != nil {
		return err
	}
	r.SecondsFromStart, r.MsgPerSFromStart = total.Seconds(), float64(b.o.messages)/total.Seconds()
	return nil
}

// waitSwitch waits until the target behind ctl has switched its consumer
// to the server, and checks that it replayed IDs 1 to cutoff.
func (b *bench) waitSwitch(ctx context.Context, ctl control.Client, cutoff uint64) (err error) {
	var st control.State
	deadline := time.Now().Add(switchTimeout)
	for {
		if st, err = ctl.State(ctx); err != nil {
			return err
		}
		if rs := st.Replay; rs != nil && len(rs.Switched) > 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the target sidecar did not switch the consumer to the server within %s of the app's last ack: replay %+v", switchTimeout, st.Replay)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	if rs := st.Replay; rs.Replayed != cutoff || rs.LastReplayedID != cutoff {
		return fmt.Errorf("the target sidecar reports replay %+v after the consumer acked %d messages: want %d replayed up to ID %d (were some consumed from the server?)",
			rs, b.o.messages, cutoff, cutoff)
	}
	return nil
}

// sidecarConfig is a NATS sidecar's configuration with the product's
// defaults for the log, on loopback ports of its own, with a fresh state
// folder that cleanup removes.
func (b *bench) sidecarConfig(logName string) (cfg sidecar.Config, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "natsbench-state-")
	if err != nil {
		return cfg, nil, err
	}
	return sidecar.Config{
		Broker: sidecar.BrokerNATS, Listen: "127.0.0.1:0", Upstream: b.o.server, UpstreamConnectTimeout: 10 * time.Second,
		NATSURL: b.logURL, LogName: logName, LogMaxAge: time.Hour, LogMaxBytes: 1 << 30,
		LogPendingMaxBytes: 64 << 20, LogPendingMaxRecords: 65536,
		ControlListen: "127.0.0.1:0", ControlToken: controlToken, DrainTimeout: 10 * time.Second,
		StopHeld: "deliver", ReplayCutoff: "marker", LogLevel: "warn", StateDir: dir,
	}, func() { _ = os.RemoveAll(dir) }, nil
}

func (b *bench) deleteLog(ctx context.Context, logName string) error {
	return shadowqueue.DeleteJetStream(context.WithoutCancel(ctx), b.logURL, logName)
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// consume drains the bench's messages from the durable consumer on stream
// with an unmodified nats.go pull consumer (Consume, one Ack per message)
// connected to url, and fills r's timings. after, if set, runs once the
// last message is acked, before the consumer stops and disconnects.
func (b *bench) consume(ctx context.Context, url, stream string, r *result, after func() error) error {
	nc, err := nats.Connect(url, nats.Name("natsbench-app"))
	if err != nil {
		return err
	}
	defer nc.Close()
	ajs, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := ajs.Consumer(ctx, stream, consumerName)
	if err != nil {
		return err
	}
	var opts []jetstream.PullConsumeOpt
	if b.o.batch > 0 {
		opts = append(opts, jetstream.PullMaxMessages(b.o.batch))
	}
	n, chunk := b.o.messages, b.o.chunk
	stamps := make([]time.Time, 0, n/chunk+1)
	done := make(chan struct{})
	var count int
	cpu := cpuMeter{serverPID: b.serverPID, logPID: b.o.logServerPID}
	cpu.start()
	start := time.Now()
	// Consume calls the handler from one goroutine, so count needs no lock.
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if b.o.work > 0 {
			time.Sleep(b.o.work)
		}
		if b.o.spin > 0 {
			for t := time.Now(); time.Since(t) < b.o.spin; {
				// the consumer's own work on the message
			}
		}
		if err := m.Ack(); err != nil {
			return
		}
		count++
		if count%chunk == 0 || count == n {
			stamps = append(stamps, time.Now())
		}
		if count == n {
			close(done)
		}
	}, opts...)
	if err != nil {
		return err
	}
	defer cc.Stop()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(drainTimeout):
		return fmt.Errorf("drained %d of %d messages in %s", count, n, drainTimeout)
	}
	// The last Ack only buffered the ack in the client: the drain ends
	// when the server has every ack, which a flush's PONG proves (a
	// sidecar keeps the app's PING behind the acks waiting on the log).
	if err := nc.FlushTimeout(drainTimeout); err != nil {
		return fmt.Errorf("flush the acks: %w", err)
	}
	stamps[len(stamps)-1] = time.Now()
	r.BenchCPUUs, r.ServerCPUUs, r.LogServerCPUUs = cpu.stop(n)
	elapsed := stamps[len(stamps)-1].Sub(start)
	r.Seconds, r.MsgPerS = elapsed.Seconds(), float64(n)/elapsed.Seconds()
	r.ChunkMs = chunkMs(start, stamps)
	if after != nil {
		return after()
	}
	return nil
}

// chunkMs turns the times at which each chunk ended into how long each
// took, in milliseconds, from start.
func chunkMs(start time.Time, stamps []time.Time) []float64 {
	out := make([]float64, len(stamps))
	prev := start
	for i, t := range stamps {
		out[i] = float64(t.Sub(prev).Microseconds()) / 1000
		prev = t
	}
	return out
}

// scrapeCounter reads the counter name from the Prometheus text at url.
func scrapeCounter(ctx context.Context, url, name string) (uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return counterValue(resp.Body, name)
}

// counterValue finds the sample of the counter name (without labels) in
// Prometheus text.
func counterValue(r io.Reader, name string) (uint64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil || v < 0 {
				return 0, fmt.Errorf("metric %s: bad value %q", name, f[1])
			}
			return uint64(v), nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("metric %s: not found", name)
}
