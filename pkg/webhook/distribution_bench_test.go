package webhook

import (
	"context"
	"fmt"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/distribution"
)

// BenchmarkDistributionAdmissionReviews: what one ResourceDistribution create
// costs the apiserver when its sender claims a user allowed nowhere
// cluster-wide, over 1000 labelled namespaces (a selector of them): the
// SubjectAccessReviews per request (reviews/op), with the webhook's default
// bound and without one. Anyone who reaches the webhook's port can send such
// a request with any user in it; the bound is what keeps its cost flat.
func BenchmarkDistributionAdmissionReviews(b *testing.B) {
	const namespaces = 1000
	var objs []client.Object
	for i := range namespaces {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns-%04d", i), Labels: map[string]string{"team": "ml"}}})
	}
	c := fake.NewClientBuilder().WithScheme(newTestScheme(b)).WithObjects(objs...).Build()
	rd := newDistribution(pullSecret, v1alpha1.ResourceDistributionTargets{
		NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ml"}}})
	req := distributionRequest(b, admissionv1.Create, rd, nil)
	for _, bound := range []int{NewOptions().DistributionMaxNamespaceReviews, 0} {
		name := fmt.Sprintf("bound=%d", bound)
		if bound == 0 {
			name = "unbounded"
		}
		b.Run(name, func(b *testing.B) {
			sar := &sarRecorder{}
			h := &resourceDistributions{
				namespaces: c,
				authorizer: &distribution.Authorizer{SAR: sar.client().AuthorizationV1().SubjectAccessReviews(), MaxReviews: bound},
				protected:  []string{"resclass-system", "resclass-node"},
			}
			for b.Loop() {
				if resp := h.Handle(context.Background(), req); resp.Allowed {
					b.Fatal("admitted a user allowed nowhere")
				}
			}
			b.ReportMetric(float64(len(sar.asked))/float64(b.N), "reviews/op")
		})
	}
}
