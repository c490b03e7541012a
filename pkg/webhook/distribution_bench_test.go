package webhook

import (
	"context"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/distribution"
)

// BenchmarkDistributionAdmissionReviews: what one ResourceDistribution create
// over 10 000 labelled namespaces (a selector of them) costs, in
// SubjectAccessReviews per request (reviews/op) and in the webhook's own
// time against a fake apiserver (ns/op; the real apiserver's figure is
// e2e's BenchmarkDistributionAdmissionAtScale):
//
//   - allowed-nowhere: its sender claims a user allowed nowhere. Anyone who
//     reaches the webhook's port can send such a request with any user in
//     it. With the default --distribution-max-namespace-reviews (10 000)
//     it asks every namespace; with a bound of 200 it asks only the
//     cluster-wide review and is refused. What bounds the first across
//     requests is --distribution-review-qps, not measured here.
//   - per-namespace-rights: the user may create Secrets in each namespace,
//     not cluster-wide: admitted. uncached asks every time
//     (--distribution-review-ttl=0); cached repeats one request, as a
//     second apply or a retry after running out of time does (the first
//     request, which asks them all, is not timed).
func BenchmarkDistributionAdmissionReviews(b *testing.B) {
	const namespaces = 10_000
	nsCache, perNamespace := labelledNamespaces(b, namespaces)
	rd := newDistribution(pullSecret, v1alpha1.ResourceDistributionTargets{
		NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ml"}}})
	req := distributionRequest(b, admissionv1.Create, rd, nil)
	for _, side := range []struct {
		name    string
		allowed map[string]bool
		bound   int
		ttl     time.Duration
	}{
		{"allowed-nowhere/bound=default", nil, NewOptions().DistributionMaxNamespaceReviews, 0},
		{"allowed-nowhere/bound=200", nil, 200, 0},
		{"per-namespace-rights/uncached", perNamespace, NewOptions().DistributionMaxNamespaceReviews, 0},
		{"per-namespace-rights/cached", perNamespace, NewOptions().DistributionMaxNamespaceReviews, DefaultDistributionReviewTTL},
	} {
		b.Run(side.name, func(b *testing.B) {
			sar := &sarRecorder{allowed: side.allowed}
			h := &resourceDistributions{
				namespaces: nsCache,
				authorizer: &distribution.Authorizer{SAR: sar.client().AuthorizationV1().SubjectAccessReviews(),
					MaxReviews: side.bound, Workers: reviewWorkers, TTL: side.ttl, MaxEntries: maxCachedReviews},
				protected: []string{"resclass-system", "resclass-node"},
			}
			if side.ttl > 0 {
				// Not timed: the first request, which fills the cache.
				h.Handle(context.Background(), req)
				sar.asked = nil
			}
			for b.Loop() {
				if resp := h.Handle(context.Background(), req); resp.Allowed != (side.allowed != nil) {
					b.Fatalf("allowed %v: %v", resp.Allowed, resp.Result)
				}
			}
			b.ReportMetric(float64(len(sar.asked))/float64(b.N), "reviews/op")
		})
	}
}
