package webhook

import (
	"context"
	"net/http"
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
)

// sarRecorder answers SubjectAccessReviews from a table of namespaces where
// the user may create (namespace "" = cluster-wide) and records the questions.
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
		s.mu.Lock()
		defer s.mu.Unlock()
		s.asked = append(s.asked, attrs.Namespace)
		sar.Status.Allowed = sar.Spec.User == "alice" && attrs.Verb == "create" && s.allowed[attrs.Namespace]
		return true, sar, nil
	})
	return c
}

func distributionRequest(tb testing.TB, op admissionv1.Operation, rd, old *v1alpha1.ResourceDistribution) admission.Request {
	tb.Helper()
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "uid-1", Operation: op, Name: rd.Name,
		Kind:     metav1.GroupVersionKind{Group: "resclass.io", Version: "v1alpha1", Kind: "ResourceDistribution"},
		UserInfo: authenticationv1.UserInfo{Username: "alice", Groups: []string{"team"}},
		Object:   runtime.RawExtension{Raw: mustJSON(tb, rd)},
	}}
	if old != nil {
		req.OldObject = runtime.RawExtension{Raw: mustJSON(tb, old)}
	}
	return req
}

func newDistribution(resource string, targets v1alpha1.ResourceDistributionTargets) *v1alpha1.ResourceDistribution {
	return &v1alpha1.ResourceDistribution{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resclass.io/v1alpha1", Kind: "ResourceDistribution"},
		ObjectMeta: metav1.ObjectMeta{Name: "rd"},
		Spec:       v1alpha1.ResourceDistributionSpec{Resource: runtime.RawExtension{Raw: []byte(resource)}, Targets: targets},
	}
}

const pullSecret = `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"pull"},"stringData":{"token":"x"}}`

// distributionEnv: namespaces a, b, c labelled team=ml, d unlabelled, and a
// foreign Secret "pull" in c and d.
func distributionEnv(tb testing.TB, allowed map[string]bool) (*resourceDistributions, *sarRecorder) {
	tb.Helper()
	s := newTestScheme(tb)
	var objs []client.Object
	for _, ns := range []string{"a", "b", "c", "d"} {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if ns != "d" {
			n.Labels = map[string]string{"team": "ml"}
		}
		objs = append(objs, n)
	}
	for _, ns := range []string{"c", "d"} {
		objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pull", Namespace: ns}})
	}
	objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "a"}})
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).
		WithIndex(&corev1.Secret{}, "metadata.name", func(o client.Object) []string { return []string{o.GetName()} }).
		Build()
	sar := &sarRecorder{allowed: allowed}
	return &resourceDistributions{namespaces: c, objects: c, sar: sar.client().AuthorizationV1().SubjectAccessReviews()}, sar
}

func TestResourceDistributionsHandle(t *testing.T) {
	ml := v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ml"}}}
	ab := v1alpha1.ResourceDistributionTargets{IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: "a"}, {Name: "b"}}}
	a := v1alpha1.ResourceDistributionTargets{IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: "a"}}}
	everywhere := map[string]bool{"": true}
	for _, tc := range []struct {
		name     string
		allowed  map[string]bool
		req      func(t *testing.T) admission.Request
		code     int32 // 0: allowed
		contains []string
		absent   []string
		asked    []string // SubjectAccessReview namespaces, in any order
	}{{
		name: "create into namespaces the author may write, cluster-wide", allowed: everywhere,
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Create, newDistribution(pullSecret, ab), nil)
		},
		asked: []string{""},
	}, {
		name: "create asks per namespace when not allowed cluster-wide", allowed: map[string]bool{"a": true, "b": true},
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Create, newDistribution(pullSecret, ab), nil)
		},
		asked: []string{"", "a", "b"},
	}, {
		name: "create refused where the author may not write, naming only those", allowed: map[string]bool{"a": true},
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Create, newDistribution(pullSecret, ab), nil)
		},
		code: http.StatusForbidden, contains: []string{`user "alice" may not create secrets in 1 target namespace(s): b`}, absent: []string{" a,"},
		asked: []string{"", "a", "b"},
	}, {
		name: "create refused while targets hold a same-named object: all of them, only targets", allowed: everywhere,
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Create, newDistribution(pullSecret, ml), nil)
		},
		code: http.StatusForbidden, contains: []string{`Secret "pull" already exists in 1 target namespace(s)`, ": c;"}, absent: []string{"c, d"},
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
		name: "an update asks only about newly targeted namespaces", allowed: map[string]bool{"b": true},
		req: func(t *testing.T) admission.Request {
			return distributionRequest(t, admissionv1.Update, newDistribution(pullSecret, ab), newDistribution(pullSecret, a))
		},
		asked: []string{"", "b"},
	}, {
		name: "an update that keeps the spec asks nothing", allowed: nil,
		req: func(t *testing.T) admission.Request {
			relabelled := newDistribution(pullSecret, ab)
			relabelled.Labels = map[string]string{"x": "y"}
			return distributionRequest(t, admissionv1.Update, relabelled, newDistribution(pullSecret, ab))
		},
	}, {
		name: "the status subresource is not judged", allowed: nil,
		req: func(t *testing.T) admission.Request {
			req := distributionRequest(t, admissionv1.Update, newDistribution(`{}`, ab), newDistribution(pullSecret, ab))
			req.SubResource = "status"
			return req
		},
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
			resp := h.Handle(context.Background(), tc.req(t))
			if tc.code == 0 {
				if !resp.Allowed {
					t.Fatalf("denied: %+v", resp.Result)
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
				got := map[string]bool{}
				for _, ns := range sar.asked {
					got[ns] = true
				}
				want := map[string]bool{}
				for _, ns := range tc.asked {
					want[ns] = true
				}
				if len(got) != len(want) || len(sar.asked) != len(tc.asked) {
					t.Errorf("SubjectAccessReviews for %q, want %q", sar.asked, tc.asked)
				}
				for ns := range want {
					if !got[ns] {
						t.Errorf("SubjectAccessReviews for %q, want %q", sar.asked, tc.asked)
					}
				}
			}
		})
	}
}
