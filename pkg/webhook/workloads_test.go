package webhook

import (
	"context"
	"net/http"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/resclass/resclass/pkg/quota"
)

// workloadRequest is the AdmissionRequest the apiserver sends for a workload.
func workloadRequest(t testing.TB, op admissionv1.Operation, obj runtime.Object, old runtime.Object) admission.Request {
	gvk := obj.GetObjectKind().GroupVersionKind()
	r := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       "8a5d2c3e-0000-4000-8000-000000000002",
		Kind:      metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind},
		Name:      "w",
		Namespace: "team-a",
		Operation: op,
		Object:    runtime.RawExtension{Raw: mustJSON(t, obj)},
	}}
	if old != nil {
		r.OldObject = runtime.RawExtension{Raw: mustJSON(t, old)}
	}
	return r
}

// templated is a workload and where its pod template is.
type templated struct {
	path string
	obj  runtime.Object
}

// withTemplate is one workload of each kind the webhook checks, pod's spec
// as its template's.
func withTemplate(pod *corev1.Pod) []templated {
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels}, Spec: pod.Spec}
	meta := metav1.ObjectMeta{Name: "w", Namespace: "team-a"}
	apps := func(kind string) metav1.TypeMeta { return metav1.TypeMeta{APIVersion: "apps/v1", Kind: kind} }
	batch := func(kind string) metav1.TypeMeta { return metav1.TypeMeta{APIVersion: "batch/v1", Kind: kind} }
	return []templated{
		{"spec.template", &appsv1.Deployment{TypeMeta: apps("Deployment"), ObjectMeta: meta, Spec: appsv1.DeploymentSpec{Template: tmpl}}},
		{"spec.template", &appsv1.StatefulSet{TypeMeta: apps("StatefulSet"), ObjectMeta: meta, Spec: appsv1.StatefulSetSpec{Template: tmpl}}},
		{"spec.template", &appsv1.DaemonSet{TypeMeta: apps("DaemonSet"), ObjectMeta: meta, Spec: appsv1.DaemonSetSpec{Template: tmpl}}},
		{"spec.template", &appsv1.ReplicaSet{TypeMeta: apps("ReplicaSet"), ObjectMeta: meta, Spec: appsv1.ReplicaSetSpec{Template: tmpl}}},
		{"spec.template", &batchv1.Job{TypeMeta: batch("Job"), ObjectMeta: meta, Spec: batchv1.JobSpec{Template: tmpl}}},
		{"spec.jobTemplate.spec.template", &batchv1.CronJob{TypeMeta: batch("CronJob"), ObjectMeta: meta, Spec: batchv1.CronJobSpec{
			Schedule: "* * * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: tmpl}}}}},
		{"spec.template", &corev1.ReplicationController{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ReplicationController"}, ObjectMeta: meta,
			Spec: corev1.ReplicationControllerSpec{Template: &tmpl}}},
	}
}

func TestWorkloadPolicies(t *testing.T) {
	cfg := mustParseQuotaConfig(t, coveringQuotaConfig)
	h := &workloadPolicies{pods: &podPolicies{config: func() *quota.Config { return cfg }, quotas: quotaIndex(t)}}
	ctx := context.Background()
	emptySel := newPod(affinity(requiredAffinity(affinityTerm(&metav1.LabelSelector{}))))
	uncovered := newPod(priority("cluster-services"))
	fine, uncoveredW := withTemplate(newPod()), withTemplate(uncovered)
	for i, w := range withTemplate(emptySel) {
		kind, path := w.obj.GetObjectKind().GroupVersionKind().Kind, w.path
		t.Run(kind, func(t *testing.T) {
			resp := h.Handle(ctx, workloadRequest(t, admissionv1.Create, w.obj, nil))
			checkResponse(t, resp, false, http.StatusForbidden,
				path+".spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaceSelector: Invalid value",
				[]string{"empty namespaceSelector selects every namespace"}, nil)
			// An update that leaves the template alone is not checked (a
			// workload admitted before the policy can still be labelled);
			// one that brings the empty selector in is.
			checkResponse(t, h.Handle(ctx, workloadRequest(t, admissionv1.Update, w.obj, w.obj)), true, http.StatusOK, "", nil, nil)
			checkResponse(t, h.Handle(ctx, workloadRequest(t, admissionv1.Update, w.obj, fine[i].obj)), false, http.StatusForbidden, path+".spec.affinity", nil, nil)
			checkResponse(t, h.Handle(ctx, workloadRequest(t, admissionv1.Create, fine[i].obj, nil)), true, http.StatusOK, "", nil, nil)
			// A template whose priority class no quota of the namespace covers.
			checkResponse(t, h.Handle(ctx, workloadRequest(t, admissionv1.Create, uncoveredW[i].obj, nil)), false, http.StatusForbidden,
				path+": every pod of this "+kind+" would be refused: ",
				[]string{"insufficient quota to match these scopes", `namespace "team-a" needs a ResourceQuota`}, nil)
		})
	}

	// Deleting, a subresource and a kind it does not check are let through;
	// an object that does not decode is a bad request.
	dep := withTemplate(emptySel)[0].obj
	if resp := h.Handle(ctx, workloadRequest(t, admissionv1.Delete, dep, nil)); !resp.Allowed {
		t.Errorf("DELETE: %+v", resp.Result)
	}
	scale := workloadRequest(t, admissionv1.Update, dep, dep)
	scale.SubResource = "scale"
	if resp := h.Handle(ctx, scale); !resp.Allowed {
		t.Errorf("scale: %+v", resp.Result)
	}
	other := workloadRequest(t, admissionv1.Create, &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}}, nil)
	if resp := h.Handle(ctx, other); !resp.Allowed {
		t.Errorf("ConfigMap: %+v", resp.Result)
	}
	bad := workloadRequest(t, admissionv1.Create, dep, nil)
	bad.Object.Raw = []byte(`{"apiVersion":"apps/v1","kind":"Deployment","spec":{"template":{"spec":{"containers":[{"resources":{"limits":{"cpu":"1e999999999"}}}]}}}}`)
	checkResponse(t, h.Handle(ctx, bad), false, http.StatusBadRequest, "decoding the Deployment", nil, nil)
	rc := &corev1.ReplicationController{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ReplicationController"}}
	if resp := h.Handle(ctx, workloadRequest(t, admissionv1.Create, rc, nil)); !resp.Allowed {
		t.Errorf("a ReplicationController without a template: %+v", resp.Result)
	}
}
