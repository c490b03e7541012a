package resourceclasses

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
)

// TestQueueingHints: a waiting pod is retried when a pod that held devices is
// deleted, or a Node is added or its allocatable changes (the hint,
// TestAgentBackHint); NodeDevices and ResourceClasses are not registered
// (TestNewDevicesAndClassesActivateWaitingPods).
func TestQueueingHints(t *testing.T) {
	events, err := (&Plugin{}).EventsToRegister(context.Background())
	if err != nil || len(events) != 2 || events[0].Event.Resource != fwk.Pod || events[0].Event.ActionType != fwk.Delete ||
		events[1].Event.Resource != fwk.Node || events[1].Event.ActionType != fwk.Add|fwk.UpdateNodeAllocatable {
		t.Fatalf("EventsToRegister = %v, %v; want the Pod deletion, and the Node addition and allocatable update", events, err)
	}
	for _, e := range events {
		if e.QueueingHintFn == nil {
			t.Errorf("event %s has no queueing hint", e.Event.Label())
		}
	}
	logger := klog.Background()
	waiting := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{v1alpha1.ResourceNamePrefix + "gpu": resource.MustParse("1")}}}}}}
	holder := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{assignment.AnnotationKey: "{}"}}, Spec: corev1.PodSpec{NodeName: "n1"}}
	for _, tc := range []struct {
		name     string
		hint     fwk.QueueingHintFn
		old, new any
		want     fwk.QueueingHint
	}{
		{"holder deleted", (&Plugin{shared: &shared{cache: newCache()}}).holderGone, holder, nil, fwk.Queue},
		{"pod without assignment deleted", (&Plugin{}).holderGone, &corev1.Pod{Spec: corev1.PodSpec{NodeName: "n1"}}, nil, fwk.QueueSkip},
		{"unbound pod deleted", (&Plugin{}).holderGone, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: holder.Annotations}}, nil, fwk.QueueSkip},
	} {
		got, err := tc.hint(logger, waiting, tc.old, tc.new)
		if err != nil || got != tc.want {
			t.Errorf("%s: hint = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

// TestNewDevicesAndClassesActivateWaitingPods: with no NodeDevices or
// ResourceClass events registered, the plugin's informer handlers retry the
// pods it turned away once the cache holds the change: new devices, and a
// class that appears.
func TestNewDevicesAndClassesActivateWaitingPods(t *testing.T) {
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", gpu("g0", 0, "80Gi"))}, allClasses)
	first := gpuPod("first", "gpu", 1)
	h.reserve(first, "n1")
	waiting := gpuPod("waiting", "gpu", 1)
	if _, st := h.fits(waiting, "n1"); st.Code() != fwk.Unschedulable {
		t.Fatalf("n1 full: %v, want Unschedulable", st)
	}
	before := len(h.activator.got())
	h.plugin.nodeDevicesChanged(klog.Background(), nodeDevices("n2", gpu("h0", 0, "80Gi")))
	if got := h.activator.got()[before:]; !slices.Contains(got, "default/waiting") {
		t.Errorf("after n2's devices appeared, activated %v, want default/waiting", got)
	}

	fpga := gpuPod("fpga", "fpga", 1)
	if _, _, st := h.preFilter(fpga); st.IsSuccess() {
		t.Fatalf("a class that does not exist: %v, want the pod turned away", st)
	}
	before = len(h.activator.got())
	h.plugin.cache.setClass(rclass("fpga", expr("kind", v1alpha1.ResourceSelectorOpIn, "fpga")))
	if got := h.activator.got()[before:]; !slices.Contains(got, "default/fpga") {
		t.Errorf("after class fpga appeared, activated %v, want default/fpga", got)
	}
}

// TestStripManagedFields: the informers store objects without managed fields,
// and with everything else.
func TestStripManagedFields(t *testing.T) {
	nd := nodeDevices("n1", gpu("g0", 0, "80Gi"))
	nd.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "node-agent", Operation: metav1.ManagedFieldsOperationApply}}
	nd.Labels = map[string]string{"resclass.io/profile": "dgx"}
	out, err := stripManagedFields(nd)
	got, ok := out.(*v1alpha1.NodeDevices)
	if err != nil || !ok || got.ManagedFields != nil || got.Labels["resclass.io/profile"] != "dgx" || len(got.Status.Devices) != 1 {
		t.Errorf("stripManagedFields = %+v, %v; want the object without managed fields only", out, err)
	}
}
