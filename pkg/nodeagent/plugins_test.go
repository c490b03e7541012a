package nodeagent

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/internal/hostile"
	"github.com/resclass/resclass/pkg/internal/watchdog"
	"github.com/resclass/resclass/pkg/selector"
)

func class(name, rv string, exprs ...v1alpha1.ResourceSelectorRequirement) *v1alpha1.ResourceClass {
	return &v1alpha1.ResourceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv},
		Spec:       v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: exprs}}},
	}
}

func kindIs(kind string) v1alpha1.ResourceSelectorRequirement {
	return v1alpha1.ResourceSelectorRequirement{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{kind}}
}

func TestClassMatcherEndpoints(t *testing.T) {
	q := resource.MustParse("1Gi")
	devices := []v1alpha1.Device{
		{ID: "GPU-a", Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{v1alpha1.AttributeNUMANode: v1alpha1.IntAttribute(1)}},
		{ID: "GPU-b", Kind: v1alpha1.DeviceKindNvidiaGPU, Reason: "XID 79"},
		{ID: "hugepages-1Gi-numa0", Kind: v1alpha1.DeviceKindHugePages, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{
			v1alpha1.AttributeSize: {QuantityValue: &q}, v1alpha1.AttributeNUMANode: v1alpha1.IntAttribute(0),
		}},
	}
	m := newClassMatcher(kinds.Builtin, 3)
	classes := []*v1alpha1.ResourceClass{
		class("any-gpu", "1", kindIs(v1alpha1.DeviceKindNvidiaGPU)),
		class("also-gpu", "1", kindIs(v1alpha1.DeviceKindNvidiaGPU)),
		class("pages", "1", kindIs(v1alpha1.DeviceKindHugePages)),
		class("nics", "1", kindIs(v1alpha1.DeviceKindNIC)), // selects nothing here
		class("broken", "1", v1alpha1.ResourceSelectorRequirement{Key: "memory", Operator: v1alpha1.ResourceSelectorOpGtEq, Values: []string{"lots"}}),
	}
	eps := m.endpoints(classes, devices, nil)
	if len(eps) != 3 {
		t.Fatalf("endpoints %v, want any-gpu, also-gpu and pages", eps)
	}
	gpus := eps[v1alpha1.ResourceNamePrefix+"any-gpu"]
	if len(gpus) != 2 || !gpus[0].Healthy || gpus[0].NUMANode != 1 || gpus[1].Healthy || gpus[1].NUMANode != -1 {
		t.Errorf("any-gpu devices %+v: the unhealthy GPU is advertised as such, NUMA -1 when unknown", gpus)
	}
	pool := eps[v1alpha1.ResourceNamePrefix+"pages"]
	if len(pool) != 3 || pool[2].ID != "hugepages-1Gi-numa0/2" || pool[0].NUMANode != 0 {
		t.Errorf("pool slots %+v", pool)
	}
	if got := m.classesOf()["GPU-a"]; len(got) != 2 || got[0] != "also-gpu" || got[1] != "any-gpu" {
		t.Errorf("classes serving GPU-a: %v", got)
	}

	// A class compiles once per resourceVersion; a deleted one is dropped.
	before := m.compiled["any-gpu"].class
	m.endpoints(classes[:1], devices, nil)
	if m.compiled["any-gpu"].class != before {
		t.Error("an unchanged class was compiled again")
	}
	if _, ok := m.compiled["pages"]; ok {
		t.Error("a deleted class stays compiled")
	}
	changed := class("any-gpu", "2", kindIs(v1alpha1.DeviceKindHugePages))
	if eps := m.endpoints([]*v1alpha1.ResourceClass{changed}, devices, nil); len(eps[v1alpha1.ResourceNamePrefix+"any-gpu"]) != 3 {
		t.Errorf("a changed class is not recompiled: %v", eps)
	}
}

func TestHealthReachesIntrospection(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	a := newAgent(Config{NodeName: "n"}, nil, nil, nil)
	recorder := record.NewFakeRecorder(10)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	s := newIntrospectionSource()
	healthy := []v1alpha1.Device{{ID: "GPU-a", Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true}, {ID: "GPU-b", Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true}}
	prev := a.reportHealth(ctx, recorder, node, s.HealthHub, nil, healthy)
	s.update(healthy, nil)
	current, changes, cancel := s.SubscribeHealth()
	defer cancel()
	if len(current) != 2 || !current[0].GetHealthy() {
		t.Fatalf("current %v", current)
	}
	prev = a.reportHealth(ctx, recorder, node, s.HealthHub, prev, healthy)
	failed := []v1alpha1.Device{{ID: "GPU-a", Kind: v1alpha1.DeviceKindNvidiaGPU, Reason: "XID 79"}}
	a.reportHealth(ctx, recorder, node, s.HealthHub, prev, failed)
	s.update(failed, nil)
	if ev := <-changes; ev.GetHealthy() || ev.GetReason() != "XID 79" {
		t.Errorf("change %v", ev)
	}
	select {
	case ev := <-changes:
		t.Errorf("an unchanged pass published %v", ev)
	default:
	}
	current, _, cancelAgain := s.SubscribeHealth()
	cancelAgain()
	if len(current) != 1 {
		t.Errorf("GPU-b is gone but still watched: %v", current)
	}
	if ev := <-recorder.Events; ev != "Warning DeviceUnhealthy nvidia-gpu GPU-a is unhealthy: XID 79" {
		t.Errorf("event %q", ev)
	}
	if d := s.Devices(); len(d) != 1 || d[0].GetNumaNode() != -1 || d[0].GetHealthy() {
		t.Errorf("devices %v", d)
	}
}

// FuzzClassMatcher feeds hostile classes (values that went around the
// webhook) and hostile device attributes (what a broken NVML or sysfs may
// answer) through the agent's class matching: it must decide within the
// watchdog and advertise, for each class, exactly the devices the class
// selects.
func FuzzClassMatcher(f *testing.F) {
	f.Add("memory", uint8(5), "1e999999999", uint8(3), "", int64(40), int32(9))
	f.Add("memory", uint8(6), "40Gi", uint8(3), "", int64(1), int32(999999999))
	f.Add("custom", uint8(8), "1e-999999999", uint8(1), "", int64(-1), int32(0))
	f.Add("speed", uint8(5), "1.6Tbps", uint8(4), "99999999999999999999999999Pbps", int64(0), int32(0))
	f.Add("driverVersion", uint8(6), "580.159.04", uint8(5), "1.2.3.4.5.6.7.8.9", int64(0), int32(0))
	ops := []v1alpha1.ResourceSelectorOperator{"In", "NotIn", "Eq", "Exists", "DoesNotExist", "Gt", "GtEq", "Lt", "LtEq"}
	f.Fuzz(func(t *testing.T, key string, opIndex uint8, value string, typ uint8, text string, num int64, scale int32) {
		watchdog.Run(t, func() {
			a := hostile.Attribute(typ, text, num, scale)
			devices := []v1alpha1.Device{
				{ID: "GPU-hostile", Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{key: a, "memory": a}},
				{ID: "GPU-ok", Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{"memory": {QuantityValue: ptr.To(resource.MustParse("80Gi"))}}},
			}
			op := ops[int(opIndex)%len(ops)]
			var values []string
			if op != "Exists" && op != "DoesNotExist" {
				values = []string{value}
			}
			rc := class("fuzz", "1", v1alpha1.ResourceSelectorRequirement{Key: key, Operator: op, Values: values})
			eps := newClassMatcher(kinds.Builtin, 2).endpoints([]*v1alpha1.ResourceClass{rc}, devices, nil)
			c, errs := selector.Compile(&rc.Spec, field.NewPath("spec"))
			var want []string
			for i := range devices {
				if len(errs) == 0 && c.Matches(selector.NewDevice(&devices[i])) {
					want = append(want, devices[i].ID)
				}
			}
			var got []string
			for _, d := range eps[v1alpha1.ResourceNamePrefix+"fuzz"] {
				got = append(got, d.ID)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("advertised %v, the class selects %v", got, want)
			}
		})
	})
}

// The reproduction at the node agent's door: a class that went around
// the webhook with an out-of-range value serves nothing, and a device whose
// memory is out of range is served by no class that compares memory; neither
// runs away.
func TestOutOfRangeValuesAtTheAgent(t *testing.T) {
	huge := resource.MustParse("1e999999999")
	devices := []v1alpha1.Device{
		{ID: "GPU-hostile", Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{"memory": {QuantityValue: &huge}}},
		{ID: "GPU-ok", Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{"memory": {QuantityValue: ptr.To(resource.MustParse("80Gi"))}}},
	}
	watchdog.Run(t, func() {
		eps := newClassMatcher(kinds.Builtin, 1).endpoints([]*v1alpha1.ResourceClass{
			class("hostile", "1", v1alpha1.ResourceSelectorRequirement{Key: "memory", Operator: v1alpha1.ResourceSelectorOpGt, Values: []string{"1e999999999"}}),
			class("big", "1", v1alpha1.ResourceSelectorRequirement{Key: "memory", Operator: v1alpha1.ResourceSelectorOpGtEq, Values: []string{"40Gi"}}),
		}, devices, nil)
		if _, ok := eps[v1alpha1.ResourceNamePrefix+"hostile"]; ok {
			t.Error("a class with an out-of-range value serves devices")
		}
		if big := eps[v1alpha1.ResourceNamePrefix+"big"]; len(big) != 1 || big[0].ID != "GPU-ok" {
			t.Errorf("memory GtEq 40Gi serves %+v, want GPU-ok only", big)
		}
	})
}

// A share class sees each GPU in a sharing mode as the units of its share
// that fit it; a class without a share sees only the GPUs served whole.
func TestClassMatcherShareSlotsPerClass(t *testing.T) {
	shared := func(id string, mode v1alpha1.SharingMode) v1alpha1.Device {
		d := gpu80(id)
		d.Sharing = &v1alpha1.DeviceSharing{Mode: mode}
		if mode.Shares() {
			d.Sharing.Capacity, d.Sharing.Enforcement = shareCapacity(&d, mode)
		}
		return d
	}
	devices := []v1alpha1.Device{shared("GPU-m", v1alpha1.SharingMPS), shared("GPU-t", v1alpha1.SharingTimeSlicing), shared("GPU-x", v1alpha1.SharingExclusive)}
	withShare := func(name string, memory string, compute int32) *v1alpha1.ResourceClass {
		c := class(name, "1", kindIs(v1alpha1.DeviceKindNvidiaGPU))
		c.Spec.Share = &v1alpha1.ResourceShare{}
		if memory != "" {
			c.Spec.Share.Memory = ptr.To(resource.MustParse(memory))
		}
		if compute > 0 {
			c.Spec.Share.Compute = &compute
		}
		return c
	}
	classes := []*v1alpha1.ResourceClass{
		class("whole", "1", kindIs(v1alpha1.DeviceKindNvidiaGPU)),
		withShare("gpu-10g", "10Gi", 25),
		withShare("gpu-20g", "20Gi", 0),
		withShare("gpu-tenth", "", 10),
		withShare("too-big", "100Gi", 0), // fits no GPU: no endpoint
	}
	eps := newClassMatcher(kinds.Builtin, 3).endpoints(classes, devices, nil)
	ids := func(class string) []string {
		var out []string
		for _, d := range eps[v1alpha1.ResourceNamePrefix+class] {
			out = append(out, d.ID)
		}
		return out
	}
	want := map[string][]string{
		"whole":     {"GPU-x"},
		"gpu-10g":   append(handoff.ShareSlotIDs("GPU-m", 4), handoff.ShareSlotIDs("GPU-t", 4)...),
		"gpu-20g":   append(handoff.ShareSlotIDs("GPU-m", 4), handoff.ShareSlotIDs("GPU-t", 4)...),
		"gpu-tenth": append(handoff.ShareSlotIDs("GPU-m", 10), handoff.ShareSlotIDs("GPU-t", 10)...),
		"too-big":   nil,
	}
	for class, w := range want {
		if got := ids(class); !slices.Equal(got, w) {
			t.Errorf("%s: %v, want %v", class, got, w)
		}
	}
}
