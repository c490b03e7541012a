package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/distribution"
)

// testUser is who sends the requests of these tests.
var testUser = authenticationv1.UserInfo{Username: "alice", Groups: []string{"team"}}

// sarRecorder answers SubjectAccessReviews from a table of "verb namespace"
// that alice may do (namespace "" = cluster-wide) and records the questions
// as "verb namespace".
type sarRecorder struct {
	mu      sync.Mutex
	allowed map[string]bool
	asked   []string
}

func (s *sarRecorder) client() *k8sfake.Clientset {
	c := k8sfake.NewClientset()
	c.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		attrs := sar.Spec.ResourceAttributes
		q := attrs.Verb + " " + attrs.Namespace
		s.mu.Lock()
		defer s.mu.Unlock()
		s.asked = append(s.asked, q)
		sar.Status.Allowed = sar.Spec.User == "alice" && slices.Equal(sar.Spec.Groups, []string{"team"}) && s.allowed[q]
		return true, sar, nil
	})
	return c
}

func distributionRequest(tb testing.TB, op admissionv1.Operation, rd, old *v1alpha1.ResourceDistribution) admission.Request {
	tb.Helper()
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "uid-1", Operation: op, Name: rd.Name,
		Kind:     metav1.GroupVersionKind{Group: "resclass.io", Version: "v1alpha1", Kind: "ResourceDistribution"},
		UserInfo: testUser,
		Object:   runtime.RawExtension{Raw: mustJSON(tb, rd)},
	}}
	if old != nil {
		req.OldObject = runtime.RawExtension{Raw: mustJSON(tb, old)}
	}
	if op == admissionv1.Delete {
		req.OldObject, req.Object = req.Object, runtime.RawExtension{}
	}
	return req
}

// newDistribution is a distribution whose author annotation records
// testUser, as the mutating webhook would have it.
func newDistribution(resource string, targets v1alpha1.ResourceDistributionTargets) *v1alpha1.ResourceDistribution {
	return &v1alpha1.ResourceDistribution{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resclass.io/v1alpha1", Kind: "ResourceDistribution"},
		ObjectMeta: metav1.ObjectMeta{Name: "rd", Annotations: distribution.AuthorOf(testUser).Annotations()},
		Spec:       v1alpha1.ResourceDistributionSpec{Resource: runtime.RawExtension{Raw: []byte(resource)}, Targets: targets},
	}
}

// withCopies records copies in namespaces in the status.
func withCopies(rd *v1alpha1.ResourceDistribution, namespaces ...string) *v1alpha1.ResourceDistribution {
	rd.Status.DistributedResources = map[string]string{}
	for _, ns := range namespaces {
		rd.Status.DistributedResources[ns] = "1"
	}
	return rd
}

const pullSecret = `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"pull"},"stringData":{"token":"x"}}`

// distributionEnv: namespaces a, b, c labelled team=ml, d unlabelled, and
// resclass-system labelled team=ml (never a default target).
func distributionEnv(tb testing.TB, allowed map[string]bool) (*resourceDistributions, *sarRecorder) {
	tb.Helper()
	s := newTestScheme(tb)
	var objs []client.Object
	for _, ns := range []string{"a", "b", "c", "d", "resclass-system"} {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if ns != "d" {
			n.Labels = map[string]string{"team": "ml"}
		}
		objs = append(objs, n)
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	sar := &sarRecorder{allowed: allowed}
	return &resourceDistributions{
		namespaces: c,
		authorizer: &distribution.Authorizer{SAR: sar.client().AuthorizationV1().SubjectAccessReviews()},
		protected:  []string{"resclass-system", "resclass-node"},
	}, sar
}

func TestResourceDistributionsHandle(t *testing.T) {
	ml := v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ml"}}}
	ab := v1alpha1.ResourceDistributionTargets{IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: "a"}, {Name: "b"}}}
	a := v1alpha1.ResourceDistributionTargets{IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: "a"}}}
	everywhere := map[string]bool{"create ": true, "update ": true, "delete ": true}
	for _, tc := range []struct {
		name     string
		allowed  map[string]bool
		req      func(t *testing.T) admission.Request
		code     int32 // 0: allowed
		contains []string
		absent   []string
		warning  string
		asked    []string // SubjectAccessReviews "verb namespace", in any order
		// maxReviews is the authorizer's MaxReviews (0: no bound).
		maxReviews int
	}{{
		name: "create into namespaces the author may write, cluster-wide", allowed: everywhere,
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Create, newDistribution(pullSecret, ab), nil)
		},
		asked: []string{"create "},
	}, {
		name: "create asks per namespace when not allowed cluster-wide", allowed: map[string]bool{"create a": true, "create b": true},
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Create, newDistribution(pullSecret, ab), nil)
		},
		asked: []string{"create ", "create a", "create b"},
	}, {
		name: "create refused where the author may not write, naming only those", allowed: map[string]bool{"create a": true},
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Create, newDistribution(pullSecret, ab), nil)
		},
		code: http.StatusForbidden, contains: []string{`user "alice" may not create secrets in 1 target namespace(s): b`}, absent: []string{" a,"},
		asked: []string{"create ", "create a", "create b"},
	}, {
		name: "a selector never reaches resclass's own namespace", allowed: map[string]bool{"create a": true, "create b": true, "create c": true},
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Create, newDistribution(pullSecret, ml), nil)
		},
		asked: []string{"create ", "create a", "create b", "create c"},
	}, {
		name: "a forged author is refused before anything is asked", allowed: everywhere,
		req: func(t *testing.T) admission.Request {
			rd := newDistribution(pullSecret, ab)
			rd.Annotations = distribution.Author{Username: "admin", Groups: []string{"system:masters"}}.Annotations()
			return distributionRequest(t, admissionv1.Create, rd, nil)
		},
		code: http.StatusForbidden, contains: []string{v1alpha1.AnnotationAuthorPrefix + ".*", `must record the user who writes the spec ("alice")`},
		asked: []string{},
	}, {
		name: "the requester's record with one more field is refused", allowed: everywhere,
		req: func(t *testing.T) admission.Request {
			rd := newDistribution(pullSecret, ab)
			rd.Annotations[v1alpha1.AnnotationAuthorJSON] = `{"username":"admin","groups":["system:masters"]}`
			return distributionRequest(t, admissionv1.Create, rd, nil)
		},
		code: http.StatusForbidden, contains: []string{`must record the user who writes the spec ("alice")`},
		asked: []string{},
	}, {
		name: "an identity too large to read back is refused", allowed: everywhere,
		req: func(t *testing.T) admission.Request {
			big := testUser
			big.Groups = nil
			for i := range 300 {
				big.Groups = append(big.Groups, fmt.Sprint("group-", i))
			}
			rd := newDistribution(pullSecret, ab)
			rd.Annotations = distribution.AuthorOf(big).Annotations()
			req := distributionRequest(t, admissionv1.Create, rd, nil)
			req.UserInfo = big
			return req
		},
		code: http.StatusForbidden, contains: []string{`user "alice" cannot be recorded as the author`, "300 groups, more than 256"},
		asked: []string{},
	}, {
		name: "no author: the mutating webhook is missing", allowed: everywhere,
		req: func(t *testing.T) admission.Request {
			rd := newDistribution(pullSecret, ab)
			rd.Annotations = nil
			return distributionRequest(t, admissionv1.Create, rd, nil)
		},
		code: http.StatusForbidden, contains: []string{"are missing", "MutatingWebhookConfiguration"},
		asked: []string{},
	}, {
		name: "a Pod is not distributable", allowed: everywhere,
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Create, newDistribution(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}`, ab), nil)
		},
		code: http.StatusUnprocessableEntity, contains: []string{"spec.resource.kind"},
	}, {
		name: "renaming the resource is refused", allowed: everywhere,
		req: func(t *testing.T) admission.Request {
			renamed := newDistribution(strings.Replace(pullSecret, `"pull"`, `"pull2"`, 1), ab)
			return distributionRequest(t, admissionv1.Update, renamed, newDistribution(pullSecret, ab))
		},
		code: http.StatusUnprocessableEntity, contains: []string{"spec.resource.metadata.name"},
	}, {
		name: "an update asks create only about newly targeted namespaces", allowed: map[string]bool{"create b": true},
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Update, newDistribution(pullSecret, ab), withCopies(newDistribution(pullSecret, a), "a"))
		},
		asked: []string{"create ", "create b"},
	}, {
		name: "new content asks update where copies stay, and warns where the author may not", allowed: map[string]bool{"update a": true},
		req: func(t *testing.T) admission.Request {
			changed := newDistribution(strings.Replace(pullSecret, `"x"`, `"y"`, 1), ab)
			return distributionRequest(t, admissionv1.Update, changed, withCopies(newDistribution(pullSecret, ab), "a", "b"))
		},
		warning: `user "alice" may not update secrets in 1 target namespace(s): b`,
		asked:   []string{"update ", "update a", "update b"},
	}, {
		name: "shrinking the targets needs delete where copies go", allowed: map[string]bool{"delete a": true},
		req: func(t *testing.T) admission.Request {
			// b holds a copy though the old targets no longer say so (a
			// namespace relabelled since): the status counts too.
			return distributionRequest(t, admissionv1.Update, newDistribution(pullSecret, v1alpha1.ResourceDistributionTargets{
				IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: "c"}}}), withCopies(newDistribution(pullSecret, a), "a", "b"))
		},
		code: http.StatusForbidden, contains: []string{`may not create secrets in 1 target namespace(s): c`, `may not delete secrets in 1 namespace(s) holding a copy: b`},
		absent: []string{"holding a copy: a"},
		asked:  []string{"create ", "create c", "delete ", "delete a", "delete b"},
	}, {
		name: "deleting needs delete wherever there is a copy", allowed: map[string]bool{"delete a": true},
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Delete, withCopies(newDistribution(pullSecret, ml), "a", "b"), nil)
		},
		code: http.StatusForbidden, contains: []string{`user "alice" may not delete secrets in 1 namespace(s) holding a copy: b`},
		asked: []string{"delete ", "delete a", "delete b"},
	}, {
		// status.distributed counts 3 copies, the map names 1 (the
		// controller's bound): any namespace may hold one of the others.
		name: "deleting a distribution whose status names only some copies needs delete in every namespace", allowed: map[string]bool{"delete a": true, "delete b": true, "delete c": true},
		req: func(t *testing.T) admission.Request {
			old := withCopies(newDistribution(pullSecret, ml), "a")
			old.Status.Distributed = 3
			return distributionRequest(t, admissionv1.Delete, old, nil)
		},
		code: http.StatusForbidden, contains: []string{`may not delete secrets in 2 namespace(s) that may hold a copy`, `: d, resclass-system`},
		asked: []string{"delete ", "delete a", "delete b", "delete c", "delete d", "delete resclass-system"},
	}, {
		name: "shrinking a distribution whose status names only some copies needs delete in every namespace no longer targeted", allowed: map[string]bool{"delete b": true, "delete c": true, "delete d": true},
		req: func(t *testing.T) admission.Request {
			old := withCopies(newDistribution(pullSecret, ml), "b")
			old.Status.Distributed = 3
			return distributionRequest(t, admissionv1.Update, newDistribution(pullSecret, a), old)
		},
		code: http.StatusForbidden, contains: []string{`may not delete secrets in 1 namespace(s) that may hold a copy`, `: resclass-system`},
		asked: []string{"delete ", "delete b", "delete c", "delete d", "delete resclass-system"},
	}, {
		name: "a status that names every copy (distributed equal to the map's size) is taken at its word", allowed: map[string]bool{"delete a": true},
		req: func(t *testing.T) admission.Request {
			old := withCopies(newDistribution(pullSecret, ml), "a")
			old.Status.Distributed = 1
			return distributionRequest(t, admissionv1.Delete, old, nil)
		},
		asked: []string{"delete ", "delete a"},
	}, {
		// Written before the type fence: it no longer parses, its copies
		// remain, and deleting it deletes them.
		name: "deleting a distribution whose Secret type is no longer distributable still needs delete where its copies are", allowed: map[string]bool{"delete a": true},
		req: func(t *testing.T) admission.Request {
			custom := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"pull"},"type":"example.com/custom","stringData":{"token":"x"}}`
			return distributionRequest(t, admissionv1.Delete, withCopies(newDistribution(custom, ml), "a", "b"), nil)
		},
		code: http.StatusForbidden, contains: []string{`user "alice" may not delete secrets in 1 namespace(s) holding a copy: b`},
		asked: []string{"delete ", "delete a", "delete b"},
	}, {
		name: "deleting a distribution without copies asks nothing", allowed: nil,
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Delete, newDistribution(pullSecret, ml), nil)
		},
	}, {
		name: "an update that keeps the spec asks nothing", allowed: nil,
		req: func(t *testing.T) admission.Request {
			relabelled := newDistribution(pullSecret, ab)
			relabelled.Labels = map[string]string{"x": "y"}
			return distributionRequest(t, admissionv1.Update, relabelled, newDistribution(pullSecret, ab))
		},
	}, {
		name: "an update that keeps the spec may not change the author", allowed: everywhere,
		req: func(t *testing.T) admission.Request {
			old := newDistribution(pullSecret, ab)
			old.Annotations = distribution.Author{Username: "bob"}.Annotations()
			return distributionRequest(t, admissionv1.Update, newDistribution(pullSecret, ab), old)
		},
		code: http.StatusForbidden, contains: []string{"change only with the spec"},
		asked: []string{},
	}, {
		name: "the status subresource is not judged", allowed: nil,
		req: func(t *testing.T) admission.Request {
			req := distributionRequest(t, admissionv1.Update, newDistribution(`{}`, ab), newDistribution(pullSecret, ab))
			req.SubResource = "status"
			return req
		},
	}, {
		// The bound on one request's cost: past it nothing is asked one by
		// one, whoever claims to send the request.
		name: "a create needing more per-namespace reviews than the bound is refused after the cluster-wide one", allowed: map[string]bool{"create a": true, "create b": true, "create c": true},
		maxReviews: 2,
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Create, newDistribution(pullSecret, ml), nil)
		},
		code: http.StatusForbidden, contains: []string{`user "alice" may not create secrets cluster-wide, and the request needs it in 3 namespaces, more than the 2 checked one by one`, "ask for create secrets in every namespace"},
		asked: []string{"create "},
	}, {
		name: "the bound costs nothing to an author allowed cluster-wide", allowed: everywhere, maxReviews: 2,
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Create, newDistribution(pullSecret, ml), nil)
		},
		asked: []string{"create "},
	}, {
		name: "within the bound each namespace is asked", allowed: map[string]bool{"create a": true, "create b": true}, maxReviews: 2,
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Create, newDistribution(pullSecret, ab), nil)
		},
		asked: []string{"create ", "create a", "create b"},
	}, {
		name: "new content past the bound warns, leaving the controller to ask", allowed: map[string]bool{"update a": true, "update b": true, "update c": true}, maxReviews: 2,
		req: func(t *testing.T) admission.Request {
			changed := newDistribution(strings.Replace(pullSecret, `"x"`, `"y"`, 1), ml)
			return distributionRequest(t, admissionv1.Update, changed, withCopies(newDistribution(pullSecret, ml), "a", "b", "c"))
		},
		warning: `user "alice" may not update secrets cluster-wide, and the request needs it in 3 namespaces`,
		asked:   []string{"update "},
	}, {
		name: "a credential Secret type is refused before anything is asked", allowed: everywhere,
		req: func(t *testing.T) admission.Request {
			token := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"bootstrap-token-abcdef"},"type":"bootstrap.kubernetes.io/token","stringData":{"token-id":"abcdef","token-secret":"0123456789abcdef"}}`
			return distributionRequest(t, admissionv1.Create, newDistribution(token, ab), nil)
		},
		code: http.StatusUnprocessableEntity, contains: []string{"spec.resource.type", "bootstrap.kubernetes.io/token", "credential"}, absent: []string{"0123456789abcdef"},
		asked: []string{},
	}, {
		name: "a ConfigMap the cluster reads by name, into kube-system, is refused", allowed: everywhere,
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Create, newDistribution(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"aws-auth"},"data":{"mapRoles":"x"}}`,
				v1alpha1.ResourceDistributionTargets{IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: "a"}, {Name: "kube-system"}}}), nil)
		},
		code: http.StatusUnprocessableEntity, contains: []string{"spec.targets.includedNamespaces[1]", "kube-system/aws-auth"},
		asked: []string{},
	}, {
		name: "undecodable", allowed: everywhere,
		req: func(t *testing.T) admission.Request {
			req := distributionRequest(t, admissionv1.Create, newDistribution(pullSecret, ab), nil)
			req.Object.Raw = []byte(`{"kind":"ResourceDistribution","apiVersion":"resclass.io/v1alpha1","spec":7}`)
			return req
		},
		code: http.StatusBadRequest,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			h, sar := distributionEnv(t, tc.allowed)
			h.authorizer.MaxReviews = tc.maxReviews
			resp := h.Handle(context.Background(), tc.req(t))
			if tc.code == 0 {
				if !resp.Allowed {
					t.Fatalf("denied: %+v", resp.Result)
				}
				if tc.warning != "" && (len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], tc.warning)) {
					t.Errorf("warnings %q, want one saying %q", resp.Warnings, tc.warning)
				}
			} else {
				if resp.Allowed || resp.Result == nil || resp.Result.Code != tc.code {
					t.Fatalf("got allowed=%v result=%+v, want code %d", resp.Allowed, resp.Result, tc.code)
				}
				for _, s := range tc.contains {
					if !strings.Contains(resp.Result.Message, s) {
						t.Errorf("message %q lacks %q", resp.Result.Message, s)
					}
				}
				for _, s := range tc.absent {
					if strings.Contains(resp.Result.Message, s) {
						t.Errorf("message %q has %q", resp.Result.Message, s)
					}
				}
			}
			if tc.asked != nil || tc.code == 0 {
				got, want := slices.Sorted(slices.Values(sar.asked)), slices.Sorted(slices.Values(tc.asked))
				if !slices.Equal(got, want) {
					t.Errorf("SubjectAccessReviews %q, want %q", got, want)
				}
			}
		})
	}
}

// TestResourceDistributionAuthor: the mutating webhook records the requester
// on create and on a spec change (and drops any other annotation of the
// record, the old JSON one included), and keeps (or restores) the recorded
// author on any other update.
func TestResourceDistributionAuthor(t *testing.T) {
	ab := v1alpha1.ResourceDistributionTargets{IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: "a"}, {Name: "b"}}}
	alice := distribution.AuthorOf(testUser).Annotations()
	bob := distribution.Author{Username: "bob", Groups: []string{"system:masters"}}.Annotations()
	oldJSON := map[string]string{v1alpha1.AnnotationAuthorJSON: `{"username":"bob"}`}
	bobAndMore := maps.Clone(bob)
	bobAndMore[v1alpha1.AnnotationAuthorPrefix+".scopes"] = "all"
	planted := maps.Clone(bobAndMore)
	planted[v1alpha1.AnnotationAuthorJSON] = "{}"
	with := func(record map[string]string, resource string) *v1alpha1.ResourceDistribution {
		rd := newDistribution(resource, ab)
		rd.Annotations = map[string]string{"keep": "me"}
		maps.Copy(rd.Annotations, record)
		return rd
	}
	changed := strings.Replace(pullSecret, `"x"`, `"y"`, 1)
	for _, tc := range []struct {
		name    string
		req     admission.Request
		want    map[string]string // the record after the patch
		patched bool
	}{
		{name: "create records the requester", req: distributionRequest(t, admissionv1.Create, with(nil, pullSecret), nil), want: alice, patched: true},
		{name: "create overwrites a forged author", req: distributionRequest(t, admissionv1.Create, with(bob, pullSecret), nil), want: alice, patched: true},
		{name: "create drops a planted field and the old annotation", req: distributionRequest(t, admissionv1.Create, with(planted, pullSecret), nil), want: alice, patched: true},
		{name: "create already right is left alone", req: distributionRequest(t, admissionv1.Create, with(alice, pullSecret), nil), want: alice},
		{name: "a spec change records the requester", req: distributionRequest(t, admissionv1.Update, with(bob, changed), with(bob, pullSecret)), want: alice, patched: true},
		{name: "a spec change replaces the old JSON author", req: distributionRequest(t, admissionv1.Update, with(oldJSON, changed), with(oldJSON, pullSecret)), want: alice, patched: true},
		{name: "a metadata change keeps the author", req: distributionRequest(t, admissionv1.Update, with(alice, pullSecret), with(bob, pullSecret)), want: bob, patched: true},
		{name: "a metadata change keeps a record with more fields", req: distributionRequest(t, admissionv1.Update, with(alice, pullSecret), with(bobAndMore, pullSecret)), want: bobAndMore, patched: true},
		{name: "a metadata change keeps the old JSON author", req: distributionRequest(t, admissionv1.Update, with(alice, pullSecret), with(oldJSON, pullSecret)), want: oldJSON, patched: true},
		{name: "a metadata change cannot add one", req: distributionRequest(t, admissionv1.Update, with(alice, pullSecret), with(nil, pullSecret)), want: nil, patched: true},
		{name: "a metadata change keeping it is left alone", req: distributionRequest(t, admissionv1.Update, with(bob, pullSecret), with(bob, pullSecret)), want: bob},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := resourceDistributionAuthor{}.Handle(context.Background(), tc.req)
			if !resp.Allowed {
				t.Fatalf("denied: %+v", resp.Result)
			}
			if (len(resp.Patches) > 0) != tc.patched {
				t.Fatalf("patches %+v, want patched=%v", resp.Patches, tc.patched)
			}
			// Apply the patch as the apiserver would.
			var obj map[string]any
			if err := json.Unmarshal(tc.req.Object.Raw, &obj); err != nil {
				t.Fatal(err)
			}
			annotations := obj["metadata"].(map[string]any)["annotations"].(map[string]any)
			for _, p := range resp.Patches {
				key := strings.ReplaceAll(strings.TrimPrefix(p.Path, "/metadata/annotations/"), "~1", "/")
				switch p.Operation {
				case "add":
					annotations[key] = p.Value
				case "remove":
					if _, ok := annotations[key]; !ok {
						t.Fatalf("removes %s, which is not there", key)
					}
					delete(annotations, key)
				default:
					t.Fatalf("unexpected patch %+v", p)
				}
			}
			got := map[string]string{}
			for k, v := range annotations {
				got[k] = v.(string)
			}
			if record := distribution.AuthorRecord(got); !maps.Equal(record, tc.want) {
				t.Errorf("record %q, want %q", record, tc.want)
			}
			if got["keep"] != "me" {
				t.Errorf("other annotations changed: %v", annotations)
			}
		})
	}
	// No annotations at all: the patch adds the map.
	rd := newDistribution(pullSecret, ab)
	rd.Annotations = nil
	resp := resourceDistributionAuthor{}.Handle(context.Background(), distributionRequest(t, admissionv1.Create, rd, nil))
	if len(resp.Patches) != 1 || resp.Patches[0].Path != "/metadata/annotations" || !reflect.DeepEqual(resp.Patches[0].Value, alice) {
		t.Errorf("patches %+v, want one adding /metadata/annotations with the record", resp.Patches)
	}
}

// TestSpecChanged: the webhooks decide "the spec changed" as the admission
// policy's object.spec != oldObject.spec does, on the JSON: an empty list
// and an absent one differ (the typed comparison called them equal, and the
// policy would have refused a write the webhook kept the old author for).
func TestSpecChanged(t *testing.T) {
	for _, tc := range []struct {
		now, before string
		want        bool
	}{
		{`{"spec":{"targets":{}}}`, `{"spec":{"targets":{}}}`, false},
		{`{"metadata":{"labels":{"a":"b"}},"spec":{"targets":{}}}`, `{"spec":{"targets":{}}}`, false},
		{`{"spec":{"targets":{"includedNamespaces":[]}}}`, `{"spec":{"targets":{}}}`, true},
		{`{"spec":{"resource":{"data":{"k":"v"}}}}`, `{"spec":{"resource":{"data":{"k":"w"}}}}`, true},
		{`{"spec":{"n":1}}`, `{"spec":{"n":1.0}}`, false},
		{`{"spec":{"a":1,"b":2}}`, `{"spec":{"b":2,"a":1}}`, false},
	} {
		req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: admissionv1.Update,
			Object: runtime.RawExtension{Raw: []byte(tc.now)}, OldObject: runtime.RawExtension{Raw: []byte(tc.before)}}}
		if got, err := specChanged(req); err != nil || got != tc.want {
			t.Errorf("specChanged(%s, %s) = %v, %v; want %v", tc.now, tc.before, got, err, tc.want)
		}
	}
}

// TestDenialNamesSomeNamespaces: a denial about thousands of namespaces names
// the first maxNamedInDenial and counts the rest.
func TestDenialNamesSomeNamespaces(t *testing.T) {
	var names []string
	for i := range 5000 {
		names = append(names, fmt.Sprintf("ns-%04d", i))
	}
	got := someNames(names)
	if want := fmt.Sprintf("ns-0000, ns-0001, ns-0002, ns-0003, ns-0004, ns-0005, ns-0006, ns-0007, ns-0008, ns-0009, ns-0010, ns-0011, ns-0012, ns-0013, ns-0014, ns-0015, ns-0016, ns-0017, ns-0018, ns-0019 and %d more", 5000-maxNamedInDenial); got != want {
		t.Errorf("someNames of 5000 = %q, want %q", got, want)
	}
	if got := someNames(names[:3]); got != "ns-0000, ns-0001, ns-0002" {
		t.Errorf("someNames of 3 = %q", got)
	}
}
