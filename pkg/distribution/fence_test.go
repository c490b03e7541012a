package distribution

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	deploydistribution "github.com/resclass/resclass/deploy/distribution"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// TestFencePolicyLists: the write policy's lists are fence.go's, in every
// expression that spells them (the matchConditions' verdict and the
// validations' messages), so that the webhook's create-time refusal and the
// apiserver's fence on the controller's writes say the same.
func TestFencePolicyLists(t *testing.T) {
	var policy *admissionregistrationv1.ValidatingAdmissionPolicy
	for _, doc := range bytes.Split(deploydistribution.Policy, []byte("\n---\n")) {
		p := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		if err := yaml.UnmarshalStrict(doc, p); err == nil && p.Kind == "ValidatingAdmissionPolicy" && p.Name == "resclass-distribution-writes" {
			policy = p
		}
	}
	if policy == nil {
		t.Fatal("deploy/distribution/policy.yaml has no ValidatingAdmissionPolicy resclass-distribution-writes")
	}
	var types []string
	for _, ty := range DistributableSecretTypes {
		types = append(types, string(ty))
	}
	lists := map[string]struct {
		re   *regexp.Regexp
		want []string
	}{
		"Secret types":        {regexp.MustCompile(`object\.type in \[([^\]]*)\]`), types},
		"reserved ConfigMaps": {regexp.MustCompile(`exists\(n, n in \[([^\]]*)\]\)`), reservedIn()},
	}
	var expressions []string
	for _, c := range policy.Spec.MatchConditions {
		expressions = append(expressions, c.Expression)
	}
	for _, v := range policy.Spec.Validations {
		expressions = append(expressions, v.Expression)
	}
	for what, l := range lists {
		found := 0
		for _, e := range expressions {
			for _, m := range l.re.FindAllStringSubmatch(e, -1) {
				found++
				var got []string
				for _, item := range strings.Split(m[1], ",") {
					got = append(got, strings.Trim(strings.TrimSpace(item), "'"))
				}
				if !slices.Equal(got, l.want) {
					t.Errorf("%s in the policy: %q, want fence.go's %q", what, got, l.want)
				}
			}
		}
		// The verdict (matchConditions) and the validation that says why.
		if found != 2 {
			t.Errorf("%s spelled %d times in the policy, want 2 (the matchCondition and its validation)", what, found)
		}
	}
}

func TestReservedNameErrors(t *testing.T) {
	parse := func(kind, name string) *Resource {
		t.Helper()
		r, errs := ParseResource(runtime.RawExtension{Raw: []byte(`{"apiVersion":"v1","kind":"` + kind + `","metadata":{"name":"` + name + `"}}`)}, field.NewPath("spec", "resource"))
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		return r
	}
	included := func(names ...string) *v1alpha1.ResourceDistributionTargets {
		t := &v1alpha1.ResourceDistributionTargets{}
		for _, n := range names {
			t.IncludedNamespaces = append(t.IncludedNamespaces, v1alpha1.ResourceDistributionNamespace{Name: n})
		}
		return t
	}
	tests := []struct {
		name    string
		res     *Resource
		targets *v1alpha1.ResourceDistributionTargets
		want    []string // field paths
	}{
		{"kube-root-ca.crt anywhere", parse(KindConfigMap, "kube-root-ca.crt"), &v1alpha1.ResourceDistributionTargets{}, []string{"spec.resource.metadata.name"}},
		{"aws-auth into kube-system", parse(KindConfigMap, "aws-auth"), included("team-a", "kube-system"), []string{"spec.targets.includedNamespaces[1]"}},
		{"cluster-info into kube-public", parse(KindConfigMap, "cluster-info"), included("kube-public"), []string{"spec.targets.includedNamespaces[0]"}},
		{"aws-auth elsewhere", parse(KindConfigMap, "aws-auth"), included("team-a"), nil},
		{"cluster-info into kube-system", parse(KindConfigMap, "cluster-info"), included("kube-system"), nil},
		{"a Secret of a reserved ConfigMap name", parse(KindSecret, "aws-auth"), included("kube-system"), nil},
		{"another name into kube-system", parse(KindConfigMap, "registry-mirrors"), included("kube-system"), nil},
		{"a resource that did not parse", nil, included("kube-system"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := ReservedNameErrors(tt.res, tt.targets, field.NewPath("spec"))
			var got []string
			for _, e := range errs {
				got = append(got, e.Field)
				if e.Type != field.ErrorTypeForbidden || !strings.Contains(e.Detail, "rename the ConfigMap") {
					t.Errorf("%v: want Forbidden, saying what to change", e)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("errors at %q, want %q", got, tt.want)
			}
		})
	}
}
