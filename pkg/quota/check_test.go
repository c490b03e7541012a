package quota

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/resourcequota"
	resourcequotaapi "k8s.io/apiserver/pkg/admission/plugin/resourcequota/apis/resourcequota"
	"sigs.k8s.io/yaml"
)

// The ResourceQuota of the "Priority in ResourceQuota" proposal's two user stories, verbatim (a YAML list).
const priorityQuotaList = `- apiVersion: v1
  kind: ResourceQuota
  metadata:
    name: pods-cluster-services
  spec:
    hard:
      pods: "10"
    scopeSelector:
      matchExpressions:
      - operator : In
        scopeName: PriorityClass
        values: ["cluster-services"]
`

func seedQuota(t *testing.T) *corev1.ResourceQuota {
	t.Helper()
	var list []corev1.ResourceQuota
	if err := yaml.UnmarshalStrict([]byte(priorityQuotaList), &list); err != nil || len(list) != 1 {
		t.Fatalf("decoding the seed quota: %v (%d items)", err, len(list))
	}
	return &list[0]
}

type podOption func(*corev1.Pod)

// makePod returns a pod with one container that requests 100m CPU (so it is
// not BestEffort unless an option says so).
func makePod(opts ...podOption) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c",
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
			},
		}}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func priorityClass(name string) podOption {
	return func(p *corev1.Pod) { p.Spec.PriorityClassName = name }
}

func bestEffort(p *corev1.Pod) { p.Spec.Containers[0].Resources = corev1.ResourceRequirements{} }

func terminating(p *corev1.Pod) {
	d := int64(60)
	p.Spec.ActiveDeadlineSeconds = &d
}

// extended sets requests and limits of extended resources, as the apiserver's
// defaulting leaves them when a pod sets only limits.
func extended(quantities map[string]string) podOption {
	return func(p *corev1.Pod) {
		r := &p.Spec.Containers[0].Resources
		r.Limits = corev1.ResourceList{}
		for name, q := range quantities {
			r.Requests[corev1.ResourceName(name)] = resource.MustParse(q)
			r.Limits[corev1.ResourceName(name)] = resource.MustParse(q)
		}
	}
}

func podAffinity(term corev1.PodAffinityTerm) podOption {
	return func(p *corev1.Pod) {
		p.Spec.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term},
		}}
	}
}

func preferredPodAntiAffinity(term corev1.PodAffinityTerm) podOption {
	return func(p *corev1.Pod) {
		p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: 1, PodAffinityTerm: term}},
		}}
	}
}

var appTerm = corev1.PodAffinityTerm{
	LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}},
	TopologyKey:   "kubernetes.io/hostname",
}

func withNamespaces(t corev1.PodAffinityTerm, ns ...string) corev1.PodAffinityTerm {
	t.Namespaces = ns
	return t
}

func withNamespaceSelector(t corev1.PodAffinityTerm, s *metav1.LabelSelector) corev1.PodAffinityTerm {
	t.NamespaceSelector = s
	return t
}

type quotaOption func(*corev1.ResourceQuota)

// makeQuota returns a quota of namespace ns limiting the given resources
// (name, quantity, name, quantity, ...) in spec.hard only, as a quota is
// before the quota controller has written its status.
func makeQuota(name string, hard []string, opts ...quotaOption) *corev1.ResourceQuota {
	q := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{}},
	}
	for i := 0; i+1 < len(hard); i += 2 {
		q.Spec.Hard[corev1.ResourceName(hard[i])] = resource.MustParse(hard[i+1])
	}
	for _, o := range opts {
		o(q)
	}
	return q
}

var pods10 = []string{"pods", "10"}

func scopes(s ...corev1.ResourceQuotaScope) quotaOption {
	return func(q *corev1.ResourceQuota) { q.Spec.Scopes = s }
}

func scopeSelector(reqs ...corev1.ScopedResourceSelectorRequirement) quotaOption {
	return func(q *corev1.ResourceQuota) {
		q.Spec.ScopeSelector = &corev1.ScopeSelector{MatchExpressions: reqs}
	}
}

func priorityReq(op corev1.ScopeSelectorOperator, values ...string) corev1.ScopedResourceSelectorRequirement {
	return corev1.ScopedResourceSelectorRequirement{ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: op, Values: values}
}

// statusOnly moves spec.hard to status.hard: a quota the controller has
// seen but whose spec no longer limits anything.
func statusOnly(q *corev1.ResourceQuota) {
	q.Status.Hard, q.Spec.Hard = q.Spec.Hard, nil
}

const (
	cfgExtended = "- resource: pods\n  matchContains: [class.resclass.io/]\n"
	cfgNotIn    = "- resource: pods\n  matchScopes:\n  - {scopeName: PriorityClass, operator: NotIn, values: [cluster-services]}\n"
	cfgNoClass  = "- resource: pods\n  matchScopes:\n  - {scopeName: PriorityClass, operator: DoesNotExist}\n"
	cfgTwo      = "- resource: pods\n  matchScopes:\n  - {scopeName: PriorityClass, operator: In, values: [cluster-services]}\n  - {scopeName: CrossNamespacePodAffinity}\n"
	cfgQoS      = "- resource: pods\n  matchScopes:\n  - {scopeName: Terminating}\n- resource: pods\n  matchScopes:\n  - {scopeName: BestEffort}\n"
	cfgBoth     = "- resource: pods\n  matchContains: [class.resclass.io/]\n  matchScopes:\n  - {scopeName: PriorityClass, operator: Exists}\n"

	msgClusterServices = "insufficient quota to match these scopes: [{PriorityClass In [cluster-services]}]"
	msgAnyPriority     = "insufficient quota to match these scopes: [{PriorityClass Exists []}]"
	msgCrossNamespace  = "insufficient quota to match these scopes: [{CrossNamespacePodAffinity Exists []}]"
	msgHighMem         = "insufficient quota to consume: requests.class.resclass.io/nvidia.high.mem"
)

func TestCheck(t *testing.T) {
	highMem := extended(map[string]string{"class.resclass.io/nvidia.high.mem": "2"})
	nsTerm := withNamespaces(appTerm, "other")
	tests := []struct {
		name   string
		config string // a whole file, or limitedResources entries for rqConfig
		pod    *corev1.Pod
		quotas []*corev1.ResourceQuota
		// wantReason "" means allowed.
		wantReason, wantMessage string
		// notUpstream marks cases where this package deliberately differs
		// from the apiserver (see the package doc), skipped by TestCheckMatchesUpstream.
		notUpstream bool
	}{
		// Priority in ResourceQuota, story 1.
		{name: "story 1: cluster-services without quota", config: priorityQuotaStory1, pod: makePod(priorityClass("cluster-services")),
			wantReason: ReasonUncoveredScopes, wantMessage: msgClusterServices},
		{name: "story 1: cluster-services with the seed quota", config: priorityQuotaStory1, pod: makePod(priorityClass("cluster-services")),
			quotas: []*corev1.ResourceQuota{nil /* seed quota added in the test */}},
		{name: "story 1: cluster-services with an unscoped quota", config: priorityQuotaStory1, pod: makePod(priorityClass("cluster-services")),
			quotas: []*corev1.ResourceQuota{makeQuota("all", pods10)}, wantReason: ReasonUncoveredScopes, wantMessage: msgClusterServices},
		{name: "story 1: cluster-services with a quota for another class", config: priorityQuotaStory1, pod: makePod(priorityClass("cluster-services")),
			quotas:     []*corev1.ResourceQuota{makeQuota("other", pods10, scopeSelector(priorityReq(corev1.ScopeSelectorOpIn, "high")))},
			wantReason: ReasonUncoveredScopes, wantMessage: msgClusterServices},
		{name: "story 1: cluster-services with a BestEffort quota", config: priorityQuotaStory1, pod: makePod(priorityClass("cluster-services"), bestEffort),
			quotas: []*corev1.ResourceQuota{makeQuota("be", pods10, scopes(corev1.ResourceQuotaScopeBestEffort))}, wantReason: ReasonUncoveredScopes, wantMessage: msgClusterServices},
		{name: "story 1: no priority class", config: priorityQuotaStory1, pod: makePod()},
		{name: "story 1: another priority class", config: priorityQuotaStory1, pod: makePod(priorityClass("high"))},

		// Priority in ResourceQuota, story 2.
		{name: "story 2: cluster-services with the seed quota", config: priorityQuotaStory2, pod: makePod(priorityClass("cluster-services")),
			quotas: []*corev1.ResourceQuota{nil}},
		{name: "story 2: high with the seed quota", config: priorityQuotaStory2, pod: makePod(priorityClass("high")),
			quotas: []*corev1.ResourceQuota{nil}, wantReason: ReasonUncoveredScopes, wantMessage: msgAnyPriority},
		{name: "story 2: no priority class", config: priorityQuotaStory2, pod: makePod()},
		{name: "story 2: high with an Exists quota", config: priorityQuotaStory2, pod: makePod(priorityClass("high")),
			quotas: []*corev1.ResourceQuota{makeQuota("any", pods10, scopeSelector(priorityReq(corev1.ScopeSelectorOpExists)))}},
		{name: "story 2: high with a NotIn quota", config: priorityQuotaStory2, pod: makePod(priorityClass("high")),
			quotas: []*corev1.ResourceQuota{nil, makeQuota("rest", pods10, scopeSelector(priorityReq(corev1.ScopeSelectorOpNotIn, "cluster-services")))}},

		// PriorityClass NotIn and DoesNotExist match pods without a class.
		{name: "NotIn: pod without class is limited", config: rqConfig(cfgNotIn), pod: makePod(),
			wantReason: ReasonUncoveredScopes, wantMessage: "insufficient quota to match these scopes: [{PriorityClass NotIn [cluster-services]}]"},
		{name: "NotIn: covered by a DoesNotExist quota", config: rqConfig(cfgNotIn), pod: makePod(),
			quotas: []*corev1.ResourceQuota{makeQuota("none", pods10, scopeSelector(priorityReq(corev1.ScopeSelectorOpDoesNotExist)))}},
		{name: "NotIn: cluster-services is not limited", config: rqConfig(cfgNotIn), pod: makePod(priorityClass("cluster-services"))},
		{name: "DoesNotExist: pod without class is limited", config: rqConfig(cfgNoClass), pod: makePod(),
			quotas:     []*corev1.ResourceQuota{makeQuota("exists", pods10, scopeSelector(priorityReq(corev1.ScopeSelectorOpExists)))},
			wantReason: ReasonUncoveredScopes, wantMessage: "insufficient quota to match these scopes: [{PriorityClass DoesNotExist []}]"},
		{name: "DoesNotExist: covered by a NotIn quota", config: rqConfig(cfgNoClass), pod: makePod(),
			quotas: []*corev1.ResourceQuota{makeQuota("rest", pods10, scopeSelector(priorityReq(corev1.ScopeSelectorOpNotIn, "x")))}},
		{name: "DoesNotExist: pod with a class is not limited", config: rqConfig(cfgNoClass), pod: makePod(priorityClass("high"))},

		// Cross-namespace pod affinity (CrossNamespacePodAffinity).
		{name: "cross-namespace: namespaces", config: crossNamespaceAffinityQuota, pod: makePod(podAffinity(nsTerm)),
			wantReason: ReasonUncoveredScopes, wantMessage: msgCrossNamespace},
		{name: "cross-namespace: empty namespaceSelector", config: crossNamespaceAffinityQuota,
			pod:        makePod(podAffinity(withNamespaceSelector(appTerm, &metav1.LabelSelector{}))),
			wantReason: ReasonUncoveredScopes, wantMessage: msgCrossNamespace},
		{name: "cross-namespace: preferred anti-affinity with namespaceSelector", config: crossNamespaceAffinityQuota,
			pod:        makePod(preferredPodAntiAffinity(withNamespaceSelector(appTerm, &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}))),
			quotas:     []*corev1.ResourceQuota{makeQuota("all", pods10)},
			wantReason: ReasonUncoveredScopes, wantMessage: msgCrossNamespace},
		{name: "cross-namespace: same-namespace affinity is not limited", config: crossNamespaceAffinityQuota, pod: makePod(podAffinity(appTerm))},
		{name: "cross-namespace: same-namespace preferred anti-affinity is not limited", config: crossNamespaceAffinityQuota, pod: makePod(preferredPodAntiAffinity(appTerm))},
		{name: "cross-namespace: no affinity", config: crossNamespaceAffinityQuota, pod: makePod()},
		{name: "cross-namespace: covered by spec.scopes", config: crossNamespaceAffinityQuota, pod: makePod(podAffinity(nsTerm)),
			quotas: []*corev1.ResourceQuota{makeQuota("xns", pods10, scopes(corev1.ResourceQuotaScopeCrossNamespacePodAffinity))}},
		{name: "cross-namespace: covered by scopeSelector", config: crossNamespaceAffinityQuota, pod: makePod(preferredPodAntiAffinity(nsTerm)),
			quotas: []*corev1.ResourceQuota{makeQuota("xns", pods10, scopeSelector(scopeCrossNamespace))}},

		// Several limited scopes and quotas.
		{name: "two limited scopes, one covered", config: rqConfig(cfgTwo), pod: makePod(priorityClass("cluster-services"), podAffinity(nsTerm)),
			quotas:     []*corev1.ResourceQuota{nil},
			wantReason: ReasonUncoveredScopes, wantMessage: msgCrossNamespace},
		{name: "two limited scopes, none covered", config: rqConfig(cfgTwo), pod: makePod(priorityClass("cluster-services"), podAffinity(nsTerm)),
			wantReason: ReasonUncoveredScopes,
			wantMessage: "insufficient quota to match these scopes: [{PriorityClass In [cluster-services]} " +
				"{CrossNamespacePodAffinity Exists []}]"},
		{name: "two limited scopes covered by two quotas", config: rqConfig(cfgTwo), pod: makePod(priorityClass("cluster-services"), podAffinity(nsTerm)),
			quotas: []*corev1.ResourceQuota{makeQuota("all", pods10), nil, makeQuota("xns", pods10, scopes(corev1.ResourceQuotaScopeCrossNamespacePodAffinity))}},
		{name: "two limited scopes covered by one quota with both", config: rqConfig(cfgTwo), pod: makePod(priorityClass("cluster-services"), podAffinity(nsTerm)),
			quotas: []*corev1.ResourceQuota{makeQuota("both", pods10, scopes(corev1.ResourceQuotaScopeCrossNamespacePodAffinity),
				scopeSelector(priorityReq(corev1.ScopeSelectorOpIn, "cluster-services")))}},
		{name: "two limited scopes, only one applies to the pod", config: rqConfig(cfgTwo), pod: makePod(podAffinity(nsTerm)),
			quotas:     []*corev1.ResourceQuota{nil},
			wantReason: ReasonUncoveredScopes, wantMessage: msgCrossNamespace},
		// A quota's scope covers by name even when the quota as a whole does
		// not match the pod (upstream UncoveredQuotaScopes).
		{name: "coverage is by scope name per matched scope", config: rqConfig(cfgTwo), pod: makePod(podAffinity(nsTerm)),
			quotas: []*corev1.ResourceQuota{makeQuota("xns-be", pods10, scopes(corev1.ResourceQuotaScopeCrossNamespacePodAffinity, corev1.ResourceQuotaScopeBestEffort))}},

		// Terminating and BestEffort.
		{name: "terminating best-effort pod, no quota", config: rqConfig(cfgQoS), pod: makePod(terminating, bestEffort),
			wantReason:  ReasonUncoveredScopes,
			wantMessage: "insufficient quota to match these scopes: [{Terminating Exists []} {BestEffort Exists []}]"},
		{name: "terminating pod with a Terminating quota", config: rqConfig(cfgQoS), pod: makePod(terminating),
			quotas: []*corev1.ResourceQuota{makeQuota("t", pods10, scopes(corev1.ResourceQuotaScopeTerminating))}},
		{name: "terminating pod with a NotTerminating quota", config: rqConfig(cfgQoS), pod: makePod(terminating),
			quotas:     []*corev1.ResourceQuota{makeQuota("nt", pods10, scopes(corev1.ResourceQuotaScopeNotTerminating))},
			wantReason: ReasonUncoveredScopes, wantMessage: "insufficient quota to match these scopes: [{Terminating Exists []}]"},
		{name: "best-effort pod with a BestEffort quota", config: rqConfig(cfgQoS), pod: makePod(bestEffort),
			quotas: []*corev1.ResourceQuota{makeQuota("be", pods10, scopes(corev1.ResourceQuotaScopeBestEffort))}},
		{name: "burstable long-running pod is not limited", config: rqConfig(cfgQoS), pod: makePod()},

		// matchContains.
		{name: "extended resource without quota", config: rqConfig(cfgExtended), pod: makePod(highMem),
			wantReason: ReasonUncoveredResources, wantMessage: msgHighMem},
		{name: "extended resource with a quota for it", config: rqConfig(cfgExtended), pod: makePod(highMem),
			quotas: []*corev1.ResourceQuota{makeQuota("gpu", []string{"requests.class.resclass.io/nvidia.high.mem", "4"})}},
		{name: "extended resource with a quota for another one", config: rqConfig(cfgExtended), pod: makePod(highMem),
			quotas:     []*corev1.ResourceQuota{makeQuota("gpu", []string{"requests.class.resclass.io/nvidia.low.mem", "4", "pods", "10"})},
			wantReason: ReasonUncoveredResources, wantMessage: msgHighMem},
		{name: "extended resource with a quota of another priority class", config: rqConfig(cfgExtended), pod: makePod(highMem, priorityClass("high")),
			quotas: []*corev1.ResourceQuota{makeQuota("gpu", []string{"requests.class.resclass.io/nvidia.high.mem", "4"},
				scopeSelector(priorityReq(corev1.ScopeSelectorOpIn, "cluster-services")))},
			wantReason: ReasonUncoveredResources, wantMessage: msgHighMem},
		{name: "extended resource with a quota of its priority class", config: rqConfig(cfgExtended), pod: makePod(highMem, priorityClass("cluster-services")),
			quotas: []*corev1.ResourceQuota{makeQuota("gpu", []string{"requests.class.resclass.io/nvidia.high.mem", "4"},
				scopeSelector(priorityReq(corev1.ScopeSelectorOpIn, "cluster-services")))}},
		{name: "two extended resources, one covered", config: rqConfig(cfgExtended),
			pod: makePod(extended(map[string]string{"class.resclass.io/b": "1", "class.resclass.io/c": "1", "class.resclass.io/a": "1"})),
			quotas: []*corev1.ResourceQuota{makeQuota("b", []string{"requests.class.resclass.io/b", "1"}),
				makeQuota("c-besteffort", []string{"requests.class.resclass.io/c", "1"}, scopes(corev1.ResourceQuotaScopeBestEffort))},
			wantReason: ReasonUncoveredResources, wantMessage: "insufficient quota to consume: requests.class.resclass.io/a,requests.class.resclass.io/c"},
		{name: "zero quantity is not consumption", config: rqConfig(cfgExtended), pod: makePod(extended(map[string]string{"class.resclass.io/a": "0"}))},
		{name: "no extended resource", config: rqConfig(cfgExtended), pod: makePod()},
		{name: "resources are checked before scopes", config: rqConfig(cfgBoth), pod: makePod(highMem, priorityClass("high")),
			wantReason: ReasonUncoveredResources, wantMessage: msgHighMem},
		{name: "scopes are checked once resources are covered", config: rqConfig(cfgBoth), pod: makePod(highMem, priorityClass("high")),
			quotas:     []*corev1.ResourceQuota{makeQuota("gpu", []string{"requests.class.resclass.io/nvidia.high.mem", "4"})},
			wantReason: ReasonUncoveredScopes, wantMessage: msgAnyPriority},
		{name: "a quota's spec.hard covers before its status is written", config: rqConfig(cfgBoth), pod: makePod(highMem, priorityClass("high")),
			quotas: []*corev1.ResourceQuota{makeQuota("gpu", []string{"requests.class.resclass.io/nvidia.high.mem", "4"}, scopeSelector(priorityReq(corev1.ScopeSelectorOpExists)))}},
		{name: "status.hard alone does not cover", config: rqConfig(cfgExtended), pod: makePod(highMem),
			quotas:     []*corev1.ResourceQuota{makeQuota("gpu", []string{"requests.class.resclass.io/nvidia.high.mem", "4"}, statusOnly)},
			wantReason: ReasonUncoveredResources, wantMessage: msgHighMem, notUpstream: true},

		// Empty configurations allow everything.
		{name: "empty config", config: rqConfig("- resource: pods\n"), pod: makePod(priorityClass("cluster-services"), podAffinity(nsTerm), highMem)},
		// The apiserver would deny: see TestUpstreamAppliesAllMatchScopesToPods.
		{name: "non-pod entries only", config: rqConfig("- resource: persistentvolumeclaims\n  matchScopes: [{scopeName: PriorityClass, operator: Exists}]\n"),
			pod: makePod(priorityClass("cluster-services")), notUpstream: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := parseTestConfig(t, tc.config)
			quotas := withSeedQuota(t, tc.quotas)
			d, err := cfg.Check(tc.pod, quotas)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			switch {
			case tc.wantReason == "" && d != nil:
				t.Fatalf("Check denied: %+v", *d)
			case tc.wantReason != "" && d == nil:
				t.Fatalf("Check allowed, want %s: %s", tc.wantReason, tc.wantMessage)
			case d != nil && (d.Reason != tc.wantReason || d.Message != tc.wantMessage):
				t.Fatalf("Check = %+v\nwant    {Reason:%s Message:%s}", *d, tc.wantReason, tc.wantMessage)
			}
		})
	}

	// Parity: the apiserver's own CheckRequest, given the same (normalized)
	// limited scopes and resources and quotas whose status is written (and
	// far from their limits), denies the same pods with the same messages.
	for _, tc := range tests {
		if tc.notUpstream {
			continue
		}
		t.Run("upstream/"+tc.name, func(t *testing.T) {
			cfg := parseTestConfig(t, tc.config)
			err := upstreamCheck(t, cfg, tc.pod, withSeedQuota(t, tc.quotas))
			switch {
			case tc.wantReason == "" && err != nil:
				t.Fatalf("upstream denied: %v", err)
			case tc.wantReason != "" && err == nil:
				t.Fatalf("upstream allowed, want: %s", tc.wantMessage)
			case err != nil && !strings.HasSuffix(err.Error(), tc.wantMessage):
				t.Fatalf("upstream denied with %q, want a message ending in %q", err, tc.wantMessage)
			}
		})
	}
}

func parseTestConfig(t *testing.T, config string) *Config {
	t.Helper()
	if !strings.Contains(config, "kind:") {
		config = rqConfig(config)
	}
	cfg, err := Parse([]byte(config))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return cfg
}

// withSeedQuota replaces nil entries with the covering-quota proposal's quota.
func withSeedQuota(t *testing.T, quotas []*corev1.ResourceQuota) []*corev1.ResourceQuota {
	out := make([]*corev1.ResourceQuota, len(quotas))
	for i, q := range quotas {
		if q == nil {
			q = seedQuota(t)
		}
		out[i] = q
	}
	return out
}

// upstreamCheck runs the apiserver's ResourceQuota admission check for
// creating pod, with status.hard = spec.hard and nothing used.
func upstreamCheck(t *testing.T, cfg *Config, pod *corev1.Pod, quotas []*corev1.ResourceQuota) error {
	t.Helper()
	var in []corev1.ResourceQuota
	for _, q := range quotas {
		q = q.DeepCopy()
		q.Status.Hard = q.Spec.Hard
		q.Status.Used = corev1.ResourceList{}
		for name := range q.Spec.Hard {
			q.Status.Used[name] = resource.MustParse("0")
		}
		in = append(in, *q)
	}
	limited := []resourcequotaapi.LimitedResource{{Resource: "pods", MatchContains: cfg.matchContains, MatchScopes: cfg.scopes}}
	attrs := admission.NewAttributesRecord(pod.DeepCopy(), nil, corev1.SchemeGroupVersion.WithKind("Pod"), pod.Namespace, pod.Name,
		corev1.SchemeGroupVersion.WithResource("pods"), "", admission.Create, &metav1.CreateOptions{}, false, nil)
	_, err := resourcequota.CheckRequest(in, attrs, podEvaluator, limited)
	return err
}

// TestUpstreamAppliesAllMatchScopesToPods pins the upstream behaviour the
// package doc mentions and Config.Warnings reports: CheckRequest matches the
// pod against the matchScopes of every limitedResources entry, whatever its
// resource, while this package enforces the pods entries only.
func TestUpstreamAppliesAllMatchScopesToPods(t *testing.T) {
	pod := makePod(priorityClass("cluster-services"))
	limited := []resourcequotaapi.LimitedResource{{Resource: "persistentvolumeclaims", MatchScopes: []corev1.ScopedResourceSelectorRequirement{scopeAnyPriority}}}
	attrs := admission.NewAttributesRecord(pod, nil, corev1.SchemeGroupVersion.WithKind("Pod"), pod.Namespace, pod.Name,
		corev1.SchemeGroupVersion.WithResource("pods"), "", admission.Create, &metav1.CreateOptions{}, false, nil)
	if _, err := resourcequota.CheckRequest(nil, attrs, podEvaluator, limited); err == nil || err.Error() != msgAnyPriority {
		t.Errorf("upstream CheckRequest = %v, want %q (if upstream changed, update the package doc and Config.Warnings)", err, msgAnyPriority)
	}
}

func TestCheckBrokenQuota(t *testing.T) {
	cfg := parseTestConfig(t, priorityQuotaStory1)
	broken := makeQuota("broken", pods10, scopeSelector(priorityReq(corev1.ScopeSelectorOpIn, "not a label value")))
	if _, err := cfg.Check(makePod(priorityClass("cluster-services")), []*corev1.ResourceQuota{broken}); err == nil || !strings.Contains(err.Error(), "quota broken") {
		t.Errorf("Check with a broken quota for a limited pod: err = %v, want one naming the quota", err)
	}
	if d, err := cfg.Check(makePod(priorityClass("high")), []*corev1.ResourceQuota{broken}); d != nil || err != nil {
		t.Errorf("Check with a broken quota for a pod that is not limited = %v, %v; want allowed", d, err)
	}

	cfg = parseTestConfig(t, cfgExtended)
	pod := makePod(extended(map[string]string{"class.resclass.io/a": "1"}))
	broken = makeQuota("broken", []string{"requests.class.resclass.io/a", "1"}, scopeSelector(priorityReq(corev1.ScopeSelectorOpIn, "not a label value")))
	if _, err := cfg.Check(pod, []*corev1.ResourceQuota{broken}); err == nil || !strings.Contains(err.Error(), "quota broken") {
		t.Errorf("Check with a broken quota covering a limited resource: err = %v, want one naming the quota", err)
	}
}

func TestCheckDoesNotModifyInputs(t *testing.T) {
	cfg := parseTestConfig(t, cfgBoth)
	pod := makePod(extended(map[string]string{"class.resclass.io/a": "1"}), priorityClass("x"))
	q := makeQuota("a", []string{"requests.class.resclass.io/a", "1"}, scopeSelector(priorityReq(corev1.ScopeSelectorOpExists)))
	podCopy, qCopy := pod.DeepCopy(), q.DeepCopy()
	if d, err := cfg.Check(pod, []*corev1.ResourceQuota{q}); d != nil || err != nil {
		t.Fatalf("Check = %v, %v; want allowed", d, err)
	}
	if !apiequality.Semantic.DeepEqual(podCopy, pod) || !apiequality.Semantic.DeepEqual(qCopy, q) {
		t.Error("Check modified its inputs")
	}
}

func BenchmarkCheck(b *testing.B) {
	cfg, err := Parse([]byte(rqConfig(cfgTwo + cfgExtended)))
	if err != nil {
		b.Fatal(err)
	}
	quotas := []*corev1.ResourceQuota{
		makeQuota("all", pods10),
		makeQuota("xns", pods10, scopes(corev1.ResourceQuotaScopeCrossNamespacePodAffinity)),
		makeQuota("cs", pods10, scopeSelector(priorityReq(corev1.ScopeSelectorOpIn, "cluster-services"))),
	}
	for _, bc := range []struct {
		name string
		pod  *corev1.Pod
	}{
		{"not limited", makePod()},
		{"limited scopes", makePod(priorityClass("cluster-services"), podAffinity(withNamespaces(appTerm, "x")))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if d, err := cfg.Check(bc.pod, quotas); d != nil || err != nil {
					b.Fatal(d, err)
				}
			}
		})
	}
}
