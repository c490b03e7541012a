package webhook

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/resclass/resclass/pkg/quota"
)

func BenchmarkTmpPhases(b *testing.B) {
	cfg := mustParseQuotaConfig(b, benchQuotaConfig)
	pods := &podPolicies{config: func() *quota.Config { return cfg }, quotas: quotaIndex(b, benchQuotas()...)}
	req := podRequest(admissionv1.Create, "team-a", mustJSON(b, benchPod()))
	body := review(b, "admission.k8s.io/v1", ptr.To(req.AdmissionRequest))
	b.Logf("review %d bytes, object %d", len(body), len(req.Object.Raw))
	serve := func(h admission.Handler) func(b *testing.B) {
		wh := &webhook.Admission{Handler: h}
		return func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, PodsPath, bytes.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				w := httptest.NewRecorder()
				wh.ServeHTTP(w, r)
			}
		}
	}
	allow := admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { return admission.Allowed("") })
	b.Run("serve-allow", serve(allow))
	b.Run("serve-pods", serve(pods))
	b.Run("handle", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			pods.Handle(context.Background(), req)
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var d policyPod
			_ = decode(req.Object, corev1.SchemeGroupVersion.WithKind("Pod"), &d)
			_ = d.pod()
		}
	})
	var d policyPod
	_ = decode(req.Object, corev1.SchemeGroupVersion.WithKind("Pod"), &d)
	pod := d.pod()
	b.Run("check", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			pods.check(context.Background(), PodsPath, "team-a", pod, "", nil)
		}
	})
}
