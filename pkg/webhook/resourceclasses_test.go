package webhook

import (
	"context"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

func expr(key string, op v1alpha1.ResourceSelectorOperator, values ...string) v1alpha1.ResourceSelectorRequirement {
	return v1alpha1.ResourceSelectorRequirement{Key: key, Operator: op, Values: values}
}

// newResourceClass is a ResourceClass as the apiserver hands it over, one
// selector per argument.
func newResourceClass(name string, selectors ...[]v1alpha1.ResourceSelectorRequirement) *v1alpha1.ResourceClass {
	c := &v1alpha1.ResourceClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "ResourceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
	}
	for _, s := range selectors {
		c.Spec.ResourceSelector = append(c.Spec.ResourceSelector, v1alpha1.ResourcePropertySelector{MatchExpressions: s})
	}
	return c
}

// bigGPU selects GPUs with at least 30G of memory and compute capability 8.0.
func bigGPU() *v1alpha1.ResourceClass {
	return newResourceClass("nvidia-big",
		[]v1alpha1.ResourceSelectorRequirement{
			expr("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"),
			expr("memory", v1alpha1.ResourceSelectorOpGtEq, "30G"),
			expr("computeCapability", v1alpha1.ResourceSelectorOpGtEq, "8.0"),
			expr("migEnabled", v1alpha1.ResourceSelectorOpEq, "false"),
		},
		[]v1alpha1.ResourceSelectorRequirement{
			expr("Kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"),
			expr("product", v1alpha1.ResourceSelectorOpIn, "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"),
			expr("vendor.example/ecc", v1alpha1.ResourceSelectorOpExists),
		})
}

// classRequest is the AdmissionRequest the apiserver sends for ResourceClasses.
func classRequest(op admissionv1.Operation, object, old []byte) admission.Request {
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       "8a5d2c3e-0000-4000-8000-000000000002",
		Kind:      metav1.GroupVersionKind{Group: v1alpha1.GroupName, Version: "v1alpha1", Kind: "ResourceClass"},
		Resource:  metav1.GroupVersionResource{Group: v1alpha1.GroupName, Version: "v1alpha1", Resource: "resourceclasses"},
		Name:      "nvidia-big",
		Operation: op,
		Object:    runtime.RawExtension{Raw: object},
		OldObject: runtime.RawExtension{Raw: old},
	}}
}

// TestResourceClassesHandle: selectors that pkg/selector would refuse are
// refused at create with an Invalid status naming each offending field, the
// spec cannot change afterwards, and everything else passes.
func TestResourceClassesHandle(t *testing.T) {
	h := &resourceClasses{}
	js := func(c *v1alpha1.ResourceClass) []byte { return mustJSON(t, c) }
	modified := func(mod func(*v1alpha1.ResourceClass)) *v1alpha1.ResourceClass {
		c := bigGPU()
		mod(c)
		return c
	}
	const sel0 = "spec.resourceSelector[0]."

	type cause struct {
		field string
		typ   metav1.CauseType
	}
	for _, tc := range []struct {
		name    string
		req     admission.Request
		allowed bool
		code    int32    // for a refusal
		causes  []cause  // for a 422
		message []string // substrings of a refusal's message
		denial  string   // the denial reason counted, "" for none
	}{
		{name: "create valid", req: classRequest(admissionv1.Create, js(bigGPU()), nil), allowed: true},
		{name: "create without selectors", req: classRequest(admissionv1.Create, js(newResourceClass("nothing")), nil), allowed: true},
		{name: "memory is a quantity", req: classRequest(admissionv1.Create, js(modified(func(c *v1alpha1.ResourceClass) {
			c.Spec.ResourceSelector[0].MatchExpressions[1] = expr("memory", v1alpha1.ResourceSelectorOpGt, "lots")
		})), nil), code: http.StatusUnprocessableEntity,
			causes:  []cause{{sel0 + "matchExpressions[1].values[0]", metav1.CauseTypeFieldValueInvalid}},
			message: []string{`ResourceClass.resclass.io "nvidia-big" is invalid`, sel0 + "matchExpressions[1].values[0]", `"lots"`},
			denial:  reasonInvalidSelector},
		{name: "kind has no order", req: classRequest(admissionv1.Create, js(modified(func(c *v1alpha1.ResourceClass) {
			c.Spec.ResourceSelector[0].MatchExpressions[0] = expr("kind", v1alpha1.ResourceSelectorOpGt, "nvidia-gpu")
		})), nil), code: http.StatusUnprocessableEntity,
			causes:  []cause{{sel0 + "matchExpressions[0].operator", metav1.CauseTypeFieldValueInvalid}},
			message: []string{sel0 + "matchExpressions[0].operator", "has no order"},
			denial:  reasonInvalidSelector},
		{name: "unknown operator", req: classRequest(admissionv1.Create, js(modified(func(c *v1alpha1.ResourceClass) {
			c.Spec.ResourceSelector[1].MatchExpressions[2] = expr("vendor.example/ecc", "Bigger", "1")
		})), nil), code: http.StatusUnprocessableEntity,
			causes:  []cause{{"spec.resourceSelector[1].matchExpressions[2].operator", metav1.CauseTypeFieldValueNotSupported}},
			message: []string{"spec.resourceSelector[1].matchExpressions[2].operator", `"Bigger"`},
			denial:  reasonInvalidSelector},
		{name: "every error is a cause", req: classRequest(admissionv1.Create, js(modified(func(c *v1alpha1.ResourceClass) {
			c.Spec.ResourceSelector[0].MatchExpressions[1].Values = []string{"lots"}
			c.Spec.ResourceSelector[1].MatchExpressions[0].Key = ""
		})), nil), code: http.StatusUnprocessableEntity,
			causes: []cause{
				{sel0 + "matchExpressions[1].values[0]", metav1.CauseTypeFieldValueInvalid},
				{"spec.resourceSelector[1].matchExpressions[0].key", metav1.CauseTypeFieldValueRequired},
			},
			denial: reasonInvalidSelector},

		{name: "update changing the spec", req: classRequest(admissionv1.Update, js(modified(func(c *v1alpha1.ResourceClass) {
			c.Spec.ResourceSelector[0].MatchExpressions[1].Values = []string{"40G"}
		})), js(bigGPU())), code: http.StatusUnprocessableEntity,
			causes:  []cause{{"spec", metav1.CauseTypeForbidden}},
			message: []string{"spec is immutable"},
			denial:  reasonSpecImmutable},
		// The immutability error alone: the new spec's own errors would
		// only suggest that fixing them is enough.
		{name: "update to an invalid spec", req: classRequest(admissionv1.Update, js(modified(func(c *v1alpha1.ResourceClass) {
			c.Spec.ResourceSelector[0].MatchExpressions[1].Values = []string{"lots"}
		})), js(bigGPU())), code: http.StatusUnprocessableEntity,
			causes:  []cause{{"spec", metav1.CauseTypeForbidden}},
			message: []string{"spec is immutable"},
			denial:  reasonSpecImmutable},
		{name: "update of labels only", req: classRequest(admissionv1.Update, js(modified(func(c *v1alpha1.ResourceClass) {
			c.Labels = map[string]string{"team": "ml"}
			c.Annotations = map[string]string{"note": "relabelled"}
		})), js(bigGPU())), allowed: true},
		// A class stored before the webhook (or before a rule was tightened)
		// can still lose its finalizers and change labels: the unchanged spec
		// is not judged again.
		{name: "metadata update of a class whose stored spec is invalid", req: func() admission.Request {
			stale := modified(func(c *v1alpha1.ResourceClass) {
				c.Spec.ResourceSelector[0].MatchExpressions[1] = expr("memory", v1alpha1.ResourceSelectorOpGt, "lots")
			})
			relabelled := stale.DeepCopy()
			relabelled.Labels = map[string]string{"team": "ml"}
			relabelled.Finalizers = nil
			return classRequest(admissionv1.Update, js(relabelled), js(stale))
		}(), allowed: true},
		// Semantic equality: an empty list is the omitted list.
		{name: "update with an equivalent spec", req: classRequest(admissionv1.Update, js(modified(func(c *v1alpha1.ResourceClass) {
			c.Spec.ResourceSelector[1].MatchExpressions[2].Values = []string{}
		})), js(bigGPU())), allowed: true},
		{name: "update of status", req: func() admission.Request {
			r := classRequest(admissionv1.Update, js(modified(func(c *v1alpha1.ResourceClass) {
				c.Status.Allocatable = resource.MustParse("8")
			})), js(bigGPU()))
			r.SubResource = "status"
			return r
		}(), allowed: true},
		// Status requests are not looked at at all.
		{name: "status subresource, whatever its object", req: func() admission.Request {
			r := classRequest(admissionv1.Update, []byte("not an object"), nil)
			r.SubResource = "status"
			return r
		}(), allowed: true},
		{name: "delete", req: classRequest(admissionv1.Delete, nil, js(bigGPU())), allowed: true},

		{name: "undecodable object", req: classRequest(admissionv1.Create, []byte(`{"spec":{"resourceSelector":"gpu"}}`), nil),
			code: http.StatusBadRequest, message: []string{"decoding the ResourceClass"}, denial: reasonBadRequest},
		{name: "no object", req: classRequest(admissionv1.Create, nil, nil),
			code: http.StatusBadRequest, message: []string{"decoding the ResourceClass"}, denial: reasonBadRequest},
		{name: "undecodable old object", req: classRequest(admissionv1.Update, js(bigGPU()), []byte("{")),
			code: http.StatusBadRequest, message: []string{"decoding the old ResourceClass"}, denial: reasonBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := denialCounts(t)
			resp := h.Handle(context.Background(), tc.req)
			checkDenialCounted(t, before, ResourceClassesPath, tc.denial)
			if resp.Allowed != tc.allowed {
				t.Fatalf("allowed = %v, want %v (result %+v)", resp.Allowed, tc.allowed, resp.Result)
			}
			if tc.allowed {
				return
			}
			r := resp.Result
			if r == nil || r.Code != tc.code || r.Message == "" {
				t.Fatalf("result %+v, want code %d with a message", r, tc.code)
			}
			for _, s := range tc.message {
				if !strings.Contains(r.Message, s) {
					t.Errorf("message %q does not contain %q", r.Message, s)
				}
			}
			if tc.code != http.StatusUnprocessableEntity {
				return
			}
			// What kubectl prints: `ResourceClass.resclass.io "x" is
			// invalid: <field>: ...`, every field error among the causes.
			if r.Status != metav1.StatusFailure || r.Reason != metav1.StatusReasonInvalid {
				t.Errorf("status %q reason %q, want Failure Invalid", r.Status, r.Reason)
			}
			d := r.Details
			if d == nil {
				t.Fatal("no details")
			}
			if d.Group != v1alpha1.GroupName || d.Kind != "ResourceClass" || d.Name != "nvidia-big" {
				t.Errorf("details name %s %s %q, want %s ResourceClass \"nvidia-big\"", d.Group, d.Kind, d.Name, v1alpha1.GroupName)
			}
			var got []cause
			for _, c := range d.Causes {
				got = append(got, cause{c.Field, c.Type})
				if !strings.Contains(r.Message, c.Field) {
					t.Errorf("message %q does not name %s", r.Message, c.Field)
				}
			}
			if len(got) == 0 || len(got) != len(tc.causes) {
				t.Fatalf("causes %v, want %v", got, tc.causes)
			}
			for i := range got {
				if got[i] != tc.causes[i] {
					t.Errorf("cause %d: %v, want %v", i, got[i], tc.causes[i])
				}
			}
		})
	}
}

// A class the selector accepts but DRA cannot carry (its CEL would be longer
// than the apiserver takes) is admitted, with a warning saying it has no
// DeviceClass; a translatable one gets no warning.
func TestResourceClassesWarnUntranslatable(t *testing.T) {
	h := &resourceClasses{}
	var long []string
	for i := range 64 {
		long = append(long, strings.Repeat("v", 120)+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	big := newResourceClass("too-big", []v1alpha1.ResourceSelectorRequirement{
		expr("product", v1alpha1.ResourceSelectorOpIn, long...), expr("architecture", v1alpha1.ResourceSelectorOpNotIn, long...),
	})
	resp := h.Handle(context.Background(), classRequest(admissionv1.Create, mustJSON(t, big), nil))
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "has no DRA DeviceClass") || len(resp.Warnings[0]) > 256 {
		t.Errorf("allowed=%v warnings=%q, want allowed with one warning about the DeviceClass", resp.Allowed, resp.Warnings)
	}
	resp = h.Handle(context.Background(), classRequest(admissionv1.Create, mustJSON(t, bigGPU()), nil))
	if !resp.Allowed || len(resp.Warnings) != 0 {
		t.Errorf("allowed=%v warnings=%q, want allowed without warnings", resp.Allowed, resp.Warnings)
	}
}
