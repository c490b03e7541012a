package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/quota"
)

// Helpers shared by the webhook tests, fuzz target and benchmark.

// newTestScheme is the scheme Run builds: client-go's kinds and resclass's.
func newTestScheme(tb testing.TB) *runtime.Scheme {
	tb.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		tb.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		tb.Fatal(err)
	}
	return s
}

// quotaIndex is a client-go indexer holding quotas, as the quota
// informer's store does, read as the webhook reads it (informerQuotas).
func quotaIndex(tb testing.TB, quotas ...*corev1.ResourceQuota) quotaSource {
	tb.Helper()
	indexer := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc})
	for _, q := range quotas {
		if err := indexer.Add(q.DeepCopy()); err != nil {
			tb.Fatal(err)
		}
	}
	return informerQuotas{indexer}
}

func mustParseQuotaConfig(tb testing.TB, data string) *quota.Config {
	tb.Helper()
	cfg, err := quota.Parse([]byte(data))
	if err != nil {
		tb.Fatalf("quota.Parse: %v", err)
	}
	return cfg
}

// coveringQuotaConfig is the covering-quota rule of priority classes (story
// 1) and cross-namespace affinity, in the apiserver's own file format: pods of priority class
// cluster-services, and pods with cross-namespace affinity terms, need a
// ResourceQuota for that scope in their namespace.
const coveringQuotaConfig = `apiVersion: apiserver.config.k8s.io/v1
kind: ResourceQuotaConfiguration
limitedResources:
- resource: pods
  matchScopes:
  - scopeName: PriorityClass
    operator: In
    values: ["cluster-services"]
  - scopeName: CrossNamespacePodAffinity
    operator: Exists
`

// clusterServicesQuota covers the PriorityClass In [cluster-services] scope.
func clusterServicesQuota(ns string) *corev1.ResourceQuota {
	return &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "cluster-services", Namespace: ns},
		Spec: corev1.ResourceQuotaSpec{
			Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("10")},
			ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{
				ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpIn, Values: []string{"cluster-services"},
			}}},
		},
	}
}

// crossNamespaceQuota covers the CrossNamespacePodAffinity scope.
func crossNamespaceQuota(ns string) *corev1.ResourceQuota {
	return &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "cross-namespace", Namespace: ns},
		Spec: corev1.ResourceQuotaSpec{
			Hard:   corev1.ResourceList{corev1.ResourcePods: resource.MustParse("10")},
			Scopes: []corev1.ResourceQuotaScope{corev1.ResourceQuotaScopeCrossNamespacePodAffinity},
		},
	}
}

type podOption func(*corev1.Pod)

// newPod is a pod as the apiserver hands it to a validating webhook: typed,
// in namespace team-a, with requests (so not BestEffort).
func newPod(opts ...podOption) *corev1.Pod {
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "team-a", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "app", Image: "registry.example/app:1",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi"),
			}},
		}}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func priority(class string) podOption {
	return func(p *corev1.Pod) { p.Spec.PriorityClassName = class }
}

func podNamespace(ns string) podOption {
	return func(p *corev1.Pod) { p.Namespace = ns }
}

func affinity(a *corev1.Affinity) podOption {
	return func(p *corev1.Pod) { p.Spec.Affinity = a }
}

// extendedResource sets both requests and limits, as the apiserver's
// defaulting has done by the time a validating webhook sees the pod.
func extendedResource(name, qty string) podOption {
	return func(p *corev1.Pod) {
		r := &p.Spec.Containers[0].Resources
		if r.Limits == nil {
			r.Limits = corev1.ResourceList{}
		}
		r.Requests[corev1.ResourceName(name)] = resource.MustParse(qty)
		r.Limits[corev1.ResourceName(name)] = resource.MustParse(qty)
	}
}

// affinityTerm is a pod affinity term for app=db pods on the same node, in the
// namespaces that ns and sel name (neither: the pod's own).
func affinityTerm(sel *metav1.LabelSelector, ns ...string) corev1.PodAffinityTerm {
	return corev1.PodAffinityTerm{
		LabelSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
		TopologyKey:       corev1.LabelHostname,
		Namespaces:        ns,
		NamespaceSelector: sel,
	}
}

func weighted(t corev1.PodAffinityTerm) corev1.WeightedPodAffinityTerm {
	return corev1.WeightedPodAffinityTerm{Weight: 10, PodAffinityTerm: t}
}

func requiredAffinity(terms ...corev1.PodAffinityTerm) *corev1.Affinity {
	return &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: terms}}
}

var (
	emptySelector = &metav1.LabelSelector{}
	teamSelector  = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "hpc"}}
)

func mustJSON(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// podRequest is the AdmissionRequest the apiserver sends for pods in ns.
func podRequest(op admissionv1.Operation, ns string, object []byte) admission.Request {
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       "8a5d2c3e-0000-4000-8000-000000000001",
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Name:      "app",
		Namespace: ns,
		Operation: op,
		Object:    runtime.RawExtension{Raw: object},
	}}
}

// denialCounts reads every series of resclass_webhook_denials_total, keyed
// "webhook reason".
func denialCounts(tb testing.TB) map[string]float64 {
	tb.Helper()
	ch := make(chan prometheus.Metric)
	go func() {
		denials.Collect(ch)
		close(ch)
	}()
	out := map[string]float64{}
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			tb.Fatal(err)
		}
		var webhook, reason string
		for _, l := range d.GetLabel() {
			switch l.GetName() {
			case "webhook":
				webhook = l.GetValue()
			case "reason":
				reason = l.GetValue()
			}
		}
		out[webhook+" "+reason] = d.GetCounter().GetValue()
	}
	return out
}

// denialDelta is what changed in resclass_webhook_denials_total since before.
func denialDelta(tb testing.TB, before map[string]float64) map[string]float64 {
	tb.Helper()
	delta := map[string]float64{}
	for k, v := range denialCounts(tb) {
		if d := v - before[k]; d != 0 {
			delta[k] = d
		}
	}
	return delta
}

// notChecked leaves the denial metric of a case unchecked: whether an
// internal error (500) should count as a denial is not settled.
const notChecked = "(not checked)"

// checkDenialCounted asserts that exactly one denial, for reason on webhook,
// was counted since before; reason "" asserts that none was.
func checkDenialCounted(t *testing.T, before map[string]float64, webhook, reason string) {
	t.Helper()
	if reason == notChecked {
		return
	}
	want := map[string]float64{}
	if reason != "" {
		want[webhook+" "+reason] = 1
	}
	if got := denialDelta(t, before); !maps.Equal(got, want) {
		t.Errorf("denials counted: %v, want %v", got, want)
	}
}

// TestEmptyNamespaceSelectors: every term with namespaceSelector {} is
// reported, with the path a user can find it by, and nothing else is.
func TestEmptyNamespaceSelectors(t *testing.T) {
	const (
		podAff  = "spec.affinity.podAffinity."
		antiAff = "spec.affinity.podAntiAffinity."
		req     = "requiredDuringSchedulingIgnoredDuringExecution"
		pref    = "preferredDuringSchedulingIgnoredDuringExecution"
	)
	for _, tc := range []struct {
		name     string
		affinity *corev1.Affinity
		root     *field.Path
		want     []string
	}{
		{name: "no affinity"},
		{name: "node affinity only", affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{}}},
		{name: "required affinity {}", affinity: requiredAffinity(affinityTerm(emptySelector)),
			want: []string{podAff + req + "[0].namespaceSelector"}},
		{name: "preferred affinity {}", affinity: &corev1.Affinity{PodAffinity: &corev1.PodAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{weighted(affinityTerm(emptySelector))}}},
			want: []string{podAff + pref + "[0].podAffinityTerm.namespaceSelector"}},
		{name: "required anti-affinity {}", affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{affinityTerm(emptySelector)}}},
			want: []string{antiAff + req + "[0].namespaceSelector"}},
		{name: "preferred anti-affinity {}", affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{weighted(affinityTerm(emptySelector))}}},
			want: []string{antiAff + pref + "[0].podAffinityTerm.namespaceSelector"}},
		{name: "{} beside namespaces is still {}", affinity: requiredAffinity(affinityTerm(emptySelector, "other")),
			want: []string{podAff + req + "[0].namespaceSelector"}},
		{name: "empty matchLabels map is {}", affinity: requiredAffinity(affinityTerm(&metav1.LabelSelector{MatchLabels: map[string]string{}})),
			want: []string{podAff + req + "[0].namespaceSelector"}},
		{name: "nil selector: the pod's own namespace", affinity: requiredAffinity(affinityTerm(nil))},
		{name: "nil selector with namespaces", affinity: requiredAffinity(affinityTerm(nil, "other"))},
		{name: "matchLabels", affinity: requiredAffinity(affinityTerm(teamSelector))},
		{name: "matchExpressions", affinity: requiredAffinity(affinityTerm(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "team", Operator: metav1.LabelSelectorOpExists}}}))},
		{name: "every {} term, in order", affinity: &corev1.Affinity{
			PodAffinity: &corev1.PodAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution:  []corev1.PodAffinityTerm{affinityTerm(teamSelector), affinityTerm(emptySelector), affinityTerm(nil), affinityTerm(emptySelector)},
				PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{weighted(affinityTerm(teamSelector)), weighted(affinityTerm(emptySelector))},
			},
			PodAntiAffinity: &corev1.PodAntiAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution:  []corev1.PodAffinityTerm{affinityTerm(emptySelector)},
				PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{weighted(affinityTerm(nil)), weighted(affinityTerm(emptySelector))},
			},
		}, want: []string{
			podAff + req + "[1].namespaceSelector",
			podAff + req + "[3].namespaceSelector",
			podAff + pref + "[1].podAffinityTerm.namespaceSelector",
			antiAff + req + "[0].namespaceSelector",
			antiAff + pref + "[1].podAffinityTerm.namespaceSelector",
		}},
		// The path is the caller's: a workload's pod template reports its own.
		{name: "pod template path", root: field.NewPath("spec", "template", "spec"), affinity: requiredAffinity(affinityTerm(emptySelector)),
			want: []string{"spec.template.spec.affinity.podAffinity." + req + "[0].namespaceSelector"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := tc.root
			if root == nil {
				root = field.NewPath("spec")
			}
			errs := EmptyNamespaceSelectors(&corev1.PodSpec{Affinity: tc.affinity}, root)
			var got []string
			for _, e := range errs {
				got = append(got, e.Field)
				if e.Type != field.ErrorTypeInvalid || e.BadValue != "{}" {
					t.Errorf("%s: type %s, value %v; want Invalid \"{}\"", e.Field, e.Type, e.BadValue)
				}
				if !strings.Contains(e.Detail, "select the namespaces you mean") {
					t.Errorf("%s: detail %q does not say what to write instead", e.Field, e.Detail)
				}
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("reported\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

// TestPodPoliciesHandle drives Handle with the requests the apiserver sends,
// the pod as JSON: the namespaceSelector policy, the covering-quota rule
// against the quotas of the request's namespace, what is let through
// without a look, and the denial metric.
func TestPodPoliciesHandle(t *testing.T) {
	s := newTestScheme(t)
	seeds := mustParseQuotaConfig(t, coveringQuotaConfig)
	// Only a non-pod entry: parsed, but Empty.
	nonPods := mustParseQuotaConfig(t, `apiVersion: apiserver.config.k8s.io/v1
kind: ResourceQuotaConfiguration
limitedResources:
- resource: persistentvolumeclaims
  matchContains: [".storageclass.storage.k8s.io/requests.storage"]
`)
	if !nonPods.Empty() {
		t.Fatal("a configuration without pod entries should be Empty")
	}
	brokenQuota := clusterServicesQuota("team-a")
	brokenQuota.Spec.ScopeSelector.MatchExpressions[0].Values = []string{"not a label value"}
	failingReader := fake.NewClientBuilder().WithScheme(s).WithInterceptorFuncs(interceptor.Funcs{
		List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			return errors.New("informer cache not synced")
		},
	}).Build()

	js := func(p *corev1.Pod) []byte { return mustJSON(t, p) }
	create := func(p *corev1.Pod) admission.Request { return podRequest(admissionv1.Create, "team-a", js(p)) }
	emptySelectorPod := newPod(affinity(requiredAffinity(affinityTerm(emptySelector))))
	crossNamespacePod := newPod(affinity(requiredAffinity(affinityTerm(nil, "other"))))
	clusterServicesPod := newPod(priority("cluster-services"))
	const (
		emptyPath     = "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaceSelector"
		insufficient  = "insufficient quota to match these scopes:"
		scopeCS       = "{PriorityClass In [cluster-services]}"
		scopeXNS      = "{CrossNamespacePodAffinity Exists []}"
		namespaceTeam = `namespace "team-a" needs a ResourceQuota`
	)

	type want struct {
		allowed  bool
		code     int32
		prefix   string
		contains []string
		absent   []string
		denial   string // the denial reason counted, "" for none, notChecked
	}
	allowed := want{allowed: true, code: http.StatusOK}
	for _, tc := range []struct {
		name       string
		req        admission.Request
		allowEmpty bool
		config     *quota.Config
		quotas     []*corev1.ResourceQuota
		reader     client.Reader // instead of quotas
		want       want
	}{
		// The namespaceSelector policy (the namespaceSelector proposal).
		{name: "{} denied", req: create(emptySelectorPod), want: want{code: http.StatusForbidden,
			contains: []string{emptyPath, `Invalid value: "{}"`, "select the namespaces you mean"}, denial: reasonEmptyNamespaceSelector}},
		{name: "{} in preferred anti-affinity denied", req: create(newPod(affinity(&corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{weighted(affinityTerm(emptySelector))}}}))),
			want: want{code: http.StatusForbidden, contains: []string{
				"spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.namespaceSelector",
				"select the namespaces you mean"}, denial: reasonEmptyNamespaceSelector}},
		{name: "every {} term named in one denial", req: create(newPod(affinity(requiredAffinity(affinityTerm(emptySelector), affinityTerm(teamSelector), affinityTerm(emptySelector))))),
			want: want{code: http.StatusForbidden, contains: []string{
				"requiredDuringSchedulingIgnoredDuringExecution[0].namespaceSelector",
				"requiredDuringSchedulingIgnoredDuringExecution[2].namespaceSelector"},
				absent: []string{"requiredDuringSchedulingIgnoredDuringExecution[1]"}, denial: reasonEmptyNamespaceSelector}},
		{name: "{} checked before quotas", req: create(newPod(priority("cluster-services"), affinity(requiredAffinity(affinityTerm(emptySelector))))),
			config: seeds, want: want{code: http.StatusForbidden, contains: []string{emptyPath}, absent: []string{insufficient}, denial: reasonEmptyNamespaceSelector}},
		{name: "null namespaceSelector allowed", req: podRequest(admissionv1.Create, "team-a", []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"app"},
			"spec":{"containers":[{"name":"app","image":"x"}],"affinity":{"podAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":[
			{"labelSelector":{"matchLabels":{"app":"db"}},"topologyKey":"kubernetes.io/hostname","namespaceSelector":null}]}}}}`)),
			want: allowed},
		{name: "non-empty namespaceSelector allowed", req: create(newPod(affinity(requiredAffinity(affinityTerm(teamSelector))))), want: allowed},
		{name: "{} allowed when allowed", req: create(emptySelectorPod), allowEmpty: true, want: allowed},
		// Without --refuse-empty-namespace-selector only the {} rule is off: {} is a
		// cross-namespace term, so the covering-quota rule still applies.
		{name: "allowed {} still needs a quota", req: create(emptySelectorPod), allowEmpty: true, config: seeds,
			want: want{code: http.StatusForbidden, prefix: insufficient, contains: []string{scopeXNS}, absent: []string{emptyPath}, denial: quota.ReasonUncoveredScopes}},
		{name: "allowed {} with a quota", req: create(emptySelectorPod), allowEmpty: true, config: seeds,
			quotas: []*corev1.ResourceQuota{crossNamespaceQuota("team-a")}, want: allowed},

		// Requests the policies are not about are allowed without decoding
		// the object: each of these objects would be denied (or fail to
		// decode) if it were looked at.
		{name: "UPDATE", req: podRequest(admissionv1.Update, "team-a", js(emptySelectorPod)), config: seeds, want: allowed},
		{name: "DELETE", req: podRequest(admissionv1.Delete, "team-a", nil), config: seeds, want: allowed},
		{name: "CONNECT", req: podRequest(admissionv1.Connect, "team-a", []byte("not an object")), want: allowed},
		{name: "status subresource", req: func() admission.Request {
			r := podRequest(admissionv1.Update, "team-a", js(emptySelectorPod))
			r.SubResource = "status"
			return r
		}(), want: allowed},
		{name: "binding subresource create", req: func() admission.Request {
			r := podRequest(admissionv1.Create, "team-a", []byte(`{"apiVersion":"v1","kind":"Binding","metadata":{"name":"app"},"target":{"kind":"Node","name":"n1"}}`))
			r.SubResource, r.Kind.Kind = "binding", "Binding"
			return r
		}(), config: seeds, want: allowed},
		{name: "eviction subresource create", req: func() admission.Request {
			r := podRequest(admissionv1.Create, "team-a", []byte(`{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"app"}}`))
			r.SubResource, r.Kind = "eviction", metav1.GroupVersionKind{Group: "policy", Version: "v1", Kind: "Eviction"}
			return r
		}(), config: seeds, want: allowed},
		{name: "another kind", req: func() admission.Request {
			r := podRequest(admissionv1.Create, "team-a", []byte("not an object"))
			r.Kind = metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
			return r
		}(), want: allowed},

		// An object that is not a pod is a bad request, 400, and counted.
		{name: "not JSON", req: podRequest(admissionv1.Create, "team-a", []byte("{not json")),
			want: want{code: http.StatusBadRequest, contains: []string{"decoding the pod"}, denial: reasonBadRequest}},
		{name: "no object", req: podRequest(admissionv1.Create, "team-a", nil),
			want: want{code: http.StatusBadRequest, contains: []string{"decoding the pod"}, denial: reasonBadRequest}},
		{name: "wrong field type", req: podRequest(admissionv1.Create, "team-a", []byte(`{"apiVersion":"v1","kind":"Pod","spec":{"containers":"app"}}`)),
			want: want{code: http.StatusBadRequest, contains: []string{"decoding the pod"}, denial: reasonBadRequest}},
		{name: "object of another kind", req: podRequest(admissionv1.Create, "team-a", []byte(`{"apiVersion":"resclass.io/v1alpha1","kind":"ResourceClass","metadata":{"name":"x"}}`)),
			want: want{code: http.StatusBadRequest, contains: []string{"decoding the pod"}, denial: reasonBadRequest}},

		// The covering-quota rule (cross-namespace affinity and priority classes).
		{name: "limited priority class without quota", req: create(clusterServicesPod), config: seeds,
			want: want{code: http.StatusForbidden, prefix: insufficient, contains: []string{scopeCS, namespaceTeam}, denial: quota.ReasonUncoveredScopes}},
		{name: "limited priority class with quota", req: create(clusterServicesPod), config: seeds,
			quotas: []*corev1.ResourceQuota{clusterServicesQuota("team-a")}, want: allowed},
		{name: "a quota in another namespace does not cover", req: create(clusterServicesPod), config: seeds,
			quotas: []*corev1.ResourceQuota{clusterServicesQuota("team-b"), crossNamespaceQuota("team-a")},
			want:   want{code: http.StatusForbidden, prefix: insufficient, contains: []string{scopeCS}, denial: quota.ReasonUncoveredScopes}},
		{name: "unlimited priority class", req: create(newPod(priority("high"))), config: seeds, want: allowed},
		{name: "cross-namespace term without quota", req: create(crossNamespacePod), config: seeds,
			want: want{code: http.StatusForbidden, prefix: insufficient, contains: []string{scopeXNS}, denial: quota.ReasonUncoveredScopes}},
		{name: "cross-namespace term with quota", req: create(crossNamespacePod), config: seeds,
			quotas: []*corev1.ResourceQuota{crossNamespaceQuota("team-a")}, want: allowed},
		{name: "same-namespace term is not limited", req: create(newPod(affinity(requiredAffinity(affinityTerm(nil))))), config: seeds, want: allowed},
		{name: "both scopes, one covered", req: create(newPod(priority("cluster-services"), affinity(requiredAffinity(affinityTerm(teamSelector))))), config: seeds,
			quotas: []*corev1.ResourceQuota{clusterServicesQuota("team-a")},
			want:   want{code: http.StatusForbidden, prefix: insufficient, contains: []string{scopeXNS}, absent: []string{scopeCS}, denial: quota.ReasonUncoveredScopes}},
		{name: "both scopes, both covered", req: create(newPod(priority("cluster-services"), affinity(requiredAffinity(affinityTerm(teamSelector))))), config: seeds,
			quotas: []*corev1.ResourceQuota{clusterServicesQuota("team-a"), crossNamespaceQuota("team-a")}, want: allowed},
		{name: "nil config allows everything", req: create(newPod(priority("cluster-services"), affinity(requiredAffinity(affinityTerm(teamSelector))))), want: allowed},
		{name: "config without pod entries allows everything", req: create(clusterServicesPod), config: nonPods, want: allowed},
		// The request's namespace is authoritative: the object's may be
		// empty in a create, and is not what the apiserver will use.
		{name: "pod without namespace, quota in the request's", req: create(newPod(priority("cluster-services"), podNamespace(""))), config: seeds,
			quotas: []*corev1.ResourceQuota{clusterServicesQuota("team-a")}, want: allowed},
		{name: "pod without namespace, no quota in the request's", req: create(newPod(priority("cluster-services"), podNamespace(""))), config: seeds,
			want: want{code: http.StatusForbidden, prefix: insufficient, contains: []string{namespaceTeam}, denial: quota.ReasonUncoveredScopes}},
		{name: "pod object naming another namespace", req: podRequest(admissionv1.Create, "team-b", js(newPod(priority("cluster-services"), podNamespace("team-a")))), config: seeds,
			quotas: []*corev1.ResourceQuota{clusterServicesQuota("team-a")},
			want:   want{code: http.StatusForbidden, prefix: insufficient, contains: []string{`namespace "team-b"`}, denial: quota.ReasonUncoveredScopes}},
		// Failing closed: a quota that cannot be judged, or a cache that
		// cannot be read, is a 500, not an allowance.
		{name: "broken quota", req: create(clusterServicesPod), config: seeds, quotas: []*corev1.ResourceQuota{brokenQuota},
			want: want{code: http.StatusInternalServerError, contains: []string{"cluster-services"}, denial: notChecked}},
		{name: "quota cache error", req: create(clusterServicesPod), config: seeds, reader: failingReader,
			want: want{code: http.StatusInternalServerError, contains: []string{`namespace "team-a"`, "informer cache not synced"}, denial: notChecked}},
		{name: "quota cache not read for an unlimited config", req: create(clusterServicesPod), reader: failingReader, want: allowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reader quotaSource = readerQuotas{tc.reader}
			if tc.reader == nil {
				reader = quotaIndex(t, tc.quotas...)
			}
			h := &podPolicies{
				allowEmptyNamespaceSelector: tc.allowEmpty,
				config:                      func() *quota.Config { return tc.config },
				quotas:                      reader,
			}
			before := denialCounts(t)
			resp := h.Handle(context.Background(), tc.req)
			checkResponse(t, resp, tc.want.allowed, tc.want.code, tc.want.prefix, tc.want.contains, tc.want.absent)
			checkDenialCounted(t, before, PodsPath, tc.want.denial)
		})
	}
}

// checkResponse asserts a handler's answer: allowed or not, Result.Code, and
// what Result.Message says.
func checkResponse(t *testing.T, resp admission.Response, allowed bool, code int32, prefix string, contains, absent []string) {
	t.Helper()
	if resp.Allowed != allowed {
		t.Errorf("allowed = %v, want %v (result %+v)", resp.Allowed, allowed, resp.Result)
	}
	if resp.Result == nil {
		t.Fatalf("no result")
	}
	msg := resp.Result.Message
	if resp.Result.Code != code {
		t.Errorf("code = %d, want %d (message %q)", resp.Result.Code, code, msg)
	}
	if !allowed && msg == "" {
		t.Error("a refusal without a message")
	}
	if code == http.StatusForbidden && resp.Result.Reason != metav1.StatusReasonForbidden {
		t.Errorf("reason = %q, want Forbidden", resp.Result.Reason)
	}
	if !strings.HasPrefix(msg, prefix) {
		t.Errorf("message %q does not start with %q", msg, prefix)
	}
	for _, s := range contains {
		if !strings.Contains(msg, s) {
			t.Errorf("message %q does not contain %q", msg, s)
		}
	}
	for _, s := range absent {
		if strings.Contains(msg, s) {
			t.Errorf("message %q contains %q", msg, s)
		}
	}
}

// TestPodPoliciesDenialMetric: the series an alert on uncovered pods would
// use, read as an operator's dashboard does, by its labels.
func TestPodPoliciesDenialMetric(t *testing.T) {
	cfg := mustParseQuotaConfig(t, coveringQuotaConfig)
	h := &podPolicies{
		config: func() *quota.Config { return cfg },
		quotas: quotaIndex(t),
	}
	series := denials.WithLabelValues(PodsPath, quota.ReasonUncoveredScopes)
	req := podRequest(admissionv1.Create, "team-a", mustJSON(t, newPod(priority("cluster-services"))))
	before := testutil.ToFloat64(series)
	for range 3 {
		if resp := h.Handle(context.Background(), req); resp.Allowed {
			t.Fatal("an uncovered pod was allowed")
		}
	}
	if got := testutil.ToFloat64(series) - before; got != 3 {
		t.Errorf("%s denials counted: %v, want 3", quota.ReasonUncoveredScopes, got)
	}
	// An allowed pod counts nothing.
	before = testutil.ToFloat64(series)
	h.Handle(context.Background(), podRequest(admissionv1.Create, "team-a", mustJSON(t, newPod())))
	if got := testutil.ToFloat64(series) - before; got != 0 {
		t.Errorf("an allowed pod counted %v denials", got)
	}
}
