package controller

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ms2m/ms2m/internal/contract"
)

// Result is how a requested migration ended, as the result label of
// ms2m_migrations_total.
type Result string

const (
	ResultSucceeded  Result = "succeeded"
	ResultFailed     Result = "failed"      // the source was resumed
	ResultRejected   Result = "rejected"    // bad request; nothing was touched
	ResultRolledBack Result = "rolled_back" // left running by a killed controller, or restored on the source's node
)

// DurationBuckets are the bounds, in seconds, of the migration histograms:
// from 1 ms (a downtime, a quick phase) to 5 minutes (the default bound on
// each wait).
var DurationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// Metrics are the controller's Prometheus metrics; docs/migrator.md lists
// them.
type Metrics struct {
	Migrations    *prometheus.CounterVec
	Duration      *prometheus.HistogramVec
	Downtime      *prometheus.HistogramVec
	PhaseDuration *prometheus.HistogramVec
	Running       prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg. If reg
// already holds them (a second controller in one process), it shares those.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Migrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ms2m_migrations_total",
			Help: "Requested migrations that ended, by strategy and result (succeeded, failed, rejected, rolled_back).",
		}, []string{"strategy", "result"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ms2m_migration_duration_seconds",
			Help:    "Time from the start of a migration to the deletion of its source, of migrations that succeeded, by strategy.",
			Buckets: DurationBuckets,
		}, []string{"strategy"}),
		Downtime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ms2m_migration_downtime_seconds",
			Help:    "Time no consumer took messages from the queue during a migration that succeeded, by strategy.",
			Buckets: DurationBuckets,
		}, []string{"strategy"}),
		PhaseDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ms2m_migration_phase_duration_seconds",
			Help:    "Time each phase of a migration took, by strategy and phase; the phases that ended, of migrations that succeeded or failed.",
			Buckets: DurationBuckets,
		}, []string{"strategy", "phase"}),
		Running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ms2m_migrations_running",
			Help: "Migrations this controller drives now.",
		}),
	}
	var err error
	if m.Migrations, err = register(reg, m.Migrations); err != nil {
		return nil, err
	}
	if m.Duration, err = register(reg, m.Duration); err != nil {
		return nil, err
	}
	if m.Downtime, err = register(reg, m.Downtime); err != nil {
		return nil, err
	}
	if m.PhaseDuration, err = register(reg, m.PhaseDuration); err != nil {
		return nil, err
	}
	if m.Running, err = register(reg, m.Running); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c with reg, or returns the collector reg already has
// under its name.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	switch {
	case err == nil:
		return c, nil
	case errors.As(err, &are):
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}

// DefaultMetrics are the metrics in controller-runtime's registry, which
// the manager's metrics endpoint serves.
var DefaultMetrics = sync.OnceValue(func() *Metrics {
	m, err := NewMetrics(ctrlmetrics.Registry)
	if err != nil {
		panic("controller: register the metrics: " + err.Error()) // fixed names and labels: a bug
	}
	return m
})

// started counts a migration this controller now drives; stopped, deferred
// by the caller, ends it.
func (m *Metrics) started() { m.Running.Inc() }
func (m *Metrics) stopped() { m.Running.Dec() }

// record counts a migration that ended with result, as st (with its report,
// if the migration ran) describes it.
func (m *Metrics) record(result Result, st Status) {
	strategy := strategyLabel(st.Strategy)
	m.Migrations.WithLabelValues(strategy, string(result)).Inc()
	if st.Report == nil {
		return
	}
	if result == ResultSucceeded {
		m.Duration.WithLabelValues(strategy).Observe(st.Report.Total.Seconds())
		m.Downtime.WithLabelValues(strategy).Observe(st.Report.Downtime.Seconds())
	}
	for _, ph := range st.Report.Phases {
		m.PhaseDuration.WithLabelValues(strategy, ph.Name).Observe(ph.Took.Seconds())
	}
}

// strategyLabel bounds the strategy label to the strategies there are: a
// status read back from an annotation may hold anything.
func strategyLabel(s string) string {
	switch contract.Strategy(s) {
	case contract.StrategyMS2M, contract.StrategyMS2MCutoff, contract.StrategyStopAndCopy, contract.StrategyCRIUAlone:
		return s
	}
	return "unknown"
}
