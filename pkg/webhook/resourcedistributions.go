package webhook

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/distribution"
)

// ResourceDistributionsPath is where ResourceDistribution validation is served.
const ResourceDistributionsPath = "/validate-resourcedistributions"

const (
	reasonInvalidDistribution = "invalid-distribution"
	reasonConflict            = "conflict"
	reasonUnauthorized        = "unauthorized"
)

// resourceDistributions validates ResourceDistributions (seed 002): the
// resource is a complete Secret or ConfigMap whose apiVersion, kind and name
// never change; at create no target namespace may hold a same-named object;
// and the requester must be allowed to create that kind in every namespace
// the distribution would newly write to — the webhook's controller can write
// anywhere, so without this check a distribution would be a way around RBAC.
type resourceDistributions struct {
	// namespaces reads Namespaces from the informer cache.
	namespaces client.Reader
	// objects lists same-named Secrets or ConfigMaps, metadata only, from the
	// apiserver: one call per create, filtered there by name.
	objects client.Reader
	sar     authorizationclient.SubjectAccessReviewInterface
}

func (d *resourceDistributions) Handle(ctx context.Context, req admission.Request) admission.Response {
	if (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) || req.SubResource != "" {
		return admission.Allowed("")
	}
	gvk := v1alpha1.SchemeGroupVersion.WithKind("ResourceDistribution")
	rd := &v1alpha1.ResourceDistribution{}
	if err := decode(req.Object, gvk, rd); err != nil {
		denials.WithLabelValues(ResourceDistributionsPath, reasonBadRequest).Inc()
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the ResourceDistribution: %w", err))
	}
	spec := field.NewPath("spec")
	res, errs := distribution.ParseResource(rd.Spec.Resource, spec.Child("resource"))
	targets, targetErrs := distribution.CompileTargets(&rd.Spec.Targets, spec.Child("targets"))
	errs = append(errs, targetErrs...)

	var oldTargets *distribution.Targets
	if req.Operation == admissionv1.Update {
		old := &v1alpha1.ResourceDistribution{}
		if err := decode(req.OldObject, gvk, old); err != nil {
			denials.WithLabelValues(ResourceDistributionsPath, reasonBadRequest).Inc()
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the old ResourceDistribution: %w", err))
		}
		// A stored spec that no longer parses cannot be compared; the new one
		// is judged on its own then.
		if oldRes, oldErrs := distribution.ParseResource(old.Spec.Resource, spec.Child("resource")); len(oldErrs) == 0 && res != nil {
			errs = append(errs, distribution.ImmutableFieldsChanged(oldRes, res, spec.Child("resource"))...)
		}
		oldTargets, _ = distribution.CompileTargets(&old.Spec.Targets, spec.Child("targets"))
		if equalSpecs(old, rd) {
			return admission.Allowed("")
		}
	}
	if len(errs) > 0 {
		denials.WithLabelValues(ResourceDistributionsPath, reasonInvalidDistribution).Inc()
		status := apierrors.NewInvalid(gvk.GroupKind(), rd.Name, errs).ErrStatus
		return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &status}}
	}

	var nsList corev1.NamespaceList
	if err := d.namespaces.List(ctx, &nsList, client.UnsafeDisableDeepCopy); err != nil {
		return internalError(ctx, ResourceDistributionsPath, fmt.Errorf("listing namespaces: %w", err))
	}
	var resolved, added []string
	for i := range nsList.Items {
		ns := &nsList.Items[i]
		if !targets.Matches(ns) {
			continue
		}
		resolved = append(resolved, ns.Name)
		if oldTargets == nil || !oldTargets.Matches(ns) {
			added = append(added, ns.Name)
		}
	}
	slices.Sort(resolved)
	slices.Sort(added)

	if req.Operation == admissionv1.Create {
		conflicts, err := d.conflicts(ctx, res, resolved)
		if err != nil {
			return internalError(ctx, ResourceDistributionsPath, err)
		}
		if len(conflicts) > 0 {
			denials.WithLabelValues(ResourceDistributionsPath, reasonConflict).Inc()
			return admission.Denied(fmt.Sprintf("%s %q already exists in %d target namespace(s), not created by this distribution: %s; "+
				"rename the resource or leave those namespaces out of the targets (a distribution copies to all of its targets or to none)",
				res.Kind, res.Name, len(conflicts), strings.Join(conflicts, ", ")))
		}
	}

	denied, err := d.unauthorized(ctx, req.UserInfo, res, added)
	if err != nil {
		return internalError(ctx, ResourceDistributionsPath, err)
	}
	if len(denied) > 0 {
		denials.WithLabelValues(ResourceDistributionsPath, reasonUnauthorized).Inc()
		return admission.Denied(fmt.Sprintf("user %q may not create %s in %d target namespace(s): %s; "+
			"a ResourceDistribution may only copy into namespaces where its author could create the object",
			req.UserInfo.Username, resourceName(res), len(denied), strings.Join(denied, ", ")))
	}
	return admission.Allowed("")
}

// conflicts lists the target namespaces holding a same-named object of the
// resource's kind (none is this distribution's: it does not exist yet).
func (d *resourceDistributions) conflicts(ctx context.Context, res *distribution.Resource, targets []string) ([]string, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(res.GVK().GroupVersion().WithKind(res.Kind + "List"))
	if err := d.objects.List(ctx, list, client.MatchingFields{"metadata.name": res.Name}); err != nil {
		return nil, fmt.Errorf("looking for %s %q in the target namespaces: %w", res.Kind, res.Name, err)
	}
	var conflicts []string
	for _, item := range list.Items {
		if _, ok := slices.BinarySearch(targets, item.Namespace); ok {
			conflicts = append(conflicts, item.Namespace)
		}
	}
	slices.Sort(conflicts)
	return conflicts, nil
}

// unauthorized returns the namespaces where user may not create the
// resource's kind. One cluster-wide review answers for all when it allows;
// otherwise each namespace is asked, a few at a time.
func (d *resourceDistributions) unauthorized(ctx context.Context, user authenticationv1.UserInfo, res *distribution.Resource, namespaces []string) ([]string, error) {
	if len(namespaces) == 0 {
		return nil, nil
	}
	allowed := func(ns string) (bool, error) {
		extra := make(map[string]authorizationv1.ExtraValue, len(user.Extra))
		for k, v := range user.Extra {
			extra[k] = authorizationv1.ExtraValue(v)
		}
		review, err := d.sar.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Version: "v1", Resource: resourceName(res)},
		}}, metav1.CreateOptions{})
		if err != nil {
			return false, fmt.Errorf("asking whether %q may create %s in %q: %w", user.Username, resourceName(res), ns, err)
		}
		return review.Status.Allowed, nil
	}
	if ok, err := allowed(metav1.NamespaceAll); err != nil || ok {
		return nil, err
	}
	var (
		mu     sync.Mutex
		denied []string
		errs   []error
		wg     sync.WaitGroup
	)
	work := make(chan string)
	for range min(8, len(namespaces)) {
		wg.Go(func() {
			for ns := range work {
				ok, err := allowed(ns)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else if !ok {
					denied = append(denied, ns)
				}
				mu.Unlock()
			}
		})
	}
	for _, ns := range namespaces {
		work <- ns
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		return nil, errs[0]
	}
	slices.Sort(denied)
	return denied, nil
}

// equalSpecs reports an update that leaves the spec alone (labels, status
// through the main resource, finalizers): nothing to judge again.
func equalSpecs(a, b *v1alpha1.ResourceDistribution) bool {
	return equality.Semantic.DeepEqual(a.Spec, b.Spec)
}

// resourceName is the API resource of a distributable kind, for RBAC.
func resourceName(res *distribution.Resource) string {
	return strings.ToLower(res.Kind) + "s"
}
