package dra

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/dra/dradevice"
)

// nvidiaHighMem is the proposal's class: Kind In nvidia-gpu, memory GtEq 30G.
func nvidiaHighMem() *v1alpha1.ResourceClassSpec {
	return specOf([]v1alpha1.ResourceSelectorRequirement{req("Kind", "In", "nvidia-gpu"), req("memory", "GtEq", "30G")})
}

// BenchmarkDeviceClassMatch evaluates, as kube-scheduler's allocator does, the
// translated DeviceClass selector of nvidia.high.mem against the H100 mapped
// by Device. The baseline is the same question written by hand on the same
// device, the way DRA's documentation writes selectors: what the
// translation's form (cel.bind, lookups by key, presence tests) costs per
// device the allocator checks. (Most of either is DeviceMatches building the
// device's maps: 20 attributes and capacities.) translated-two-attributes is
// the translation against the same device stripped to the two keys the class
// reads: what publishing every attribute costs each evaluation (docs/dra.md,
// "Throughput").
func BenchmarkDeviceClassMatch(b *testing.B) {
	h := h100()
	mapped, err := dradevice.Device(&h)
	if err != nil {
		b.Fatal(err)
	}
	run := func(b *testing.B, expr string, d dracel.Device) {
		r := dracel.GetCompiler(Features).CompileCELExpression(expr, dracel.Options{})
		if r.Error != nil {
			b.Fatal(r.Error)
		}
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if m, _, err := r.DeviceMatches(ctx, d); err != nil || !m {
				b.Fatalf("wrong answer: %v %v", m, err)
			}
		}
	}
	b.Run("translated", func(b *testing.B) {
		expr, err := Selector(nvidiaHighMem())
		if err != nil {
			b.Fatal(err)
		}
		run(b, expr, dracel.Device{Driver: dradevice.DriverName, Attributes: mapped.Attributes, Capacity: mapped.Capacity})
	})
	b.Run("translated-two-attributes", func(b *testing.B) {
		expr, err := Selector(nvidiaHighMem())
		if err != nil {
			b.Fatal(err)
		}
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"kind": mapped.Attributes["kind"]}
		capacity := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": mapped.Capacity["memory"]}
		run(b, expr, dracel.Device{Driver: dradevice.DriverName, Attributes: attrs, Capacity: capacity})
	})
	b.Run("baseline-handwritten", func(b *testing.B) {
		run(b, `device.driver == "resclass.io" && device.attributes["resclass.io"].kind == "nvidia-gpu" && `+
			`device.capacity["resclass.io"].memory.compareTo(quantity("30G")) >= 0`,
			dracel.Device{Driver: dradevice.DriverName, Attributes: mapped.Attributes, Capacity: mapped.Capacity})
	})
}

// BenchmarkTranslate is what the DeviceClass controller and the webhook's
// warning pay per class: selector.Compile, the translation, and the upstream
// compile with its cost estimate. The baseline is that upstream compile alone
// (what the apiserver pays again when the DeviceClass is written).
func BenchmarkTranslate(b *testing.B) {
	spec := nvidiaHighMem()
	expr, err := Selector(spec)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("selector", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Selector(spec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline-compile", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := Check(expr); err != nil {
				b.Fatal(err)
			}
		}
	})
}
