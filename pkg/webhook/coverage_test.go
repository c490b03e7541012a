package webhook

import (
	"slices"
	"strings"
	"testing"

	"github.com/resclass/resclass/pkg/quota"
)

// A rule is reported when the rendered matchConditions leave out pods it
// concerns, and only then.
func TestCoverageReportsRulesTheMatchConditionsLeaveOut(t *testing.T) {
	const header = "apiVersion: apiserver.config.k8s.io/v1\nkind: ResourceQuotaConfiguration\nlimitedResources:\n- resource: pods\n"
	for _, tc := range []struct {
		name   string
		cover  []string
		refuse bool
		rule   string // matchScopes/matchContains of one pods entry; "" none
		want   []string
	}{
		{name: "the component's policies", cover: []string{"EmptyNamespaceSelector", "CrossNamespacePodAffinity", "PriorityClass=cluster-services"}, refuse: true,
			rule: "  matchScopes:\n  - {scopeName: CrossNamespacePodAffinity, operator: Exists}\n  - {scopeName: PriorityClass, operator: In, values: [cluster-services]}\n"},
		{name: "another priority class added at run time", cover: []string{"PriorityClass=cluster-services"},
			rule: "  matchScopes:\n  - {scopeName: PriorityClass, operator: In, values: [cluster-services, high]}\n",
			want: []string{"PriorityClass In [cluster-services high]"}},
		{name: "every priority class covers In", cover: []string{"PriorityClass"},
			rule: "  matchScopes:\n  - {scopeName: PriorityClass, operator: In, values: [a, b]}\n  - {scopeName: PriorityClass, operator: Exists}\n"},
		{name: "Exists needs every priority class", cover: []string{"PriorityClass=a"},
			rule: "  matchScopes:\n  - {scopeName: PriorityClass, operator: Exists}\n", want: []string{"PriorityClass Exists"}},
		{name: "NotIn concerns pods without a priority class", cover: []string{"PriorityClass"},
			rule: "  matchScopes:\n  - {scopeName: PriorityClass, operator: NotIn, values: [a]}\n", want: []string{"PriorityClass NotIn [a]"}},
		{name: "BestEffort is read by no condition", cover: []string{"CrossNamespacePodAffinity"},
			rule: "  matchScopes:\n  - {scopeName: BestEffort, operator: Exists}\n", want: []string{"BestEffort Exists"}},
		{name: "cross-namespace affinity not rendered", cover: []string{"None"},
			rule: "  matchScopes:\n  - {scopeName: CrossNamespaceAffinity}\n", want: []string{"CrossNamespacePodAffinity Exists"}},
		{name: "a longer substring of a covered one", cover: []string{"Contains=class.resclass.io/"},
			rule: "  matchContains: [class.resclass.io/nvidia, requests.class.resclass.io/]\n"},
		{name: "a substring not covered", cover: []string{"Contains=class.resclass.io/"},
			rule: "  matchContains: [nvidia.com/gpu]\n", want: []string{`matchContains "nvidia.com/gpu"`}},
		{name: "every pod consumes pods", cover: []string{"Contains=pods"},
			rule: "  matchContains: [pods]\n", want: []string{`matchContains "pods"`}},
		{name: "the empty-selector refusal without its condition", cover: []string{"PriorityClass"}, refuse: true,
			want: []string{"--refuse-empty-namespace-selector"}},
		{name: "cross-namespace affinity covers the empty selector", cover: []string{"CrossNamespacePodAffinity"}, refuse: true},
		{name: "All: no matchConditions", cover: []string{"All"}, refuse: true,
			rule: "  matchScopes:\n  - {scopeName: BestEffort, operator: Exists}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cover, err := parseCoverage(tc.cover)
			if err != nil {
				t.Fatal(err)
			}
			cfg := &quota.Config{}
			if tc.rule != "" {
				if cfg, err = quota.Parse([]byte(header + tc.rule)); err != nil {
					t.Fatal(err)
				}
			}
			got := cover.uncovered(tc.refuse, cfg)
			if len(got) != len(tc.want) {
				t.Fatalf("uncovered %q, want %d matching %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("uncovered[%d] = %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}

func TestCoverageFlagRefusesUnknownTokens(t *testing.T) {
	for _, bad := range []string{"PriorityClass=", "Contains=", "Terminating", "all"} {
		if _, err := parseCoverage([]string{bad}); err == nil {
			t.Errorf("--match-conditions-cover=%s accepted", bad)
		}
	}
	o := NewOptions()
	if !slices.Equal(o.MatchConditionsCover, []string{"All"}) {
		t.Errorf("default --match-conditions-cover %v, want All (nothing reported for a hand-written configuration)", o.MatchConditionsCover)
	}
}
