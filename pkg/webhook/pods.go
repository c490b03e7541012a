package webhook

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/resclass/resclass/pkg/quota"
)

// PodsPath is where the pod policies are served.
const PodsPath = "/validate-pods"

// Denial reasons, the label values of resclass_webhook_denials_total.
const (
	reasonEmptyNamespaceSelector = "empty-namespace-selector"
	reasonBadRequest             = "bad-request"
	// reasonInternalError: the webhook could not decide (quota cache not
	// readable, a quota it cannot evaluate); failurePolicy decides the rest.
	reasonInternalError = "internal-error"
)

// podPolicies admits pod creations under the namespaceSelector and
// covering-quota policies (seeds 000 and 001).
type podPolicies struct {
	// allowEmptyNamespaceSelector turns off the {} rejection (upstream's reading:
	// all namespaces).
	allowEmptyNamespaceSelector bool
	config                      func() *quota.Config
	// quotas reads ResourceQuotas from the informer cache, never the apiserver.
	quotas client.Reader
}

func (p *podPolicies) Handle(ctx context.Context, req admission.Request) admission.Response {
	// Affinity and priority class are immutable, and the quota rule is about
	// creation, as the apiserver's: only CREATE is checked.
	if req.Operation != admissionv1.Create || req.Kind.Kind != "Pod" || req.SubResource != "" {
		return admission.Allowed("")
	}
	var decoded policyPod
	if err := decode(req.Object, corev1.SchemeGroupVersion.WithKind("Pod"), &decoded); err != nil {
		denials.WithLabelValues(PodsPath, reasonBadRequest).Inc()
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the pod: %w", err))
	}
	// The pod's namespace may be unset in a create; the request's is authoritative.
	return p.check(ctx, PodsPath, req.Namespace, decoded.pod(), "", nil)
}

// policyPod is the part of a pod that the two policies read: the affinity
// terms, and what the apiserver's pod quota evaluator reads for usage and
// scopes (resources, priority class, activeDeadlineSeconds, QoS, phase,
// deletion). Decoding only these skips the rest of the object (environment,
// volumes, labels, annotations, managedFields) without building it: the full
// decode was the pod webhook's largest cost and most of its allocations
// (docs/webhook.md, "Performance"). TestPolicyPodAgrees and
// FuzzPolicyPodAgrees check that the policies decide the same on it as on the
// whole pod.
type policyPod struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        struct {
		DeletionTimestamp          *metav1.Time `json:"deletionTimestamp,omitempty"`
		DeletionGracePeriodSeconds *int64       `json:"deletionGracePeriodSeconds,omitempty"`
	} `json:"metadata"`
	Spec struct {
		InitContainers        []policyContainer            `json:"initContainers,omitempty"`
		Containers            []policyContainer            `json:"containers"`
		ActiveDeadlineSeconds *int64                       `json:"activeDeadlineSeconds,omitempty"`
		Affinity              *corev1.Affinity             `json:"affinity,omitempty"`
		PriorityClassName     string                       `json:"priorityClassName,omitempty"`
		Priority              *int32                       `json:"priority,omitempty"`
		Overhead              corev1.ResourceList          `json:"overhead,omitempty"`
		Resources             *corev1.ResourceRequirements `json:"resources,omitempty"`
	} `json:"spec"`
	// Status is small on a create (the apiserver sets phase and qosClass);
	// the evaluator reads phase, qosClass and the containers' statuses.
	Status corev1.PodStatus `json:"status"`
}

type policyContainer struct {
	Name          string                         `json:"name"`
	Resources     corev1.ResourceRequirements    `json:"resources"`
	RestartPolicy *corev1.ContainerRestartPolicy `json:"restartPolicy,omitempty"`
}

// pod is the decoded part as a Pod, every other field empty.
func (d *policyPod) pod() *corev1.Pod {
	pod := &corev1.Pod{TypeMeta: d.TypeMeta, Status: d.Status}
	pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds = d.Metadata.DeletionTimestamp, d.Metadata.DeletionGracePeriodSeconds
	s := &pod.Spec
	s.ActiveDeadlineSeconds, s.Affinity, s.PriorityClassName, s.Priority, s.Overhead, s.Resources =
		d.Spec.ActiveDeadlineSeconds, d.Spec.Affinity, d.Spec.PriorityClassName, d.Spec.Priority, d.Spec.Overhead, d.Spec.Resources
	containers := func(in []policyContainer) []corev1.Container {
		if in == nil {
			return nil
		}
		out := make([]corev1.Container, len(in))
		for i, c := range in {
			out[i] = corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy}
		}
		return out
	}
	s.InitContainers, s.Containers = containers(d.Spec.InitContainers), containers(d.Spec.Containers)
	return pod
}

// check applies both policies to pod in namespace ns: a pod being created,
// or the pod a workload's template makes (workloads.go). For a template,
// owner names the workload's kind ("Deployment") and template is where the
// template is in it, so that a denial names the field to fix.
func (p *podPolicies) check(ctx context.Context, path, ns string, pod *corev1.Pod, owner string, template *field.Path) admission.Response {
	specPath := field.NewPath("spec")
	if template != nil {
		specPath = template.Child("spec")
	}
	if !p.allowEmptyNamespaceSelector {
		if errs := EmptyNamespaceSelectors(&pod.Spec, specPath); len(errs) > 0 {
			denials.WithLabelValues(path, reasonEmptyNamespaceSelector).Inc()
			return admission.Denied(errs.ToAggregate().Error())
		}
	}
	cfg := p.config()
	if cfg.Empty() {
		return admission.Allowed("")
	}
	var list corev1.ResourceQuotaList
	if err := p.quotas.List(ctx, &list, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return internalError(ctx, path, fmt.Errorf("reading the ResourceQuotas of namespace %q: %w", ns, err))
	}
	quotas := make([]*corev1.ResourceQuota, len(list.Items))
	for i := range list.Items {
		quotas[i] = &list.Items[i]
	}
	denial, err := cfg.Check(pod, quotas)
	if err != nil {
		return internalError(ctx, path, err)
	}
	if denial != nil {
		denials.WithLabelValues(path, denial.Reason).Inc()
		if owner != "" {
			return admission.Denied(fmt.Sprintf("%s: every pod of this %s would be refused: %s (namespace %q needs a ResourceQuota whose scopes cover its pods; see docs/webhook.md)",
				template, owner, denial.Message, ns))
		}
		return admission.Denied(fmt.Sprintf("%s (namespace %q needs a ResourceQuota whose scopes cover the pod; see docs/webhook.md)", denial.Message, ns))
	}
	return admission.Allowed("")
}

// internalError answers 500, logs why and counts it: the HTTP status the
// apiserver sees is 200 whatever the answer, so without this an undecided
// admission would leave no trace but the user's error.
func internalError(ctx context.Context, path string, err error) admission.Response {
	denials.WithLabelValues(path, reasonInternalError).Inc()
	logf.FromContext(ctx).Error(err, "cannot decide an admission", "webhook", path)
	return admission.Errored(http.StatusInternalServerError, err)
}

// EmptyNamespaceSelectors reports every pod (anti-)affinity term, required or
// preferred, whose namespaceSelector is the empty selector {}. The
// namespaceSelector policy (docs/webhook.md) makes {} invalid so that no pod selects
// every namespace by accident; upstream Kubernetes later read it as "all
// namespaces". A nil selector (the pod's own namespace) is fine.
func EmptyNamespaceSelectors(spec *corev1.PodSpec, path *field.Path) field.ErrorList {
	if spec.Affinity == nil {
		return nil
	}
	var errs field.ErrorList
	check := func(term *corev1.PodAffinityTerm, p *field.Path) {
		if s := term.NamespaceSelector; s != nil && len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0 {
			errs = append(errs, field.Invalid(p.Child("namespaceSelector"), "{}",
				"an empty namespaceSelector selects every namespace, so this term would reach pods cluster-wide: "+
					"select the namespaces you mean (e.g. matchLabels: {team: hpc}) or list them in namespaces; "+
					"leave namespaceSelector unset to mean the pod's own namespace"))
		}
	}
	walk := func(required []corev1.PodAffinityTerm, preferred []corev1.WeightedPodAffinityTerm, p *field.Path) {
		for i := range required {
			check(&required[i], p.Child("requiredDuringSchedulingIgnoredDuringExecution").Index(i))
		}
		for i := range preferred {
			check(&preferred[i].PodAffinityTerm, p.Child("preferredDuringSchedulingIgnoredDuringExecution").Index(i).Child("podAffinityTerm"))
		}
	}
	affinity := path.Child("affinity")
	if a := spec.Affinity.PodAffinity; a != nil {
		walk(a.RequiredDuringSchedulingIgnoredDuringExecution, a.PreferredDuringSchedulingIgnoredDuringExecution, affinity.Child("podAffinity"))
	}
	if a := spec.Affinity.PodAntiAffinity; a != nil {
		walk(a.RequiredDuringSchedulingIgnoredDuringExecution, a.PreferredDuringSchedulingIgnoredDuringExecution, affinity.Child("podAntiAffinity"))
	}
	return errs
}
