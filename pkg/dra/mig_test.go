package dra

import (
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/dra/dradevice"
	migtable "github.com/resclass/resclass/pkg/mig"
	"github.com/resclass/resclass/pkg/selector"
)

// MIG slices made on demand on DRA nodes, through upstream's structured
// allocator with partitionable devices (what kube-scheduler runs in 1.36):
// the potential slices a dynamic GPU publishes are given without overlap,
// around the operator's instances, within each profile's instance limit,
// the smallest profile a class accepts first; a class without createMIG
// never gets one.

// dynamicA100 is an A100-40GB in MIG mode marked dynamic, with instances.
func dynamicA100(id string, instances ...v1alpha1.MIGInstance) v1alpha1.Device {
	m := migtable.A100_40GB.API(instances...)
	m.Mode = v1alpha1.MIGDynamic
	b := newDev(v1alpha1.DeviceKindNvidiaGPU, id).str("product", migtable.A100_40GB.Product).str("architecture", "Ampere").
		bool(v1alpha1.AttributeMIGEnabled, true).int("numaNode", 0)
	b.d.MIG = m
	return b.d
}

// migSlices are the slices a DRA node publishes for its dynamic GPUs and
// its other devices: as pkg/nodeagent lays them out, each checked by the
// apiserver's validation.
func migSlices(t *testing.T, gpus []v1alpha1.Device, others ...v1alpha1.Device) (specs []resourceapi.ResourceSliceSpec, byName map[string]v1alpha1.Device) {
	t.Helper()
	byName = map[string]v1alpha1.Device{}
	var counters []resourceapi.CounterSet
	for i := range gpus {
		g, err := dradevice.MIGPotentials(&gpus[i])
		if err != nil {
			t.Fatal(err)
		}
		counters = append(counters, g.Counters)
		specs = append(specs, resourceapi.ResourceSliceSpec{Devices: g.Devices})
		for j := range g.Devices {
			byName[g.Devices[j].Name] = g.Potentials[j]
		}
	}
	specs = append(specs, resourceapi.ResourceSliceSpec{SharedCounters: counters})
	if len(others) > 0 {
		devices, refused := dradevice.Devices(others)
		if len(refused) > 0 {
			t.Fatal(refused)
		}
		for i := range devices {
			byName[devices[i].Name] = others[i]
		}
		specs = append(specs, resourceapi.ResourceSliceSpec{Devices: devices})
	}
	for _, s := range specs {
		if errs := specErrors(t, s); len(errs) > 0 {
			t.Fatalf("the apiserver would refuse the slice: %v", errs.ToAggregate())
		}
	}
	return specs, byName
}

func migClass(name string, createMIG bool, exprs ...v1alpha1.ResourceSelectorRequirement) *v1alpha1.ResourceClass {
	return &v1alpha1.ResourceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.ResourceClassSpec{
		CreateMIG: createMIG, ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: exprs}},
	}}
}

func expr(key string, op v1alpha1.ResourceSelectorOperator, values ...string) v1alpha1.ResourceSelectorRequirement {
	return v1alpha1.ResourceSelectorRequirement{Key: key, Operator: op, Values: values}
}

func countClaim(name, class string, count int64) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count},
		}}}},
	}
}

// given is the resclass ids of what one allocation gave; nil when the
// claim could not be allocated.
func given(t *testing.T, out []resourceapi.AllocationResult, byName map[string]v1alpha1.Device) []string {
	t.Helper()
	if len(out) == 0 {
		return nil
	}
	var ids []string
	for _, r := range out[0].Devices.Results {
		d, ok := byName[r.Device]
		if !ok {
			t.Fatalf("allocated %s, which is not published", r.Device)
		}
		ids = append(ids, d.ID)
	}
	return ids
}

func TestMIGPotentialsAllocate(t *testing.T) {
	kindMIG := expr("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindNvidiaMIG)
	small := migClass("mig-10g", true, kindMIG, expr("memory", v1alpha1.ResourceSelectorOpGtEq, "9G"))
	media := migClass("mig-me", true, kindMIG, expr("migProfile", v1alpha1.ResourceSelectorOpIn, "1g.5gb+me"))
	existing := migClass("mig-any", false, kindMIG)
	whole := migClass("gpu-any", false, expr("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindNvidiaGPU))
	anything := migClass("anything", false, expr("memory", v1alpha1.ResourceSelectorOpGtEq, "1G"))

	// GPU 0 holds the operator's 3g.20gb at 4 (memory slices 4-7), whose
	// MIG device is published as a device of its own.
	gpus := []v1alpha1.Device{dynamicA100("GPU-0", v1alpha1.MIGInstance{Profile: "3g.20gb", Start: 4}), dynamicA100("GPU-1")}
	operators := mig20()
	specs, byName := migSlices(t, gpus, operators)

	// What pkg/selector says each class selects among them, the judge of
	// the DeviceClasses' CEL on the same devices.
	for _, rc := range []*v1alpha1.ResourceClass{small, media, existing, whole, anything} {
		class, errs := selector.Compile(&rc.Spec, nil)
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		dc, err := DeviceClass(rc)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range specs {
			for _, d := range s.Devices {
				res := byName[d.Name]
				sd := selector.NewDevice(&res)
				if _, _, _, ok := migtable.ParseSliceID(res.ID); ok {
					sd = selector.NewPotentialDevice(&res)
				}
				if got, want := celMatches(t, dc.Spec.Selectors[0].CEL.Expression, published(t, d), dradevice.DriverName), class.Matches(sd); got != want {
					t.Errorf("class %s on %s: the DeviceClass says %v, pkg/selector %v", rc.Name, res.ID, got, want)
				}
			}
		}
	}

	// Only a class that may select MIG devices pays for excluding the
	// potential ones.
	for rc, want := range map[*v1alpha1.ResourceClass]bool{existing: true, anything: true, whole: false, small: false} {
		expr, err := Selector(&rc.Spec)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(expr, dradevice.MIGDomain); got != want {
			t.Errorf("class %s: its selector tests %s: %v, want %v", rc.Name, dradevice.MIGDomain, got, want)
		}
	}

	allocate := allocatorOn(t, specs, small, media, existing)
	// The smallest profile of at least 9G is the 1g.10gb; the first fit
	// skips GPU 0's slices the operator took, and never overlaps.
	var placed []string
	for _, name := range []string{"a", "b", "c", "d", "e", "f"} {
		ids := given(t, allocate(countClaim(name, small.Name, 1)), byName)
		if len(ids) != 1 {
			t.Fatalf("claim %s: given %v, want one slice", name, ids)
		}
		gpu, profile, start, ok := migtable.ParseSliceID(ids[0])
		if !ok || profile != "1g.10gb" {
			t.Fatalf("claim %s: given %s, want a potential 1g.10gb", name, ids[0])
		}
		if gpu == "GPU-0" && start >= 4 {
			t.Errorf("claim %s: given %s, over the operator's 3g.20gb", name, ids[0])
		}
		placed = append(placed, ids[0])
	}
	slices.Sort(placed)
	want := []string{
		migtable.SliceID("GPU-0", "1g.10gb", 0), migtable.SliceID("GPU-0", "1g.10gb", 2),
		migtable.SliceID("GPU-1", "1g.10gb", 0), migtable.SliceID("GPU-1", "1g.10gb", 2), migtable.SliceID("GPU-1", "1g.10gb", 4), migtable.SliceID("GPU-1", "1g.10gb", 6),
	}
	if !slices.Equal(placed, want) {
		t.Errorf("placed %v, want %v", placed, want)
	}
	// The class selects existing MIG devices too: the operator's 3g.20gb
	// is the last it can be given.
	if ids := given(t, allocate(countClaim("g", small.Name, 1)), byName); !slices.Equal(ids, []string{operators.ID}) {
		t.Errorf("a seventh claim was given %v, want the operator's %s", ids, operators.ID)
	}
	if ids := given(t, allocate(countClaim("h", small.Name, 1)), byName); ids != nil {
		t.Errorf("an eighth claim was given %v on full GPUs", ids)
	}

	// One 1g.5gb+me per GPU (its instance limit), though slices are free
	// on neither GPU now: a fresh node.
	specs, byName = migSlices(t, gpus)
	allocate = allocatorOn(t, specs, media)
	gpusGiven := map[string]bool{}
	for _, name := range []string{"m1", "m2"} {
		ids := given(t, allocate(countClaim(name, media.Name, 1)), byName)
		if len(ids) != 1 {
			t.Fatalf("claim %s: given %v", name, ids)
		}
		gpu, _, _, _ := migtable.ParseSliceID(ids[0])
		gpusGiven[gpu] = true
	}
	if len(gpusGiven) != 2 {
		t.Errorf("two 1g.5gb+me on one GPU: %v", gpusGiven)
	}
	if ids := given(t, allocate(countClaim("m3", media.Name, 1)), byName); ids != nil {
		t.Errorf("a third 1g.5gb+me was given %v, past the limit of one per GPU", ids)
	}

	// A class without createMIG gets the operator's MIG device and no
	// potential slice.
	specs, byName = migSlices(t, gpus, operators)
	allocate = allocatorOn(t, specs, existing)
	if ids := given(t, allocate(countClaim("x", existing.Name, 2)), byName); ids != nil {
		t.Errorf("two MIG devices given to a class without createMIG: %v", ids)
	}
	if ids := given(t, allocate(countClaim("y", existing.Name, 1)), byName); !slices.Equal(ids, []string{operators.ID}) {
		t.Errorf("a class without createMIG given %v, want the operator's %s", ids, operators.ID)
	}
}

// TestMIGPotentialsOfAnUnhealthyGPU: a GPU that turns unhealthy taints its
// potential slices, so the allocator gives none of them to a new claim.
func TestMIGPotentialsOfAnUnhealthyGPU(t *testing.T) {
	sick := dynamicA100("GPU-0")
	sick.Healthy = false
	g, err := dradevice.MIGPotentials(&sick)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range g.Devices {
		if len(d.Taints) != 1 || d.Taints[0].Key != dradevice.TaintUnhealthy {
			t.Errorf("%s: taints %v, want %s", d.Name, d.Taints, dradevice.TaintUnhealthy)
		}
	}
	small := migClass("mig-any-new", true, expr("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindNvidiaMIG))
	specs, byName := migSlices(t, []v1alpha1.Device{sick})
	if ids := given(t, allocatorOn(t, specs, small)(countClaim("a", small.Name, 1)), byName); ids != nil {
		t.Errorf("a slice of an unhealthy GPU given: %v", ids)
	}
}
