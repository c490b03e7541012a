package draplugin

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the DRA plugin's Prometheus metrics. A nil *Metrics counts
// nothing.
type Metrics struct {
	claims  *prometheus.CounterVec
	latency *prometheus.HistogramVec
}

// NewMetrics registers the plugin's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "resclass_node_agent_dra_claims_total",
			Help: "ResourceClaims the DRA plugin was asked about, by operation (prepare, unprepare) and outcome: prepared, repeated (prepared before: the same answer again), unprepared, unknown (unprepare of a claim not prepared here), conflict (a device already prepared for another claim: refused), invalid (not allocated, or a device not on this node), error (the CDI spec or the checkpoint could not be written).",
		}, []string{"operation", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "resclass_node_agent_dra_call_duration_seconds",
			Help:    "Time to answer one kubelet DRA call (prepare: NodePrepareResources, unprepare: NodeUnprepareResources), all its claims together, checkpoint written.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"operation"}),
	}
	reg.MustRegister(m.claims, m.latency)
	return m
}

func (m *Metrics) claim(operation, outcome string) {
	if m != nil {
		m.claims.WithLabelValues(operation, outcome).Inc()
	}
}

func (m *Metrics) observe(operation string, start time.Time) {
	if m != nil {
		m.latency.WithLabelValues(operation).Observe(time.Since(start).Seconds())
	}
}
