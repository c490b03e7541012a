package resourceclasses

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/mig"
)

// dynamicGPU is an A100-80GB in MIG mode, marked for dynamic MIG, with
// instances, as the node agent publishes it.
func dynamicGPU(id string, numa int64, instances ...v1alpha1.MIGInstance) v1alpha1.Device {
	d := migEnabled(gpu(id, numa, "80Gi"))
	d.Attributes[v1alpha1.AttributeProduct] = v1alpha1.DeviceAttribute{StringValue: ptr.To(mig.A100_80GB.Product)}
	d.MIG = mig.A100_80GB.API(instances...)
	d.MIG.Mode = v1alpha1.MIGDynamic
	return d
}

// migClass selects MIG devices of at least memory, created ones and, with
// create, slices to create.
func migClass(name, memory string, create bool) *v1alpha1.ResourceClass {
	rc := rclass(name, expr("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindNvidiaMIG), expr("memory", v1alpha1.ResourceSelectorOpGtEq, memory))
	rc.Spec.CreateMIG = create
	return rc
}

var (
	mig20g      = migClass("mig-20g", "20G", true)
	mig40g      = migClass("mig-40g", "40G", true)
	migExisting = migClass("mig-existing", "20G", false)
)

func sliceCache(nds ...*v1alpha1.NodeDevices) *cache {
	c := newCache()
	for _, rc := range []*v1alpha1.ResourceClass{gpuClass, mig20g, mig40g, migExisting} {
		c.setClass(rc)
	}
	for _, nd := range nds {
		c.setNodeDevices(nd)
	}
	return c
}

// reserveOne reserves pod, asking n of class, on node and returns its ids.
func reserveOne(t *testing.T, c *cache, name, class string, n int, node string) []string {
	t.Helper()
	a, _ := place(t, c, gpuPod(name, class, n), node, BinPack)
	return a.Containers[0].Classes[class]
}

// TestSlicesPlacedOnDemand: a class with createMIG gets the smallest profile
// that satisfies it, at the placement that keeps the largest profile
// creatable; slices held exclude what they overlap; a released slice is
// free again; classes without createMIG and whole-GPU classes select no
// slice.
func TestSlicesPlacedOnDemand(t *testing.T) {
	c := sliceCache(nodeDevices("n1", dynamicGPU("GPU-A", 0)))
	// 1g.20gb (two slices) satisfies 20G; at 6 the 4g.40gb stays creatable
	// and the most placements remain.
	if got := reserveOne(t, c, "p1", "mig-20g", 1, "n1"); fmt.Sprint(got) != "[GPU-A/mig/1g.20gb@6]" {
		t.Fatalf("p1 got %v", got)
	}
	// 40G: 3g.40gb, the smaller of the two 4-slice profiles, at 0 (4 is
	// half taken).
	if got := reserveOne(t, c, "p2", "mig-40g", 1, "n1"); fmt.Sprint(got) != "[GPU-A/mig/3g.40gb@0]" {
		t.Fatalf("p2 got %v", got)
	}
	// Slices 4 and 5 are left: one more 1g.20gb, then nothing of 40G.
	if got := reserveOne(t, c, "p3", "mig-20g", 1, "n1"); fmt.Sprint(got) != "[GPU-A/mig/1g.20gb@4]" {
		t.Fatalf("p3 got %v", got)
	}
	if why := refusal(t, c, gpuPod("p4", "mig-20g", 1), "n1"); why.unresolvable {
		t.Errorf("a full GPU is a resolvable refusal: %+v", why)
	}
	c.release(types.UID("uid-p2"))
	if got := reserveOne(t, c, "p5", "mig-20g", 2, "n1"); fmt.Sprint(got) != "[GPU-A/mig/1g.20gb@0 GPU-A/mig/1g.20gb@2]" {
		t.Fatalf("p5 got %v", got)
	}
	// Slices are selected only by classes with createMIG, and a GPU in MIG
	// mode is never given whole.
	if why := refusal(t, c, gpuPod("q1", "mig-existing", 1), "n1"); !why.unresolvable {
		t.Errorf("a class without createMIG on a dynamic GPU: %+v", why)
	}
	refusal(t, c, gpuPod("q2", "gpu", 1), "n1")
}

// TestSlicesCountWhatTheGPUPublishes: instances on the GPU (an operator's
// or created for pods) take their slices; the fuller GPU is taken first;
// status counts slices of the class's smallest profile.
func TestSlicesCountWhatTheGPUPublishes(t *testing.T) {
	c := sliceCache(nodeDevices("n1",
		dynamicGPU("GPU-A", 0),
		dynamicGPU("GPU-B", 0, v1alpha1.MIGInstance{Profile: "4g.40gb", Start: 0}),
	))
	if got := reserveOne(t, c, "p1", "mig-40g", 1, "n1"); fmt.Sprint(got) != "[GPU-B/mig/3g.40gb@4]" {
		t.Fatalf("p1 got %v, want the fuller GPU's last 40G", got)
	}
	// At 4 rather than 0: the 4g.40gb, which only starts at 0, stays creatable.
	if got := reserveOne(t, c, "p2", "mig-40g", 1, "n1"); fmt.Sprint(got) != "[GPU-A/mig/3g.40gb@4]" {
		t.Fatalf("p2 got %v", got)
	}
	st := c.classStatus()["mig-20g"]
	// Each GPU takes four 1g.20gb empty; GPU-A has room for two more, GPU-B none.
	if st.Allocatable.Value() != 8 || st.Available.Value() != 2 {
		t.Errorf("mig-20g status: allocatable %s, available %s", &st.Allocatable, &st.Available)
	}
}

// TestSliceHoldingsAreChecked: after a restart, a pod's slice is believed
// when it fits beside what the GPU has and other pods hold; one that
// overlaps is not, and its pod holds what it asks for, which slice unknown.
func TestSliceHoldingsAreChecked(t *testing.T) {
	c := sliceCache(nodeDevices("n1", dynamicGPU("GPU-A", 0, v1alpha1.MIGInstance{Profile: "1g.20gb", Start: 6, Created: true})))
	trusted := func(name string) bool {
		c.mu.RLock()
		defer c.mu.RUnlock()
		h := c.pods[types.UID("uid-"+name)]
		return h != nil && h.trusted
	}
	// The created instance is the first pod's: believed.
	c.hold(holdingFromPod(boundPod(t, "created", "n1", "n1", "mig-20g", "GPU-A/mig/1g.20gb@6")))
	c.hold(holdingFromPod(boundPod(t, "planned", "n1", "n1", "mig-20g", "GPU-A/mig/2g.20gb@0")))
	if !trusted("created") || !trusted("planned") {
		t.Fatalf("holdings not believed: created %v, planned %v", trusted("created"), trusted("planned"))
	}
	// 3g.40gb at 4 overlaps the created 1g.20gb at 6.
	c.hold(holdingFromPod(boundPod(t, "overlapping", "n1", "n1", "mig-40g", "GPU-A/mig/3g.40gb@4")))
	if trusted("overlapping") {
		t.Fatal("an overlapping slice is believed")
	}
	// Slices 2-5 are free: 1g.20gb at 2 or 4 leave the same, the lower
	// start is taken.
	if got := reserveOne(t, c, "p1", "mig-20g", 1, "n1"); fmt.Sprint(got) != "[GPU-A/mig/1g.20gb@2]" {
		t.Fatalf("p1 got %v", got)
	}
}

// TestSlicesOrWholeGPUs: a class with createMIG that also selects whole GPUs
// is served by slices while the dynamic GPU has room, then by a whole GPU;
// an unhealthy dynamic GPU offers no slice.
func TestSlicesOrWholeGPUs(t *testing.T) {
	either := rclass("either", expr("memory", v1alpha1.ResourceSelectorOpGtEq, "40G"))
	either.Spec.CreateMIG = true
	c := sliceCache(nodeDevices("n1", dynamicGPU("GPU-A", 0), gpu("GPU-W", 0, "80Gi")), nodeDevices("n2", unhealthy(dynamicGPU("GPU-S", 0))))
	c.setClass(either)
	if got := reserveOne(t, c, "p1", "either", 2, "n1"); fmt.Sprint(got) != "[GPU-A/mig/3g.40gb@4 GPU-A/mig/3g.40gb@0]" {
		t.Fatalf("p1 got %v", got)
	}
	if got := reserveOne(t, c, "p2", "either", 1, "n1"); fmt.Sprint(got) != "[GPU-W]" {
		t.Fatalf("p2 got %v", got)
	}
	refusal(t, c, gpuPod("p3", "either", 1), "n1")
	refusal(t, c, gpuPod("p4", "either", 1), "n2")
}

// TestSlicePreemption: preemption's what-ifs see a victim's slice free: a
// pod of the 40G class fits the full GPU once the holder of the 3g.40gb in
// its way is removed, and no longer when it is added back; the cache keeps
// the slice held.
func TestSlicePreemption(t *testing.T) {
	low := boundPod(t, "low", "n1", "n1", "mig-40g", "GPU-A/mig/3g.40gb@4")
	other := boundPod(t, "other", "n1", "n1", "mig-40g", "GPU-A/mig/3g.40gb@0")
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", dynamicGPU("GPU-A", 0))}, []*v1alpha1.ResourceClass{mig20g, mig40g}, low, other)
	h.waitFor("the two holds", func() bool { return h.holds(low.UID) && h.holds(other.UID) })

	high := gpuPod("high", "mig-40g", 1)
	cs, st := h.fits(high, "n1")
	wantCode(t, st, fwk.Unschedulable)
	ni := h.nodes["n1"]
	what := cs.Clone()
	if st := h.fw.RunPreFilterExtensionRemovePod(h.ctx, what, high, podInfo(t, low), ni); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := h.filter(what, high, "n1"); !st.IsSuccess() {
		t.Errorf("low removed: %v, want high to fit on its slices", st)
	}
	if st := h.fw.RunPreFilterExtensionAddPod(h.ctx, what, high, podInfo(t, low), ni); !st.IsSuccess() {
		t.Fatal(st)
	}
	wantCode(t, h.filter(what, high, "n1"), fwk.Unschedulable)
	wantCode(t, h.filter(cs.Clone(), high, "n1"), fwk.Unschedulable)
}

// TestSlicesOfOverlappingClassesInOnePod: two classes that select slices of
// one GPU, in one pod, get slices that do not overlap.
func TestSlicesOfOverlappingClassesInOnePod(t *testing.T) {
	c := sliceCache(nodeDevices("n1", dynamicGPU("GPU-A", 0)))
	pod := testPod("two", ctr{name: "a", limits: map[corev1.ResourceName]string{cls("mig-20g"): "2"}}, ctr{name: "b", limits: map[corev1.ResourceName]string{cls("mig-40g"): "1"}})
	a, _ := place(t, c, pod, "n1", BinPack)
	got := fmt.Sprint(a.Devices("a", "mig-20g"), a.Devices("b", "mig-40g"))
	if want := "[GPU-A/mig/1g.20gb@6 GPU-A/mig/1g.20gb@4] [GPU-A/mig/3g.40gb@0]"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	// The GPU is full: 1g.20gb at 6 and 4, 3g.40gb at 0.
	refusal(t, c, gpuPod("more", "mig-20g", 1), "n1")
}
