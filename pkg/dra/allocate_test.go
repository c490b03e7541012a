package dra

import (
	"fmt"
	"os"
	"regexp"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	internal "k8s.io/kubernetes/pkg/apis/resource"
	resourcevalidation "k8s.io/kubernetes/pkg/apis/resource/validation"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/dra/dradevice"
)

// Share classes through upstream's structured allocator (what kube-scheduler's
// DynamicResources runs, DRAConsumableCapacity on as in 1.36): the published
// shared GPU and the share class's DeviceClass give claims that request N
// units as capacity their shares, side by side on one GPU, up to its
// capacity; a whole class never gets the shared GPU; a claim that the
// apiserver would refuse is not what the docs tell users to write.

type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, dc := range c {
		out = append(out, dc)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if dc, ok := c[name]; ok {
		return dc, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// shareRequest is a claim of one request of class, asking for capacity
// (share.resclass.io/<name>: value pairs) as docs/dra.md shows.
func shareRequest(name, class string, capacity ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}
	if len(capacity) > 0 {
		req := map[resourceapi.QualifiedName]resource.Quantity{}
		for i := 0; i+1 < len(capacity); i += 2 {
			req[dradevice.ShareCapacity(capacity[i])] = resource.MustParse(capacity[i+1])
		}
		c.Spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: req}
	}
	return c
}

func validateClaim(t *testing.T, c *resourceapi.ResourceClaim) {
	t.Helper()
	var in internal.ResourceClaim
	if err := legacyscheme.Scheme.Convert(c, &in, nil); err != nil {
		t.Fatal(err)
	}
	if errs := resourcevalidation.ValidateResourceClaim(&in); len(errs) > 0 {
		t.Errorf("the apiserver would refuse claim %s: %v", c.Name, errs.ToAggregate())
	}
}

// allocator allocates claims on node-1, which has gpus, with the
// DeviceClasses of rcs, recording what it allocates as the scheduler does,
// so that each call sees what the earlier ones took. Every claim must pass
// Kubernetes' validation.
func allocator(t *testing.T, gpus []v1alpha1.Device, rcs ...*v1alpha1.ResourceClass) func(claims ...*resourceapi.ResourceClaim) []resourceapi.AllocationResult {
	t.Helper()
	devices, refused := dradevice.Devices(gpus)
	if len(refused) > 0 {
		t.Fatal(refused)
	}
	validateSlice(t, devices)
	return allocatorOn(t, []resourceapi.ResourceSliceSpec{{Devices: devices}}, rcs...)
}

// allocatorOn is allocator over the slices of node-1's pool that specs
// (their devices or counters) are.
func allocatorOn(t *testing.T, specs []resourceapi.ResourceSliceSpec, rcs ...*v1alpha1.ResourceClass) func(claims ...*resourceapi.ResourceClaim) []resourceapi.AllocationResult {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	var slices []*resourceapi.ResourceSlice
	for i, spec := range specs {
		spec.Driver, spec.NodeName = dradevice.DriverName, ptr("node-1")
		spec.Pool = resourceapi.ResourcePool{Name: "node-1", ResourceSliceCount: int64(len(specs))}
		slices = append(slices, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-1-resclass.io-%d", i)}, Spec: spec})
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	cls := classes{}
	for _, rc := range rcs {
		dc, err := DeviceClass(rc)
		if err != nil {
			t.Fatal(err)
		}
		cls[rc.Name] = dc
	}
	features := structured.Features{ConsumableCapacity: true, DeviceTaints: true, PrioritizedList: true, PartitionableDevices: true}
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	return func(claims ...*resourceapi.ResourceClaim) []resourceapi.AllocationResult {
		t.Helper()
		for _, c := range claims {
			validateClaim(t, c)
		}
		a, err := structured.NewAllocator(ctx, features, state, cls, slices, dracel.NewCache(10, dracel.Features{EnableConsumableCapacity: true}))
		if err != nil {
			t.Fatal(err)
		}
		out, err := a.Allocate(ctx, node, claims)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range out {
			for _, d := range r.Devices.Results {
				id := structured.MakeDeviceID(d.Driver, d.Pool, d.Device)
				if d.ShareID == nil {
					state.AllocatedDevices.Insert(id)
					continue
				}
				state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, d.ShareID))
				consumed := structured.ConsumedCapacity{}
				for name, q := range d.ConsumedCapacity {
					consumed[name] = ptr(q.DeepCopy())
				}
				state.AggregatedCapacity.Insert(structured.DeviceConsumedCapacity{DeviceID: id, ConsumedCapacity: consumed})
			}
		}
		return out
	}
}

func TestShareClassesAllocate(t *testing.T) {
	gpuSel := []v1alpha1.ResourceSelectorRequirement{req("kind", "In", "nvidia-gpu")}
	allocate := allocator(t, []v1alpha1.Device{
		sharing(h100(), "GPU-shared", v1alpha1.SharingMPS, "40Gi", "100", ""),
		sharing(h100(), "GPU-whole", v1alpha1.SharingExclusive, "", "", ""),
	},
		&v1alpha1.ResourceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu"}, Spec: *specOf(gpuSel)},
		&v1alpha1.ResourceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu-10g"}, Spec: v1alpha1.ResourceClassSpec{
			ResourceSelector: specOf(gpuSel).ResourceSelector,
			Share:            &v1alpha1.ResourceShare{Memory: ptr(resource.MustParse("10Gi")), Compute: ptr(int32(25))},
		}},
	)
	sharedName, wholeName := dradevice.DeviceName("GPU-shared"), dradevice.DeviceName("GPU-whole")

	// Two shares of different sizes, on the one shared GPU.
	out := allocate(shareRequest("two-units", "gpu-10g", "memory", "20Gi", "compute", "50"), shareRequest("one-unit", "gpu-10g", "memory", "10Gi", "compute", "25"))
	if len(out) != 2 {
		t.Fatalf("the two shares were not allocated: %v", out)
	}
	for i, want := range []struct{ memory, compute string }{{"20Gi", "50"}, {"10Gi", "25"}} {
		r := out[i].Devices.Results
		if len(r) != 1 || r[0].Device != sharedName || r[0].ShareID == nil {
			t.Fatalf("share %d allocated %+v, want a share of %s", i, r, sharedName)
		}
		got := r[0].ConsumedCapacity
		if q := got[dradevice.ShareCapacity("memory")]; q.Cmp(resource.MustParse(want.memory)) != 0 {
			t.Errorf("share %d consumed memory %s, want %s", i, q.String(), want.memory)
		}
		if q := got[dradevice.ShareCapacity("compute")]; q.Cmp(resource.MustParse(want.compute)) != 0 {
			t.Errorf("share %d consumed compute %s, want %s", i, q.String(), want.compute)
		}
		if q, ok := got["memory"]; !ok || !q.IsZero() {
			t.Errorf("share %d consumed %v of the GPU's own memory, want 0", i, got["memory"])
		}
	}

	// A request that is no multiple of the step is rounded up to it; one
	// beyond what is left (10Gi and 25% are) fits nowhere, and the whole
	// class gets the GPU served whole, never the shared one.
	out = allocate(shareRequest("odd", "gpu-10g", "memory", "1000Ki", "compute", "1"))
	if len(out) != 1 {
		t.Fatalf("1000Ki of memory was not allocated: %+v", out)
	}
	if q := out[0].Devices.Results[0].ConsumedCapacity[dradevice.ShareCapacity("memory")]; q.Cmp(resource.MustParse("1Mi")) != 0 {
		t.Errorf("1000Ki was not rounded up to 1Mi: %+v", out)
	}
	if out := allocate(shareRequest("too-big", "gpu-10g", "memory", "10Gi", "compute", "25")); out != nil {
		t.Errorf("a share beyond the GPU's capacity was allocated: %+v", out)
	}
	out = allocate(shareRequest("whole", "gpu"))
	if len(out) != 1 || out[0].Devices.Results[0].Device != wholeName || out[0].Devices.Results[0].ShareID != nil {
		t.Errorf("the whole class got %+v, want %s whole", out, wholeName)
	}
	if out := allocate(shareRequest("whole-again", "gpu")); out != nil {
		t.Errorf("the whole class got a second GPU: %+v", out)
	}
	// Asking for the GPU's own memory (not the share capacity) gets nothing:
	// no claim consumes it.
	c := shareRequest("own-memory", "gpu-10g")
	c.Spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("1Mi")}}
	if out := allocate(c); out != nil {
		t.Errorf("a claim of the GPU's own memory was allocated: %+v", out)
	}
}

// The ResourceClass and ResourceClaimTemplate docs/dra.md ("Share classes")
// tells users to write are accepted and give the claim its two units.
func TestDocShareClaimAllocates(t *testing.T) {
	raw, err := os.ReadFile("../../docs/dra.md")
	if err != nil {
		t.Fatal(err)
	}
	var rc *v1alpha1.ResourceClass
	var tmpl *resourceapi.ResourceClaimTemplate
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(raw, -1) {
		for _, part := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(m[1]), -1) {
			var meta metav1.PartialObjectMetadata
			if err := yaml.Unmarshal([]byte(part), &meta); err != nil {
				continue
			}
			switch {
			case meta.Kind == "ResourceClass" && meta.Name == "gpu-10g":
				rc = &v1alpha1.ResourceClass{}
				err = yaml.UnmarshalStrict([]byte(part), rc)
			case meta.Kind == "ResourceClaimTemplate" && meta.Name == "two-units-of-gpu-10g":
				tmpl = &resourceapi.ResourceClaimTemplate{}
				err = yaml.UnmarshalStrict([]byte(part), tmpl)
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, part)
			}
		}
	}
	if rc == nil || tmpl == nil {
		t.Fatalf("docs/dra.md has no ResourceClass gpu-10g (%v) or ResourceClaimTemplate two-units-of-gpu-10g (%v)", rc != nil, tmpl != nil)
	}
	if rc.Spec.Share == nil {
		t.Fatal("the documented gpu-10g is no share class")
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "notebook-share", UID: "u1"}, Spec: tmpl.Spec.Spec}
	legacyscheme.Scheme.Default(claim) // as the apiserver does: count 1
	allocate := allocator(t, []v1alpha1.Device{sharing(h100(), "GPU-shared", v1alpha1.SharingMPS, "81559Mi", "100", "")}, rc)
	out := allocate(claim)
	if len(out) != 1 || len(out[0].Devices.Results) != 1 {
		t.Fatalf("the documented claim was not allocated: %+v", out)
	}
	got := out[0].Devices.Results[0].ConsumedCapacity
	mem, compute := got[dradevice.ShareCapacity("memory")], got[dradevice.ShareCapacity("compute")]
	if mem.Cmp(resource.MustParse("20Gi")) != 0 || compute.Cmp(resource.MustParse("50")) != 0 {
		t.Errorf("the documented claim consumed %v, want two units (20Gi, 50)", got)
	}
}
