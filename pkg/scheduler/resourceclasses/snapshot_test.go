package resourceclasses

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

func snapshotOf(nds []*v1alpha1.NodeDevices, classes []*v1alpha1.ResourceClass, pods ...*corev1.Pod) *Snapshot {
	var cs []v1alpha1.ResourceClass
	for _, c := range classes {
		cs = append(cs, *c)
	}
	var ns []v1alpha1.NodeDevices
	for _, n := range nds {
		ns = append(ns, *n)
	}
	var ps []corev1.Pod
	for _, p := range pods {
		ps = append(ps, *p)
	}
	return NewSnapshot(cs, ns, ps)
}

// The snapshot answers as the plugin does: the same pods fit and do not fit
// the same nodes, for the same reasons.
func TestSnapshotFitAgreesWithThePlugin(t *testing.T) {
	nds := []*v1alpha1.NodeDevices{
		nodeDevices("n1", gpu("g0", 0, "80Gi"), gpu("g1", 0, "40Gi")),
		nodeDevices("n2", gpu("g0", 0, "40Gi"), nic("eth0", 0)),
		nodeDevices("n3", nic("eth0", 0)),
	}
	held := boundPod(t, "held", "n1", "n1", "gpu-big", "g0")
	h := newHarness(t, FirstFit, nds, allClasses, held)
	snap := snapshotOf(nds, allClasses, held)

	for _, pod := range []*corev1.Pod{gpuPod("one", "gpu", 1), gpuPod("two", "gpu", 2), gpuPod("big", "gpu-big", 1),
		testPod("pair", ctr{name: "app", limits: map[corev1.ResourceName]string{cls("gpu"): "1", cls("nic"): "1"}})} {
		draws, fits, err := snap.Fit(pod)
		if err != nil {
			t.Fatalf("%s: %v", pod.Name, err)
		}
		if len(draws) == 0 {
			t.Fatalf("%s: no draws", pod.Name)
		}
		cs, pre, st := h.preFilter(pod)
		for _, f := range fits {
			var got *fwk.Status
			if pre != nil && !pre.NodeNames.Has(f.Node) || !st.IsSuccess() && st.Code() == fwk.UnschedulableAndUnresolvable {
				if f.Fits || !f.Unresolvable {
					t.Errorf("%s on %s: snapshot %+v, the plugin's PreFilter leaves the node out (%v)", pod.Name, f.Node, f, st)
				}
				continue
			}
			got = h.filter(cs, pod, f.Node)
			if got.IsSuccess() != f.Fits || (!f.Fits && !strings.Contains(got.Message(), f.Reason)) {
				t.Errorf("%s on %s: snapshot %+v, plugin %v", pod.Name, f.Node, f, got)
			}
		}
	}

	// A class that does not exist is PreFilter's refusal of the pod.
	if _, _, err := snap.Fit(gpuPod("x", "no-such-class", 1)); err == nil || !strings.Contains(err.Error(), `"no-such-class" does not exist`) {
		t.Errorf("missing class: %v", err)
	}
	// A pod without class requests is skipped.
	if draws, fits, err := snap.Fit(testPod("plain", ctr{name: "app"})); draws != nil || fits != nil || err != nil {
		t.Errorf("plain pod: %v %v %v", draws, fits, err)
	}
}

func TestSnapshotDevicesAndStatus(t *testing.T) {
	nds := []*v1alpha1.NodeDevices{
		nodeDevices("n1", gpu("g0", 0, "80Gi"), gpu("g1", 0, "40Gi"), unhealthy(gpu("g2", 0, "80Gi")), migEnabled(gpu("g3", 0, "80Gi")), nic("eth0", 0)),
	}
	held := boundPod(t, "held", "n1", "n1", "gpu-big", "g0")
	snap := snapshotOf(nds, allClasses, held)

	if _, ok := snap.Devices("nope"); ok {
		t.Error("an unknown class has devices")
	}
	nodes, ok := snap.Devices("gpu-big")
	if !ok || len(nodes) != 1 || len(nodes[0].Devices) != 5 {
		t.Fatalf("devices: %+v %v", nodes, ok)
	}
	byID := map[string]SnapshotDevice{}
	for _, d := range nodes[0].Devices {
		byID[d.ID] = d
	}
	if d := byID["g0"]; !d.Selected || d.Free || !slices.Equal(d.HeldBy, []string{"default/held"}) {
		t.Errorf("g0 (held): %+v", d)
	}
	if d := byID["g1"]; d.Selected || d.Free || len(d.NotSelected) != 1 || !strings.Contains(d.NotSelected[0], "memory is 40Gi, not GtEq 80Gi") {
		t.Errorf("g1 (too small): %+v", d)
	}
	if d := byID["g2"]; !d.Selected || d.Healthy || d.Free {
		t.Errorf("g2 (unhealthy): %+v", d)
	}
	if d := byID["g3"]; !d.Selected || d.Free || !strings.Contains(d.Unusable, "MIG") {
		t.Errorf("g3 (MIG): %+v", d)
	}
	if d := byID["eth0"]; d.Selected || !strings.Contains(strings.Join(d.NotSelected, ";"), `kind is "nic"`) {
		t.Errorf("eth0: %+v", d)
	}

	st := snap.Status()["gpu-big"]
	if st.Allocatable.Value() != 1 || st.Requested.Value() != 1 || st.Available.Value() != 0 {
		t.Errorf("gpu-big status: allocatable %s requested %s available %s, want 1 1 0", &st.Allocatable, &st.Requested, &st.Available)
	}
	if st := snap.Status()["gpu"]; st.Allocatable.Value() != 2 || st.Available.Value() != 1 {
		t.Errorf("gpu status: allocatable %s available %s, want 2 1", &st.Allocatable, &st.Available)
	}
}
