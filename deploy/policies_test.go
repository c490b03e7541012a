package deploy_test

import (
	"encoding/json"
	"testing"

	"github.com/google/cel-go/cel"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/resclass/resclass/deploy/install"
)

// kustomizeBase renders deploy/.
func kustomizeBase(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	objs, err := install.Kustomize()
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// policyPods are pod specs, as JSON objects (empty fields left out, as the
// apiserver gives them to CEL), each using one feature a policy may concern.
func policyPods() map[string]any {
	term := func(mutate func(*corev1.PodAffinityTerm)) corev1.PodAffinityTerm {
		t := corev1.PodAffinityTerm{TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}}
		mutate(&t)
		return t
	}
	container := func(r corev1.ResourceRequirements) []corev1.Container {
		return []corev1.Container{{Name: "c", Image: "x", Resources: r}}
	}
	one := resource.MustParse("1")
	specs := map[string]corev1.PodSpec{
		"plain": {Containers: container(corev1.ResourceRequirements{})},
		"empty-selector": {Containers: container(corev1.ResourceRequirements{}), Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term(func(t *corev1.PodAffinityTerm) { t.NamespaceSelector = &metav1.LabelSelector{} })},
		}}},
		"cross-namespace": {Containers: container(corev1.ResourceRequirements{}), Affinity: &corev1.Affinity{PodAffinity: &corev1.PodAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term(func(t *corev1.PodAffinityTerm) { t.Namespaces = []string{"other"} })},
		}}},
		"cross-namespace-preferred": {Containers: container(corev1.ResourceRequirements{}), Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: 1, PodAffinityTerm: term(func(t *corev1.PodAffinityTerm) {
				t.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
			})}},
		}}},
		"same-namespace-affinity": {Containers: container(corev1.ResourceRequirements{}), Affinity: &corev1.Affinity{PodAffinity: &corev1.PodAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term(func(*corev1.PodAffinityTerm) {})},
		}}},
		"cluster-services":     {Containers: container(corev1.ResourceRequirements{}), PriorityClassName: "cluster-services"},
		"high":                 {Containers: container(corev1.ResourceRequirements{}), PriorityClassName: "high"},
		"system-node-critical": {Containers: container(corev1.ResourceRequirements{}), PriorityClassName: "system-node-critical"},
		"class-limit":          {Containers: container(corev1.ResourceRequirements{Limits: corev1.ResourceList{"class.resclass.io/gpu": one}})},
		"class-request-init": {Containers: container(corev1.ResourceRequirements{}),
			InitContainers: container(corev1.ResourceRequirements{Requests: corev1.ResourceList{"class.resclass.io/nic": one}})},
		"cpu": {Containers: container(corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: one}})},
	}
	out := map[string]any{}
	for name, spec := range specs {
		data, err := json.Marshal(spec)
		if err != nil {
			panic(err)
		}
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			panic(err)
		}
		out[name] = m
	}
	return out
}

// matches evaluates matchConditions on object as the apiserver does: the
// webhook is called when every condition is true.
func matches(t *testing.T, conditions []admissionregistrationv1.MatchCondition, object map[string]any) bool {
	t.Helper()
	env, err := cel.NewEnv(cel.Variable("object", cel.DynType))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conditions {
		ast, iss := env.Compile(c.Expression)
		if iss.Err() != nil {
			t.Fatalf("matchCondition %s: %v", c.Name, iss.Err())
		}
		prg, err := env.Program(ast)
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := prg.Eval(map[string]any{"object": object})
		if err != nil {
			t.Fatalf("matchCondition %s on %v: %v", c.Name, object, err)
		}
		if out.Value() != true {
			return false
		}
	}
	return true
}
