package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionv1beta1 "k8s.io/api/admission/v1beta1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/internal/watchdog"
	"github.com/resclass/resclass/pkg/quota"
)

// fuzzQuotaConfig limits both scopes of the seeds and the class resources,
// so that a fuzzed pod can reach every part of the covering-quota check.
const fuzzQuotaConfig = coveringQuotaConfig + `  matchContains: ["class.resclass.io/"]
`

// reviewOracle decodes an AdmissionReview body as controller-runtime's
// webhook does (the same deserializer, into a type the scheme does not know,
// so v1 and v1beta1 both land in v1), to tell which inputs carry a request
// whose UID the response must echo.
type reviewOracle struct{ admissionv1.AdmissionReview }

var reviewCodecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	if err := admissionv1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := admissionv1beta1.AddToScheme(s); err != nil {
		panic(err)
	}
	return serializer.NewCodecFactory(s)
}()

func decodeReview(body []byte) (*admissionv1.AdmissionRequest, bool) {
	var ar reviewOracle
	req := &admissionv1.AdmissionRequest{}
	ar.Request = req
	ar.SetGroupVersionKind(admissionv1.SchemeGroupVersion.WithKind("AdmissionReview"))
	if _, _, err := reviewCodecs.UniversalDeserializer().Decode(body, nil, &ar); err != nil {
		return nil, false
	}
	return req, true
}

// review wraps a request in the AdmissionReview the apiserver posts.
func review(tb testing.TB, apiVersion string, req *admissionv1.AdmissionRequest) []byte {
	tb.Helper()
	return mustJSON(tb, map[string]any{"apiVersion": apiVersion, "kind": "AdmissionReview", "request": req})
}

// fuzzHandlers are the two webhooks as Run registers them, except that a
// panic is not recovered: it crashes the fuzzer, which then keeps the input.
func fuzzHandlers(tb testing.TB) map[string]http.Handler {
	tb.Helper()
	cfg := mustParseQuotaConfig(tb, fuzzQuotaConfig)
	gpuQuota := clusterServicesQuota("team-a")
	gpuQuota.Name = "gpus"
	gpuQuota.Spec.Hard["requests.class.resclass.io/nvidia-big"] = gpuQuota.Spec.Hard[corev1.ResourcePods]
	pods := &podPolicies{
		config: func() *quota.Config { return cfg },
		quotas: quotaIndex(tb, gpuQuota, crossNamespaceQuota("team-a"), clusterServicesQuota("team-b")),
	}
	distributions, _ := distributionEnv(tb, map[string]bool{"create a": true, "delete a": true})
	return map[string]http.Handler{
		PodsPath:                       &webhook.Admission{Handler: pods, RecoverPanic: ptr.To(false)},
		WorkloadsPath:                  &webhook.Admission{Handler: &workloadPolicies{pods: pods}, RecoverPanic: ptr.To(false)},
		ResourceClassesPath:            &webhook.Admission{Handler: &resourceClasses{}, RecoverPanic: ptr.To(false)},
		ResourceDistributionsPath:      &webhook.Admission{Handler: distributions, RecoverPanic: ptr.To(false)},
		ResourceDistributionAuthorPath: &webhook.Admission{Handler: resourceDistributionAuthor{}, RecoverPanic: ptr.To(false)},
	}
}

// FuzzAdmissionReview posts arbitrary bodies to every webhook over their
// http.Handler, as the apiserver would, and checks what any caller may rely
// on: no panic; an AdmissionReview with a response for every request; the
// request's UID echoed (the apiserver rejects a response without it); no
// response both allowing and reporting an error code; a refusal always says
// why; and the same body always gets the same answer.
func FuzzAdmissionReview(f *testing.F) {
	// Limited by every rule and covered by the quotas of team-a: allowed
	// after the whole check.
	podCreate := podRequest(admissionv1.Create, "team-a", mustJSON(f, newPod(
		priority("cluster-services"), extendedResource("class.resclass.io/nvidia-big", "1"),
		affinity(requiredAffinity(affinityTerm(teamSelector), affinityTerm(nil, "other")))))).AdmissionRequest
	podEmptySelector := podRequest(admissionv1.Create, "team-b", mustJSON(f, newPod(
		affinity(requiredAffinity(affinityTerm(emptySelector)))))).AdmissionRequest
	classCreate := classRequest(admissionv1.Create, mustJSON(f, bigGPU()), nil).AdmissionRequest
	changed := bigGPU()
	changed.Spec.ResourceSelector[0].MatchExpressions[1].Values = []string{"lots"}
	classUpdate := classRequest(admissionv1.Update, mustJSON(f, changed), mustJSON(f, bigGPU())).AdmissionRequest
	wrongKind := classCreate
	wrongKind.Kind = podCreate.Kind
	ab := v1alpha1.ResourceDistributionTargets{IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: "a"}, {Name: "b"}}}
	distCreate := distributionRequest(f, admissionv1.Create, newDistribution(pullSecret, ab), nil).AdmissionRequest
	distUpdate := distributionRequest(f, admissionv1.Update, newDistribution(pullSecret, ab),
		newDistribution(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"pull"}}`, v1alpha1.ResourceDistributionTargets{})).AdmissionRequest
	distDelete := distributionRequest(f, admissionv1.Delete, withCopies(newDistribution(pullSecret, ab), "a", "b"), nil).AdmissionRequest

	var workloads []admissionv1.AdmissionRequest
	for i, w := range withTemplate(newPod(priority("cluster-services"), affinity(requiredAffinity(affinityTerm(teamSelector))))) {
		var old runtime.Object
		op := admissionv1.Create
		if i%2 == 1 {
			op, old = admissionv1.Update, withTemplate(newPod())[i].obj
		}
		workloads = append(workloads, workloadRequest(f, op, w.obj, old).AdmissionRequest)
	}
	for i := range workloads {
		f.Add(review(f, "admission.k8s.io/v1", &workloads[i]))
	}
	for _, seed := range [][]byte{
		review(f, "admission.k8s.io/v1", &podCreate),
		review(f, "admission.k8s.io/v1", &classCreate),
		review(f, "admission.k8s.io/v1", &classUpdate),
		review(f, "admission.k8s.io/v1beta1", &podCreate),
		review(f, "admission.k8s.io/v1", &podEmptySelector),
		review(f, "admission.k8s.io/v1", &wrongKind),
		review(f, "admission.k8s.io/v1", &distCreate),
		review(f, "admission.k8s.io/v1", &distUpdate),
		review(f, "admission.k8s.io/v1", &distDelete),
		[]byte(``),
		[]byte(`{}`),
		[]byte(`{"request":null}`),
		[]byte(`{"request":{"uid":"u1"}}`),
		[]byte(`{"apiVersion":"v1","kind":"Pod","request":{"uid":"u2","operation":"CREATE","kind":{"version":"v1","kind":"Pod"}}}`),
		[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u3","operation":"CREATE","kind":{"version":"v1","kind":"Pod"},"namespace":"team-a","object":"not an object"}}`),
		[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u4","operation":"CREATE","kind":{"version":"v1","kind":"Pod"},"namespace":"team-a","object":{"spec":{"priority":1e40,"containers":[{"name":"c","resources":{"requests":{"class.resclass.io/x":"9999999999999999999999999999999999999e999999"}}}]}}}}`),
		[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u5","operation":"CREATE","kind":{"group":"resclass.io","version":"v1alpha1","kind":"ResourceClass"},"object":{"spec":{"resourceSelector":[{"matchExpressions":[{"key":"memory","operator":"Gt","values":["1e999999999"]}]}]}}}}`),
		[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":1e999}}`),
		// Each of these held a handler for 10^|exponent| steps in
		// apimachinery's quantity parser before decode bounded them.
		[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u6","operation":"CREATE","kind":{"version":"v1","kind":"Pod"},"namespace":"team-a","object":{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"name":"c","resources":{"limits":{"cpu":"1e-999999999"}}}]}}}}`),
		[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u7","operation":"CREATE","kind":{"version":"v1","kind":"Pod"},"namespace":"team-a","object":{"apiVersion":"v1","kind":"Pod","spec":{"priorityClassName":"cluster-services","containers":[{"name":"c","resources":{"requests":{"class.resclass.io/nvidia-big":9e99999999}}}]}}}}`),
		[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u8","operation":"UPDATE","kind":{"group":"resclass.io","version":"v1alpha1","kind":"ResourceClass"},"object":{"apiVersion":"resclass.io/v1alpha1","kind":"ResourceClass","status":{"allocatable":"1e-999999999"}},"oldObject":{"apiVersion":"resclass.io/v1alpha1","kind":"ResourceClass"}}}`),
		review(f, "admission.k8s.io/v1", &podCreate)[:200],
	} {
		f.Add(seed)
	}

	handlers := fuzzHandlers(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		watchdog.Run(t, func() {
			req, decoded := decodeReview(body)
			for path, h := range handlers {
				first := postReview(t, h, path, body)
				if decoded && req.UID != "" && first.UID != req.UID {
					t.Errorf("%s: response UID %q, request UID %q", path, first.UID, req.UID)
				}
				if !decoded && (first.Allowed || first.Result == nil || first.Result.Code != http.StatusBadRequest) {
					t.Errorf("%s: an AdmissionReview that does not decode was answered %+v, want a 400 refusal", path, first)
				}
				if again := postReview(t, h, path, body); again.Allowed != first.Allowed {
					t.Errorf("%s: allowed %v, then %v for the same body", path, first.Allowed, again.Allowed)
				}
			}
		})
	})
}

// postReview posts body to h as the apiserver does and checks the envelope
// of the answer, returning its response.
func postReview(t *testing.T, h http.Handler, path string, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	switch w.Code {
	case http.StatusOK:
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return &admissionv1.AdmissionResponse{Result: &metav1.Status{Code: int32(w.Code)}}
	default:
		t.Fatalf("%s: HTTP %d: %s", path, w.Code, w.Body)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatalf("%s: the answer is not an AdmissionReview: %v: %s", path, err, w.Body)
	}
	resp := out.Response
	if resp == nil {
		t.Fatalf("%s: an AdmissionReview without a response: %s", path, w.Body)
	}
	if resp.Allowed && resp.Result != nil && resp.Result.Code >= 400 {
		t.Errorf("%s: allowed with code %d: %s", path, resp.Result.Code, resp.Result.Message)
	}
	if !resp.Allowed && (resp.Result == nil || resp.Result.Code < 400 || strings.TrimSpace(resp.Result.Message) == "") {
		t.Errorf("%s: refused without an error code and a reason: %+v", path, resp.Result)
	}
	return resp
}

// FuzzPolicyPodAgrees: the pod webhook decodes only the fields its policies
// read (policyPod); on any pod that decodes whole, it must decode too, and
// both policies must answer the same as on the whole pod. A field the
// apiserver's quota evaluator starts to read, and policyPod lacks, shows
// here as a different answer.
func FuzzPolicyPodAgrees(f *testing.F) {
	sidecar := corev1.ContainerRestartPolicyAlways
	for _, pod := range []*corev1.Pod{
		benchPod(),
		newPod(),
		newPod(affinity(requiredAffinity(affinityTerm(emptySelector)))),
		newPod(priority("cluster-services"), extendedResource("class.resclass.io/nvidia-big", "1"),
			affinity(requiredAffinity(affinityTerm(teamSelector), affinityTerm(nil, "other")))),
		func() *corev1.Pod { // BestEffort, terminating, with a sidecar asking for the class
			p := newPod(priority("system-high"))
			p.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
			p.Spec.ActiveDeadlineSeconds = ptr.To[int64](60)
			p.Spec.InitContainers = []corev1.Container{{Name: "side", RestartPolicy: &sidecar, Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{"class.resclass.io/nvidia-big": resource.MustParse("1")}}}}
			return p
		}(),
		func() *corev1.Pod { // pod-level resources, overhead, a finished pod being deleted
			p := newPod(priority("cluster-services"), extendedResource("class.resclass.io/nvidia-big", "2"))
			p.Spec.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}
			p.Spec.Overhead = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("10Mi")}
			p.Status = corev1.PodStatus{Phase: corev1.PodSucceeded, QOSClass: corev1.PodQOSBurstable}
			p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &metav1.Time{Time: time.Unix(1, 0)}, ptr.To[int64](0)
			return p
		}(),
	} {
		f.Add(mustJSON(f, pod))
	}
	f.Add([]byte(`{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"name":"c","env":"not a list","resources":{"limits":{"class.resclass.io/nvidia-big":"1"}}}]}}`))
	f.Add([]byte(`{"apiVersion":"v1","kind":"Pod","spec":{"containers":"not a list"}}`))

	cfg := mustParseQuotaConfig(f, benchQuotaConfig)
	// All five quotas, which cover every rule, and two of them (a priority
	// class and the class resource), which leave scopes to deny.
	all := benchQuotas()
	policies := []*podPolicies{
		{config: func() *quota.Config { return cfg }, quotas: quotaIndex(f, all...)},
		{config: func() *quota.Config { return cfg }, quotas: quotaIndex(f, all[1], all[4])},
	}
	gvk := corev1.SchemeGroupVersion.WithKind("Pod")
	f.Fuzz(func(t *testing.T, data []byte) {
		watchdog.Run(t, func() {
			raw := runtime.RawExtension{Raw: data}
			var whole corev1.Pod
			wholeErr := decode(raw, gvk, &whole)
			var part policyPod
			partErr := decode(raw, gvk, &part)
			if wholeErr != nil {
				return // the apiserver sends only pods that decode whole
			}
			if partErr != nil {
				t.Fatalf("the pod decodes whole but not as policyPod: %v", partErr)
			}
			ctx := context.Background()
			for i, p := range policies {
				want := p.check(ctx, PodsPath, "team-a", &whole, "", nil)
				got := p.check(ctx, PodsPath, "team-a", part.pod(), "", nil)
				if got.Allowed != want.Allowed || (got.Result == nil) != (want.Result == nil) ||
					got.Result != nil && (got.Result.Code != want.Result.Code || got.Result.Message != want.Result.Message) {
					t.Fatalf("quotas %d: on the policy fields: %v %+v; on the whole pod: %v %+v", i, got.Allowed, got.Result, want.Allowed, want.Result)
				}
			}
		})
	})
}
