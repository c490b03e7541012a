package webhook

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	toolscache "k8s.io/client-go/tools/cache"
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
// covering-quota policies (cross-namespace affinity and priority classes).
type podPolicies struct {
	// allowEmptyNamespaceSelector turns off the {} rejection (upstream's reading:
	// all namespaces).
	allowEmptyNamespaceSelector bool
	config                      func() *quota.Config
	// quotas reads ResourceQuotas from the informer cache, never the apiserver.
	quotas quotaSource
}

// quotaSource lists the ResourceQuotas of a namespace from a cache. The
// quotas are the cache's own objects: read them, never change them.
type quotaSource interface {
	resourceQuotas(ctx context.Context, ns string) ([]*corev1.ResourceQuota, error)
}

// informerQuotas reads the quota informer's store through its namespace
// index: the objects as stored, no copy. Listing through the manager's cache
// copies every quota of the namespace into a new list on each admission
// (controller-runtime sets the list's items by reflection, even with
// UnsafeDisableDeepCopy): allocations the pod webhook's tail pays for
// (docs/webhook.md, "Performance").
type informerQuotas struct{ indexer toolscache.Indexer }

func (q informerQuotas) resourceQuotas(_ context.Context, ns string) ([]*corev1.ResourceQuota, error) {
	objs, err := q.indexer.ByIndex(toolscache.NamespaceIndex, ns)
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.ResourceQuota, 0, len(objs))
	for _, o := range objs {
		rq, ok := o.(*corev1.ResourceQuota)
		if !ok {
			return nil, fmt.Errorf("the quota informer holds a %T", o)
		}
		out = append(out, rq)
	}
	return out, nil
}

// readerQuotas lists the quotas through a client.Reader: the manager's cache
// where its informer is not a client-go SharedIndexInformer, and the tests'
// fake clients.
type readerQuotas struct{ reader client.Reader }

func (q readerQuotas) resourceQuotas(ctx context.Context, ns string) ([]*corev1.ResourceQuota, error) {
	var list corev1.ResourceQuotaList
	if err := q.reader.List(ctx, &list, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	out := make([]*corev1.ResourceQuota, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
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
		Affinity              *policyAffinity              `json:"affinity,omitempty"`
		PriorityClassName     string                       `json:"priorityClassName,omitempty"`
		Priority              *int32                       `json:"priority,omitempty"`
		Overhead              corev1.ResourceList          `json:"overhead,omitempty"`
		Resources             *corev1.ResourceRequirements `json:"resources,omitempty"`
	} `json:"spec"`
	// Status is small on a create (the apiserver sets phase and qosClass);
	// the evaluator reads phase, qosClass and the containers' statuses.
	Status corev1.PodStatus `json:"status"`
}

// policyAffinity is what the policies read of a pod's affinity: the pod
// (anti-)affinity terms' namespaces and namespaceSelector (the empty-selector
// rule, and the evaluator's CrossNamespacePodAffinity scope). Node affinity,
// label selectors and topology keys, maps and strings built for nothing, are
// skipped.
type policyAffinity struct {
	PodAffinity     *policyPodAffinity `json:"podAffinity,omitempty"`
	PodAntiAffinity *policyPodAffinity `json:"podAntiAffinity,omitempty"`
}

type policyPodAffinity struct {
	Required  []policyAffinityTerm `json:"requiredDuringSchedulingIgnoredDuringExecution,omitempty"`
	Preferred []struct {
		Term policyAffinityTerm `json:"podAffinityTerm"`
	} `json:"preferredDuringSchedulingIgnoredDuringExecution,omitempty"`
}

type policyAffinityTerm struct {
	Namespaces        []string              `json:"namespaces,omitempty"`
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
}

// affinity is a, as a corev1.Affinity whose terms hold the policy fields only.
func (a *policyAffinity) affinity() *corev1.Affinity {
	if a == nil {
		return nil
	}
	terms := func(in *policyPodAffinity) ([]corev1.PodAffinityTerm, []corev1.WeightedPodAffinityTerm) {
		var required []corev1.PodAffinityTerm
		var preferred []corev1.WeightedPodAffinityTerm
		if in.Required != nil {
			required = make([]corev1.PodAffinityTerm, len(in.Required))
			for i, t := range in.Required {
				required[i] = corev1.PodAffinityTerm{Namespaces: t.Namespaces, NamespaceSelector: t.NamespaceSelector}
			}
		}
		if in.Preferred != nil {
			preferred = make([]corev1.WeightedPodAffinityTerm, len(in.Preferred))
			for i, t := range in.Preferred {
				preferred[i].PodAffinityTerm = corev1.PodAffinityTerm{Namespaces: t.Term.Namespaces, NamespaceSelector: t.Term.NamespaceSelector}
			}
		}
		return required, preferred
	}
	out := &corev1.Affinity{}
	if a.PodAffinity != nil {
		r, p := terms(a.PodAffinity)
		out.PodAffinity = &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: r, PreferredDuringSchedulingIgnoredDuringExecution: p}
	}
	if a.PodAntiAffinity != nil {
		r, p := terms(a.PodAntiAffinity)
		out.PodAntiAffinity = &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: r, PreferredDuringSchedulingIgnoredDuringExecution: p}
	}
	return out
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
		d.Spec.ActiveDeadlineSeconds, d.Spec.Affinity.affinity(), d.Spec.PriorityClassName, d.Spec.Priority, d.Spec.Overhead, d.Spec.Resources
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
	specPath := podSpecPath
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
	quotas, err := p.quotas.resourceQuotas(ctx, ns)
	if err != nil {
		return internalError(ctx, path, fmt.Errorf("reading the ResourceQuotas of namespace %q: %w", ns, err))
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

// podSpecPath is a pod's spec, where a pod's denials point. Paths are
// immutable (Child makes a new one), so one serves every admission.
var podSpecPath = field.NewPath("spec")

// EmptyNamespaceSelectors reports every pod (anti-)affinity term, required or
// preferred, whose namespaceSelector is the empty selector {}. The
// namespaceSelector policy (docs/webhook.md) makes {} invalid so that no pod selects
// every namespace by accident; upstream Kubernetes later read it as "all
// namespaces". A nil selector (the pod's own namespace) is fine. A term's path
// is built only when the term is refused: nearly every pod has none, and the
// paths were allocations on every admission.
func EmptyNamespaceSelectors(spec *corev1.PodSpec, path *field.Path) field.ErrorList {
	if spec.Affinity == nil {
		return nil
	}
	var errs field.ErrorList
	empty := func(term *corev1.PodAffinityTerm) bool {
		s := term.NamespaceSelector
		return s != nil && len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0
	}
	refuse := func(p *field.Path) {
		errs = append(errs, field.Invalid(p.Child("namespaceSelector"), "{}",
			"an empty namespaceSelector selects every namespace, so this term would reach pods cluster-wide: "+
				"select the namespaces you mean (e.g. matchLabels: {team: hpc}) or list them in namespaces; "+
				"leave namespaceSelector unset to mean the pod's own namespace"))
	}
	walk := func(required []corev1.PodAffinityTerm, preferred []corev1.WeightedPodAffinityTerm, kind string) {
		for i := range required {
			if empty(&required[i]) {
				refuse(path.Child("affinity", kind, "requiredDuringSchedulingIgnoredDuringExecution").Index(i))
			}
		}
		for i := range preferred {
			if empty(&preferred[i].PodAffinityTerm) {
				refuse(path.Child("affinity", kind, "preferredDuringSchedulingIgnoredDuringExecution").Index(i).Child("podAffinityTerm"))
			}
		}
	}
	if a := spec.Affinity.PodAffinity; a != nil {
		walk(a.RequiredDuringSchedulingIgnoredDuringExecution, a.PreferredDuringSchedulingIgnoredDuringExecution, "podAffinity")
	}
	if a := spec.Affinity.PodAntiAffinity; a != nil {
		walk(a.RequiredDuringSchedulingIgnoredDuringExecution, a.PreferredDuringSchedulingIgnoredDuringExecution, "podAntiAffinity")
	}
	return errs
}
