package webhook

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/resclass/resclass/pkg/quota"
)

// Tokens of --match-conditions-cover: what the rendered webhook
// configuration's matchConditions send to the pods webhook.
const (
	coverAll                    = "All"
	coverNone                   = "None"
	coverEmptyNamespaceSelector = "EmptyNamespaceSelector"
	coverCrossNamespace         = string(corev1.ResourceQuotaScopeCrossNamespacePodAffinity)
	coverPriorityClass          = string(corev1.ResourceQuotaScopePriorityClass)
	coverContainsPrefix         = "Contains="
)

// coverage is what the pods webhook's matchConditions let through, as the
// install rendered them (Helm's webhook.policies, the kustomize component):
// the apiserver never sends the webhook a pod they leave out, so a rule about
// such pods is never enforced, and the webhook must say so rather than seem
// to enforce it.
type coverage struct {
	all                    bool
	emptyNamespaceSelector bool
	crossNamespace         bool
	anyPriorityClass       bool
	priorityClasses        []string
	contains               []string
}

// parseCoverage reads --match-conditions-cover.
func parseCoverage(tokens []string) (coverage, error) {
	var c coverage
	for _, t := range tokens {
		switch {
		case t == coverAll:
			c.all = true
		case t == coverNone:
		case t == coverEmptyNamespaceSelector:
			c.emptyNamespaceSelector = true
		case t == coverCrossNamespace:
			c.crossNamespace = true
		case t == coverPriorityClass:
			c.anyPriorityClass = true
		case strings.HasPrefix(t, coverPriorityClass+"=") && len(t) > len(coverPriorityClass)+1:
			c.priorityClasses = append(c.priorityClasses, strings.TrimPrefix(t, coverPriorityClass+"="))
		case strings.HasPrefix(t, coverContainsPrefix) && len(t) > len(coverContainsPrefix):
			c.contains = append(c.contains, strings.TrimPrefix(t, coverContainsPrefix))
		default:
			return c, fmt.Errorf("--match-conditions-cover: %q: want %s, %s, %s, %s, %s, %s=<name> or %s<substring>",
				t, coverAll, coverNone, coverEmptyNamespaceSelector, coverCrossNamespace, coverPriorityClass, coverPriorityClass, coverContainsPrefix)
		}
	}
	return c, nil
}

// uncovered describes each rule in force that concerns pods the
// matchConditions do not send: the empty-selector refusal, each limited
// scope, each matchContains. Empty when everything enforced is reachable.
func (c coverage) uncovered(refuseEmptyNamespaceSelector bool, cfg *quota.Config) []string {
	if c.all {
		return nil
	}
	var out []string
	if refuseEmptyNamespaceSelector && !c.emptyNamespaceSelector && !c.crossNamespace {
		out = append(out, "--refuse-empty-namespace-selector")
	}
	for _, s := range cfg.Scopes() {
		if !c.coversScope(s) {
			out = append(out, fmt.Sprintf("matchScopes {%s %s %v}", s.ScopeName, s.Operator, s.Values))
		}
	}
	for _, m := range cfg.MatchContains() {
		if !c.coversContains(m) {
			out = append(out, fmt.Sprintf("matchContains %q", m))
		}
	}
	return out
}

func (c coverage) coversScope(s corev1.ScopedResourceSelectorRequirement) bool {
	switch {
	case s.ScopeName == corev1.ResourceQuotaScopeCrossNamespacePodAffinity:
		return c.crossNamespace
	case s.ScopeName == corev1.ResourceQuotaScopePriorityClass && s.Operator == corev1.ScopeSelectorOpExists:
		return c.anyPriorityClass
	case s.ScopeName == corev1.ResourceQuotaScopePriorityClass && s.Operator == corev1.ScopeSelectorOpIn:
		if c.anyPriorityClass {
			return true
		}
		for _, v := range s.Values {
			if !slices.Contains(c.priorityClasses, v) {
				return false
			}
		}
		return true
	}
	// NotIn and DoesNotExist concern pods without a priority class;
	// Terminating, BestEffort and their Not* depend on fields no rendered
	// condition reads.
	return false
}

// coversContains: the rendered condition sends a pod when one of its
// requests.<name> or limits.<name> contains a covered substring, so it sends
// every pod consuming a name that contains m when a covered substring is part
// of m. Every pod consumes pods and count/pods, which no condition narrows.
func (c coverage) coversContains(m string) bool {
	if strings.Contains("count/pods", m) {
		return false
	}
	return slices.ContainsFunc(c.contains, func(covered string) bool { return strings.Contains(m, covered) })
}
