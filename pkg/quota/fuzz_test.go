package quota

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		priorityQuotaStory1, priorityQuotaStory2, crossNamespaceAffinityQuota, bareV1,
		rqConfig(cfgExtended), rqConfig(cfgNotIn), rqConfig(cfgNoClass), rqConfig(cfgTwo), rqConfig(cfgQoS), rqConfig(cfgBoth),
		`{"apiVersion": "apiserver.config.k8s.io/v1", "kind": "ResourceQuotaConfiguration", "limitedResources": [{"resource": "pods", "matchContains": ["a"]}]}`,
		`{"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration", "plugins": [{"name": "ResourceQuota", "configuration": {"apiVersion": "resourcequota.admission.k8s.io/v1beta1", "kind": "Configuration", "limitedResources": []}}]}`,
		// Invalid.
		"", "hello", "\x00", "limitedResources: []\n", "apiVersion: v1\nkind: Pod\n",
		rqConfig("- resource: pods\n  matchScope: []\n"),
		rqConfig("- resource: pods\n  matchScopes:\n  - {scopeName: PriorityClass, operator: In}\n"),
		rqConfig("- resource: pods\n  matchScopes:\n  - {scopeName: BestEffort, operator: In, values: [a]}\n"),
		rqConfig("- resource: pods\n  matchScopes:\n  - {scopeName: PriorityClass, operator: In, values: ['a b']}\n"),
		"apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n- name: ResourceQuota\n  path: /x\n",
		"apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins: [{name: ResourceQuota}]\n",
	} {
		f.Add([]byte(s))
	}
	pods := []*corev1.Pod{{}, makePod(priorityClass("cluster-services"), podAffinity(withNamespaces(appTerm, "x")), terminating)}
	f.Fuzz(func(t *testing.T, data []byte) {
		watchdog.Run(t, func() {
			cfg, err := Parse(data)
			again, errAgain := Parse(data)
			if (err == nil) != (errAgain == nil) || err != nil && err.Error() != errAgain.Error() {
				t.Fatalf("Parse is not deterministic: %v, then %v", err, errAgain)
			}
			if err != nil {
				if cfg != nil {
					t.Fatal("Parse returned a Config with an error")
				}
				return
			}
			if !reflect.DeepEqual(cfg, again) {
				t.Fatalf("Parse is not deterministic: %+v, then %+v", cfg, again)
			}
			for _, s := range cfg.Scopes() {
				if !slices.Contains(podScopes, s.ScopeName) || !slices.Contains(scopeOperators, s.Operator) {
					t.Fatalf("Parse accepted scope %v", s)
				}
				if s.ScopeName != corev1.ResourceQuotaScopePriorityClass && s.Operator != corev1.ScopeSelectorOpExists {
					t.Fatalf("Parse accepted scope %v", s)
				}
			}
			for _, s := range cfg.MatchContains() {
				if s == "" {
					t.Fatal("Parse accepted an empty matchContains")
				}
			}
			// What Parse accepts, the evaluator can evaluate: Check never
			// fails because of the configuration.
			for _, pod := range pods {
				if _, err := cfg.Check(pod, nil); err != nil {
					t.Fatalf("Check with an accepted config: %v", err)
				}
			}
		})
	})
}

func FuzzCheck(f *testing.F) {
	cfg, err := Parse([]byte(rqConfig(cfgTwo + cfgExtended + cfgQoS + cfgNoClass)))
	if err != nil {
		f.Fatal(err)
	}
	for _, tc := range []struct {
		pod   *corev1.Pod
		quota *corev1.ResourceQuota
	}{
		{makePod(), makeQuota("all", pods10)},
		{makePod(priorityClass("cluster-services"), podAffinity(withNamespaces(appTerm, "x"))),
			makeQuota("cs", pods10, scopeSelector(priorityReq(corev1.ScopeSelectorOpIn, "cluster-services")))},
		{makePod(extended(map[string]string{"class.resclass.io/a": "1"}), terminating, bestEffort),
			makeQuota("a", []string{"requests.class.resclass.io/a", "1"}, scopes(corev1.ResourceQuotaScopeTerminating))},
		{makePod(preferredPodAntiAffinity(withNamespaceSelector(appTerm, nil))), makeQuota("broken", pods10, scopeSelector(priorityReq("Bad")))},
	} {
		pod, _ := json.Marshal(tc.pod)
		quota, _ := json.Marshal(tc.quota)
		f.Add(pod, quota)
	}
	f.Fuzz(func(t *testing.T, podJSON, quotaJSON []byte) {
		watchdog.Run(t, func() {
			var pod corev1.Pod
			var quota corev1.ResourceQuota
			if json.Unmarshal(podJSON, &pod) != nil || json.Unmarshal(quotaJSON, &quota) != nil {
				return // not a pod and a quota: nothing to check
			}
			d, err := cfg.Check(&pod, []*corev1.ResourceQuota{&quota, nil})
			if d == nil {
				return
			}
			if err != nil {
				t.Fatalf("Check returned both %+v and %v", *d, err)
			}
			switch {
			case d.Reason == ReasonUncoveredResources && strings.HasPrefix(d.Message, "insufficient quota to consume: "):
			case d.Reason == ReasonUncoveredScopes && strings.HasPrefix(d.Message, "insufficient quota to match these scopes: "):
			default:
				t.Fatalf("unexpected denial %+v", *d)
			}
		})
	})
}

// FuzzReload writes arbitrary contents into a loaded configuration file and
// reloads it, as the webhook's poll does: never a panic or a run-away parse;
// an invalid content keeps the last good configuration in use and reports
// itself; a valid one is what Current returns afterwards.
func FuzzReload(f *testing.F) {
	for _, s := range []string{priorityQuotaStory1, crossNamespaceAffinityQuota, "", "hello", "limitedResources: []\n", rqConfig(cfgTwo)} {
		f.Add(s)
	}
	path := filepath.Join(f.TempDir(), "quota.yaml")
	if err := os.WriteFile(path, []byte(crossNamespaceAffinityQuota), 0o600); err != nil {
		f.Fatal(err)
	}
	file, err := NewFile(path, 0, logr.Discard())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, content string) {
		watchdog.Run(t, func() {
			// Back to a known good state first, so each input is judged
			// against the same configuration.
			if err := os.WriteFile(path, []byte(crossNamespaceAffinityQuota), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := file.Reload(); err != nil {
				t.Fatalf("reloading the namespaceSelector proposal's configuration: %v", err)
			}
			good := file.Current()
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			err := file.Reload()
			want, parseErr := Parse([]byte(content))
			switch {
			case (err == nil) != (parseErr == nil):
				t.Fatalf("Reload: %v, Parse: %v", err, parseErr)
			case err != nil && (file.Current() != good || !file.Status().Failed):
				t.Fatalf("an invalid file replaced the configuration in use, or was not reported: %+v", file.Status())
			case err == nil && !reflect.DeepEqual(file.Current(), want):
				t.Fatalf("Current is not the file's configuration")
			}
		})
	})
}
