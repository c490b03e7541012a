package quota

import (
	"bytes"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/admission/plugin/resourcequota"
	resourcequotaapi "k8s.io/apiserver/pkg/admission/plugin/resourcequota/apis/resourcequota"
	"k8s.io/apiserver/pkg/apis/apiserver"
	apiserverinstall "k8s.io/apiserver/pkg/apis/apiserver/install"
	"sigs.k8s.io/yaml"
)

// pluginName is the ResourceQuota admission plugin's registered name, the
// entry of an AdmissionConfiguration this package reads.
const pluginName = "ResourceQuota"

// ScopeCrossNamespaceAffinity is the spelling of the
// CrossNamespacePodAffinity scope used by the seed proposal. Parse accepts it
// and normalizes it to corev1.ResourceQuotaScopeCrossNamespacePodAffinity,
// the only spelling the apiserver's ResourceQuota validation accepts.
const ScopeCrossNamespaceAffinity corev1.ResourceQuotaScope = "CrossNamespaceAffinity"

// podScopes are the scopes the pod quota evaluator understands. Any other
// scope never matches a pod, so configuring it would silently do nothing.
var podScopes = []corev1.ResourceQuotaScope{
	corev1.ResourceQuotaScopeTerminating,
	corev1.ResourceQuotaScopeNotTerminating,
	corev1.ResourceQuotaScopeBestEffort,
	corev1.ResourceQuotaScopeNotBestEffort,
	corev1.ResourceQuotaScopePriorityClass,
	corev1.ResourceQuotaScopeCrossNamespacePodAffinity,
}

var scopeOperators = []corev1.ScopeSelectorOperator{
	corev1.ScopeSelectorOpIn,
	corev1.ScopeSelectorOpNotIn,
	corev1.ScopeSelectorOpExists,
	corev1.ScopeSelectorOpDoesNotExist,
}

// admissionCodecs decodes AdmissionConfiguration files with the apiserver's
// own scheme, strictly, as kube-apiserver does.
var admissionCodecs = func() serializer.CodecFactory {
	scheme := runtime.NewScheme()
	apiserverinstall.Install(scheme)
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict)
}()

// Config is a parsed, validated and normalized ResourceQuota admission
// configuration, reduced to what is enforced for pods. It is immutable; a nil
// *Config is valid and allows everything.
type Config struct {
	// scopes are the matchScopes of all pods entries, normalized (alias
	// resolved, empty operator set to Exists), in file order.
	scopes []corev1.ScopedResourceSelectorRequirement
	// matchContains are the matchContains of all pods entries, without
	// duplicates. A flat list is equivalent to upstream's per-entry loop
	// (limitedByDefault) because the result is a set of resource names.
	matchContains []string
	warnings      []string
}

// Parse decodes a ResourceQuota admission configuration: the plugin's own
// file (apiserver.config.k8s.io/v1 ResourceQuotaConfiguration, or
// resourcequota.admission.k8s.io/v1beta1 or v1alpha1 Configuration), or an
// AdmissionConfiguration (apiserver.config.k8s.io/v1 or
// apiserver.k8s.io/v1alpha1) whose ResourceQuota plugin entry has an inline
// configuration. YAML and JSON are accepted. Decoding is strict and all
// validation errors are returned together, each with its field path.
func Parse(data []byte) (*Config, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("empty ResourceQuota configuration")
	}
	// Peek at the kind to pick the decoder, so that errors come from the
	// decoder of the kind the file claims to be.
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(data, &meta); err != nil {
		return nil, fmt.Errorf("decoding ResourceQuota configuration: %w", err)
	}
	root, where := field.NewPath("limitedResources"), ""
	if meta.Kind == "AdmissionConfiguration" {
		obj, _, err := admissionCodecs.UniversalDecoder().Decode(data, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decoding AdmissionConfiguration: %w", err)
		}
		ac, ok := obj.(*apiserver.AdmissionConfiguration)
		if !ok {
			return nil, fmt.Errorf("decoding AdmissionConfiguration: unexpected type %T", obj)
		}
		var path *field.Path
		if data, path, err = pluginConfiguration(ac); err != nil {
			return nil, err
		}
		root, where = path.Child("limitedResources"), path.String()+": "
	}
	cfg, err := resourcequota.LoadConfiguration(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%sdecoding ResourceQuota configuration: %w", where, err)
	}
	return newConfig(cfg, root)
}

// pluginConfiguration returns the inline configuration of the first
// ResourceQuota entry (the one kube-apiserver uses) and its field path.
func pluginConfiguration(ac *apiserver.AdmissionConfiguration) ([]byte, *field.Path, error) {
	for i, p := range ac.Plugins {
		if p.Name != pluginName {
			continue
		}
		path := field.NewPath("plugins").Index(i)
		switch {
		case p.Configuration != nil:
			return p.Configuration.Raw, path.Child("configuration"), nil
		case p.Path != "":
			// The path would name a file inside the apiserver's file
			// system, or one the webhook would have to watch as well.
			return nil, nil, field.Invalid(path.Child("path"), p.Path,
				"mount the ResourceQuota configuration itself (or an AdmissionConfiguration with it inline under configuration:) instead of a file that refers to another file")
		default:
			return nil, nil, field.Required(path.Child("configuration"), "the ResourceQuota entry has no configuration")
		}
	}
	return nil, nil, field.Required(field.NewPath("plugins"), fmt.Sprintf("no entry with name %q", pluginName))
}

// newConfig normalizes, validates and flattens a decoded configuration.
func newConfig(in *resourcequotaapi.Configuration, root *field.Path) (*Config, error) {
	var errs field.ErrorList
	c := &Config{}
	for i, lr := range in.LimitedResources {
		path := root.Index(i)
		if lr.Resource == "" {
			errs = append(errs, field.Required(path.Child("resource"), ""))
			continue
		}
		if lr.APIGroup != "" || lr.Resource != "pods" {
			w := fmt.Sprintf("%s: resource %q of API group %q is not enforced by this webhook, which enforces pods only", path, lr.Resource, lr.APIGroup)
			if len(lr.MatchScopes) > 0 {
				w += "; unlike the apiserver, it does not apply this entry's matchScopes to pods either"
			}
			c.warnings = append(c.warnings, w)
			continue
		}
		for j, s := range lr.MatchContains {
			if s == "" {
				errs = append(errs, field.Invalid(path.Child("matchContains").Index(j), s,
					"must not be empty (it would match every resource the pod consumes)"))
				continue
			}
			if !slices.Contains(c.matchContains, s) {
				c.matchContains = append(c.matchContains, s)
			}
		}
		for j, s := range lr.MatchScopes {
			s = normalizeScope(s)
			if scopeErrs := validateScope(s, path.Child("matchScopes").Index(j)); len(scopeErrs) > 0 {
				errs = append(errs, scopeErrs...)
				continue
			}
			c.scopes = append(c.scopes, s)
		}
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return c, nil
}

// normalizeScope resolves the CrossNamespaceAffinity alias and reads a
// missing operator as Exists. Upstream defines no default operator (its
// conversion and defaulting leave it empty); the seed examples omit it for
// CrossNamespaceAffinity, and Exists is the only operator the apiserver
// allows for such scopes in a ResourceQuota.
func normalizeScope(s corev1.ScopedResourceSelectorRequirement) corev1.ScopedResourceSelectorRequirement {
	if s.ScopeName == ScopeCrossNamespaceAffinity {
		s.ScopeName = corev1.ResourceQuotaScopeCrossNamespacePodAffinity
	}
	if s.Operator == "" {
		s.Operator = corev1.ScopeSelectorOpExists
	}
	return s
}

// validateScope checks a normalized scope requirement like the apiserver
// validates a ResourceQuota's scopeSelector, restricted to pod scopes, plus
// that PriorityClass values are usable by the evaluator (it turns them into
// a label selector, so they must be valid label values).
func validateScope(s corev1.ScopedResourceSelectorRequirement, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if !slices.Contains(podScopes, s.ScopeName) {
		errs = append(errs, field.NotSupported(path.Child("scopeName"), s.ScopeName, podScopes))
	}
	if !slices.Contains(scopeOperators, s.Operator) {
		return append(errs, field.NotSupported(path.Child("operator"), s.Operator, scopeOperators))
	}
	if s.ScopeName != corev1.ResourceQuotaScopePriorityClass && s.Operator != corev1.ScopeSelectorOpExists {
		// The evaluator ignores the operator of these scopes: DoesNotExist
		// would silently mean Exists. The apiserver rejects it in quotas.
		errs = append(errs, field.Invalid(path.Child("operator"), s.Operator,
			"must be 'Exists' when scope is any of Terminating, NotTerminating, BestEffort, NotBestEffort or CrossNamespacePodAffinity"))
	}
	switch s.Operator {
	case corev1.ScopeSelectorOpIn, corev1.ScopeSelectorOpNotIn:
		if len(s.Values) == 0 {
			errs = append(errs, field.Required(path.Child("values"),
				"must be at least one value when `operator` is 'In' or 'NotIn'"))
		}
		for k, v := range s.Values {
			for _, msg := range validation.IsValidLabelValue(v) {
				errs = append(errs, field.Invalid(path.Child("values").Index(k), v, msg))
			}
		}
	default:
		if len(s.Values) != 0 {
			errs = append(errs, field.Invalid(path.Child("values"), s.Values,
				"must be empty when `operator` is 'Exists' or 'DoesNotExist'"))
		}
	}
	return errs
}

// Empty reports whether the configuration limits nothing for pods, so
// every pod is allowed.
func (c *Config) Empty() bool {
	return c == nil || len(c.scopes) == 0 && len(c.matchContains) == 0
}

// Scopes returns a copy of the limited pod scopes, normalized, for logs and
// documentation.
func (c *Config) Scopes() []corev1.ScopedResourceSelectorRequirement {
	if c == nil || len(c.scopes) == 0 {
		return nil
	}
	out := make([]corev1.ScopedResourceSelectorRequirement, len(c.scopes))
	for i, s := range c.scopes {
		out[i] = *s.DeepCopy()
	}
	return out
}

// MatchContains returns a copy of the substrings that make a consumed pod
// resource limited, for logs and documentation.
func (c *Config) MatchContains() []string {
	if c == nil {
		return nil
	}
	return slices.Clone(c.matchContains)
}

// Warnings describes accepted but unenforced parts of the configuration
// (limitedResources entries for resources other than pods), so that the
// webhook can log them.
func (c *Config) Warnings() []string {
	if c == nil {
		return nil
	}
	return slices.Clone(c.warnings)
}
