package webhook

import (
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"
)

// The workloads webhook's condition is the pods webhook's on the pod
// template's spec: written out (matchConditions have no variables), so this
// keeps the two the same in the kustomize component (the Helm chart derives
// one from the other).
func TestWorkloadConditionIsThePodsOnTheTemplate(t *testing.T) {
	// The component's JSON patch: one add of a webhook per entry.
	var ops []struct {
		Op    string                                    `json:"op"`
		Path  string                                    `json:"path"`
		Value admissionregistrationv1.ValidatingWebhook `json:"value"`
	}
	if err := yaml.UnmarshalStrict(PolicyWebhooks, &ops); err != nil {
		t.Fatal(err)
	}
	conditions := map[string]string{}
	for _, op := range ops {
		wh := op.Value
		for _, c := range wh.MatchConditions {
			if c.Name == "concerned-by-a-policy" {
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
