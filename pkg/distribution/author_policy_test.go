package distribution

import (
	"bytes"
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/util/version"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"

	deploywebhook "github.com/resclass/resclass/deploy/webhook"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// policyRecord evaluates the variables of deploy/webhook/author-policy.yaml
// that build the requester's record (user, uid, groups, extra), compiled by
// kube-apiserver's own admission CEL compiler for the Kubernetes version the
// chart requires, against a request as the apiserver presents it.
type policyRecord func(t *testing.T, u authenticationv1.UserInfo) (policy, webhook map[string]string)

func compilePolicyRecord(tb testing.TB) policyRecord {
	tb.Helper()
	doc, _, _ := bytes.Cut(deploywebhook.AuthorPolicy, []byte("\n---\n"))
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	if err := yaml.UnmarshalStrict(doc, &policy); err != nil {
		tb.Fatal(err)
	}
	compiler := plugincel.NewCompiler(environment.MustBaseEnvSet(version.MajorMinor(1, 36)))
	fields := map[string]string{"user": v1alpha1.AnnotationAuthorUser, "uid": v1alpha1.AnnotationAuthorUID,
		"groups": v1alpha1.AnnotationAuthorGroups, "extra": v1alpha1.AnnotationAuthorExtra}
	programs := map[string]plugincel.CompilationResult{}
	for _, v := range policy.Spec.Variables {
		annotation, ok := fields[v.Name]
		if !ok {
			continue
		}
		result := compiler.CompileCELExpression(&validating.Variable{Name: v.Name, Expression: v.Expression}, plugincel.OptionalVariableDeclarations{}, environment.StoredExpressions)
		if result.Error != nil {
			tb.Fatalf("variable %s: %v", v.Name, result.Error)
		}
		programs[annotation] = result
	}
	if len(programs) != len(fields) {
		tb.Fatalf("the policy builds %d of the record's %d fields", len(programs), len(fields))
	}
	return func(t *testing.T, u authenticationv1.UserInfo) (map[string]string, map[string]string) {
		t.Helper()
		// What the apiserver hands CEL: the request as unstructured data,
		// empty fields left out; and the webhook, the same request as JSON
		// (both see invalid UTF-8 as U+FFFD).
		data, err := json.Marshal(admissionv1.AdmissionRequest{UserInfo: u})
		if err != nil {
			t.Fatal(err)
		}
		var request map[string]any
		if err := json.Unmarshal(data, &request); err != nil {
			t.Fatal(err)
		}
		var received admissionv1.AdmissionRequest
		if err := json.Unmarshal(data, &received); err != nil {
			t.Fatal(err)
		}
		record := map[string]string{}
		for annotation, result := range programs {
			out, _, err := result.Program.Eval(map[string]any{"request": request})
			if err != nil {
				t.Fatalf("%s: %v", annotation, err)
			}
			s, ok := out.Value().(string)
			if !ok {
				t.Fatalf("%s evaluates to %v", annotation, out)
			}
			record[annotation] = s
		}
		return record, AuthorOf(received.UserInfo).Annotations()
	}
}

// FuzzAuthorPolicyAgrees: the admission policy builds, in CEL, exactly the
// record Author.Annotations writes, for any identity: the policy compares the
// stored record with it as strings, so a difference would refuse the
// webhook's own writes (or, the other way round, admit a record the
// controller reads differently). The e2e test TestDistributionAuthorBound
// checks the same on a real apiserver for one identity.
func FuzzAuthorPolicyAgrees(f *testing.F) {
	for _, s := range [][7]string{
		{"alice", "", "", "", "", "", ""},
		{"system:serviceaccount:ci:deployer", "u-1", "system:serviceaccounts", "system:authenticated", "authentication.kubernetes.io/credential-id", "JTI=x", "y"},
		{"a,b;c=d%", "=", "x,y", "100%", "k=1;", "v,w", ""},
		{"b", "", "", "a;b=c", "", "", "%25"},
		{"é", "ü", "ß", "ß", "π", "\u2028", "\x00"},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5], s[6])
	}
	record := compilePolicyRecord(f)
	f.Fuzz(func(t *testing.T, user, uid, g1, g2, key, v1, v2 string) {
		watchdog.Run(t, func() {
			for _, u := range []authenticationv1.UserInfo{
				{Username: user, UID: uid},
				{Username: user, UID: uid, Groups: []string{g1, g2, g1},
					Extra: map[string]authenticationv1.ExtraValue{key: {v1, v2, v1}, key + "2": {}, "k": {v2}}},
			} {
				got, want := record(t, u)
				if len(got) != len(want) || got[v1alpha1.AnnotationAuthorUser] != want[v1alpha1.AnnotationAuthorUser] ||
					got[v1alpha1.AnnotationAuthorUID] != want[v1alpha1.AnnotationAuthorUID] || got[v1alpha1.AnnotationAuthorGroups] != want[v1alpha1.AnnotationAuthorGroups] ||
					got[v1alpha1.AnnotationAuthorExtra] != want[v1alpha1.AnnotationAuthorExtra] {
					t.Fatalf("for %+v the policy builds\n  %q\nthe webhook writes\n  %q", u, got, want)
				}
			}
		})
	})
}
