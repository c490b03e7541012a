package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
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
	// reasonOutOfTime: the reviews did not finish within the admission's
	// time (reviewBudget).
	reasonOutOfTime = "out-of-time"
)

var distributionGVK = v1alpha1.SchemeGroupVersion.WithKind("ResourceDistribution")

// resourceDistributions validates ResourceDistributions (docs/distribution.md) and
// authorizes them: the resource is a complete Secret or ConfigMap whose
// apiVersion, kind and name never change; the v1alpha1.AnnotationAuthorPrefix
// annotations record the requester (resourceDistributionAuthor writes them,
// this refuses any other record, as the admission policy resclass-spec-author
// does in the apiserver); and the requester must be allowed to make, in every
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
	// authorizer asks SubjectAccessReviews for the requester, at most
	// --distribution-review-qps of them a second for all requests, and
	// reuses an answer for --distribution-review-ttl.
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
	errs = append(errs, distribution.ReservedNameErrors(res, &rd.Spec.Targets, spec)...)

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
		changed, err := specChanged(req)
		if err != nil {
			denials.WithLabelValues(ResourceDistributionsPath, reasonBadRequest).Inc()
			return admission.Errored(http.StatusBadRequest, err)
		}
		if !changed {
			// Labels, finalizers and the like: the spec's author stays.
			if !maps.Equal(distribution.AuthorRecord(rd.Annotations), distribution.AuthorRecord(old.Annotations)) {
				denials.WithLabelValues(ResourceDistributionsPath, reasonForgedAuthor).Inc()
				return admission.Denied(fmt.Sprintf("the annotations %s.* record who wrote the spec; they change only with the spec", v1alpha1.AnnotationAuthorPrefix))
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
	// The admission policy resclass-spec-author makes the same check in the
	// apiserver, where no webhook configuration can take it out of the path;
	// this one says it first, and refuses an identity the controller could
	// not read back.
	requester := distribution.AuthorOf(req.UserInfo)
	if got := distribution.AuthorRecord(rd.Annotations); !maps.Equal(got, requester.Annotations()) {
		denials.WithLabelValues(ResourceDistributionsPath, reasonForgedAuthor).Inc()
		if len(got) == 0 {
			return admission.Denied(fmt.Sprintf("the annotations %s.* are missing: resclass's mutating webhook %q records the author; is the MutatingWebhookConfiguration resclass-webhook installed?",
				v1alpha1.AnnotationAuthorPrefix, "resourcedistributions-author.resclass.io"))
		}
		return admission.Denied(fmt.Sprintf("the annotations %s.* must record the user who writes the spec (%q); they are set by resclass's webhook, not by hand",
			v1alpha1.AnnotationAuthorPrefix, req.UserInfo.Username))
	}
	if _, err := distribution.ParseAuthor(requester.Annotations()); err != nil {
		denials.WithLabelValues(ResourceDistributionsPath, reasonForgedAuthor).Inc()
		return admission.Denied(fmt.Sprintf("user %q cannot be recorded as the author of a ResourceDistribution: %v; write it as an identity with fewer groups or extra attributes",
			req.UserInfo.Username, err))
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
	if complete && len(copies) == 0 {
		return admission.Allowed("")
	}
	if len(errs) > 0 {
		// Stored before a rule that now refuses it (a Secret type no longer
		// distributable): its copies are still there, and their kind is all
		// the check needs. A spec that never parsed has none.
		kind := distribution.KindOf(old.Spec.Resource)
		if kind == "" {
			return admission.Allowed("")
		}
		res = &distribution.Resource{Kind: kind}
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
	reason := reasonUnauthorized
	for _, verb := range []string{distribution.VerbCreate, distribution.VerbUpdate, distribution.VerbDelete} {
		denied, err := d.authorizer.Denied(ctx, user, verb, res.APIResource(), writes[verb])
		if late := (*distribution.OutOfTimeError)(nil); errors.As(err, &late) {
			// Answered now, refused, rather than after the apiserver
			// gave up on the call (a failure that says nothing).
			if verb == distribution.VerbUpdate {
				warnings = append(warnings, fmt.Sprintf("user %q may not %s; the copies there keep their content where the author may not update them (the controller checks each before writing; see the status)",
					req.UserInfo.Username, late))
				continue
			}
			reason = reasonOutOfTime
			parts = append(parts, fmt.Sprintf("%s (or ask for %s %s in every namespace: one review answers for all)", late, verb, res.APIResource()))
			continue
		}
		if tooMany := (*distribution.TooManyReviewsError)(nil); errors.As(err, &tooMany) {
			// Not allowed cluster-wide, and too many namespaces to ask
			// about each (the authorizer's MaxReviews): refused without
			// asking, or, for an update, left to the controller, which
			// asks before each write.
			if verb == distribution.VerbUpdate {
				warnings = append(warnings, fmt.Sprintf("user %q may not %s; the copies there keep their content where the author may not update them (the controller checks each before writing; see the status)",
					req.UserInfo.Username, tooMany))
				continue
			}
			parts = append(parts, fmt.Sprintf("%s (ask for %s %s in every namespace, or change fewer namespaces at a time)", tooMany, verb, res.APIResource()))
			continue
		}
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
	denials.WithLabelValues(ResourceDistributionsPath, reason).Inc()
	return admission.Denied(fmt.Sprintf("user %q may not %s; a ResourceDistribution may only write where its author could write the object itself",
		req.UserInfo.Username, strings.Join(parts, "; may not ")))
}

// specChanged reports whether an update changes the spec, compared as the
// admission policy resclass-spec-author compares it (object.spec !=
// oldObject.spec in CEL: the JSON values, where [] and an absent list differ
// and 1 equals 1.0), so that the webhooks and the policy never disagree on
// whose write records an author. A create changes it.
func specChanged(req admission.Request) (bool, error) {
	if req.Operation != admissionv1.Update {
		return true, nil
	}
	spec := func(raw []byte, what string) (any, error) {
		var obj map[string]any
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, fmt.Errorf("decoding the %s ResourceDistribution: %w", what, err)
		}
		return obj["spec"], nil
	}
	now, err := spec(req.Object.Raw, "new")
	if err != nil {
		return false, err
	}
	before, err := spec(req.OldObject.Raw, "old")
	if err != nil {
		return false, err
	}
	return !reflect.DeepEqual(now, before), nil
}

// resourceDistributionAuthor records who wrote a distribution's spec, in the
// v1alpha1.AnnotationAuthorPrefix annotations: the requester, on create and
// on an update that changes the spec (and removes any other annotation of
// that prefix, the old JSON one included); on any other update the record is
// kept as it was (and added or removed by nobody). The admission policy
// resclass-spec-author, which the apiserver evaluates after every mutating
// webhook, refuses any other record, with or without this webhook, and the
// validating webhook says so too: the record cannot be forged by setting it,
// nor by another mutating webhook.
type resourceDistributionAuthor struct{}

func (resourceDistributionAuthor) Handle(_ context.Context, req admission.Request) admission.Response {
	if (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) || req.SubResource != "" {
		return admission.Allowed("")
	}
	rd := &v1alpha1.ResourceDistribution{}
	if err := decode(req.Object, distributionGVK, rd); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the ResourceDistribution: %w", err))
	}
	want := distribution.AuthorOf(req.UserInfo).Annotations()
	changed, err := specChanged(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if !changed {
		old := &v1alpha1.ResourceDistribution{}
		if err := decode(req.OldObject, distributionGVK, old); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the old ResourceDistribution: %w", err))
		}
		want = distribution.AuthorRecord(old.Annotations)
	}
	got := distribution.AuthorRecord(rd.Annotations)
	if maps.Equal(got, want) {
		return admission.Allowed("")
	}
	if len(rd.Annotations) == 0 {
		// No annotations to add to: the whole map (JSON patch adds a
		// member only to an object that exists).
		return admission.Patched("", jsonpatch.NewOperation("add", "/metadata/annotations", want))
	}
	var ops []jsonpatch.JsonPatchOperation
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, keep := want[k]; !keep {
			ops = append(ops, jsonpatch.NewOperation("remove", annotationPath(k), nil))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if v, has := got[k]; !has || v != want[k] {
			ops = append(ops, jsonpatch.NewOperation("add", annotationPath(k), want[k]))
		}
	}
	return admission.Patched("", ops...)
}

// annotationPath is the JSON pointer of an annotation (RFC 6901 escapes).
func annotationPath(key string) string {
	return "/metadata/annotations/" + strings.ReplaceAll(strings.ReplaceAll(key, "~", "~0"), "/", "~1")
}

// The ResourceDistribution admission's reviews (server.go): how many one
// request asks at once, and how many answers are kept (about 150 bytes each:
// the requester is a digest in the key, whatever the size of its identity).
const (
	reviewWorkers    = 32
	maxCachedReviews = 50_000
)

// reviewClient is the client of the ResourceDistribution admission's
// SubjectAccessReviews: its own, unthrottled, because the Authorizer's
// Limiter paces them (--distribution-review-qps) and, unlike client-go's,
// gives up at once when a wait would pass the admission's deadline. On the
// shared client (--kube-api-qps 100) 10 000 reviews took 100 s.
//
// In protobuf, not JSON: 10 000 reviews are 10 000 decodes and encodes on
// the apiserver and here, and protobuf is the cheaper of the two for both.
func reviewClient(cfg *rest.Config) (kubernetes.Interface, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS = -1 // no client-side limiter (rest.RESTClientFor)
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return kubernetes.NewForConfig(cfg)
}

// defaultAdmissionTimeout is the resourcedistributions webhook's
// timeoutSeconds in deploy/webhook, assumed when a call does not say its own.
const defaultAdmissionTimeout = 10 * time.Second

// maxAdmissionTimeout is the largest timeoutSeconds a webhook may have.
const maxAdmissionTimeout = 30 * time.Second

// reviewBudget gives each ResourceDistribution admission a deadline before
// the apiserver's: the apiserver says its timeout for the call in the query
// (?timeout=10s, rounded up to a second), and a review still running when the
// apiserver gives up is wasted and the user reads only that the call failed.
// So the reviews stop at the budget (admissionBudget) and the request is
// refused with how far they got.
func reviewBudget(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		timeout := defaultAdmissionTimeout
		if t, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && t > 0 {
			// Whoever reaches the port may write any timeout; the
			// apiserver never waits longer than maxAdmissionTimeout.
			timeout = min(t, maxAdmissionTimeout)
		}
		ctx, cancel := context.WithTimeout(r.Context(), admissionBudget(timeout))
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// admissionBudget is the time an admission's reviews may take within the
// apiserver's timeout: less the second the apiserver's rounding may add,
// and a tenth for answering; at least half of it. 10 s: 8 s.
func admissionBudget(timeout time.Duration) time.Duration {
	return max(timeout-time.Second-timeout/10, timeout/2)
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
