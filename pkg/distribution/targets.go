package distribution

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// systemNamespaces are never targets unless includedNamespaces names them:
// they hold the control plane's own objects and a distribution aimed at
// "everything" (no option, excludedNamespaces, or a selector) should not write
// there. CompileTargets adds resclass's own namespace to them.
var systemNamespaces = []string{metav1.NamespaceSystem, metav1.NamespacePublic}

// Targets is a compiled spec.targets: which namespaces a distribution goes to.
// The zero value is not usable; build one with CompileTargets.
//
// An option is set when its list is non-empty or, for the selector, when it is
// non-nil. Every option set yields a set of namespaces and a namespace is a target
// when it is in all of them; with no option set, the excludedNamespaces rule with
// an empty list applies (every namespace but the protected ones below).
// kube-system, kube-public and resclass's own namespace are left out by that
// rule and by the selector rule (a label selector, even {}, never reaches them
// by accident), so only includedNamespaces alone targets them: the user named
// them.
type Targets struct {
	// excludeDefaults is true when the excludedNamespaces rule applies (the option
	// is set, or no option is).
	excludeDefaults bool
	// excluded are the listed excluded namespaces, nil when the option is unset.
	excluded map[string]struct{}
	// included are the listed included namespaces, nil when the option is unset;
	// includedNames is the same, sorted and without duplicates.
	included      map[string]struct{}
	includedNames []string
	// selector is nil when namespaceLabelSelector is unset.
	selector labels.Selector
	// protected are kube-system, kube-public and resclass's own namespace:
	// reached only through includedNamespaces alone.
	protected []string
}

// CompileTargets validates and compiles t; a nil t is the default (no option set).
// own are resclass's own namespaces (resclass-system, and the node agent's
// resclass-node): like kube-system and kube-public they are left out of the
// default, excludedNamespaces and selector rules, so that only a distribution
// naming them in includedNamespaces writes there. Errors carry field paths under path: an empty or invalid namespace name (a
// namespace name is a DNS-1123 label) and an invalid label selector. Listing a
// namespace twice is not an error.
func CompileTargets(t *v1alpha1.ResourceDistributionTargets, own []string, path *field.Path) (*Targets, field.ErrorList) {
	if t == nil {
		t = &v1alpha1.ResourceDistributionTargets{}
	}
	var errs field.ErrorList
	out := &Targets{protected: systemNamespaces}
	for _, ns := range own {
		if ns != "" && !slices.Contains(out.protected, ns) {
			out.protected = append(slices.Clip(out.protected), ns)
		}
	}

	if len(t.ExcludedNamespaces) > 0 {
		out.excluded = make(map[string]struct{}, len(t.ExcludedNamespaces))
		errs = append(errs, compileNames(t.ExcludedNamespaces, out.excluded, path.Child("excludedNamespaces"))...)
	}
	if len(t.IncludedNamespaces) > 0 {
		out.included = make(map[string]struct{}, len(t.IncludedNamespaces))
		errs = append(errs, compileNames(t.IncludedNamespaces, out.included, path.Child("includedNamespaces"))...)
		out.includedNames = make([]string, 0, len(out.included))
		for name := range out.included {
			out.includedNames = append(out.includedNames, name)
		}
		slices.Sort(out.includedNames)
	}
	if t.NamespaceLabelSelector != nil {
		selPath := path.Child("namespaceLabelSelector")
		selErrs := metav1validation.ValidateLabelSelector(t.NamespaceLabelSelector,
			metav1validation.LabelSelectorValidationOptions{}, selPath)
		errs = append(errs, selErrs...)
		if len(selErrs) == 0 {
			// ValidateLabelSelector gives the precise paths; this conversion is
			// what the selector means and would only fail on what it already
			// reported, but its error is kept rather than trusted away.
			sel, err := metav1.LabelSelectorAsSelector(t.NamespaceLabelSelector)
			if err != nil {
				errs = append(errs, field.Invalid(selPath, t.NamespaceLabelSelector, err.Error()))
			} else {
				out.selector = sel
			}
		}
	}
	// The excludedNamespaces rule is the default, so it applies when it is set
	// and when nothing is.
	out.excludeDefaults = out.excluded != nil ||
		(out.included == nil && t.NamespaceLabelSelector == nil)

	if len(errs) > 0 {
		return nil, errs
	}
	return out, nil
}

func compileNames(list []v1alpha1.ResourceDistributionNamespace, into map[string]struct{}, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, ns := range list {
		p := path.Index(i).Child("name")
		if ns.Name == "" {
			errs = append(errs, field.Required(p, "a namespace name is required"))
			continue
		}
		if msgs := validation.IsDNS1123Label(ns.Name); len(msgs) > 0 {
			errs = append(errs, field.Invalid(p, ns.Name, strings.Join(msgs, "; ")))
			continue
		}
		into[ns.Name] = struct{}{}
	}
	return errs
}

// Matches reports whether ns is a target. A namespace being deleted (deletion
// timestamp set or phase Terminating) never is: the API server refuses new
// objects in it, and a copy there would be removed with it anyway.
func (t *Targets) Matches(ns *corev1.Namespace) bool {
	if t == nil || ns == nil || ns.Name == "" {
		return false
	}
	if ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating {
		return false
	}
	system := slices.Contains(t.protected, ns.Name)
	if t.excludeDefaults {
		if _, ok := t.excluded[ns.Name]; ok || system {
			return false
		}
	}
	// A selector, even {}, never reaches the system namespaces by accident.
	if t.selector != nil && system {
		return false
	}
	if t.included != nil {
		if _, ok := t.included[ns.Name]; !ok {
			return false
		}
	}
	if t.selector != nil && !t.selector.Matches(labels.Set(ns.Labels)) {
		return false
	}
	return true
}

// Resolve returns the names of the namespaces among namespaces that are targets,
// sorted and without duplicates. Listed namespaces that do not exist are not
// invented: the result is always a subset of the input.
func (t *Targets) Resolve(namespaces []*corev1.Namespace) []string {
	var out []string
	for _, ns := range namespaces {
		if t.Matches(ns) {
			out = append(out, ns.Name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Explicit returns the includedNamespaces names, sorted and without duplicates,
// or nil when that option is unset. It is for messages ("namespace x is listed
// but does not exist"), not for matching.
func (t *Targets) Explicit() []string {
	if t == nil {
		return nil
	}
	return slices.Clone(t.includedNames)
}
