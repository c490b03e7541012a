package webhook

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/dra"
	"github.com/resclass/resclass/pkg/selector"
)

// warning cuts an admission warning to what clients show: the apiserver
// truncates longer ones (and kubectl prints each on one line).
func warning(s string) string {
	const limit = 256
	if len(s) > limit {
		return s[:limit-3] + "..."
	}
	return s
}

// ResourceClassesPath is where ResourceClass validation is served.
const ResourceClassesPath = "/validate-resourceclasses"

const (
	reasonInvalidSelector = "invalid-selector"
	reasonSpecImmutable   = "spec-immutable"
)

// resourceClasses validates ResourceClasses: selectors that pkg/selector
// compiles (the same code the scheduler and node agent select devices with), and
// a spec that never changes after create. The CRD's schema and CEL rules catch
// the structural mistakes first; this catches what needs the attribute types
// (a quantity that does not parse, Gt on a string attribute).
type resourceClasses struct{}

func (r *resourceClasses) Handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	// Status is written through the status subresource, which the webhook
	// configuration does not route here; a request for it is allowed as is.
	if req.SubResource != "" {
		return admission.Allowed("")
	}
	class := &v1alpha1.ResourceClass{}
	gvk := v1alpha1.SchemeGroupVersion.WithKind("ResourceClass")
	if err := decode(req.Object, gvk, class); err != nil {
		denials.WithLabelValues(ResourceClassesPath, reasonBadRequest).Inc()
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the ResourceClass: %w", err))
	}
	specPath := field.NewPath("spec")
	reason := reasonInvalidSelector
	var errs field.ErrorList
	if req.Operation == admissionv1.Update {
		old := &v1alpha1.ResourceClass{}
		if err := decode(req.OldObject, gvk, old); err != nil {
			denials.WithLabelValues(ResourceClassesPath, reasonBadRequest).Inc()
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the old ResourceClass: %w", err))
		}
		if equality.Semantic.DeepEqual(old.Spec, class.Spec) {
			// A metadata change (labels, finalizers, owners) never re-judges
			// the spec: a class stored before the webhook, or before a rule
			// was tightened, must still be relabelled and deleted.
			return admission.Allowed("")
		}
		reason = reasonSpecImmutable
		errs = field.ErrorList{field.Forbidden(specPath,
			"spec is immutable: pods hold devices through this class, so delete and recreate the ResourceClass (or create one with a new name) to change what it selects")}
	} else {
		errs = selector.Validate(&class.Spec, specPath)
	}
	if len(errs) == 0 {
		if req.Operation == admissionv1.Create {
			// Admitted either way: device-plugin nodes serve the class. But
			// DRA nodes serve it to nobody, which the creator should hear
			// now rather than from the class's condition later.
			if _, err := dra.Selector(&class.Spec); err != nil {
				return admission.Allowed("").WithWarnings(warning(err.Error()))
			}
		}
		return admission.Allowed("")
	}
	denials.WithLabelValues(ResourceClassesPath, reason).Inc()
	// An Invalid status reads as `ResourceClass "x" is invalid: spec...: ...`
	// in kubectl, with every field error in its details.
	status := apierrors.NewInvalid(gvk.GroupKind(), class.Name, errs).ErrStatus
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &status}}
}
