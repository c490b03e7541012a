package distribution

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// FuzzParseResource: ParseResource never panics and returns either a Resource or
// errors; a Resource is a valid Secret or ConfigMap whose copies and hash are
// deterministic and whose copies are its own, up to date.
func FuzzParseResource(f *testing.F) {
	for _, s := range []string{
		secretJSON,
		configMapJSON,
		`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"}}`,
		`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"t","annotations":{"kubernetes.io/service-account.name":"default"}},"type":"kubernetes.io/service-account-token","data":{"extra":"YmFyCg=="}}`,
		`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"t"},"type":"kubernetes.io/tls","stringData":{"tls.crt":"c","tls.key":"k"}}`,
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","labels":{"a":"b"}},"data":{"k":"v"},"binaryData":{"b":"AAE="}}`,
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"x","uid":"u","ownerReferences":[]}}`,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}`,
		`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"k":"!!"}}`,
		`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"k":"v"},"data":{}}`,
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"k":1}}`,
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"k":"v"},"binaryData":{"k":""}}`,
		`{"apiVersion":"v1","kind":"ConfigMap","spec":{}}`,
		`{"apiVersion":1}`,
		`[]`, `null`, `""`, `{`, ``, `{}`,
	} {
		f.Add([]byte(s))
	}
	rd := owner("dist", "uid-1")
	f.Fuzz(func(t *testing.T, data []byte) {
		watchdog.Run(t, func() {
			r, errs := ParseResource(runtime.RawExtension{Raw: data}, resourcePath)
			if (r == nil) == (len(errs) == 0) {
				t.Fatalf("ParseResource returned %v and %d errors", r, len(errs))
			}
			for _, e := range errs {
				if e.Field != "spec.resource" && !strings.HasPrefix(e.Field, "spec.resource.") {
					t.Fatalf("error outside the resource: %v", e)
				}
			}
			if r == nil {
				return
			}
			if r.Kind != KindSecret && r.Kind != KindConfigMap || r.APIVersion != "v1" {
				t.Fatalf("accepted %s %s", r.APIVersion, r.Kind)
			}
			// The delete check of a distribution that no longer parses
			// reads the kind alone: the same kind.
			if k := KindOf(runtime.RawExtension{Raw: data}); k != r.Kind {
				t.Fatalf("KindOf says %q, ParseResource %q", k, r.Kind)
			}
			if s, ok := r.obj.(*corev1.Secret); ok && !secretTypeAllowed(s.Type) {
				t.Fatalf("accepted a Secret of type %q", s.Type)
			}
			if msgs := validation.IsDNS1123Subdomain(r.Name); len(msgs) > 0 {
				t.Fatalf("accepted name %q: %v", r.Name, msgs)
			}
			again, errs := ParseResource(runtime.RawExtension{Raw: data}, resourcePath)
			if len(errs) > 0 || again.Hash() != r.Hash() {
				t.Fatalf("parse is not deterministic: %v", errs)
			}
			a, b := r.Copy("ns", rd, testNow), r.Copy("ns", rd, testNow)
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("Copy is not deterministic:\n%+v\n%+v", a, b)
			}
			if a.GetName() != r.Name || a.GetNamespace() != "ns" || !r.UpToDate(a) || !r.Owned(a, rd) || r.NeedsRecreate(a) {
				t.Fatalf("a copy is not the resource's own: %+v", a)
			}
			if s, ok := a.(*corev1.Secret); ok && (s.StringData != nil || s.Type == "") {
				t.Fatalf("a Secret copy is not normalized: %+v", s)
			}
			if strings.Contains(r.String(), "\n") {
				t.Fatalf("String spans lines: %q", r.String())
			}
		})
	})
}

// FuzzCompileTargets: CompileTargets never panics, and a compiled Targets resolves
// a fixed cluster deterministically to a sorted subset of it that agrees with a
// literal reading of the rules (the intersection of the options set).
func FuzzCompileTargets(f *testing.F) {
	for _, s := range []string{
		`{}`,
		`{"excludedNamespaces":[{"name":"a"}]}`,
		`{"includedNamespaces":[{"name":"a"},{"name":"kube-system"},{"name":"a"}]}`,
		`{"includedNamespaces":[{"name":"resclass-system"}],"namespaceLabelSelector":{"matchLabels":{"env":"prod"}}}`,
		`{"namespaceLabelSelector":{}}`,
		`{"namespaceLabelSelector":{"matchLabels":{"env":"prod"}}}`,
		`{"namespaceLabelSelector":{"matchExpressions":[{"key":"env","operator":"NotIn","values":["prod"]}]}}`,
		`{"excludedNamespaces":[{"name":"b"}],"includedNamespaces":[{"name":"a"},{"name":"b"}],"namespaceLabelSelector":{"matchExpressions":[{"key":"env","operator":"Exists"}]}}`,
		`{"includedNamespaces":[{"name":""}]}`,
		`{"excludedNamespaces":[{"name":"Bad_Name"}]}`,
		`{"namespaceLabelSelector":{"matchExpressions":[{"key":"env","operator":"In"}]}}`,
		`{"namespaceLabelSelector":{"matchLabels":{"bad key":"x"}}}`,
	} {
		f.Add([]byte(s))
	}
	cluster := testNamespaces()
	var all []string
	for _, ns := range cluster {
		all = append(all, ns.Name)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		watchdog.Run(t, func() {
			var spec v1alpha1.ResourceDistributionTargets
			if err := json.Unmarshal(data, &spec); err != nil {
				return
			}
			targets, errs := CompileTargets(&spec, testOwnNamespaces, field.NewPath("spec", "targets"))
			if (targets == nil) == (len(errs) == 0) {
				t.Fatalf("CompileTargets returned %v and %d errors", targets, len(errs))
			}
			if targets == nil {
				return
			}
			got := targets.Resolve(cluster)
			reversed := slices.Clone(cluster)
			slices.Reverse(reversed)
			if again := targets.Resolve(reversed); !slices.Equal(got, again) {
				t.Fatalf("Resolve depends on order: %v vs %v", got, again)
			}
			if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
				t.Fatalf("Resolve = %v, not sorted and unique", got)
			}
			for _, name := range got {
				if !slices.Contains(all, name) {
					t.Fatalf("Resolve invented %q", name)
				}
			}
			if want := literalTargets(t, &spec, cluster); !slices.Equal(got, want) {
				t.Fatalf("Resolve = %v, the rules say %v", got, want)
			}
			if e := targets.Explicit(); len(spec.IncludedNamespaces) == 0 && e != nil {
				t.Fatalf("Explicit = %v without includedNamespaces", e)
			}
		})
	})
}

// literalTargets applies the seed's rules as written, one set per option set and
// their intersection, as an oracle for Targets.
func literalTargets(t *testing.T, spec *v1alpha1.ResourceDistributionTargets, cluster []*corev1.Namespace) []string {
	var live []string
	for _, ns := range cluster {
		if ns.DeletionTimestamp == nil && ns.Status.Phase != corev1.NamespaceTerminating {
			live = append(live, ns.Name)
		}
	}
	var sets [][]string
	if len(spec.ExcludedNamespaces) > 0 || (len(spec.IncludedNamespaces) == 0 && spec.NamespaceLabelSelector == nil) {
		var s []string
		for _, n := range live {
			excluded := n == "kube-system" || n == "kube-public" || slices.Contains(testOwnNamespaces, n)
			for _, e := range spec.ExcludedNamespaces {
				excluded = excluded || e.Name == n
			}
			if !excluded {
				s = append(s, n)
			}
		}
		sets = append(sets, s)
	}
	if len(spec.IncludedNamespaces) > 0 {
		var s []string
		for _, i := range spec.IncludedNamespaces {
			s = append(s, i.Name)
		}
		sets = append(sets, s)
	}
	if spec.NamespaceLabelSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(spec.NamespaceLabelSelector)
		if err != nil {
			t.Fatalf("compiled a selector that does not convert: %v", err)
		}
		var s []string
		for _, ns := range cluster {
			// A selector never reaches the system namespaces or resclass's own.
			if sel.Matches(labels.Set(ns.Labels)) && ns.Name != "kube-system" && ns.Name != "kube-public" && !slices.Contains(testOwnNamespaces, ns.Name) {
				s = append(s, ns.Name)
			}
		}
		sets = append(sets, s)
	}
	var out []string
	for _, n := range live {
		in := true
		for _, s := range sets {
			in = in && slices.Contains(s, n)
		}
		if in {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
