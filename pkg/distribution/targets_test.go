package distribution

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// testOwnNamespaces are resclass's own namespaces in these tests: the
// control plane's and the node agent's.
var testOwnNamespaces = []string{"resclass-system", "resclass-node"}

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// testNamespaces is a small cluster: the system namespaces, three ordinary ones and
// two on their way out (one by phase, one by deletion timestamp only).
func testNamespaces() []*corev1.Namespace {
	terminating := namespace("terminating", map[string]string{"env": "prod"})
	terminating.Status.Phase = corev1.NamespaceTerminating
	deleting := namespace("deleting", map[string]string{"env": "prod"})
	deleting.DeletionTimestamp = &metav1.Time{}
	return []*corev1.Namespace{
		namespace("default", nil),
		namespace("kube-system", map[string]string{"tier": "system"}),
		namespace("kube-public", nil),
		namespace(testOwnNamespaces[0], map[string]string{"env": "prod"}),
		namespace(testOwnNamespaces[1], map[string]string{"env": "prod"}),
		namespace("a", map[string]string{"env": "prod", "team": "x"}),
		namespace("b", map[string]string{"env": "test"}),
		namespace("c", nil),
		terminating,
		deleting,
	}
}

func names(ns ...string) []v1alpha1.ResourceDistributionNamespace {
	out := make([]v1alpha1.ResourceDistributionNamespace, len(ns))
	for i, n := range ns {
		out[i].Name = n
	}
	return out
}

func matchLabels(kv ...string) *metav1.LabelSelector {
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		sel.MatchLabels[kv[i]] = kv[i+1]
	}
	return sel
}

func expr(key string, op metav1.LabelSelectorOperator, values ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

func TestTargetsResolve(t *testing.T) {
	tests := []struct {
		name    string
		targets *v1alpha1.ResourceDistributionTargets
		want    []string
	}{
		{"nil is the default", nil, []string{"a", "b", "c", "default"}},
		{"nothing set is the default", &v1alpha1.ResourceDistributionTargets{}, []string{"a", "b", "c", "default"}},
		{"empty lists are unset", &v1alpha1.ResourceDistributionTargets{
			ExcludedNamespaces: names(), IncludedNamespaces: names()}, []string{"a", "b", "c", "default"}},

		{"excluded", &v1alpha1.ResourceDistributionTargets{ExcludedNamespaces: names("a")},
			[]string{"b", "c", "default"}},
		{"excluded twice", &v1alpha1.ResourceDistributionTargets{ExcludedNamespaces: names("a", "a", "missing")},
			[]string{"b", "c", "default"}},
		{"excluded system namespace is excluded anyway", &v1alpha1.ResourceDistributionTargets{ExcludedNamespaces: names("kube-system")},
			[]string{"a", "b", "c", "default"}},

		{"included", &v1alpha1.ResourceDistributionTargets{IncludedNamespaces: names("b", "a")},
			[]string{"a", "b"}},
		{"included kube-system alone is targeted", &v1alpha1.ResourceDistributionTargets{IncludedNamespaces: names("kube-system", "a")},
			[]string{"a", "kube-system"}},
		{"included own namespace alone is targeted", &v1alpha1.ResourceDistributionTargets{IncludedNamespaces: names(testOwnNamespaces[0])},
			[]string{testOwnNamespaces[0]}},
		{"the node agent's namespace, included alone, is targeted", &v1alpha1.ResourceDistributionTargets{IncludedNamespaces: names(testOwnNamespaces[1])},
			[]string{testOwnNamespaces[1]}},
		{"own namespace is excluded from a selector, even one it matches", &v1alpha1.ResourceDistributionTargets{
			IncludedNamespaces: names(testOwnNamespaces[0], "a"), NamespaceLabelSelector: matchLabels("env", "prod")},
			[]string{"a"}},
		{"own namespace is excluded by excludedNamespaces", &v1alpha1.ResourceDistributionTargets{
			ExcludedNamespaces: names("b"), IncludedNamespaces: names(testOwnNamespaces[0], "a")},
			[]string{"a"}},
		{"included missing namespace is not invented", &v1alpha1.ResourceDistributionTargets{IncludedNamespaces: names("a", "missing")},
			[]string{"a"}},
		{"included terminating and deleting namespaces are not targets", &v1alpha1.ResourceDistributionTargets{IncludedNamespaces: names("terminating", "deleting")},
			nil},

		{"selector matchLabels", &v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: matchLabels("env", "prod")},
			[]string{"a"}},
		{"selector matchLabels two keys", &v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: matchLabels("env", "prod", "team", "y")},
			nil},
		{"selector In", &v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: expr("env", metav1.LabelSelectorOpIn, "prod", "test")},
			[]string{"a", "b"}},
		{"selector NotIn matches unlabelled, never the system ones", &v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: expr("env", metav1.LabelSelectorOpNotIn, "prod")},
			[]string{"b", "c", "default"}},
		{"selector Exists", &v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: expr("env", metav1.LabelSelectorOpExists)},
			[]string{"a", "b"}},
		{"selector DoesNotExist", &v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: expr("env", metav1.LabelSelectorOpDoesNotExist)},
			[]string{"c", "default"}},
		// ... but the system namespaces: only includedNamespaces reaches them.
		{"empty selector is set and matches all", &v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{}},
			[]string{"a", "b", "c", "default"}},

		{"excluded and included", &v1alpha1.ResourceDistributionTargets{
			ExcludedNamespaces: names("b"), IncludedNamespaces: names("a", "b", "kube-system")},
			[]string{"a"}},
		{"excluded and selector", &v1alpha1.ResourceDistributionTargets{
			ExcludedNamespaces: names("b"), NamespaceLabelSelector: &metav1.LabelSelector{}},
			[]string{"a", "c", "default"}},
		{"excluded and selector on system label", &v1alpha1.ResourceDistributionTargets{
			ExcludedNamespaces: names("x"), NamespaceLabelSelector: matchLabels("tier", "system")},
			nil},
		{"included and selector", &v1alpha1.ResourceDistributionTargets{
			IncludedNamespaces: names("a", "b", "kube-system"), NamespaceLabelSelector: expr("env", metav1.LabelSelectorOpExists)},
			[]string{"a", "b"}},
		{"a selector never reaches a system namespace, even one included", &v1alpha1.ResourceDistributionTargets{
			IncludedNamespaces: names("a", "c", "kube-system"), NamespaceLabelSelector: matchLabels("tier", "system")},
			nil},
		{"all three", &v1alpha1.ResourceDistributionTargets{
			ExcludedNamespaces:     names("a"),
			IncludedNamespaces:     names("a", "b", "c", "kube-system"),
			NamespaceLabelSelector: &metav1.LabelSelector{}},
			[]string{"b", "c"}},
		{"all three with a real selector", &v1alpha1.ResourceDistributionTargets{
			ExcludedNamespaces:     names("c"),
			IncludedNamespaces:     names("a", "b", "c", "kube-system"),
			NamespaceLabelSelector: expr("env", metav1.LabelSelectorOpExists)},
			[]string{"a", "b"}},
		{"all three, empty intersection", &v1alpha1.ResourceDistributionTargets{
			ExcludedNamespaces:     names("a"),
			IncludedNamespaces:     names("a"),
			NamespaceLabelSelector: matchLabels("env", "prod")},
			nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			targets, errs := CompileTargets(tt.targets, testOwnNamespaces, field.NewPath("spec", "targets"))
			if len(errs) > 0 {
				t.Fatalf("CompileTargets: %v", errs)
			}
			got := targets.Resolve(testNamespaces())
			if !slices.Equal(got, tt.want) {
				t.Errorf("Resolve = %v, want %v", got, tt.want)
			}
			for _, ns := range testNamespaces() {
				if m := targets.Matches(ns); m != slices.Contains(tt.want, ns.Name) {
					t.Errorf("Matches(%s) = %v, disagrees with Resolve", ns.Name, m)
				}
			}
		})
	}
}

func TestTargetsMatchesEdgeCases(t *testing.T) {
	targets, errs := CompileTargets(nil, testOwnNamespaces, field.NewPath("targets"))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if targets.Matches(nil) {
		t.Error("nil namespace matches")
	}
	if (*Targets)(nil).Matches(namespace("a", nil)) {
		t.Error("nil Targets matches")
	}
	if !targets.Matches(namespace("a", nil)) {
		t.Error("default targets do not match an ordinary namespace")
	}
	ns := namespace("a", nil)
	ns.Status.Phase = corev1.NamespaceTerminating
	if targets.Matches(ns) {
		t.Error("a Terminating namespace matches")
	}
	ns = namespace("a", nil)
	ns.DeletionTimestamp = &metav1.Time{}
	if targets.Matches(ns) {
		t.Error("a namespace with a deletion timestamp matches")
	}
	dup := []*corev1.Namespace{namespace("b", nil), namespace("a", nil), namespace("b", nil), nil}
	if got := targets.Resolve(dup); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Resolve with duplicates and nil = %v", got)
	}
}

func TestTargetsExplicit(t *testing.T) {
	tests := []struct {
		name    string
		targets *v1alpha1.ResourceDistributionTargets
		want    []string
	}{
		{"unset", &v1alpha1.ResourceDistributionTargets{ExcludedNamespaces: names("a")}, nil},
		{"sorted and deduplicated", &v1alpha1.ResourceDistributionTargets{IncludedNamespaces: names("b", "a", "b")}, []string{"a", "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			targets, errs := CompileTargets(tt.targets, testOwnNamespaces, field.NewPath("targets"))
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			got := targets.Explicit()
			if !slices.Equal(got, tt.want) {
				t.Errorf("Explicit = %v, want %v", got, tt.want)
			}
			if len(got) > 0 {
				got[0] = "mutated"
				if targets.Explicit()[0] == "mutated" {
					t.Error("Explicit returns its own slice")
				}
			}
		})
	}
}

func TestCompileTargetsErrors(t *testing.T) {
	tests := []struct {
		name    string
		targets v1alpha1.ResourceDistributionTargets
		want    []fieldErr
	}{
		{"empty included name", v1alpha1.ResourceDistributionTargets{IncludedNamespaces: names("a", "")},
			[]fieldErr{{field.ErrorTypeRequired, "spec.targets.includedNamespaces[1].name"}}},
		{"empty excluded name", v1alpha1.ResourceDistributionTargets{ExcludedNamespaces: names("")},
			[]fieldErr{{field.ErrorTypeRequired, "spec.targets.excludedNamespaces[0].name"}}},
		{"invalid names", v1alpha1.ResourceDistributionTargets{
			ExcludedNamespaces: names("ok", "Bad_Name"), IncludedNamespaces: names("a.b")},
			[]fieldErr{
				{field.ErrorTypeInvalid, "spec.targets.excludedNamespaces[1].name"},
				{field.ErrorTypeInvalid, "spec.targets.includedNamespaces[0].name"},
			}},
		{"too long name", v1alpha1.ResourceDistributionTargets{IncludedNamespaces: names(string(make([]byte, 64)))},
			[]fieldErr{{field.ErrorTypeInvalid, "spec.targets.includedNamespaces[0].name"}}},
		{"invalid label value", v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: matchLabels("env", "not valid!")},
			[]fieldErr{{field.ErrorTypeInvalid, "spec.targets.namespaceLabelSelector.matchLabels"}}},
		{"invalid label key", v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: matchLabels("bad key", "x")},
			[]fieldErr{{field.ErrorTypeInvalid, "spec.targets.namespaceLabelSelector.matchLabels"}}},
		{"invalid operator", v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: expr("env", "Near", "x")},
			[]fieldErr{{field.ErrorTypeInvalid, "spec.targets.namespaceLabelSelector.matchExpressions[0].operator"}}},
		{"In without values", v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: expr("env", metav1.LabelSelectorOpIn)},
			[]fieldErr{{field.ErrorTypeRequired, "spec.targets.namespaceLabelSelector.matchExpressions[0].values"}}},
		{"Exists with values", v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: expr("env", metav1.LabelSelectorOpExists, "x")},
			[]fieldErr{{field.ErrorTypeForbidden, "spec.targets.namespaceLabelSelector.matchExpressions[0].values"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			targets, errs := CompileTargets(&tt.targets, testOwnNamespaces, field.NewPath("spec", "targets"))
			if targets != nil {
				t.Error("CompileTargets returned Targets with errors")
			}
			checkErrs(t, errs, tt.want)
		})
	}
}

// fieldErr is an expected field error: its type and path.
type fieldErr struct {
	typ   field.ErrorType
	field string
}

// checkErrs asserts that errs holds exactly want (type and path), in any order.
func checkErrs(t *testing.T, errs field.ErrorList, want []fieldErr) {
	t.Helper()
	var got []fieldErr
	for _, e := range errs {
		got = append(got, fieldErr{e.Type, e.Field})
	}
	less := func(a, b fieldErr) int {
		if a.field != b.field {
			if a.field < b.field {
				return -1
			}
			return 1
		}
		if a.typ < b.typ {
			return -1
		}
		if a.typ > b.typ {
			return 1
		}
		return 0
	}
	slices.SortFunc(got, less)
	want = slices.Clone(want)
	slices.SortFunc(want, less)
	if !slices.Equal(got, want) {
		t.Errorf("errors = %v\nwant %v\n(%v)", got, want, errs)
	}
}
