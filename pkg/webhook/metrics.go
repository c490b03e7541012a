package webhook

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The webhook's own metrics, beside controller-runtime's on the same /metrics:
// controller_runtime_webhook_latency_seconds{webhook} is the admission latency
// and controller_runtime_webhook_requests_total{webhook,code} the answers.
var (
	denials = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "resclass", Subsystem: "webhook", Name: "denials_total",
		Help: "Admission requests denied, by webhook path and reason (empty-namespace-selector, uncovered-scopes, uncovered-resources, invalid-selector, spec-immutable, bad-request) — and internal-error, pods the webhook could not decide on.",
	}, []string{"webhook", "reason"})
	quotaConfigLoads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "resclass", Subsystem: "webhook", Name: "quota_config_loads_total",
		Help: "Loads of --quota-config by result: loaded (a new config is in force) or invalid (reported; the last good one stays).",
	}, []string{"result"})
	quotaConfigValid = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "resclass", Subsystem: "webhook", Name: "quota_config_last_load_valid",
		Help: "1 when the last attempt to load --quota-config succeeded, 0 when the file in place is invalid and an older config is in force.",
	})
)

func init() {
	metrics.Registry.MustRegister(denials, quotaConfigLoads, quotaConfigValid)
}
