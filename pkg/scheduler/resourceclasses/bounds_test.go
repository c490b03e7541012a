package resourceclasses

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/utils/ptr"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/internal/hostile"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// A NodeDevices object that went around the CRD's bounds (a compromised node
// agent, an apiserver without the schema) reaches the plugin through its real
// informer. The devices it cannot read are given to nobody, with a Warning
// Event and the metric; the node's other devices and every other node keep
// scheduling, and nothing runs away while the cache's lock is held.
func TestOutOfRangeDeviceIsGivenToNobody(t *testing.T) {
	hostile := gpu("GPU-hostile", 0, "80Gi")
	hostile.Attributes[v1alpha1.AttributeMemory] = v1alpha1.DeviceAttribute{QuantityValue: ptr.To(resource.MustParse("1e999999999"))}
	// A pool whose page count overflows an int64 in bytes is no pool (in bytes
	// it would wrap around to a plausible 8Gi).
	hugeCount := hugePool("hugepages-1Gi-numa0", 0, "1Gi", 1<<34+8, 1<<34+8) // 8Gi once wrapped
	// A class that went around the webhook compiles to nothing.
	hostileClass := rclass("huge", expr(v1alpha1.AttributeMemory, v1alpha1.ResourceSelectorOpGt, "1e999999999"))

	before, err := testutil.GetGaugeMetricValue(invalidDevices)
	if err != nil {
		t.Fatal(err)
	}
	var h *harness
	watchdog.Run(t, func() {
		h = newHarness(t, FirstFit, []*v1alpha1.NodeDevices{
			nodeDevices("bad", hostile, gpu("GPU-ok", 0, "80Gi"), hugeCount),
			nodeDevices("good", gpu("GPU-a", 0, "80Gi"), gpu("GPU-b", 0, "80Gi")),
		}, append(allClasses, hostileClass))
	})

	select {
	case e := <-h.recorder.Events:
		if !strings.Contains(e, "Warning InvalidDevices 1 device(s) given to no pod") ||
			!strings.Contains(e, `GPU-hostile: attribute "memory": the quantity is out of range: its exponent is beyond e18`) {
			t.Errorf("Event: %s", e)
		}
	default:
		t.Error("no Event for the invalid device")
	}
	if after, _ := testutil.GetGaugeMetricValue(invalidDevices); after != before+1 {
		t.Errorf("resclass_scheduler_invalid_devices went from %v to %v, want one more", before, after)
	}

	watchdog.Run(t, func() {
		// The big-GPU class, whose selector compares memory: the node's
		// readable GPU is given, the hostile one never.
		_, got := h.reserve(gpuPod("big", bigGPUClass.Name, 1), "bad")
		if ids := got.Containers[0].Classes[bigGPUClass.Name]; len(ids) != 1 || ids[0] != "GPU-ok" {
			t.Errorf("reserved %v on node bad, want [GPU-ok]", ids)
		}
		// The class that selects every GPU by kind: the hostile GPU is not
		// one of them, so node bad has nothing left.
		if _, st := h.fits(gpuPod("any", gpuClass.Name, 1), "bad"); st.IsSuccess() {
			t.Error("a gpu pod fits node bad, whose only other GPU is its hostile one")
		}
		if _, st := h.fits(gpuPod("two", gpuClass.Name, 2), "good"); !st.IsSuccess() {
			t.Errorf("node good: %v", st)
		}
		// The overflowing pool serves nobody.
		if _, st := h.fits(hugePod("pages", hpClass.Name, 1, map[corev1.ResourceName]string{"hugepages-1Gi": "1Gi"}), "bad"); st.IsSuccess() {
			t.Error("a hugepage pod fits the pool whose page count overflows")
		}
		// The hostile class selects nothing.
		if _, _, st := h.preFilter(gpuPod("huge", hostileClass.Name, 1)); st.IsSuccess() {
			t.Error("PreFilter admitted a pod of a class that does not compile")
		}
	})
}

// FuzzCacheIngest feeds a hostile device and a hostile class through the
// cache as its informers would (either order), then asks it what the plugin
// asks: the nodes of the class, a placement, the classes' status. Any
// attribute value and any class value must be decided within the watchdog,
// and a device whose attributes cannot be read must never be placed.
func FuzzCacheIngest(f *testing.F) {
	f.Add("nvidia-gpu", "memory", uint8(3), "", int64(1), int32(999999999), "memory", uint8(5), "40Gi", true)
	f.Add("nvidia-gpu", "memory", uint8(3), "", int64(40), int32(9), "memory", uint8(6), "1e-999999999", false)
	f.Add("nic", "speed", uint8(4), "9999999999999999999999Pbps", int64(0), int32(0), "speed", uint8(7), "1.6Tbps", true)
	f.Add("nvidia-gpu", "driverVersion", uint8(5), "580.159.04", int64(0), int32(0), "driverVersion", uint8(6), "580", true)
	f.Add("huge-pages", "pagesTotal", uint8(1), "", int64(1<<62), int32(0), "kind", uint8(0), "huge-pages", true)
	f.Add("nvidia-gpu", "numaNode", uint8(1), "", int64(-1<<63), int32(0), "numaNode", uint8(8), "1e18", false)
	ops := []v1alpha1.ResourceSelectorOperator{"In", "NotIn", "Eq", "Exists", "DoesNotExist", "Gt", "GtEq", "Lt", "LtEq"}
	f.Fuzz(func(t *testing.T, kind, attr string, typ uint8, text string, num int64, scale int32, key string, opIndex uint8, value string, classFirst bool) {
		watchdog.Run(t, func() {
			d := gpu("dev-hostile", 0, "80Gi")
			d.Kind = kind
			a := hostile.Attribute(typ, text, num, scale)
			d.Attributes[attr] = a
			if kind == v1alpha1.DeviceKindHugePages {
				d.Attributes[v1alpha1.AttributeSize] = v1alpha1.DeviceAttribute{QuantityValue: resource.NewScaledQuantity(num, resource.Scale(scale))}
			}
			op := ops[int(opIndex)%len(ops)]
			var values []string
			if op != "Exists" && op != "DoesNotExist" {
				values = []string{value}
			}
			class := rclass("fuzz", expr(key, op, values...))
			nd := nodeDevices("n1", d, gpu("GPU-ok", 0, "80Gi"))

			c := newCache()
			if classFirst {
				c.setClass(class)
			}
			invalid, _ := c.setNodeDevices(nd)
			if !classFirst {
				c.setClass(class)
			}
			c.nodesFor([]string{"fuzz"})
			c.classStatus()
			demand, err := podDemand(gpuPod("p", "fuzz", 2))
			if err != nil {
				t.Fatal(err)
			}
			c.mu.RLock()
			defer c.mu.RUnlock()
			p, _ := c.nodes["n1"].place(demand, NUMAAligned)
			if p == nil || len(invalid) == 0 {
				return
			}
			for _, ids := range p.drawn {
				if slices.Contains(ids, "dev-hostile") {
					t.Fatalf("placed a device that the cache found invalid: %v", invalid)
				}
			}
		})
	})
}
