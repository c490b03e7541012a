package resourceclasses

import (
	"strings"
	"testing"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// TestDRAModeNodesAreLeftToDynamicResources: a node labelled DRA mode passes
// PreFilter's narrowing and Filter whatever the plugin knows of it, and Reserve
// holds nothing there (the stock DynamicResources plugin allocates its
// devices); a device-plugin node beside it is placed as before.
func TestDRAModeNodesAreLeftToDynamicResources(t *testing.T) {
	dra := nodeDevices("dra-1", gpu("stale", 0, "80Gi")) // a NodeDevices left from device-plugin mode
	dra.Labels = map[string]string{v1alpha1.LabelDeviceMode: v1alpha1.DeviceModeDRA}
	typo := nodeDevices("typo-1")
	typo.Labels = map[string]string{v1alpha1.LabelDeviceMode: "DRA"} // not the exact value: device-plugin mode
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("dp-1", gpu("g0", 0, "80Gi")), dra, typo}, allClasses)

	// One GPU: both nodes with devices qualify; the DRA node whatever its devices.
	_, res, st := h.preFilter(gpuPod("one", "gpu", 1))
	if !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	if res != nil && (!res.NodeNames.Has("dp-1") || !res.NodeNames.Has("dra-1") || res.NodeNames.Has("typo-1")) {
		t.Errorf("PreFilter narrowed to %v, want dp-1 and dra-1", res.NodeNames)
	}

	// Two GPUs: dp-1 has one, typo-1 none (it is a device-plugin node); the
	// DRA node passes, and Reserve there holds nothing.
	pod := gpuPod("two", "gpu", 2)
	cs, st := h.fits(pod, "dp-1")
	wantCode(t, st, fwk.Unschedulable)
	// typo-1 has no device of the class at all: unresolvable there, as on any
	// device-plugin node without the class (TestFilterRefusesNodeWithoutTheClass).
	wantCode(t, h.filter(cs, pod, "typo-1"), fwk.UnschedulableAndUnresolvable)
	if st := h.filter(cs, pod, "dra-1"); !st.IsSuccess() {
		t.Fatalf("Filter on the DRA node: %v", st)
	}
	if st := h.fw.RunReservePluginsReserve(h.ctx, cs, pod, "dra-1"); !st.IsSuccess() {
		t.Fatalf("Reserve on the DRA node: %v", st)
	}
	if s, _ := getState(cs); s.placed != nil {
		t.Errorf("Reserve on the DRA node placed devices %v", s.placed)
	}
	if h.holds(pod.UID) {
		t.Error("the cache holds devices for a pod on a DRA-mode node")
	}

	// A class no device-plugin node has devices of is still schedulable on
	// the DRA node (its DeviceClass decides there), and only there.
	_, res, st = h.preFilter(gpuPod("nic", "nic", 1))
	if !st.IsSuccess() {
		t.Fatalf("PreFilter of a class only DRA nodes may serve: %v", st)
	}
	if res == nil || res.NodeNames.Len() != 1 || !res.NodeNames.Has("dra-1") {
		t.Errorf("PreFilter narrowed to %v, want only dra-1", res)
	}
}

func TestDeviceModeOf(t *testing.T) {
	for labels, want := range map[string]string{"": v1alpha1.DeviceModeDevicePlugin, "dra": v1alpha1.DeviceModeDRA, "DRA": v1alpha1.DeviceModeDevicePlugin, "device-plugin": v1alpha1.DeviceModeDevicePlugin} {
		if got := v1alpha1.DeviceModeOf(map[string]string{v1alpha1.LabelDeviceMode: labels}); got != want {
			t.Errorf("DeviceModeOf(%q) = %q, want %q", labels, got, want)
		}
	}
}

// TestDRAModeNodesRefuseClassRequestsWithoutDRAExtendedResource: in a
// process where DynamicResources does not serve class requests (the resclass
// binary's default), a class request bound to a DRA-mode node would get no
// device, so Filter refuses such nodes, and a class only DRA nodes could
// serve is unresolvable.
func TestDRAModeNodesRefuseClassRequestsWithoutDRAExtendedResource(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.DRAExtendedResource, false)
	dra := nodeDevices("dra-1")
	dra.Labels = map[string]string{v1alpha1.LabelDeviceMode: v1alpha1.DeviceModeDRA}
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("dp-1", gpu("g0", 0, "80Gi")), dra}, allClasses)

	pod := gpuPod("one", "gpu", 1)
	cs, st := h.fits(pod, "dp-1")
	if !st.IsSuccess() {
		t.Fatalf("the device-plugin node: %v", st)
	}
	st = h.filter(cs, pod, "dra-1")
	wantCode(t, st, fwk.UnschedulableAndUnresolvable)
	if !strings.Contains(st.Message(), "through DRA") {
		t.Errorf("Filter on the DRA node says %q", st.Message())
	}
	if _, _, st := h.preFilter(gpuPod("nic", "nic", 1)); st.Code() != fwk.UnschedulableAndUnresolvable {
		t.Errorf("PreFilter of a class no device-plugin node has: %v, want unresolvable", st)
	}
}
