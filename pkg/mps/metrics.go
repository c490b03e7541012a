package mps

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the supervisor's, in a registry of its own.
type Metrics struct {
	Registry *prometheus.Registry
	running  prometheus.Gauge
	restarts *prometheus.CounterVec
}

// NewMetrics registers the supervisor's metrics.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "resclass_mps_daemons_running",
			Help: "MPS control daemons of this node whose last probe succeeded.",
		}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "resclass_mps_daemon_restarts_total",
			Help: "MPS control daemons started again, by GPU and reason: exited (it ended unasked) or probe (it stopped answering and was killed).",
		}, []string{"gpu", "reason"}),
	}
	m.Registry.MustRegister(m.running, m.restarts)
	return m
}
