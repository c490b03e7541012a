package webhook

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/distribution"
)

// ResourceDistributionsPath is where ResourceDistribution validation is
// served; ResourceDistributionAuthorPath where the author is recorded.
const (
	ResourceDistributionsPath      = "/validate-resourcedistributions"
	ResourceDistributionAuthorPath = "/mutate-resourcedistributions"
)

const (
	reasonInvalidDistribution = "invalid-distribution"
	reasonUnauthorized        = "unauthorized"
	reasonForgedAuthor        = "forged-author"
)

var distributionGVK = v1alpha1.SchemeGroupVersion.WithKind("ResourceDistribution")

// resourceDistributions validates ResourceDistributions (docs/distribution.md) and
// authorizes them: the resource is a complete Secret or ConfigMap whose
// apiVersion, kind and name never change; v1alpha1.AnnotationAuthor records
// the requester (resourceDistributionAuthor writes it, this refuses any
// other value); and the requester must be allowed to make, in every
// namespace known now, the writes the request causes — create where the
// distribution newly writes, delete where a copy goes (also when the
// distribution itself is deleted); update, where new content rewrites a
// copy, is asked too and answered with a warning (see authorize).
// The controller asks the same of the recorded author before each write
// later (docs/distribution.md, "Authorization").
//
// It reads no Secret or ConfigMap: whether a same-named object exists is the
// controller's to find out, after it has checked the author may write there,
// so that a denial here says nothing about existing objects.
type resourceDistributions struct {
	// namespaces reads Namespaces from the informer cache.
	namespaces client.Reader
	// authorizer asks SubjectAccessReviews for the requester (no cache: an
	// admission answers for the RBAC of that moment).
	authorizer *distribution.Authorizer
	// protected are resclass's own namespaces, left out of the default targets.
	protected []string
}

func (d *resourceDistributions) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.SubResource != "" {
		return admission.Allowed("")
	}
	switch req.Operation {
	case admissionv1.Create, admissionv1.Update:
		return d.write(ctx, req)
	case admissionv1.Delete:
		return d.delete(ctx, req)
	}
	return admission.Allowed("")
}

func (d *resourceDistributions) write(ctx context.Context, req admission.Request) admission.Response {
	rd := &v1alpha1.ResourceDistribution{}
	if err := decode(req.Object, distributionGVK, rd); err != nil {
		denials.WithLabelValues(ResourceDistributionsPath, reasonBadRequest).Inc()
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the ResourceDistribution: %w", err))
	}
	spec := field.NewPath("spec")
	res, errs := distribution.ParseResource(rd.Spec.Resource, spec.Child("resource"))
	targets, targetErrs := distribution.CompileTargets(&rd.Spec.Targets, d.protected, spec.Child("targets"))
	errs = append(errs, targetErrs...)

	var (
		old        *v1alpha1.ResourceDistribution
		oldRes     *distribution.Resource
		oldTargets *distribution.Targets
	)
	if req.Operation == admissionv1.Update {
		old = &v1alpha1.ResourceDistribution{}
		if err := decode(req.OldObject, distributionGVK, old); err != nil {
			denials.WithLabelValues(ResourceDistributionsPath, reasonBadRequest).Inc()
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the old ResourceDistribution: %w", err))
		}
		if equalSpecs(old, rd) {
			// Labels, finalizers and the like: the spec's author stays.
			if rd.Annotations[v1alpha1.AnnotationAuthor] != old.Annotations[v1alpha1.AnnotationAuthor] {
				denials.WithLabelValues(ResourceDistributionsPath, reasonForgedAuthor).Inc()
				return admission.Denied(fmt.Sprintf("the annotation %s records who wrote the spec; it changes only with the spec", v1alpha1.AnnotationAuthor))
			}
			return admission.Allowed("")
		}
		// A stored spec that no longer parses cannot be compared; the new one
		// is judged on its own then.
		var oldErrs field.ErrorList
		if oldRes, oldErrs = distribution.ParseResource(old.Spec.Resource, spec.Child("resource")); len(oldErrs) == 0 && res != nil {
			errs = append(errs, distribution.ImmutableFieldsChanged(oldRes, res, spec.Child("resource"))...)
		}
		oldTargets, _ = distribution.CompileTargets(&old.Spec.Targets, d.protected, spec.Child("targets"))
	}
	if len(errs) > 0 {
		denials.WithLabelValues(ResourceDistributionsPath, reasonInvalidDistribution).Inc()
		status := apierrors.NewInvalid(distributionGVK.GroupKind(), rd.Name, errs).ErrStatus
		return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &status}}
	}
	if got, want := rd.Annotations[v1alpha1.AnnotationAuthor], distribution.AuthorOf(req.UserInfo).Encode(); got != want {
		denials.WithLabelValues(ResourceDistributionsPath, reasonForgedAuthor).Inc()
		if got == "" {
			return admission.Denied(fmt.Sprintf("the annotation %s is missing: resclass's mutating webhook %q records the author; is the MutatingWebhookConfiguration resclass-webhook installed?",
				v1alpha1.AnnotationAuthor, "resourcedistributions-author.resclass.io"))
		}
		return admission.Denied(fmt.Sprintf("the annotation %s must record the user who writes the spec (%q); it is set by resclass's webhook, not by hand",
			v1alpha1.AnnotationAuthor, req.UserInfo.Username))
	}

	var nsList corev1.NamespaceList
	if err := d.namespaces.List(ctx, &nsList, client.UnsafeDisableDeepCopy); err != nil {
		return internalError(ctx, ResourceDistributionsPath, fmt.Errorf("listing namespaces: %w", err))
	}
	// The writes this request causes, by verb, in the namespaces known now.
	// When the old status names only some copies, any namespace may hold
	// one: every namespace the targets leave is one where a copy may go.
	var copies map[string]string
	allCopiesNamed := true
	if old != nil {
		copies = old.Status.DistributedResources
		_, allCopiesNamed = distribution.CopyNamespaces(&old.Status)
	}
	writes := map[string][]string{}
	for i := range nsList.Items {
		ns := &nsList.Items[i]
		_, hasCopy := copies[ns.Name]
		now := targets.Matches(ns)
		before := old != nil && (oldTargets.Matches(ns) || hasCopy || (!allCopiesNamed && !now))
		switch {
		case now && !before:
			writes[distribution.VerbCreate] = append(writes[distribution.VerbCreate], ns.Name)
		case now && before && oldRes != nil && oldRes.Hash() != res.Hash():
			writes[distribution.VerbUpdate] = append(writes[distribution.VerbUpdate], ns.Name)
		case !now && before:
			writes[distribution.VerbDelete] = append(writes[distribution.VerbDelete], ns.Name)
		}
	}
	return d.authorize(ctx, req, res, writes, allCopiesNamed)
}

// delete: a distribution's copies go with it (the garbage collector follows
// their ownerReferences), so whoever deletes it must be allowed to delete
// them.
func (d *resourceDistributions) delete(ctx context.Context, req admission.Request) admission.Response {
	old := &v1alpha1.ResourceDistribution{}
	if err := decode(req.OldObject, distributionGVK, old); err != nil {
		denials.WithLabelValues(ResourceDistributionsPath, reasonBadRequest).Inc()
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the ResourceDistribution: %w", err))
	}
	res, errs := distribution.ParseResource(old.Spec.Resource, field.NewPath("spec", "resource"))
	copies, complete := distribution.CopyNamespaces(&old.Status)
	if len(errs) > 0 || (complete && len(copies) == 0) {
		// A spec that never parsed has no copies.
		return admission.Allowed("")
	}
	if !complete {
		// The status names only some copies (a bounded map): any
		// namespace may hold one of the others.
		var nsList corev1.NamespaceList
		if err := d.namespaces.List(ctx, &nsList, client.UnsafeDisableDeepCopy); err != nil {
			return internalError(ctx, ResourceDistributionsPath, fmt.Errorf("listing namespaces: %w", err))
		}
		copies = copies[:0]
		for i := range nsList.Items {
			copies = append(copies, nsList.Items[i].Name)
		}
	}
	return d.authorize(ctx, req, res, map[string][]string{distribution.VerbDelete: copies}, complete)
}

// authorize allows the request when the requester may make every create and
// delete in writes (verb -> namespaces), and names the others when not. An
// update it may not make is a warning, not a denial: the edit goes to the
// copies the author may still write (refusing it would hold back, say, a
// credential rotation everywhere because of one namespace), and the
// controller leaves the others as they are and says so in the status.
//
// allCopiesNamed is false when the old status names only some of the copies:
// the delete checks then cover every namespace that may hold one.
func (d *resourceDistributions) authorize(ctx context.Context, req admission.Request, res *distribution.Resource, writes map[string][]string, allCopiesNamed bool) admission.Response {
	user := distribution.AuthorOf(req.UserInfo)
	var parts, warnings []string
	for _, verb := range []string{distribution.VerbCreate, distribution.VerbUpdate, distribution.VerbDelete} {
		denied, err := d.authorizer.Denied(ctx, user, verb, res.APIResource(), writes[verb])
		if err != nil {
			return internalError(ctx, ResourceDistributionsPath, err)
		}
		if len(denied) == 0 {
			continue
		}
		what := "target namespace(s)"
		if verb == distribution.VerbDelete {
			what = "namespace(s) holding a copy"
			if !allCopiesNamed {
				what = "namespace(s) that may hold a copy (the distribution's status names only some of its copies, so every namespace it no longer targets counts)"
			}
		}
		part := fmt.Sprintf("%s %s in %d %s: %s", verb, res.APIResource(), len(denied), what, someNames(denied))
		if verb == distribution.VerbUpdate {
			warnings = append(warnings, fmt.Sprintf("user %q may not %s; the copies there keep their content (see the status)", req.UserInfo.Username, part))
			continue
		}
		parts = append(parts, part)
	}
	if len(parts) == 0 {
		return admission.Allowed("").WithWarnings(warnings...)
	}
	denials.WithLabelValues(ResourceDistributionsPath, reasonUnauthorized).Inc()
	return admission.Denied(fmt.Sprintf("user %q may not %s; a ResourceDistribution may only write where its author could write the object itself",
		req.UserInfo.Username, strings.Join(parts, "; may not ")))
}

// equalSpecs reports an update that leaves the spec alone (labels, status
// through the main resource, finalizers): nothing to judge again.
func equalSpecs(a, b *v1alpha1.ResourceDistribution) bool {
	return equality.Semantic.DeepEqual(a.Spec, b.Spec)
}

// resourceDistributionAuthor records in v1alpha1.AnnotationAuthor who wrote a
// distribution's spec: the requester, on create and on an update that changes
// the spec; on any other update the annotation is kept as it was (and added
// or removed by nobody). The validating webhook, which runs after every
// mutating one, refuses a value that is not the requester's, so the
// annotation cannot be forged by setting it, nor by another mutating webhook.
type resourceDistributionAuthor struct{}

func (resourceDistributionAuthor) Handle(_ context.Context, req admission.Request) admission.Response {
	if (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) || req.SubResource != "" {
		return admission.Allowed("")
	}
	rd := &v1alpha1.ResourceDistribution{}
	if err := decode(req.Object, distributionGVK, rd); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the ResourceDistribution: %w", err))
	}
	want, set := distribution.AuthorOf(req.UserInfo).Encode(), true
	if req.Operation == admissionv1.Update {
		old := &v1alpha1.ResourceDistribution{}
		if err := decode(req.OldObject, distributionGVK, old); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the old ResourceDistribution: %w", err))
		}
		if equalSpecs(old, rd) {
			want, set = old.Annotations[v1alpha1.AnnotationAuthor]
		}
	}
	got, has := rd.Annotations[v1alpha1.AnnotationAuthor]
	if got == want && has == set {
		return admission.Allowed("")
	}
	path := "/metadata/annotations/" + strings.ReplaceAll(strings.ReplaceAll(v1alpha1.AnnotationAuthor, "~", "~0"), "/", "~1")
	switch {
	case !set:
		return admission.Patched("", jsonpatch.NewOperation("remove", path, nil))
	case rd.Annotations == nil:
		return admission.Patched("", jsonpatch.NewOperation("add", "/metadata/annotations", map[string]string{v1alpha1.AnnotationAuthor: want}))
	default:
		return admission.Patched("", jsonpatch.NewOperation("add", path, want))
	}
}

// maxNamedInDenial bounds the namespaces a denial or warning names: a
// distribution may target thousands, and the message goes back to the user,
// into the apiserver's audit log and into kubectl's output.
const maxNamedInDenial = 20

// someNames names the first maxNamedInDenial of names and counts the rest.
func someNames(names []string) string {
	if len(names) <= maxNamedInDenial {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:maxNamedInDenial], ", "), len(names)-maxNamedInDenial)
}
