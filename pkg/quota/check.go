package quota

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	quotav1 "k8s.io/apiserver/pkg/quota/v1"
	"k8s.io/kubernetes/pkg/quota/v1/evaluator/core"
	"k8s.io/utils/clock"
)

// podEvaluator is the apiserver's pod quota evaluator. It is stateless for
// the methods used here (no lister is needed: Usage, Matches and the scope
// and resource matchers only look at the pod and the quota), so one serves
// every request.
var podEvaluator = core.NewPodEvaluator(nil, clock.RealClock{})

// Denial reasons, stable for metrics labels and logs.
const (
	ReasonUncoveredResources = "uncovered-resources"
	ReasonUncoveredScopes    = "uncovered-scopes"
)

// Denial says why a pod may not be created. Message is the apiserver's
// wording for the same denial.
type Denial struct {
	Reason  string
	Message string
}

// Check applies the covering quota rule to a pod being created, given all
// ResourceQuotas of the pod's namespace. A nil Denial means the pod is
// allowed. It never counts usage nor compares it with hard limits.
//
// The error is for pods or quotas the evaluator cannot judge: a quota whose
// scopeSelector cannot be evaluated (e.g. a PriorityClass value that is not
// a valid label value) is reported as an error naming the quota, as the
// apiserver does (it refuses every pod of that namespace for that reason),
// rather than being skipped: skipping would turn an operator's broken quota
// into a misleading "insufficient quota" denial. Quotas are only evaluated
// for pods that are limited, so a broken quota never affects other pods.
func (c *Config) Check(pod *corev1.Pod, quotas []*corev1.ResourceQuota) (*Denial, error) {
	if c.Empty() || pod == nil {
		return nil, nil
	}
	m := &scopeMatcher{pod: pod}
	if d, err := c.checkResources(pod, quotas, m); d != nil || err != nil {
		return d, err
	}
	return c.checkScopes(pod, quotas, m)
}

// scopeMatcher answers whether the pod matches a scope selector, by the
// apiserver's evaluator, once per distinct selector: the limited scopes of
// the configuration and the quotas that cover them are usually the same
// selectors, and each evaluator call copies the pod into a new object (the
// largest allocation of the pod webhook after decoding, docs/webhook.md).
type scopeMatcher struct {
	pod  *corev1.Pod
	seen []scopeMatch
}

type scopeMatch struct {
	selector corev1.ScopedResourceSelectorRequirement
	matches  bool
}

// matching returns the selectors among selectors that the pod matches, in
// their order, as podEvaluator.MatchingScopes does.
func (m *scopeMatcher) matching(selectors []corev1.ScopedResourceSelectorRequirement) ([]corev1.ScopedResourceSelectorRequirement, error) {
	var out []corev1.ScopedResourceSelectorRequirement
	for _, s := range selectors {
		ok, err := m.matches(s)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, s)
		}
	}
	return out, nil
}

func (m *scopeMatcher) matches(s corev1.ScopedResourceSelectorRequirement) (bool, error) {
	for _, seen := range m.seen {
		if seen.selector.ScopeName == s.ScopeName && seen.selector.Operator == s.Operator && slices.Equal(seen.selector.Values, s.Values) {
			return seen.matches, nil
		}
	}
	matched, err := podEvaluator.MatchingScopes(m.pod, []corev1.ScopedResourceSelectorRequirement{s})
	if err != nil {
		return false, err
	}
	m.seen = append(m.seen, scopeMatch{selector: s, matches: len(matched) == 1})
	return len(matched) == 1, nil
}

// checkResources denies a pod that consumes a limited resource no matching
// quota lists (upstream CheckRequest's limitedByDefault and
// restrictedResourcesSet).
func (c *Config) checkResources(pod *corev1.Pod, quotas []*corev1.ResourceQuota, m *scopeMatcher) (*Denial, error) {
	if len(c.matchContains) == 0 {
		return nil, nil
	}
	usage, err := podEvaluator.Usage(pod)
	if err != nil {
		return nil, fmt.Errorf("computing pod usage: %w", err)
	}
	var limited sets.Set[corev1.ResourceName] // allocated only for limited pods
	for name, q := range usage {
		if q.Sign() != 1 {
			continue
		}
		for _, s := range c.matchContains {
			if strings.Contains(string(name), s) {
				if limited == nil {
					limited = sets.New[corev1.ResourceName]()
				}
				limited.Insert(name)
				break
			}
		}
	}
	for _, rq := range quotas {
		if limited.Len() == 0 {
			return nil, nil
		}
		if rq == nil {
			continue
		}
		covered := podEvaluator.MatchingResources(quotav1.ResourceNames(rq.Spec.Hard))
		if !limited.HasAny(covered...) {
			continue
		}
		// The evaluator's Matches: the quota covers one of the pod's
		// resources (judged by spec.hard: coverage is about the quota's
		// existence, see the package doc; covered is not empty here) and the
		// pod matches every scope selector of the quota.
		match := true
		for _, s := range scopeSelectors(rq) {
			ok, err := m.matches(s)
			if err != nil {
				return nil, fmt.Errorf("matching quota %s: %w", rq.Name, err)
			}
			match = match && ok
		}
		if match {
			limited.Delete(covered...)
		}
	}
	if limited.Len() == 0 {
		return nil, nil
	}
	uncovered := sets.List(limited)
	names := make([]string, len(uncovered))
	for i, n := range uncovered {
		names[i] = string(n)
	}
	return &Denial{
		Reason:  ReasonUncoveredResources,
		Message: fmt.Sprintf("insufficient quota to consume: %v", strings.Join(names, ",")),
	}, nil
}

// checkScopes denies a pod that matches a limited scope no quota of the
// namespace has a matching scope of the same name for (upstream
// CheckRequest's limitedScopes and restrictedScopes).
func (c *Config) checkScopes(pod *corev1.Pod, quotas []*corev1.ResourceQuota, m *scopeMatcher) (*Denial, error) {
	if len(c.scopes) == 0 {
		return nil, nil
	}
	limited, err := m.matching(c.scopes)
	if err != nil {
		return nil, fmt.Errorf("matching limited scopes: %w", err)
	}
	if len(limited) == 0 {
		return nil, nil
	}
	var restricted []corev1.ScopedResourceSelectorRequirement
	for _, rq := range quotas {
		if rq == nil {
			continue
		}
		matched, err := m.matching(scopeSelectors(rq))
		if err != nil {
			return nil, fmt.Errorf("matching scopes of quota %s: %w", rq.Name, err)
		}
		restricted = append(restricted, matched...)
	}
	uncovered, err := podEvaluator.UncoveredQuotaScopes(limited, restricted)
	if err != nil {
		return nil, err
	}
	if len(uncovered) == 0 {
		return nil, nil
	}
	return &Denial{
		Reason:  ReasonUncoveredScopes,
		Message: fmt.Sprintf("insufficient quota to match these scopes: %v", uncovered),
	}, nil
}

// scopeSelectors is upstream's getScopeSelectorsFromQuota: spec.scopes as
// Exists requirements, then spec.scopeSelector's expressions.
func scopeSelectors(rq *corev1.ResourceQuota) []corev1.ScopedResourceSelectorRequirement {
	var out []corev1.ScopedResourceSelectorRequirement
	for _, s := range rq.Spec.Scopes {
		out = append(out, corev1.ScopedResourceSelectorRequirement{ScopeName: s, Operator: corev1.ScopeSelectorOpExists})
	}
	if rq.Spec.ScopeSelector != nil {
		out = append(out, rq.Spec.ScopeSelector.MatchExpressions...)
	}
	return out
}
