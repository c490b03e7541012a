package webhook

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// WorkloadsPath is where the pod policies are served for the pod templates
// of the built-in workload kinds.
const WorkloadsPath = "/validate-workloads"

// workloadPolicies applies the pod policies to the pod template of a
// Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob or
// ReplicationController when it is created or its template changes, so that
// `kubectl apply` of a workload whose every pod would be refused fails there,
// naming the template's field, instead of its controller failing to create
// pods one by one. The pods themselves stay checked (podPolicies): this check
// is for the user's sake, the pod check is the boundary.
type workloadPolicies struct {
	pods *podPolicies
}

func (w *workloadPolicies) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.SubResource != "" || (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) {
		return admission.Allowed("")
	}
	gvk := schema.GroupVersionKind{Group: req.Kind.Group, Version: req.Kind.Version, Kind: req.Kind.Kind}
	tmpl, path, err := podTemplate(gvk, req.Object)
	if err != nil {
		denials.WithLabelValues(WorkloadsPath, reasonBadRequest).Inc()
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the %s: %w", gvk.Kind, err))
	}
	if tmpl == nil {
		return admission.Allowed("") // a kind this webhook does not know, or a ReplicationController without a template
	}
	if req.Operation == admissionv1.Update {
		// What the policies look at is the template's spec: an update that
		// leaves it alone (a label, a scale, the controller's revision
		// annotation) is not checked, so that a workload admitted before a
		// policy changed can still be labelled or scaled down.
		if old, _, err := podTemplate(gvk, req.OldObject); err == nil && old != nil && equality.Semantic.DeepEqual(old.Spec, tmpl.Spec) {
			return admission.Allowed("")
		}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: req.Namespace, Labels: tmpl.Labels, Annotations: tmpl.Annotations}, Spec: tmpl.Spec}
	return w.pods.check(ctx, WorkloadsPath, req.Namespace, pod, gvk.Kind, path)
}

// Where each workload kind keeps its pod template.
var (
	templatePath        = field.NewPath("spec", "template")
	cronJobTemplatePath = field.NewPath("spec", "jobTemplate", "spec", "template")
)

// podTemplate decodes a workload of a kind the webhook checks and returns its
// pod template and the template's path; a kind it does not check returns nil.
func podTemplate(gvk schema.GroupVersionKind, raw runtime.RawExtension) (*corev1.PodTemplateSpec, *field.Path, error) {
	switch gvk {
	case appsv1.SchemeGroupVersion.WithKind("Deployment"):
		o := &appsv1.Deployment{}
		return &o.Spec.Template, templatePath, decode(raw, gvk, o)
	case appsv1.SchemeGroupVersion.WithKind("StatefulSet"):
		o := &appsv1.StatefulSet{}
		return &o.Spec.Template, templatePath, decode(raw, gvk, o)
	case appsv1.SchemeGroupVersion.WithKind("DaemonSet"):
		o := &appsv1.DaemonSet{}
		return &o.Spec.Template, templatePath, decode(raw, gvk, o)
	case appsv1.SchemeGroupVersion.WithKind("ReplicaSet"):
		o := &appsv1.ReplicaSet{}
		return &o.Spec.Template, templatePath, decode(raw, gvk, o)
	case batchv1.SchemeGroupVersion.WithKind("Job"):
		o := &batchv1.Job{}
		return &o.Spec.Template, templatePath, decode(raw, gvk, o)
	case batchv1.SchemeGroupVersion.WithKind("CronJob"):
		o := &batchv1.CronJob{}
		return &o.Spec.JobTemplate.Spec.Template, cronJobTemplatePath, decode(raw, gvk, o)
	case corev1.SchemeGroupVersion.WithKind("ReplicationController"):
		o := &corev1.ReplicationController{}
		if err := decode(raw, gvk, o); err != nil {
			return nil, nil, err
		}
		return o.Spec.Template, templatePath, nil
	}
	return nil, nil, nil
}
