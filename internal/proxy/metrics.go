package proxy

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the proxy's Prometheus metrics.
type Metrics struct {
	connections          prometheus.Gauge
	deliveries           *prometheus.CounterVec
	settled              *prometheus.CounterVec
	gateWaits            prometheus.Histogram
	frameErrors          *prometheus.CounterVec
	upstreamDialFailures prometheus.Counter
	requeued             prometheus.Counter
	repeats              prometheus.Counter
	heldHanded           prometheus.Counter
	mode                 prometheus.Gauge
	suppressed           *prometheus.CounterVec
	pubChecked           prometheus.Counter
	pubMismatches        prometheus.Counter
	acksCoalesced        prometheus.Counter
	absorbed             prometheus.Counter
}

// NewMetrics makes the proxy's metrics and registers them with reg, unless
// reg is nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ms2m_sidecar_connections", Help: "App connections open through the sidecar.",
		}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ms2m_sidecar_deliveries_total", Help: "Deliveries handed to the app and teed into the replay log.",
		}, []string{"queue"}),
		settled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ms2m_sidecar_settled_total", Help: "Deliveries the app acked (outcome=ack) or nacked/rejected (outcome=reject).",
		}, []string{"queue", "outcome"}),
		gateWaits: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ms2m_sidecar_ack_gate_wait_seconds",
			Help:    "How long app acks waited for their deliveries to be durable in the replay log (only acks that had to wait).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		frameErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ms2m_sidecar_frame_errors_total", Help: "Connections closed for a malformed or unexpected frame, by the side that sent it.",
		}, []string{"side"}),
		upstreamDialFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ms2m_sidecar_upstream_connect_failures_total", Help: "App connections closed because the broker could not be reached.",
		}),
		requeued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ms2m_sidecar_requeued_total", Help: "Held deliveries given back to the broker on stop (MS2M_STOP_HELD=requeue, or arriving after the stop).",
		}),
		repeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ms2m_sidecar_repeated_deliveries_total", Help: "Redeliveries of messages the broker took back when the app's channel or connection ended holding them, logged as repeats of their first delivery (a replay gives the app each message once).",
		}),
		heldHanded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ms2m_sidecar_stop_held_delivered_total", Help: "Deliveries held back since the quiesce that a stop gave the app, before its cutoff.",
		}),
		mode: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ms2m_sidecar_mode", Help: "0 serving, 1 quiesced, 2 stopped.",
		}),
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ms2m_sidecar_suppressed_publishes_total", Help: "App publishes absorbed during replay (the source already made them), by exchange and routing key.",
		}, []string{"exchange", "routing_key"}),
		pubChecked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ms2m_sidecar_publish_checked_total", Help: "Replayed deliveries whose absorbed publishes were compared against the source's (publish checking on).",
		}),
		pubMismatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ms2m_sidecar_publish_mismatches_total", Help: "Replayed deliveries for which the app published differently than on the source: a sign of a non-deterministic app.",
		}),
		acksCoalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ms2m_sidecar_acks_coalesced_total", Help: "App acks that went upstream inside a later cumulative ack (basic.ack multiple=true) instead of on their own.",
		}),
		absorbed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ms2m_sidecar_redeliveries_absorbed_total", Help: "Redeliveries of messages the app acked while (or just before) the broker's connection went, acked upstream by the sidecar and kept from the app, which had them already.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.connections, m.deliveries, m.settled, m.gateWaits, m.frameErrors,
			m.upstreamDialFailures, m.requeued, m.repeats, m.heldHanded, m.mode, m.suppressed, m.pubChecked, m.pubMismatches, m.acksCoalesced, m.absorbed)
	}
	return m
}
