package distribution

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The distribution's own metrics, beside controller-runtime's
// (controller_runtime_reconcile_*{controller="resourcedistribution"}) on the
// same /metrics.
var (
	authorizationChecks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "resclass", Subsystem: "distribution", Name: "authorization_checks_total",
		Help: "Questions whether an author may write a copy, by result (allowed, denied, error) and cached (true: answered without a review of its own, from the cache or by the review another worker was asking; false: a SubjectAccessReview).",
	}, []string{"result", "cached"})
	forbiddenWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "resclass", Subsystem: "distribution", Name: "forbidden_writes_total",
		Help: "Writes of a copy not made because the distribution's author may not make them, by verb (create, update, delete).",
	}, []string{"verb"})
)

func init() {
	metrics.Registry.MustRegister(authorizationChecks, forbiddenWrites)
}
