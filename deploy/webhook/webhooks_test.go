package webhook

import (
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"
)

// The workloads webhook's condition is the pods webhook's on the pod
// template's spec: written out (matchConditions have no variables), so this
// keeps the two the same.
func TestWorkloadConditionIsThePodsOnTheTemplate(t *testing.T) {
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := yaml.UnmarshalStrict(Webhooks, cfg); err != nil {
		t.Fatal(err)
	}
	conditions := map[string]string{}
	for _, wh := range cfg.Webhooks {
		for _, c := range wh.MatchConditions {
			if c.Name == "uses-a-guarded-feature" {
				conditions[wh.Name] = c.Expression
			}
		}
	}
	pods, workloads := conditions["pods.resclass.io"], conditions["workloads.resclass.io"]
	const template = "(object.kind == 'CronJob' ? object.spec.jobTemplate.spec.template.spec : object.spec.template.spec)."
	if pods == "" || workloads != strings.ReplaceAll(pods, "object.spec.", template) {
		t.Errorf("the workloads condition is not the pods condition with object.spec. replaced by %s:\npods:      %s\nworkloads: %s", template, pods, workloads)
	}
}
