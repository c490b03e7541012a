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
	quotaConfigUncovered = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "resclass", Subsystem: "webhook", Name: "quota_config_uncovered_rules",
		Help: "Rules in force (limited scopes, matchContains, the empty-namespaceSelector refusal) that concern pods the webhook configuration's matchConditions never send (--match-conditions-cover): not enforced. Alert when above 0; re-render the configuration.",
	})
	shedRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "resclass", Subsystem: "webhook", Name: "shed_requests_total",
		Help: "Admission requests answered at once with HTTP 429 (overloaded) because --max-in-flight requests were already being worked on, by webhook path. The webhook's failurePolicy decides what the apiserver does with them: Fail refuses, Ignore admits.",
	}, []string{"webhook"})
	inFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "resclass", Subsystem: "webhook", Name: "in_flight_requests",
		Help: "Admission requests being worked on now; at --max-in-flight, more are shed.",
	})
)

func init() {
	metrics.Registry.MustRegister(denials, quotaConfigLoads, quotaConfigValid, quotaConfigUncovered, shedRequests, inFlight)
}
