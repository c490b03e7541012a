package quota

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The "Priority in ResourceQuota" proposal's sample user story 1, verbatim.
const priorityQuotaStory1 = `apiVersion: apiserver.k8s.io/v1alpha1
kind: AdmissionConfiguration
plugins:
- name: "ResourceQuota"
  configuration:
    apiVersion: resourcequota.admission.k8s.io/v1alpha1
    kind: Configuration
    limitedResources:
    - resource: pods
      matchScopes:
      - scopeName: PriorityClass
        operator: In
        values: ["cluster-services"]
`

// Its sample user story 2, verbatim (note "operator :").
const priorityQuotaStory2 = `apiVersion: apiserver.k8s.io/v1alpha1
kind: AdmissionConfiguration
plugins:
- name: "ResourceQuota"
  configuration:
    apiVersion: resourcequota.admission.k8s.io/v1alpha1
    kind: Configuration
    limitedResources:
    - resource: pods
      matchScopes:
      - operator : Exists
        scopeName: PriorityClass
`

// Cross-namespace affinity quota (KEP-2249), the kube-apiserver configuration, verbatim: the
// proposal's scope spelling and no operator.
const crossNamespaceAffinityQuota = `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: "ResourceQuota"
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: ResourceQuotaConfiguration
    limitedResources:
    - resource: pods
      matchScopes:
      - scopeName: CrossNamespaceAffinity
`

const bareV1 = `apiVersion: apiserver.config.k8s.io/v1
kind: ResourceQuotaConfiguration
limitedResources:
- resource: pods
  matchContains: ["class.resclass.io/"]
  matchScopes:
  - scopeName: CrossNamespacePodAffinity
    operator: Exists
  - scopeName: PriorityClass
    operator: In
    values: ["cluster-services"]
- resource: persistentvolumeclaims
  matchContains: [".storageclass.storage.k8s.io/requests.storage"]
`

var (
	scopeClusterServices = corev1.ScopedResourceSelectorRequirement{
		ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpIn, Values: []string{"cluster-services"}}
	scopeAnyPriority = corev1.ScopedResourceSelectorRequirement{
		ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpExists}
	scopeCrossNamespace = corev1.ScopedResourceSelectorRequirement{
		ScopeName: corev1.ResourceQuotaScopeCrossNamespacePodAffinity, Operator: corev1.ScopeSelectorOpExists}
)

func TestParse(t *testing.T) {
	tests := []struct {
		name              string
		data              string
		wantScopes        []corev1.ScopedResourceSelectorRequirement
		wantMatchContains []string
		wantWarnings      []string // substrings, one per warning
	}{
		{
			name:       "covering-quota story 1: AdmissionConfiguration v1alpha1, Configuration v1alpha1",
			data:       priorityQuotaStory1,
			wantScopes: []corev1.ScopedResourceSelectorRequirement{scopeClusterServices},
		},
		{
			name:       "covering-quota story 2: Exists",
			data:       priorityQuotaStory2,
			wantScopes: []corev1.ScopedResourceSelectorRequirement{scopeAnyPriority},
		},
		{
			name:       "namespaceSelector proposal: alias and missing operator normalized",
			data:       crossNamespaceAffinityQuota,
			wantScopes: []corev1.ScopedResourceSelectorRequirement{scopeCrossNamespace},
		},
		{
			name:              "bare v1 ResourceQuotaConfiguration, non-pod entry ignored",
			data:              bareV1,
			wantScopes:        []corev1.ScopedResourceSelectorRequirement{scopeCrossNamespace, scopeClusterServices},
			wantMatchContains: []string{"class.resclass.io/"},
			wantWarnings:      []string{`limitedResources[1]: resource "persistentvolumeclaims"`},
		},
		{
			name: "bare v1beta1 Configuration",
			data: `apiVersion: resourcequota.admission.k8s.io/v1beta1
kind: Configuration
limitedResources:
- resource: pods
  matchScopes:
  - {scopeName: PriorityClass, operator: Exists}
`,
			wantScopes: []corev1.ScopedResourceSelectorRequirement{scopeAnyPriority},
		},
		{
			name: "bare v1alpha1 Configuration",
			data: `apiVersion: resourcequota.admission.k8s.io/v1alpha1
kind: Configuration
limitedResources:
- resource: pods
  matchScopes:
  - {scopeName: CrossNamespaceAffinity, operator: Exists}
`,
			wantScopes: []corev1.ScopedResourceSelectorRequirement{scopeCrossNamespace},
		},
		{
			name: "bare v1 JSON",
			data: `{"apiVersion": "apiserver.config.k8s.io/v1", "kind": "ResourceQuotaConfiguration",
 "limitedResources": [{"resource": "pods", "matchContains": ["class.resclass.io/", "class.resclass.io/"],
  "matchScopes": [{"scopeName": "PriorityClass", "operator": "In", "values": ["cluster-services"]}]}]}`,
			wantScopes:        []corev1.ScopedResourceSelectorRequirement{scopeClusterServices},
			wantMatchContains: []string{"class.resclass.io/"},
		},
		{
			name: "AdmissionConfiguration v1 JSON",
			data: `{"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration", "plugins": [
 {"name": "PodSecurity", "path": "/etc/podsecurity.yaml"},
 {"name": "ResourceQuota", "configuration": {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "ResourceQuotaConfiguration",
  "limitedResources": [{"resource": "pods", "matchScopes": [{"scopeName": "CrossNamespacePodAffinity"}]}]}}]}`,
			wantScopes: []corev1.ScopedResourceSelectorRequirement{scopeCrossNamespace},
		},
		{
			name: "no limited resources",
			data: "apiVersion: apiserver.config.k8s.io/v1\nkind: ResourceQuotaConfiguration\nlimitedResources: []\n",
		},
		{
			name: "other pod scopes and PriorityClass operators",
			data: `apiVersion: apiserver.config.k8s.io/v1
kind: ResourceQuotaConfiguration
limitedResources:
- resource: pods
  matchScopes:
  - {scopeName: Terminating, operator: Exists}
  - {scopeName: NotTerminating}
  - {scopeName: BestEffort, operator: Exists}
  - {scopeName: NotBestEffort, operator: Exists}
  - {scopeName: PriorityClass, operator: NotIn, values: [low]}
  - {scopeName: PriorityClass, operator: DoesNotExist}
`,
			wantScopes: []corev1.ScopedResourceSelectorRequirement{
				{ScopeName: corev1.ResourceQuotaScopeTerminating, Operator: corev1.ScopeSelectorOpExists},
				{ScopeName: corev1.ResourceQuotaScopeNotTerminating, Operator: corev1.ScopeSelectorOpExists},
				{ScopeName: corev1.ResourceQuotaScopeBestEffort, Operator: corev1.ScopeSelectorOpExists},
				{ScopeName: corev1.ResourceQuotaScopeNotBestEffort, Operator: corev1.ScopeSelectorOpExists},
				{ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpNotIn, Values: []string{"low"}},
				{ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpDoesNotExist},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.data))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := cfg.Scopes(); !reflect.DeepEqual(got, tc.wantScopes) {
				t.Errorf("Scopes() = %v, want %v", got, tc.wantScopes)
			}
			if got := cfg.MatchContains(); !reflect.DeepEqual(got, tc.wantMatchContains) {
				t.Errorf("MatchContains() = %q, want %q", got, tc.wantMatchContains)
			}
			warnings := cfg.Warnings()
			if len(warnings) != len(tc.wantWarnings) {
				t.Fatalf("Warnings() = %q, want %d matching %q", warnings, len(tc.wantWarnings), tc.wantWarnings)
			}
			for i, w := range tc.wantWarnings {
				if !strings.Contains(warnings[i], w) {
					t.Errorf("Warnings()[%d] = %q, want it to contain %q", i, warnings[i], w)
				}
			}
			if want := len(tc.wantScopes) == 0 && len(tc.wantMatchContains) == 0; cfg.Empty() != want {
				t.Errorf("Empty() = %v, want %v", cfg.Empty(), want)
			}
		})
	}
}

// rqConfig wraps limitedResources entries (YAML, indented by two) in a bare
// v1 ResourceQuotaConfiguration.
func rqConfig(limitedResources string) string {
	return "apiVersion: apiserver.config.k8s.io/v1\nkind: ResourceQuotaConfiguration\nlimitedResources:\n" + limitedResources
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		data string
		want []string // substrings of the error
	}{
		{name: "empty", data: "", want: []string{"empty"}},
		{name: "blank", data: " \n\t\n", want: []string{"empty"}},
		{name: "garbage", data: "\x00\x01garbage{[", want: []string{"decoding"}},
		{name: "YAML scalar", data: "hello", want: []string{"decoding"}},
		{name: "no kind", data: "limitedResources: []\n", want: []string{"Kind' is missing"}},
		{
			name: "foreign kind",
			data: "apiVersion: v1\nkind: Pod\n",
			want: []string{"decoding ResourceQuota configuration", "no kind \"Pod\" is registered"},
		},
		{
			name: "unknown field",
			data: rqConfig("- resource: pods\n  matchScope: []\n"),
			want: []string{`unknown field "limitedResources[0].matchScope"`},
		},
		{
			name: "unknown top-level field in AdmissionConfiguration",
			data: "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugin: []\n",
			want: []string{"decoding AdmissionConfiguration", `unknown field "plugin"`},
		},
		{
			name: "unknown field inside inline configuration",
			data: strings.Replace(crossNamespaceAffinityQuota, "    - resource: pods\n", "    - resource: pods\n      matchScopez: []\n", 1),
			want: []string{`plugins[0].configuration: decoding ResourceQuota configuration`, `unknown field "limitedResources[0].matchScopez"`},
		},
		{
			name: "resource required",
			data: rqConfig("- matchContains: [x]\n"),
			want: []string{"limitedResources[0].resource: Required value"},
		},
		{
			name: "empty matchContains",
			data: rqConfig("- resource: pods\n  matchContains: [a, '']\n"),
			want: []string{"limitedResources[0].matchContains[1]: Invalid value"},
		},
		{
			name: "bad scope name",
			data: rqConfig("- resource: pods\n  matchScopes:\n  - {scopeName: VolumeAttributesClass, operator: Exists}\n"),
			want: []string{`limitedResources[0].matchScopes[0].scopeName: Unsupported value: "VolumeAttributesClass"`, `"CrossNamespacePodAffinity"`},
		},
		{
			name: "bad operator",
			data: rqConfig("- resource: pods\n  matchScopes:\n  - {scopeName: PriorityClass, operator: Equals, values: [a]}\n"),
			want: []string{`limitedResources[0].matchScopes[0].operator: Unsupported value: "Equals"`},
		},
		{
			name: "In without values",
			data: rqConfig("- resource: pods\n  matchScopes:\n  - {scopeName: PriorityClass, operator: In}\n"),
			want: []string{"limitedResources[0].matchScopes[0].values: Required value"},
		},
		{
			name: "NotIn with empty values",
			data: rqConfig("- resource: pods\n  matchScopes:\n  - {scopeName: PriorityClass, operator: NotIn, values: []}\n"),
			want: []string{"limitedResources[0].matchScopes[0].values: Required value"},
		},
		{
			name: "Exists with values",
			data: rqConfig("- resource: pods\n  matchScopes:\n  - {scopeName: PriorityClass, operator: Exists, values: [a]}\n"),
			want: []string{"limitedResources[0].matchScopes[0].values: Invalid value"},
		},
		{
			name: "missing operator with values",
			data: rqConfig("- resource: pods\n  matchScopes:\n  - {scopeName: PriorityClass, values: [a]}\n"),
			want: []string{"limitedResources[0].matchScopes[0].values: Invalid value"},
		},
		{
			name: "BestEffort with In",
			data: rqConfig("- resource: pods\n  matchScopes:\n  - {scopeName: BestEffort, operator: In, values: [a]}\n"),
			want: []string{"limitedResources[0].matchScopes[0].operator: Invalid value: \"In\": must be 'Exists'"},
		},
		{
			name: "Terminating with DoesNotExist",
			data: rqConfig("- resource: pods\n  matchScopes:\n  - {scopeName: Terminating, operator: DoesNotExist}\n"),
			want: []string{"limitedResources[0].matchScopes[0].operator: Invalid value: \"DoesNotExist\""},
		},
		{
			name: "PriorityClass value not a label value",
			data: rqConfig("- resource: pods\n  matchScopes:\n  - {scopeName: PriorityClass, operator: In, values: [ok, 'not ok']}\n"),
			want: []string{"limitedResources[0].matchScopes[0].values[1]: Invalid value: \"not ok\""},
		},
		{
			name: "errors aggregated, paths inside an AdmissionConfiguration",
			data: `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ResourceQuota
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: ResourceQuotaConfiguration
    limitedResources:
    - resource: pods
      matchScopes:
      - {scopeName: Bogus}
    - matchContains: [x]
`,
			want: []string{
				"plugins[0].configuration.limitedResources[0].matchScopes[0].scopeName: Unsupported value",
				"plugins[0].configuration.limitedResources[1].resource: Required value",
			},
		},
		{
			name: "path instead of inline configuration",
			data: "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n- name: ResourceQuota\n  path: /etc/kubernetes/quota.yaml\n",
			want: []string{"plugins[0].path: Invalid value", "mount the ResourceQuota configuration itself"},
		},
		{
			name: "ResourceQuota entry without configuration",
			data: "apiVersion: apiserver.k8s.io/v1alpha1\nkind: AdmissionConfiguration\nplugins:\n- name: ResourceQuota\n",
			want: []string{"plugins[0].configuration: Required value"},
		},
		{
			name: "no ResourceQuota plugin",
			data: "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n- name: PodSecurity\n  path: /etc/ps.yaml\n",
			want: []string{"plugins: Required value", `no entry with name "ResourceQuota"`},
		},
		{
			name: "AdmissionConfiguration of an unknown version",
			data: "apiVersion: apiserver.k8s.io/v1beta1\nkind: AdmissionConfiguration\nplugins: []\n",
			want: []string{"decoding AdmissionConfiguration"},
		},
		{
			name: "inline configuration of another kind",
			data: strings.Replace(crossNamespaceAffinityQuota, "kind: ResourceQuotaConfiguration", "kind: PodSecurityConfiguration", 1),
			want: []string{"plugins[0].configuration: decoding ResourceQuota configuration", "PodSecurityConfiguration"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.data))
			if err == nil {
				t.Fatalf("Parse succeeded with scopes %v, want an error", cfg.Scopes())
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestNilConfig(t *testing.T) {
	var c *Config
	if !c.Empty() || c.Scopes() != nil || c.MatchContains() != nil || c.Warnings() != nil {
		t.Error("a nil Config must be empty")
	}
	if d, err := c.Check(&corev1.Pod{}, nil); d != nil || err != nil {
		t.Errorf("Check on a nil Config = %v, %v; want allowed", d, err)
	}
}
