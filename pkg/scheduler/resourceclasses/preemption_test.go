package resourceclasses

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

func podInfo(t *testing.T, pod *corev1.Pod) fwk.PodInfo {
	t.Helper()
	pi, err := framework.NewPodInfo(pod)
	if err != nil {
		t.Fatal(err)
	}
	return pi
}

// TestPreemptionWhatIfs drives AddPod and RemovePod through the framework, as
// DefaultPreemption does when it looks for the fewest victims on a node: a
// victim's devices are free in the cycle's view, whichever class it took
// them through; one added back takes them again; the shared cache and other
// cycles never see either.
func TestPreemptionWhatIfs(t *testing.T) {
	// n1: g0..g2 80Gi, g3 40Gi, all held. low-b took g1 and g2 through
	// gpu-big, which overlaps gpu.
	lowA := boundPod(t, "low-a", "n1", "n1", "gpu", "g0")
	lowB := boundPod(t, "low-b", "n1", "n1", "gpu-big", "g1", "g2")
	lowC := boundPod(t, "low-c", "n1", "n1", "gpu", "g3")
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{suspectNode()}, allClasses, lowA, lowB, lowC)
	h.waitFor("the three holds", func() bool { return h.holds(lowA.UID) && h.holds(lowB.UID) && h.holds(lowC.UID) })

	high := gpuPod("high", "gpu", 2)
	cs, st := h.fits(high, "n1")
	wantCode(t, st, fwk.Unschedulable, "Insufficient free devices of class gpu")
	ni := h.nodes["n1"]
	remove := func(cs fwk.CycleState, pod *corev1.Pod) {
		t.Helper()
		if st := h.fw.RunPreFilterExtensionRemovePod(h.ctx, cs, high, podInfo(t, pod), ni); !st.IsSuccess() {
			t.Fatalf("RemovePod %s: %v", pod.Name, st)
		}
	}
	add := func(cs fwk.CycleState, pod *corev1.Pod) {
		t.Helper()
		if st := h.fw.RunPreFilterExtensionAddPod(h.ctx, cs, high, podInfo(t, pod), ni); !st.IsSuccess() {
			t.Fatalf("AddPod %s: %v", pod.Name, st)
		}
	}

	t.Run("a victim of an overlapping class frees its devices", func(t *testing.T) {
		what := cs.Clone()
		remove(what, lowB)
		if st := h.filter(what, high, "n1"); !st.IsSuccess() {
			t.Errorf("low-b removed: %v, want high to fit on g1 and g2", st)
		}
		add(what, lowB) // preemption's reprieve
		wantCode(t, h.filter(what, high, "n1"), fwk.Unschedulable)
	})
	t.Run("each victim counts", func(t *testing.T) {
		what := cs.Clone()
		remove(what, lowA)
		wantCode(t, h.filter(what, high, "n1"), fwk.Unschedulable)
		remove(what, lowC)
		if st := h.filter(what, high, "n1"); !st.IsSuccess() {
			t.Errorf("low-a and low-c removed: %v, want high to fit on g0 and g3", st)
		}
		// A clone of the what-if is its own: adding low-a back there leaves
		// this one as it is.
		again := what.Clone()
		add(again, lowA)
		wantCode(t, h.filter(again, high, "n1"), fwk.Unschedulable)
		if st := h.filter(what, high, "n1"); !st.IsSuccess() {
			t.Errorf("after a clone changed: %v", st)
		}
	})
	t.Run("the cycle and the cache are untouched", func(t *testing.T) {
		wantCode(t, h.filter(cs, high, "n1"), fwk.Unschedulable)
		h.wantRoomFor("gpu", 0)
	})
}

// TestNominatedPodsKeepTheirDevices: a pod nominated to a node (its victims
// are leaving) counts as holding what it asks there, so a lower pod's Filter
// does not take it; a nominated pod already bound counts once.
func TestNominatedPodsKeepTheirDevices(t *testing.T) {
	lowA := boundPod(t, "low-a", "n1", "n1", "gpu", "g0")
	lowB := boundPod(t, "low-b", "n1", "n1", "gpu", "g1")
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{suspectNode()}, allClasses, lowA, lowB)
	h.waitFor("the two holds", func() bool { return h.holds(lowA.UID) && h.holds(lowB.UID) })
	ni := h.nodes["n1"]

	// g2 and g3 are free; the nominated pod asks both.
	nominated := gpuPod("nominated", "gpu", 2)
	thief := gpuPod("thief", "gpu", 1)
	cs, st := h.fits(thief, "n1")
	if !st.IsSuccess() {
		t.Fatalf("thief alone: %v", st)
	}
	with := cs.Clone()
	if st := h.fw.RunPreFilterExtensionAddPod(h.ctx, with, thief, podInfo(t, nominated), ni); !st.IsSuccess() {
		t.Fatal(st)
	}
	wantCode(t, h.filter(with, thief, "n1"), fwk.Unschedulable, "Insufficient free devices of class gpu")

	// The nominated pod's class overlaps: a big-GPU nominee takes g2 (g3 is
	// 40Gi), and the thief still gets g3.
	big := gpuPod("big", "gpu-big", 1)
	withBig := cs.Clone()
	if st := h.fw.RunPreFilterExtensionAddPod(h.ctx, withBig, thief, podInfo(t, big), ni); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := h.filter(withBig, thief, "n1"); !st.IsSuccess() {
		t.Errorf("with a 1-GPU nominee: %v, want the thief to fit on the last GPU", st)
	}

	// Adding a pod the cache already holds there changes nothing.
	bound := cs.Clone()
	if st := h.fw.RunPreFilterExtensionAddPod(h.ctx, bound, thief, podInfo(t, lowA), ni); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := h.filter(bound, thief, "n1"); !st.IsSuccess() {
		t.Errorf("low-a added again: %v, want no change", st)
	}
	// Removing the nominee again (preemption of a nominated pod) frees its demand.
	if st := h.fw.RunPreFilterExtensionRemovePod(h.ctx, with, thief, podInfo(t, nominated), ni); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := h.filter(with, thief, "n1"); !st.IsSuccess() {
		t.Errorf("the nominee removed: %v", st)
	}
}
