package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ms2m/ms2m/internal/control"
	"github.com/ms2m/ms2m/internal/natsproxy"
	"github.com/ms2m/ms2m/internal/proxy"
	"github.com/ms2m/ms2m/internal/replay"
	"github.com/ms2m/ms2m/internal/shadowqueue"
	"github.com/ms2m/ms2m/internal/upstream"
)

// Options are the parts of a sidecar that tests replace.
type Options struct {
	Logger *slog.Logger
	// WrapLog, if set, wraps the replay log, for example to make it slow or
	// failing in a test.
	WrapLog func(shadowqueue.Log) shadowqueue.Log
	// Dial, if set, connects to the broker instead of net.Dialer, for
	// example to watch what the sidecar sends it.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// ReaderName, if set, names the replay log's reading connections at
	// the broker (default ms2m-replay-reader), so that a test can close a
	// target's reader from the broker's side.
	ReaderName string
	// DrainOnCancel makes the end of Start's ctx (SIGTERM, for Run) a
	// Shutdown rather than a Close: the app first finishes what it holds.
	DrainOnCancel bool
}

// Sidecar is a running sidecar.
type Sidecar struct {
	cfg          Config
	log          *slog.Logger
	reader       string       // Options.ReaderName
	proxy        *proxy.Proxy // the AMQP proxy; nil for a NATS sidecar
	front        frontProxy   // the proxy the app talks to, AMQP or NATS
	upstreamDesc string       // the broker, for logs: never with a password
	tee          *shadowqueue.Tee
	replay       shadowqueue.Log
	source       *replay.Source  // target sidecars only
	switchRec    *switchRecorder // target sidecars only
	// tookOver: this sidecar is configured for replay, but a previous run
	// in this pod took the log over (switchfile.go): it serves instead.
	tookOver *control.TakeOver
	lookup   *natsLookup // NATS sidecars only
	amqp     net.Listener
	ctlAddr  net.Addr
	ready    atomic.Bool
	// recent are the log's last records when an AMQP source continues a
	// log (tryOpenLog), for proxy.Options.Recent.
	recent []shadowqueue.Record

	wg      sync.WaitGroup
	errOnce sync.Once
	err     error
	cancel  context.CancelFunc
}

// frontProxy is what the sidecar and its control API need of the proxy in
// front of the app: *proxy.Proxy (AMQP) and *natsproxy.Proxy implement it.
type frontProxy interface {
	Serve(ctx context.Context, ln net.Listener) error
	State() proxy.State
	Quiesce(ctx context.Context) (id, epoch uint64, err error)
	Resume(ctx context.Context) error
	Stop(ctx context.Context) (proxy.StopResult, error)
	StartStopped(r proxy.StopResult)
}

// Run runs a sidecar until ctx is done.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	s, err := Start(ctx, cfg, Options{Logger: logger, DrainOnCancel: true})
	if err != nil {
		return err
	}
	return s.Wait()
}

// Start starts a sidecar. The control API answers at once (/healthz, and
// /readyz failing); Start then opens the replay log, retrying until it can
// or ctx is done, and only then listens for the app. It returns once the
// sidecar accepts app connections.
func Start(ctx context.Context, cfg Config, opts Options) (*Sidecar, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	parent := ctx
	if opts.DrainOnCancel {
		ctx = context.WithoutCancel(ctx) // the end of parent drains first (below)
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Sidecar{cfg: cfg, log: opts.Logger, reader: opts.ReaderName, cancel: cancel}
	if opts.DrainOnCancel {
		go func() {
			select {
			case <-parent.Done():
				s.drain()
				cancel()
			case <-ctx.Done():
			}
		}()
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := s.serveControl(ctx, reg); err != nil {
		cancel()
		return nil, err
	}

	rlog, last, err := s.prepareLog(ctx)
	if err != nil {
		return nil, s.abort(err)
	}
	if opts.WrapLog != nil {
		rlog = opts.WrapLog(rlog)
	}
	s.replay = rlog
	s.tee = shadowqueue.NewTee(rlog, last, shadowqueue.TeeOptions{
		Logger: s.log, MaxPendingBytes: cfg.LogPendingMaxBytes, MaxPendingRecords: cfg.LogPendingMaxRecords,
		MaxBatch: cfg.logMaxBatch(),
	})
	s.registerLogMetrics(reg)
	s.goRun(func() error { return s.tee.Run(ctx) })

	if cfg.Broker == BrokerNATS {
		s.startNATSProxy(reg, opts.Dial)
	} else if err := s.startAMQPProxy(reg, opts.Dial); err != nil {
		return nil, s.abort(err)
	}
	if s.source != nil {
		s.switchRec = &switchRecorder{s: s}
		s.goRun(func() error { s.switchRec.watch(ctx); return nil })
	}
	if err := s.restoreStop(); err != nil {
		return nil, s.abort(err)
	}
	if err := s.listen(ctx, last); err != nil {
		return nil, err
	}
	return s, nil
}

// restoreStop starts the proxy stopped if a previous run of this sidecar,
// in this pod, was stopped and not resumed (stopfile.go).
func (s *Sidecar) restoreStop() error {
	if s.cfg.StateDir == "" {
		s.log.Warn("no MS2M_STATE_DIR: a stop does not survive a restart of this sidecar (a restart between a migration's stop and its end would serve again and lose what it takes)")
		return nil
	}
	r, ok, err := readStop(s.cfg.StateDir, s.cfg.LogName)
	if err != nil || !ok {
		return err
	}
	s.front.StartStopped(r)
	s.log.Warn("started stopped: this sidecar was stopped before it restarted, and consumes nothing until POST /resume", "cutoff_id", r.CutoffID, "epoch", r.Epoch, "stopped_at", r.StoppedAt)
	return nil
}

// abort stops a sidecar that failed to start, and returns err with the
// errors of what had started.
func (s *Sidecar) abort(err error) error {
	s.fail(err)
	return errors.Join(err, s.Wait())
}

// serveControl listens on MS2M_CONTROL_LISTEN and serves the control API
// and the metrics in reg until ctx is done, then shuts the server down
// within a short grace.
func (s *Sidecar) serveControl(ctx context.Context, reg *prometheus.Registry) error {
	ctlLn, err := net.Listen("tcp", s.cfg.ControlListen)
	if err != nil {
		return fmt.Errorf("listen for the control API on MS2M_CONTROL_LISTEN=%s: %w", s.cfg.ControlListen, err)
	}
	s.ctlAddr = ctlLn.Addr()
	srv := &http.Server{Handler: control.Handler(api{s}, s.cfg.ControlToken, reg), ReadHeaderTimeout: 10 * time.Second}
	s.goRun(func() error {
		go func() {
			<-ctx.Done()
			shut, c := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer c()
			if srv.Shutdown(shut) != nil {
				srv.Close() // the grace is over: drop the connections still open
			}
		}()
		if err := srv.Serve(ctlLn); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("control API: %w", err)
		}
		return nil
	})
	return nil
}

// prepareLog opens the replay log and returns it with the record the tee
// continues after. A target first checks that the log exists, and then
// replays from it (startReplay); its tee continues after the cutoff, once
// replay is done, so last is the zero record. A target that took the log
// over before it restarted (switchfile.go) opens it as a source does.
func (s *Sidecar) prepareLog(ctx context.Context) (rlog shadowqueue.Log, last shadowqueue.Record, err error) {
	rng, isTarget, _ := s.cfg.Replay()
	if isTarget && s.cfg.StateDir != "" {
		rec, ok, err := readSwitch(s.cfg.StateDir, s.cfg.LogName)
		if err != nil {
			return nil, shadowqueue.Record{}, err
		}
		if ok {
			s.tookOver, isTarget = &control.TakeOver{CutoffID: rec.CutoffID, Epoch: rec.Epoch, SwitchedAt: rec.SwitchedAt}, false
			s.log.Warn(fmt.Sprintf("this sidecar had already taken the replay log over at cutoff %d before it restarted: serving it, not replaying", rec.CutoffID), "log", s.cfg.LogName, "epoch", rec.Epoch, "switched_at", rec.SwitchedAt)
		}
	}
	if isTarget {
		if err := s.requireLog(ctx); err != nil {
			return nil, shadowqueue.Record{}, err
		}
	}
	rlog, last, err = s.openLog(ctx)
	if err != nil {
		return nil, shadowqueue.Record{}, err
	}
	if !isTarget {
		return rlog, last, nil
	}
	if err := s.startReplay(ctx, rlog, rng, last); err != nil {
		return nil, shadowqueue.Record{}, err
	}
	return rlog, shadowqueue.Record{}, nil
}

// startReplay starts replaying rng from the replay log rlog, whose last
// record is last, in the background until ctx is done, and sets s.source.
func (s *Sidecar) startReplay(ctx context.Context, rlog shadowqueue.Log, rng replay.Range, last shadowqueue.Record) error {
	follower, isFollower := rlog.(replay.Follower)
	if !isFollower {
		return fmt.Errorf("replay mode: the replay log %q cannot be followed", s.cfg.LogName)
	}
	if s.cfg.Broker == BrokerNATS {
		follower = natsproxy.KeyedFollower(follower) // records per consumer
	}
	// What the log holds now: a cutoff of "end", and deliveries beyond
	// the cutoff that this pod's identity took before (replay.Range).
	rng.LogEnd, rng.LogEndEpoch = last.ID, last.Epoch
	src, err := replay.NewSource(follower, rng)
	if err != nil {
		return err
	}
	src.Logger = s.log
	s.source = src
	go func() {
		if err := src.Run(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("replay stopped: the app gets no more replayed messages and nothing is consumed upstream", "range", rng.String(), "err", err)
		}
	}()
	s.log.Info("replay mode", "range", rng.String(), "log", s.cfg.LogName)
	return nil
}

// startNATSProxy makes a NATS proxy, teeing into s.tee, the proxy in front
// of the app, and exports its counters in reg.
func (s *Sidecar) startNATSProxy(reg *prometheus.Registry, dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
	o := natsproxy.Options{
		Upstream:       s.cfg.Upstream,
		ConnectTimeout: s.cfg.UpstreamConnectTimeout,
		DrainTimeout:   s.cfg.DrainTimeout,
		Logger:         s.log,
		Dial:           dial,
	}
	lookup := &natsLookup{url: s.cfg.NATSURL} // connects on first use
	s.lookup = lookup
	o.Recover = lookup
	if s.source != nil {
		o.Replay, o.Lookup = s.source, lookup
	}
	np := natsproxy.New(s.tee, o)
	registerNATSMetrics(reg, np)
	s.front = np
	s.upstreamDesc = s.cfg.Upstream
	if s.source != nil {
		s.registerReplayMetrics(reg)
	}
}

// startAMQPProxy makes an AMQP proxy, teeing into s.tee and replaying from
// s.source on a target, the proxy in front of the app, and exports its
// metrics in reg. It fails when the MS2M_UPSTREAM* settings do not make a
// dialer.
func (s *Sidecar) startAMQPProxy(reg *prometheus.Registry, dial func(ctx context.Context, network, addr string) (net.Conn, error)) error {
	ucfg, err := s.cfg.UpstreamConfig()
	if err == nil {
		ucfg.AttemptTimeout = min(2*time.Second, s.cfg.UpstreamConnectTimeout)
	}
	dialer, err := upstream.NewDialer(ucfg, dial)
	if err != nil {
		return fmt.Errorf("the broker (MS2M_UPSTREAM*): %w", err)
	}
	s.upstreamDesc = dialer.String()
	popts := proxy.Options{
		Upstream:          dialer,
		ConnectTimeout:    s.cfg.UpstreamConnectTimeout,
		DrainTimeout:      s.cfg.DrainTimeout,
		LossDrain:         s.cfg.LossDrain,
		Logger:            s.log,
		Metrics:           proxy.NewMetrics(reg),
		CheckPublishes:    s.cfg.PublishCheck,
		RequeueHeldOnStop: s.cfg.StopHeld == "requeue",
		Recent:            s.recent,
	}
	s.recent = nil
	if s.source != nil {
		popts.Replay = s.source
	}
	s.proxy = proxy.New(s.tee, popts)
	s.front = s.proxy
	if s.source != nil {
		s.registerReplayMetrics(reg)
	}
	return nil
}

// registerReplayMetrics exports a target's replay progress.
func (s *Sidecar) registerReplayMetrics(reg *prometheus.Registry) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ms2m_sidecar_replay_lag", Help: "Records in the replay log beyond the last one replayed to the app (targets only)."},
			func() float64 { return float64(s.replayLag()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ms2m_sidecar_replay_reader_reconnecting", Help: "1 while the replay log reader has lost its connection to the broker and is reconnecting (targets only)."},
			func() float64 {
				if s.source.Status().Reader == replay.ReaderReconnecting {
					return 1
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ms2m_sidecar_replayed_total", Help: "Replayed deliveries handed to the app (targets only)."},
			func() float64 {
				if r := s.front.State().Replay; r != nil {
					return float64(r.Replayed)
				}
				return 0
			}),
	)
}

// listen starts serving the app. On error the sidecar is stopped.
func (s *Sidecar) listen(ctx context.Context, last shadowqueue.Record) error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		err = fmt.Errorf("listen for the app on MS2M_LISTEN=%s: %w", s.cfg.Listen, err)
		s.fail(err)
		return errors.Join(err, s.Wait())
	}
	s.amqp = ln
	s.goRun(func() error { return s.front.Serve(ctx, ln) })
	s.ready.Store(true)
	s.log.Info("sidecar ready", "broker", s.cfg.Broker, "listen", ln.Addr().String(), "upstream", s.upstreamDesc,
		"log", s.cfg.LogName, "next_id", last.ID+1, "control", s.ctlAddr.String())
	return nil
}

// requireLog checks, retrying while the broker is unreachable, that a
// target's replay log exists: replaying from a log that is not there would
// replay nothing and hand the app an empty state.
func (s *Sidecar) requireLog(ctx context.Context) error {
	delay := 100 * time.Millisecond
	for {
		var ok bool
		var err error
		if s.cfg.Broker == BrokerNATS {
			ok, err = shadowqueue.JetStreamExists(ctx, s.cfg.NATSURL, s.cfg.LogName)
		} else {
			tc, terr := s.cfg.StreamTLS()
			if terr != nil {
				return terr
			}
			ok, err = shadowqueue.StreamExists(ctx, shadowqueue.StreamOptions{URI: s.cfg.StreamURI, Name: s.cfg.LogName, TLS: tc})
		}
		if err == nil && !ok {
			return fmt.Errorf("replay mode: the replay log %q does not exist on the broker; check MS2M_LOG_NAME (it must name the source's log)", s.cfg.LogName)
		}
		if err == nil {
			return nil
		}
		s.log.Warn("cannot check the replay log yet; retrying", "log", s.cfg.LogName, "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return fmt.Errorf("replay mode: check that the replay log %q exists: %w (last error: %v)", s.cfg.LogName, context.Cause(ctx), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// openLog opens the replay log and reads its last record, retrying with
// back-off until it succeeds or ctx is done.
func (s *Sidecar) openLog(ctx context.Context) (shadowqueue.Log, shadowqueue.Record, error) {
	delay := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		l, last, err := s.tryOpenLog(ctx)
		if err == nil {
			return l, last, nil
		}
		s.log.Warn("replay log not available yet; retrying", "log", s.cfg.LogName, "attempt", attempt, "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return nil, shadowqueue.Record{}, fmt.Errorf("open replay log %q: %w (last error: %v)", s.cfg.LogName, context.Cause(ctx), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func (s *Sidecar) tryOpenLog(ctx context.Context) (shadowqueue.Log, shadowqueue.Record, error) {
	if s.cfg.Broker == BrokerNATS {
		l, err := shadowqueue.OpenJetStream(ctx, shadowqueue.JetStreamOptions{
			URL: s.cfg.NATSURL, Name: s.cfg.LogName, MaxAge: s.cfg.LogMaxAge, MaxBytes: s.cfg.LogMaxBytes, Logger: s.log,
		})
		if err != nil {
			return nil, shadowqueue.Record{}, err
		}
		last, _, err := l.Last(ctx)
		if err != nil {
			_ = l.Close() // the open failed: the error says why
			return nil, shadowqueue.Record{}, err
		}
		return l, last, nil
	}
	tc, err := s.cfg.StreamTLS()
	if err != nil {
		return nil, shadowqueue.Record{}, err
	}
	l, err := shadowqueue.OpenStream(ctx, shadowqueue.StreamOptions{
		URI: s.cfg.StreamURI, TLS: tc, Name: s.cfg.LogName, MaxAge: s.cfg.LogMaxAge, MaxBytes: s.cfg.LogMaxBytes,
		ReaderName: s.reader,
	})
	if err != nil {
		return nil, shadowqueue.Record{}, err
	}
	last, _, err := l.Last(ctx)
	if err != nil {
		l.Close()
		return nil, shadowqueue.Record{}, err
	}
	if _, isTarget, _ := s.cfg.Replay(); (!isTarget || s.tookOver != nil) && last.ID > 0 {
		// A source that continues a log may have died with its app: read
		// what that app may have held (proxy.Options.Recent).
		if s.recent, err = l.Recent(ctx, proxy.MaxRequeued); err != nil {
			l.Close()
			return nil, shadowqueue.Record{}, err
		}
	}
	return l, last, nil
}

func (s *Sidecar) registerLogMetrics(reg *prometheus.Registry) {
	gauge := func(name, help string, f func(shadowqueue.TeeStatus) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(s.tee.Status()) })
	}
	counter := func(name, help string, f func(shadowqueue.TeeStatus) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f(s.tee.Status())) })
	}
	reg.MustRegister(
		counter("ms2m_sidecar_log_writes_total", "Writes to the replay log that the broker confirmed; each carries one batch of records.", func(t shadowqueue.TeeStatus) uint64 { return t.Writes }),
		counter("ms2m_sidecar_log_records_written_total", "Records in the confirmed writes to the replay log (records per write = this / ms2m_sidecar_log_writes_total).", func(t shadowqueue.TeeStatus) uint64 { return t.Written }),
		gauge("ms2m_sidecar_log_last_id", "Last delivery ID assigned.", func(t shadowqueue.TeeStatus) float64 { return float64(t.LastID) }),
		gauge("ms2m_sidecar_log_confirmed_id", "Last delivery ID durable in the replay log.", func(t shadowqueue.TeeStatus) float64 { return float64(t.ConfirmedID) }),
		gauge("ms2m_sidecar_log_pending_records", "Records not yet confirmed by the replay log.", func(t shadowqueue.TeeStatus) float64 { return float64(t.Pending) }),
		gauge("ms2m_sidecar_log_pending_bytes", "Encoded bytes of the records not yet confirmed by the replay log (bounded by MS2M_LOG_PENDING_MAX_BYTES).", func(t shadowqueue.TeeStatus) float64 { return float64(t.PendingBytes) }),
		gauge("ms2m_sidecar_log_backpressure", "1 while the records not yet confirmed by the replay log are at a bound and reads from the broker are paused.", func(t shadowqueue.TeeStatus) float64 {
			if t.Backpressure {
				return 1
			}
			return 0
		}),
		counter("ms2m_sidecar_log_backpressure_total", "Times reads from the broker were paused because the replay log's backlog reached a bound.", func(t shadowqueue.TeeStatus) uint64 { return t.BackpressureEpisodes }),
		gauge("ms2m_sidecar_log_degraded", "1 while writes to the replay log fail (acks are held).", func(t shadowqueue.TeeStatus) float64 {
			if t.Degraded {
				return 1
			}
			return 0
		}),
	)
}

// registerNATSMetrics exports a NATS proxy's counters.
func registerNATSMetrics(reg prometheus.Registerer, p *natsproxy.Proxy) {
	counter := func(name, help string, f func(natsproxy.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f(p.Stats())) })
	}
	reg.MustRegister(
		counter("ms2m_sidecar_nats_connections_total", "App connections the NATS proxy accepted.", func(s natsproxy.Stats) uint64 { return s.Connections }),
		counter("ms2m_sidecar_nats_js_deliveries_total", "JetStream deliveries handed to the app and teed.", func(s natsproxy.Stats) uint64 { return s.JSDeliveries }),
		counter("ms2m_sidecar_nats_repeated_deliveries_total", "Redeliveries of messages whose first delivery the log has, logged as repeats of it.", func(s natsproxy.Stats) uint64 { return s.Repeats }),
		counter("ms2m_sidecar_nats_redeliveries_absorbed_total", "On a target, the server's redeliveries of messages the replay gave the app, acked by the sidecar instead of handed over again.", func(s natsproxy.Stats) uint64 { return s.RedeliveriesAbsorbed }),
		counter("ms2m_sidecar_nats_core_teed_total", "Core NATS messages teed best effort.", func(s natsproxy.Stats) uint64 { return s.CoreTeed }),
		counter("ms2m_sidecar_nats_acks_total", "App acks of JetStream deliveries sent to the server.", func(s natsproxy.Stats) uint64 { return s.Acks }),
		counter("ms2m_sidecar_nats_acks_waited_total", "Of those, acks that waited for the replay log.", func(s natsproxy.Stats) uint64 { return s.AcksWaited }),
		counter("ms2m_sidecar_nats_acks_absorbed_total", "App acks of deliveries this sidecar did not hand out, not sent on (the server redelivers those).", func(s natsproxy.Stats) uint64 { return s.AcksAbsorbed }),
		counter("ms2m_sidecar_nats_pulls_absorbed_total", "Pull requests not sent on while quiesced or stopped.", func(s natsproxy.Stats) uint64 { return s.PullsAbsorbed }),
		counter("ms2m_sidecar_nats_info_stripped_total", "Server INFOs whose cluster URLs were removed.", func(s natsproxy.Stats) uint64 { return s.INFOStripped }),
	)
}

func (s *Sidecar) goRun(f func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := f(); err != nil {
			s.fail(err)
		}
	}()
}

func (s *Sidecar) fail(err error) {
	s.errOnce.Do(func() { s.err = err })
	s.cancel()
}

// Wait blocks until the sidecar has stopped, and returns the first error.
func (s *Sidecar) Wait() error {
	s.wg.Wait()
	if s.replay != nil {
		s.replay.Close()
	}
	if s.lookup != nil {
		s.lookup.Close()
	}
	return s.err
}

// Close stops the sidecar at once and waits for it, as a crash would: the
// acks of its app that have not gone upstream yet are lost, and the broker
// redelivers those messages. Shutdown is the graceful stop.
func (s *Sidecar) Close() error {
	s.cancel()
	return s.Wait()
}

// Shutdown stops the sidecar as SIGTERM does (Run): a serving sidecar
// (AMQP or NATS) first holds new deliveries back from its app and lets it
// settle what it holds, its acks upstream, for up to MS2M_DRAIN_TIMEOUT;
// then it closes. The kubelet restarts a sidecar whose liveness probe failed with
// SIGTERM while the app runs on: without the drain, the acks still on
// their way (waiting on the log, or in the sidecar's queue) were lost, and
// the app folded the broker's redeliveries of messages it had done.
func (s *Sidecar) Shutdown() error {
	s.drain()
	return s.Close()
}

// drain is Shutdown's first part. It does nothing unless the sidecar is
// ready, serving or quiesced, and not replaying: a stopped sidecar has its
// app's acks upstream and nothing held, and a target still replaying is
// given up by its migration anyway. A serving sidecar is quiesced first.
// A drain that times out is logged, and the sidecar closes regardless.
// Then a NATS sidecar gives the deliveries it held back from the app to
// the server again (natsproxy.Proxy.ReturnHeld), which otherwise would
// come back only after the consumer's ack wait, behind later messages; an
// AMQP broker requeues them itself when the sidecar's channels close.
func (s *Sidecar) drain() {
	if !s.ready.Load() {
		return
	}
	st := s.front.State()
	if (st.Mode != proxy.Serving.String() && st.Mode != proxy.Quiesced.String()) || (st.Replay != nil && st.Replay.Replaying > 0) {
		return
	}
	if st.Mode == proxy.Serving.String() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
		began := time.Now()
		_, _, err := s.front.Quiesce(ctx)
		cancel()
		if err != nil {
			s.log.Warn("shutting down without a full drain: what the app still holds goes back to the broker", "err", err)
		} else {
			s.log.Info("drained: the app settled what it held and its acks are upstream; shutting down", "took", time.Since(began).Round(time.Millisecond))
		}
	}
	if np, ok := s.front.(*natsproxy.Proxy); ok {
		ctx, cancel := context.WithTimeout(context.Background(), returnHeldTimeout)
		defer cancel()
		if _, err := np.ReturnHeld(ctx); err != nil {
			s.log.Warn("shutting down without giving every held delivery back: the server redelivers the rest after the consumer's ack wait", "err", err)
		}
	}
}

// returnHeldTimeout bounds the drain's return of held NATS deliveries (a
// flush to the server and back).
const returnHeldTimeout = 2 * time.Second

// AMQPAddr is where the app connects.
func (s *Sidecar) AMQPAddr() string { return s.amqp.Addr().String() }

// ControlAddr is the control API's address.
func (s *Sidecar) ControlAddr() string { return s.ctlAddr.String() }

// Proxy returns the AMQP proxy (nil for a NATS sidecar).
func (s *Sidecar) Proxy() *proxy.Proxy { return s.proxy }

// replayLag returns the target's lag behind the log.
func (s *Sidecar) replayLag() uint64 {
	st := s.front.State()
	last := s.source.Status().LogLast
	if st.Replay == nil || last <= st.Replay.LastReplayedID {
		return 0
	}
	return last - st.Replay.LastReplayedID
}

// api adapts a Sidecar to the control API.
type api struct{ s *Sidecar }

var _ control.Sidecar = api{}

func (a api) State() control.State {
	st := control.State{LogName: a.s.cfg.LogName, Ready: a.s.ready.Load(), TookOver: a.s.tookOver}
	if st.Ready {
		st.State = a.s.front.State()
		if a.s.source != nil {
			ss := a.s.source.Status()
			st.Source = &ss
			lag := a.s.replayLag()
			st.ReplayLag = &lag
			if ok, _ := a.s.switchRec.record(st.State); !ok && switched(st.State) {
				// Not reported until recorded: a restart would replay
				// again. The recorder's watch logs why.
				r := *st.Replay
				r.SwitchedAt = nil
				st.Replay = &r
			}
			if r := st.Replay; r != nil && (r.SwitchedAt == nil || r.Replaying > 0) {
				st.Mode = control.ModeReplaying // a target that has not taken over yet
			}
		}
	} else {
		st.Mode = control.ModeStarting
	}
	return st
}

func (a api) Ready() error {
	if !a.s.ready.Load() {
		return errors.New("not ready: the replay log is not open yet")
	}
	return nil
}

func (a api) Quiesce(ctx context.Context) (control.Cut, error) {
	if err := a.Ready(); err != nil {
		return control.Cut{}, fmt.Errorf("%w: %w", control.ErrConflict, err)
	}
	id, epoch, err := a.s.front.Quiesce(ctx)
	if errors.Is(err, proxy.ErrStopped) {
		err = fmt.Errorf("%w: %w", control.ErrConflict, err)
	}
	return control.Cut{ID: id, Epoch: epoch}, err
}

func (a api) Resume(ctx context.Context) error {
	if err := a.Ready(); err != nil {
		return fmt.Errorf("%w: %w", control.ErrConflict, err)
	}
	if err := a.s.front.Resume(ctx); err != nil {
		return err
	}
	if a.s.cfg.StateDir != "" {
		return clearStop(a.s.cfg.StateDir) // a retried resume removes it then
	}
	return nil
}

func (a api) Stop(ctx context.Context) (control.StopResult, error) {
	if err := a.Ready(); err != nil {
		return control.StopResult{}, fmt.Errorf("%w: %w", control.ErrConflict, err)
	}
	r, err := a.s.front.Stop(ctx)
	if err == nil && a.s.cfg.StateDir != "" {
		if err := writeStop(a.s.cfg.StateDir, a.s.cfg.LogName, r); err != nil {
			return control.StopResult{}, fmt.Errorf("%w; the sidecar is stopped, but would serve again if it restarted: POST /resume, or stop again", err)
		}
	}
	return control.StopResult(r), err // the same fields: the compiler keeps them so
}
