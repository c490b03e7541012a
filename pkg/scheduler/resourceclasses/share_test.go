package resourceclasses

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/selector"
)

// ---- shared GPUs, share classes and share pods ----

// sharedGPU is a GPU in a sharing mode whose shares may take all of its
// memory and compute, as the node agent publishes it (docs/sharing.md).
func sharedGPU(id string, numa int64, memory string, mode v1alpha1.SharingMode) v1alpha1.Device {
	d := gpu(id, numa, memory)
	d.Sharing = &v1alpha1.DeviceSharing{Mode: mode, Capacity: map[string]resource.Quantity{
		v1alpha1.CapacityMemory: resource.MustParse(memory), v1alpha1.CapacityCompute: resource.MustParse("100"),
	}}
	return d
}

// changingTo is d with a mode change to mode waiting for its pods.
func changingTo(d v1alpha1.Device, mode v1alpha1.SharingMode) v1alpha1.Device {
	s := v1alpha1.DeviceSharing{Mode: v1alpha1.SharingExclusive}
	if d.Sharing != nil {
		s = *d.Sharing
	}
	s.RequestedMode = mode
	d.Sharing = &s
	return d
}

func shareClass(name, memory string, compute int32) *v1alpha1.ResourceClass {
	rc := rclass(name, expr("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindNvidiaGPU))
	rc.Spec.Share = &v1alpha1.ResourceShare{Memory: ptr.To(resource.MustParse(memory)), Compute: ptr.To(compute)}
	return rc
}

// The share classes of the tests. Both select the GPUs gpuClass selects: a
// GPU goes to gpuClass whole or to these in shares, by its mode.
var (
	gpu10g       = shareClass("gpu-10g", "10Gi", 12)
	gpu40g       = shareClass("gpu-40g", "40Gi", 50)
	shareClasses = []*v1alpha1.ResourceClass{gpuClass, gpu10g, gpu40g}
)

const gi = int64(1) << 30

// shareCache is a cache with shareClasses and nds.
func shareCache(nds ...*v1alpha1.NodeDevices) *cache {
	c := newCache()
	for _, rc := range shareClasses {
		c.setClass(rc)
	}
	for _, nd := range nds {
		c.setNodeDevices(nd)
	}
	return c
}

// place reserves pod on node with share strategy ss and returns its
// assignment and annotations; it fails the test where the pod does not fit.
func place(t *testing.T, c *cache, pod *corev1.Pod, node string, ss Strategy) (*assignment.Assignment, map[string]string) {
	t.Helper()
	d, err := podDemand(pod)
	if err != nil {
		t.Fatal(err)
	}
	r, u, err := c.reserve(pod, node, d, FirstFit, ss)
	if err != nil || u != nil {
		t.Fatalf("reserve %s on %s: %v %v", pod.Name, node, u, err)
	}
	return r.assignment, r.annotations
}

// refusal is why pod does not fit node, as Filter says it.
func refusal(t *testing.T, c *cache, pod *corev1.Pod, node string) unfit {
	t.Helper()
	d, err := podDemand(pod)
	if err != nil {
		t.Fatal(err)
	}
	why, ok := c.fits(node, nil, d)
	if ok {
		t.Fatalf("%s fits %s, want a refusal", pod.Name, node)
	}
	return why
}

// used is what shares take of device id on node.
func used(c *cache, node, id string) selector.Share {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := c.nodes[node]
	return n.devices[n.index[id]].shared.used
}

// shareOfContainer is the device and share the assignment gives container
// of class.
func shareOfContainer(t *testing.T, a *assignment.Assignment, container, class string) (string, assignment.Share) {
	t.Helper()
	for _, c := range a.Containers {
		if c.Name == container {
			if len(c.Classes[class]) != 1 {
				t.Fatalf("container %s has devices %v of share class %s, want one", container, c.Classes[class], class)
			}
			return c.Classes[class][0], c.Shares[class]
		}
	}
	t.Fatalf("no container %s in %+v", container, a)
	return "", nil
}

// bound is pod bound to node with the annotations Reserve wrote.
func bound(pod *corev1.Pod, node string, anns map[string]string) *corev1.Pod {
	p := pod.DeepCopy()
	p.Spec.NodeName, p.Status.Phase, p.Annotations = node, corev1.PodRunning, maps.Clone(anns)
	return p
}

// forged is a share pod of units of class bound to node whose annotation
// gives its container "app" the device ids with share (nil: none).
func forged(t *testing.T, name, node, class string, units int, share assignment.Share, ids ...string) *corev1.Pod {
	t.Helper()
	p := gpuPod(name, class, units)
	c := assignment.Container{Name: "app", Classes: map[string][]string{class: ids}}
	if share != nil {
		c.Shares = map[string]assignment.Share{class: share}
	}
	raw, err := assignment.Encode(&assignment.Assignment{Node: node, Containers: []assignment.Container{c}})
	if err != nil {
		t.Fatal(err)
	}
	return bound(p, node, map[string]string{assignment.AnnotationKey: raw})
}

// ---- placement ----

// TestSharesOfMixedSizes: shares of two sizes on two GPUs, bin-packed: each
// container's N units are one share on one GPU, the fullest that takes it,
// with N times the unit written beside its one device; what no GPU has free
// is refused with its size.
func TestSharesOfMixedSizes(t *testing.T) {
	c := shareCache(nodeDevices("n1", sharedGPU("g0", 0, "80Gi", v1alpha1.SharingMPS), sharedGPU("g1", 0, "80Gi", v1alpha1.SharingMPS)))
	steps := []struct {
		pod   string
		class *v1alpha1.ResourceClass
		units int
		want  string // the GPU
	}{
		{"a", gpu10g, 2, "g0"}, // both empty: the first
		{"b", gpu40g, 1, "g0"}, // g0 (60Gi free) is fuller than g1
		{"c", gpu40g, 1, "g1"}, // g0 has 20Gi left
		{"d", gpu10g, 2, "g0"}, // fills g0: 80Gi, 98%
		{"e", gpu40g, 1, "g1"}, // fills g1: 80Gi, 100%
	}
	for _, s := range steps {
		a, anns := place(t, c, gpuPod(s.pod, s.class.Name, s.units), "n1", BinPack)
		id, share := shareOfContainer(t, a, "app", s.class.Name)
		if id != s.want {
			t.Errorf("%s: on %s, want %s", s.pod, id, s.want)
		}
		unit := s.class.Spec.Share
		want := assignment.Share{v1alpha1.CapacityMemory: int64(s.units) * unit.Memory.Value(), v1alpha1.CapacityCompute: int64(s.units) * int64(*unit.Compute)}
		if !maps.Equal(share, want) {
			t.Errorf("%s: share %v, want %v", s.pod, share, want)
		}
		if got := anns[assignment.CompatKey(s.class.Name, id)]; got != fmt.Sprint(s.units) {
			t.Errorf("%s: compatibility quantity %q, want the units %d", s.pod, got, s.units)
		}
	}
	if got, want := used(c, "n1", "g0"), (selector.Share{Memory: 80 * gi, Compute: 98}); got != want {
		t.Errorf("g0 used %+v, want %+v", got, want)
	}
	if got, want := used(c, "n1", "g1"), (selector.Share{Memory: 80 * gi, Compute: 100}); got != want {
		t.Errorf("g1 used %+v, want %+v", got, want)
	}
	why := refusal(t, c, gpuPod("f", gpu10g.Name, 1), "n1")
	if why.unresolvable || !strings.Contains(why.reason, "Insufficient free share capacity of class gpu-10g") || !strings.Contains(why.reason, "(10Gi memory, 12 percent compute)") {
		t.Errorf("a full node: %+v, want a resolvable refusal that names the share", why)
	}

	// Releasing b leaves 40Gi on g0: a 40Gi share fits there again.
	c.release("uid-b")
	a, _ := place(t, c, gpuPod("g", gpu40g.Name, 1), "n1", BinPack)
	if id, _ := shareOfContainer(t, a, "app", gpu40g.Name); id != "g0" {
		t.Errorf("after b left: on %s, want g0", id)
	}
}

// TestTwoContainersTwoShares: each container of a pod gets its own share,
// and the pod's earlier shares count against the room of the GPU its later
// ones take.
func TestTwoContainersTwoShares(t *testing.T) {
	c := shareCache(nodeDevices("n1", sharedGPU("g0", 0, "80Gi", v1alpha1.SharingMPS), sharedGPU("g1", 0, "80Gi", v1alpha1.SharingMPS)))
	pod := testPod("two",
		ctr{name: "side", kind: sidecar, limits: map[corev1.ResourceName]string{cls(gpu40g.Name): "1"}},
		ctr{name: "a", limits: map[corev1.ResourceName]string{cls(gpu40g.Name): "1"}},
		ctr{name: "b", limits: map[corev1.ResourceName]string{cls(gpu40g.Name): "1"}})
	a, _ := place(t, c, pod, "n1", BinPack)
	var on []string
	for _, name := range []string{"side", "a", "b"} {
		id, share := shareOfContainer(t, a, name, gpu40g.Name)
		on = append(on, id)
		if share[v1alpha1.CapacityMemory] != 40*gi {
			t.Errorf("%s: share %v, want 40Gi", name, share)
		}
	}
	// Two 40Gi shares fill a GPU: the third cannot be where the first two are.
	if on[0] != on[1] || on[2] == on[0] {
		t.Errorf("containers on %v, want the first two on one GPU and the third on the other", on)
	}
}

// TestShareStrategy: BinPack puts a share on the GPU with the least room
// that takes it, Spread on the one with the most; the plugin's arg chooses.
func TestShareStrategy(t *testing.T) {
	for _, tc := range []struct {
		ss   Strategy
		want []string
	}{
		{BinPack, []string{"g0", "g0", "g0"}},
		{Spread, []string{"g0", "g1", "g2"}},
	} {
		t.Run(string(tc.ss), func(t *testing.T) {
			h := newHarnessWithArgs(t, fmt.Sprintf(`{"shareStrategy":%q,"statusUpdateInterval":"0s"}`, tc.ss),
				[]*v1alpha1.NodeDevices{nodeDevices("n1", sharedGPU("g0", 0, "80Gi", v1alpha1.SharingMPS), sharedGPU("g1", 0, "80Gi", v1alpha1.SharingMPS), sharedGPU("g2", 0, "80Gi", v1alpha1.SharingTimeSlicing))},
				shareClasses)
			var got []string
			for i := range tc.want {
				_, a := h.reserve(gpuPod(fmt.Sprintf("p%d", i), gpu10g.Name, 1), "n1")
				id, _ := shareOfContainer(t, a, "app", gpu10g.Name)
				got = append(got, id)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("shares on %v, want %v", got, tc.want)
			}
		})
	}
}

// TestWholeAndShareClassesNeverMix: gpu and gpu-10g select the same GPUs;
// the exclusive GPU goes only to gpu, whole, and the shared one only to
// gpu-10g, in shares, whichever is free.
func TestWholeAndShareClassesNeverMix(t *testing.T) {
	c := shareCache(nodeDevices("n1", gpu("whole", 0, "80Gi"), sharedGPU("shared", 0, "80Gi", v1alpha1.SharingMPS)))
	a, _ := place(t, c, gpuPod("w1", gpuClass.Name, 1), "n1", BinPack)
	if ids := a.Devices("app", gpuClass.Name); !slices.Equal(ids, []string{"whole"}) || len(a.Containers[0].Shares) != 0 {
		t.Errorf("whole pod got %v with shares %v, want the exclusive GPU whole", ids, a.Containers[0].Shares)
	}
	// The shared GPU is empty, and still no whole GPU is left.
	if why := refusal(t, c, gpuPod("w2", gpuClass.Name, 1), "n1"); !strings.Contains(why.reason, "Insufficient free devices of class gpu") {
		t.Errorf("second whole pod: %+v", why)
	}
	c.release("uid-w1")
	// Now the exclusive GPU is free, and a share still goes to the shared one.
	for i := range 3 {
		a, _ := place(t, c, gpuPod(fmt.Sprintf("s%d", i), gpu10g.Name, 2), "n1", BinPack)
		if id, _ := shareOfContainer(t, a, "app", gpu10g.Name); id != "shared" {
			t.Errorf("share %d on %s, want the shared GPU", i, id)
		}
	}
	status := c.classStatus()
	if s := status[gpuClass.Name]; s.Allocatable.Value() != 1 || s.Available.Value() != 1 {
		t.Errorf("gpu: allocatable %s available %s, want 1 and 1: the shared GPU is not the whole class's", s.Allocatable.String(), s.Available.String())
	}
	// 80Gi / 10Gi and 100% / 12%: 8 units; 6 taken (60Gi, 72%), 2 left.
	if s := status[gpu10g.Name]; s.Allocatable.Value() != 8 || s.Requested.Value() != 6 || s.Available.Value() != 2 {
		t.Errorf("gpu-10g: allocatable %s requested %s available %s, want 8, 6 and 2 units", s.Allocatable.String(), s.Requested.String(), s.Available.String())
	}
}

// TestShareRefusals: a request larger than any GPU of the class on the node,
// and a share class in an init container, are refused as unresolvable with
// what to change; one that fits a GPU's capacity but not what is free waits.
func TestShareRefusals(t *testing.T) {
	c := shareCache(nodeDevices("n1", sharedGPU("g0", 0, "80Gi", v1alpha1.SharingMPS), sharedGPU("g1", 0, "40Gi", v1alpha1.SharingMPS)))
	big := testPod("big", ctr{name: "main", limits: map[corev1.ResourceName]string{cls("gpu-10g"): "9"}})
	why := refusal(t, c, big, "n1")
	if want := `container "main" asks 9 units of class gpu-10g (90Gi memory, 108 percent compute): more than one GPU of the class has`; !why.unresolvable || why.reason != want {
		t.Errorf("9 units: %+v, want unresolvable %q", why, want)
	}
	initPod := testPod("init",
		ctr{name: "setup", kind: initC, limits: map[corev1.ResourceName]string{cls("gpu-10g"): "1"}},
		ctr{name: "main", limits: map[corev1.ResourceName]string{cls("gpu-10g"): "1"}})
	if why := refusal(t, c, initPod, "n1"); !why.unresolvable || !strings.Contains(why.reason, `init container "setup" requests class gpu-10g, which takes shares`) {
		t.Errorf("init container: %+v", why)
	}
	// A sidecar keeps its share: it is the sidecar's own.
	side := testPod("side",
		ctr{name: "proxy", kind: sidecar, limits: map[corev1.ResourceName]string{cls("gpu-10g"): "1"}},
		ctr{name: "main", limits: map[corev1.ResourceName]string{cls("gpu-10g"): "1"}})
	place(t, c, side, "n1", BinPack)                           // both on g1, the fullest that takes them: 20Gi left
	place(t, c, gpuPod("half", gpu40g.Name, 1), "n1", BinPack) // g0: 40Gi left
	place(t, c, gpuPod("most", "gpu-10g", 4), "n1", BinPack)   // g0: full
	why = refusal(t, c, gpuPod("three", "gpu-10g", 3), "n1")
	if why.unresolvable || !strings.Contains(why.reason, "Insufficient free share capacity of class gpu-10g") {
		t.Errorf("3 units with 20Gi free: %+v, want a resolvable refusal", why)
	}
}

// TestDrainingGPUTakesNoNewPod: a GPU whose mode change waits for its pods
// keeps them charged, and takes no new pod of either kind.
func TestDrainingGPUTakesNoNewPod(t *testing.T) {
	nd := nodeDevices("n1", sharedGPU("g0", 0, "80Gi", v1alpha1.SharingMPS), gpu("w0", 0, "80Gi"))
	c := shareCache(nd)
	_, anns := place(t, c, gpuPod("held", gpu10g.Name, 2), "n1", BinPack)
	held := bound(gpuPod("held", gpu10g.Name, 2), "n1", anns)
	c.hold(holdingFromPod(held))

	nd = nodeDevices("n1", changingTo(sharedGPU("g0", 0, "80Gi", v1alpha1.SharingMPS), v1alpha1.SharingExclusive), changingTo(gpu("w0", 0, "80Gi"), v1alpha1.SharingMPS))
	nd.ResourceVersion = "2"
	c.setNodeDevices(nd)
	if got := used(c, "n1", "g0"); got != (selector.Share{Memory: 20 * gi, Compute: 24}) {
		t.Errorf("the draining GPU's holder: used %+v, want 20Gi and 24%%", got)
	}
	if why := refusal(t, c, gpuPod("new", gpu10g.Name, 1), "n1"); why.unresolvable {
		t.Errorf("a share on a draining GPU: %+v, want a resolvable refusal", why)
	}
	if why := refusal(t, c, gpuPod("whole", gpuClass.Name, 1), "n1"); why.unresolvable {
		t.Errorf("a whole GPU whose mode is to change: %+v, want a resolvable refusal", why)
	}
	if s := c.classStatus()[gpu10g.Name]; s.Allocatable.Value() != 0 {
		t.Errorf("gpu-10g allocatable %s, want 0 while its only GPU drains", s.Allocatable.String())
	}
	nodes, _ := (&Snapshot{c: c}).Devices(gpu10g.Name)
	if d := nodes[0].Devices[0]; !strings.Contains(d.Unusable, "sharing mode is to change") || d.Free {
		t.Errorf("snapshot of the draining GPU: %+v", d)
	}

	// The change given up: the GPU takes shares again, and its waiting
	// pods are told.
	var grown []string
	c.grew = func(_ string, classes []string) { grown = append(grown, classes...) }
	nd = nodeDevices("n1", sharedGPU("g0", 0, "80Gi", v1alpha1.SharingMPS), gpu("w0", 0, "80Gi"))
	nd.ResourceVersion = "3"
	c.setNodeDevices(nd)
	if !slices.Contains(grown, gpu10g.Name) || !slices.Contains(grown, gpuClass.Name) {
		t.Errorf("mode changes given up: grown %v, want gpu-10g and gpu", grown)
	}
	place(t, c, gpuPod("new", gpu10g.Name, 1), "n1", BinPack)
}

// TestSharingOnAKindThatServesNoShares: a device that publishes a sharing
// mode its kind does not serve (a NIC, a GPU in MIG mode) is given to
// nobody, with the reason.
func TestSharingOnAKindThatServesNoShares(t *testing.T) {
	n := nic("nic0", 0)
	n.Sharing = &v1alpha1.DeviceSharing{Mode: v1alpha1.SharingMPS, Capacity: map[string]resource.Quantity{v1alpha1.CapacityCompute: resource.MustParse("100")}}
	mig := migEnabled(sharedGPU("mig", 0, "80Gi", v1alpha1.SharingMPS))
	c := newCache()
	c.setClass(nicClass)
	c.setClass(gpu10g)
	invalid, _ := c.setNodeDevices(nodeDevices("n1", n, mig, sharedGPU("ok", 0, "80Gi", v1alpha1.SharingMPS)))
	var ids []string
	for _, d := range invalid {
		ids = append(ids, d.id)
		if !strings.Contains(d.reason, "serves no shares") {
			t.Errorf("%s: reason %q", d.id, d.reason)
		}
	}
	if !slices.Equal(ids, []string{"nic0", "mig"}) {
		t.Errorf("invalid devices %v, want nic0 and mig", ids)
	}
	if s := c.classStatus()[gpu10g.Name]; s.Allocatable.Value() != 8 {
		t.Errorf("gpu-10g allocatable %s, want the 8 units of the one valid GPU", s.Allocatable.String())
	}
}

// ---- accounting ----

// TestSharesRebuiltFromBoundPods: a new cache fed the bound pods, as after a
// restart, charges every GPU exactly what the scheduler that placed them
// did, and believes every annotation.
func TestSharesRebuiltFromBoundPods(t *testing.T) {
	nd := nodeDevices("n1", sharedGPU("g0", 0, "80Gi", v1alpha1.SharingMPS), sharedGPU("g1", 1, "80Gi", v1alpha1.SharingMPS), sharedGPU("g2", 1, "40Gi", v1alpha1.SharingTimeSlicing))
	c := shareCache(nd)
	var pods []*corev1.Pod
	for i, req := range []struct {
		class string
		units int
	}{{"gpu-10g", 3}, {"gpu-40g", 1}, {"gpu-10g", 1}, {"gpu-40g", 1}, {"gpu-10g", 4}, {"gpu-40g", 1}} { // 200Gi: every GPU full
		pod := gpuPod(fmt.Sprintf("p%d", i), req.class, req.units)
		_, anns := place(t, c, pod, "n1", Spread)
		pods = append(pods, bound(pod, "n1", anns))
	}
	again := newCache()
	var reported []string
	again.untrusted = func(h *holding, why *inconsistency) { reported = append(reported, string(h.uid)+": "+why.detail) }
	for _, pod := range pods { // the pods before the classes and devices, as informers may deliver them
		again.hold(holdingFromPod(pod))
	}
	for _, rc := range shareClasses {
		again.setClass(rc)
	}
	again.setNodeDevices(nd)
	again.recheck()
	for _, id := range []string{"g0", "g1", "g2"} {
		if got, want := used(again, "n1", id), used(c, "n1", id); got != want || got == (selector.Share{}) {
			t.Errorf("%s: rebuilt %+v, placed %+v", id, got, want)
		}
	}
	if len(reported) > 0 {
		t.Errorf("annotations the scheduler wrote not believed: %v", reported)
	}
	if !maps.Equal(statusValues(again), statusValues(c)) {
		t.Errorf("status rebuilt %v, placed %v", statusValues(again), statusValues(c))
	}
}

// statusValues is every class's allocatable/requested.
func statusValues(c *cache) map[string]string {
	out := map[string]string{}
	for class, s := range c.classStatus() {
		out[class] = s.Allocatable.String() + "/" + s.Requested.String()
	}
	return out
}

// TestForgedSharesAreNotBelieved: a learned share is believed only when it is
// N units of its class, on one GPU that serves shares and the class selects;
// one that is not is reported, and its GPU is charged the larger of what it
// claims and what the container requests: never less.
func TestForgedSharesAreNotBelieved(t *testing.T) {
	nd := nodeDevices("n1", sharedGPU("g0", 0, "80Gi", v1alpha1.SharingMPS), gpu("w0", 0, "80Gi"))
	mem := func(bytes, compute int64) assignment.Share {
		return assignment.Share{v1alpha1.CapacityMemory: bytes, v1alpha1.CapacityCompute: compute}
	}
	for _, tc := range []struct {
		name     string
		pod      *corev1.Pod
		believed bool
		why      string
		charged  selector.Share // on g0
	}{
		{"as the scheduler writes it", forged(t, "ok", "n1", "gpu-10g", 2, mem(20*gi, 24), "g0"), true, "", selector.Share{Memory: 20 * gi, Compute: 24}},
		{"smaller than requested", forged(t, "small", "n1", "gpu-10g", 2, mem(1*gi, 1), "g0"), false, "not the 2 units it requests", selector.Share{Memory: 20 * gi, Compute: 24}},
		{"larger than requested", forged(t, "large", "n1", "gpu-10g", 2, mem(70*gi, 24), "g0"), false, "not the 2 units it requests", selector.Share{Memory: 70 * gi, Compute: 24}},
		{"no share", forged(t, "none", "n1", "gpu-10g", 1, nil, "g0"), false, "holds no share", selector.Share{Memory: 10 * gi, Compute: 12}},
		{"a share of a whole class", forged(t, "whole", "n1", "gpu", 1, mem(10*gi, 12), "w0"), false, "takes whole devices", selector.Share{}},
		{"a share on a whole GPU", forged(t, "onwhole", "n1", "gpu-10g", 1, mem(10*gi, 12), "w0"), false, "does not select device w0", selector.Share{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := shareCache(nd)
			var why []string
			c.untrusted = func(_ *holding, w *inconsistency) { why = append(why, w.detail) }
			c.hold(holdingFromPod(tc.pod))
			if got := used(c, "n1", "g0"); got != tc.charged {
				t.Errorf("g0 charged %+v, want %+v", got, tc.charged)
			}
			if tc.believed != (len(why) == 0) {
				t.Fatalf("believed %v, want %v (%v)", len(why) == 0, tc.believed, why)
			}
			if !tc.believed && !strings.Contains(why[0], tc.why) {
				t.Errorf("reported %q, want %q", why[0], tc.why)
			}
			// Released, it leaves nothing behind.
			c.release(tc.pod.UID)
			if got := used(c, "n1", "g0"); got != (selector.Share{}) {
				t.Errorf("after release g0 used %+v", got)
			}
		})
	}
}

// ---- preemption ----

// TestSharePreemption: on a GPU full of low-priority shares, a
// higher-priority share fits once preemption's view removes enough of them,
// and not before; the view's arithmetic leaves the cache as it is.
func TestSharePreemption(t *testing.T) {
	nd := nodeDevices("n1", sharedGPU("g0", 0, "80Gi", v1alpha1.SharingMPS))
	low := []*corev1.Pod{
		forged(t, "low-a", "n1", "gpu-40g", 1, assignment.Share{"memory": 40 * gi, "compute": 50}, "g0"),
		forged(t, "low-b", "n1", "gpu-10g", 2, assignment.Share{"memory": 20 * gi, "compute": 24}, "g0"),
		forged(t, "low-c", "n1", "gpu-10g", 2, assignment.Share{"memory": 20 * gi, "compute": 24}, "g0"),
	}
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nd}, shareClasses, low...)
	h.waitFor("the three shares", func() bool { return h.holds(low[0].UID) && h.holds(low[1].UID) && h.holds(low[2].UID) })
	c := h.plugin.cache

	high := gpuPod("high", gpu40g.Name, 1)
	cs, st := h.fits(high, "n1")
	wantCode(t, st, fwk.Unschedulable, "Insufficient free share capacity of class gpu-40g")
	ni := h.nodes["n1"]
	remove := func(cs fwk.CycleState, pod *corev1.Pod) {
		t.Helper()
		if st := h.fw.RunPreFilterExtensionRemovePod(h.ctx, cs, high, podInfo(t, pod), ni); !st.IsSuccess() {
			t.Fatalf("RemovePod %s: %v", pod.Name, st)
		}
	}
	what := cs.Clone()
	remove(what, low[1]) // 20Gi free: not enough
	wantCode(t, h.filter(what, high, "n1"), fwk.Unschedulable)
	remove(what, low[2]) // 40Gi free
	if st := h.filter(what, high, "n1"); !st.IsSuccess() {
		t.Errorf("low-b and low-c removed: %v, want high to fit in their 40Gi", st)
	}
	if st := h.fw.RunPreFilterExtensionAddPod(h.ctx, what, high, podInfo(t, low[2]), ni); !st.IsSuccess() {
		t.Fatal(st)
	}
	wantCode(t, h.filter(what, high, "n1"), fwk.Unschedulable)
	// Only a's 40Gi frees as much alone.
	alone := cs.Clone()
	remove(alone, low[0])
	if st := h.filter(alone, high, "n1"); !st.IsSuccess() {
		t.Errorf("low-a removed: %v", st)
	}
	if got := used(c, "n1", "g0"); got != (selector.Share{Memory: 80 * gi, Compute: 98}) {
		t.Errorf("the cache's g0 after the what-ifs: %+v, want 80Gi and 98%%", got)
	}
}

// ---- status, activation ----

// TestShareStatusInUnits: a share class's status counts units that fit each
// GPU's capacity and what it has free; GPUs of other sizes and a forged
// smaller share count as much as they take.
func TestShareStatusInUnits(t *testing.T) {
	c := shareCache(
		nodeDevices("n1", sharedGPU("g0", 0, "80Gi", v1alpha1.SharingMPS), sharedGPU("g1", 0, "40Gi", v1alpha1.SharingMPS)),
		nodeDevices("n2", sharedGPU("h0", 0, "80Gi", v1alpha1.SharingTimeSlicing), unhealthy(sharedGPU("h1", 0, "80Gi", v1alpha1.SharingMPS))))
	place(t, c, gpuPod("a", gpu10g.Name, 3), "n1", BinPack) // g1: 30Gi, 36%
	c.hold(holdingFromPod(forged(t, "f", "n2", gpu10g.Name, 2, assignment.Share{"memory": gi}, "h0")))
	// gpu-10g: g0 8, g1 min(4, 8) = 4, h0 8 (h1 is sick): 20 units; free g0
	// 8, g1 1 (10Gi, 64%), h0 6 (charged 20Gi, 24%).
	// gpu-40g: g0 2, g1 min(1, 2) = 1, h0 2: 5; free g0 2, g1 0, h0 1.
	for class, want := range map[string][2]int64{gpu10g.Name: {20, 15}, gpu40g.Name: {5, 3}} {
		s := c.classStatus()[class]
		if s.Allocatable.Value() != want[0] || s.Available.Value() != want[1] || s.Requested.Value() != want[0]-want[1] {
			t.Errorf("%s: allocatable %s available %s requested %s, want %d, %d, %d", class, s.Allocatable.String(), s.Available.String(), s.Requested.String(), want[0], want[1], want[0]-want[1])
		}
	}
	nodes := c.classNodeStatus()[gpu10g.Name]
	if want := []NodeStatus{{Name: "n1", Allocatable: 12, Requested: 3}, {Name: "n2", Allocatable: 8, Requested: 2}}; !slices.Equal(nodes, want) {
		t.Errorf("per node %+v, want %+v", nodes, want)
	}
}

// TestShareRoomGrownActivates: a node whose shared GPU has more room than
// before (a share gone from its published state, capacity grown) names the
// share classes it gives room to; one that republishes the same names none.
func TestShareRoomGrownActivates(t *testing.T) {
	c := shareCache()
	var grown [][]string
	c.grew = func(_ string, classes []string) { grown = append(grown, classes) }
	publish := func(rv, memory string) {
		d := sharedGPU("g0", 0, "80Gi", v1alpha1.SharingMPS)
		d.Sharing.Capacity[v1alpha1.CapacityMemory] = resource.MustParse(memory)
		nd := nodeDevices("n1", d)
		nd.ResourceVersion = rv
		c.setNodeDevices(nd)
	}
	publish("1", "40Gi")
	place(t, c, gpuPod("a", gpu10g.Name, 4), "n1", BinPack) // 40Gi: full
	grown = nil
	publish("2", "40Gi")
	if len(grown) != 0 {
		t.Errorf("the same devices again: grown %v", grown)
	}
	publish("3", "80Gi")
	if len(grown) != 1 || !slices.Equal(grown[0], []string{gpu10g.Name, gpu40g.Name}) {
		t.Errorf("capacity grown: grown %v, want both share classes", grown)
	}
	var freed []string
	c.freed = func(why string) { freed = append(freed, why) }
	c.release(types.UID("uid-a"))
	if !slices.Equal(freed, []string{activatedReleased}) {
		t.Errorf("a share released: activations %v", freed)
	}

	// A share not believed fills the GPU; the capacity that grows past it
	// is room, though charging the new devices takes it off the old ones.
	c.hold(holdingFromPod(forged(t, "f", "n1", gpu10g.Name, 1, assignment.Share{"memory": 80 * gi}, "g0")))
	grown = nil
	publish("4", "80Gi")
	publish("5", "90Gi")
	if len(grown) != 1 || !slices.Equal(grown[0], []string{gpu10g.Name}) {
		t.Errorf("capacity grown past a share not believed: grown %v, want gpu-10g (10Gi free)", grown)
	}
}

// TestOneShareAgreesWithPlacement: Filter's answer for the common share pod
// (oneShare, which builds no placement) is the placement's, fit and reason,
// on GPUs of several sizes in every state.
func TestOneShareAgreesWithPlacement(t *testing.T) {
	rng := rand.New(rand.NewPCG(37, 2026))
	for round := range 200 {
		var devs []v1alpha1.Device
		for g := range 4 {
			d := sharedGPU(fmt.Sprintf("g%d", g), 0, []string{"40Gi", "80Gi"}[rng.IntN(2)], v1alpha1.SharingMPS)
			switch rng.IntN(6) {
			case 0:
				d = unhealthy(d)
			case 1:
				d = changingTo(d, v1alpha1.SharingExclusive)
			}
			devs = append(devs, d)
		}
		c := shareCache(nodeDevices("n1", devs...))
		for p := range rng.IntN(8) {
			pod := gpuPod(fmt.Sprintf("p%d", p), shareClasses[1+rng.IntN(2)].Name, 1+rng.IntN(3))
			if d, _ := podDemand(pod); d != nil {
				_, _, _ = c.reserve(pod, "n1", d, FirstFit, BinPack) // full GPUs refuse some: as they may
			}
		}
		for _, class := range []string{gpu10g.Name, gpu40g.Name} {
			for units := 1; units <= 9; units++ {
				d, _ := podDemand(gpuPod("new", class, units))
				u, handled := c.nodes["n1"].oneShare(d)
				_, want := c.nodes["n1"].place(d, FirstFit)
				if !handled || (u == nil) != (want == nil) || (u != nil && (u.reason != want.reason || u.unresolvable != want.unresolvable)) {
					t.Fatalf("round %d, %d units of %s: oneShare %+v (handled %v), placement %+v", round, units, class, u, handled, want)
				}
			}
		}
	}
}
