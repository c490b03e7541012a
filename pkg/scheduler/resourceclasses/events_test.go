package resourceclasses

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
)

// TestQueueingHints: a waiting pod is retried for the changes that can let it
// fit, and only for those. The dynamic informers hand the hints unstructured
// objects for the custom resources.
func TestQueueingHints(t *testing.T) {
	events, err := (&Plugin{}).EventsToRegister(context.Background())
	if err != nil || len(events) != 3 {
		t.Fatalf("EventsToRegister = %v, %v; want NodeDevices, ResourceClass and Pod events", events, err)
	}
	for _, e := range events {
		if e.QueueingHintFn == nil {
			t.Errorf("event %s has no queueing hint", e.Event.Label())
		}
	}
	logger := klog.Background()
	waiting := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{v1alpha1.ResourceNamePrefix + "gpu": resource.MustParse("1")}}}}}}
	nd := func(healthy bool, conditions string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{
			"devices":    []any{map[string]any{"id": "GPU-0", "kind": "nvidia-gpu", "healthy": healthy}},
			"conditions": []any{map[string]any{"type": conditions}},
		}}}
	}
	class := func(name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{}}
		u.SetName(name)
		return u
	}
	holder := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{assignment.AnnotationKey: "{}"}}, Spec: corev1.PodSpec{NodeName: "n1"}}
	for _, tc := range []struct {
		name     string
		hint     fwk.QueueingHintFn
		old, new any
		want     fwk.QueueingHint
	}{
		{"NodeDevices added", devicesChanged, nil, nd(true, "A"), fwk.Queue},
		{"a device healed", devicesChanged, nd(false, "A"), nd(true, "A"), fwk.Queue},
		{"only conditions changed", devicesChanged, nd(true, "A"), nd(true, "B"), fwk.QueueSkip},
		{"requested class created", classRequested, nil, class("gpu"), fwk.Queue},
		{"another class created", classRequested, nil, class("nic"), fwk.QueueSkip},
		{"holder deleted", (&Plugin{cache: newCache()}).holderGone, holder, nil, fwk.Queue},
		{"pod without assignment deleted", (&Plugin{}).holderGone, &corev1.Pod{Spec: corev1.PodSpec{NodeName: "n1"}}, nil, fwk.QueueSkip},
		{"unbound pod deleted", (&Plugin{}).holderGone, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: holder.Annotations}}, nil, fwk.QueueSkip},
	} {
		got, err := tc.hint(logger, waiting, tc.old, tc.new)
		if err != nil || got != tc.want {
			t.Errorf("%s: hint = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}
