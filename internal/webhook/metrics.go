package webhook

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DurationBuckets are the bounds, in seconds, of the handler-time
// histogram: fine below 10 ms, where the handler should be (it needs about
// 0.1 ms of CPU per pod). 5 ms, the latency goal, is one of them, so the
// share of requests within the goal reads straight off the histogram.
var DurationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

// Metrics are the webhook's Prometheus metrics; docs/webhook.md lists them.
type Metrics struct {
	Requests *prometheus.CounterVec
	Duration *prometheus.HistogramVec
}

// NewMetrics creates the metrics and registers them with reg. If reg
// already holds them (a second handler in one process), it shares those.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ms2m_webhook_admission_requests_total",
			Help: "Admission requests for pods by operation (CREATE, UPDATE) and outcome (injected, restored, skipped, allowed, denied, error).",
		}, []string{"operation", "outcome"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ms2m_webhook_admission_duration_seconds",
			Help:    "Time spent in the webhook's handler per admission request, from the decoded request to the response with its patch, by operation.",
			Buckets: DurationBuckets,
		}, []string{"operation"}),
	}
	if err := reg.Register(m.Requests); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		m.Requests = are.ExistingCollector.(*prometheus.CounterVec)
	}
	if err := reg.Register(m.Duration); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		m.Duration = are.ExistingCollector.(*prometheus.HistogramVec)
	}
	return m, nil
}

func (m *Metrics) observe(op, outcome string, d time.Duration) {
	m.Requests.WithLabelValues(op, outcome).Inc()
	m.Duration.WithLabelValues(op).Observe(d.Seconds())
}
