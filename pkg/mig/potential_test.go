package mig

import (
	"fmt"
	"strings"
	"testing"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// dynamicGPU is an A100-80GB in MIG mode marked Dynamic, with instances.
func dynamicGPU(instances ...v1alpha1.MIGInstance) *v1alpha1.Device {
	m := A100_80GB.API(instances...)
	m.Mode = v1alpha1.MIGDynamic
	return &v1alpha1.Device{ID: "GPU-0", Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, MIG: m, Attributes: map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeMIGEnabled: v1alpha1.BoolAttribute(true),
		v1alpha1.AttributeProduct:    v1alpha1.StringAttribute(A100_80GB.Product),
		v1alpha1.AttributeNUMANode:   v1alpha1.IntAttribute(1),
		v1alpha1.AttributeIndex:      v1alpha1.IntAttribute(3),
	}}
}

func TestPotentials(t *testing.T) {
	g, pots, err := Potentials(dynamicGPU(v1alpha1.MIGInstance{Profile: "3g.40gb", Start: 4}))
	if err != nil {
		t.Fatal(err)
	}
	// One per profile and placement, free or not: 7+7+4+3+2+1+1.
	if len(pots) != 25 {
		t.Fatalf("%d potential slices, want 25", len(pots))
	}
	if g.FreeSlices() != 4 {
		t.Errorf("free slices %d, want 4", g.FreeSlices())
	}
	first, last := pots[0].Device, pots[len(pots)-1].Device
	if first.ID != "GPU-0/mig/1g.10gb@0" || last.ID != "GPU-0/mig/7g.80gb@0" {
		t.Errorf("ids %s ... %s", first.ID, last.ID)
	}
	if first.Kind != v1alpha1.DeviceKindNvidiaMIG || !first.Healthy {
		t.Errorf("kind %s, healthy %v", first.Kind, first.Healthy)
	}
	a := first.Attributes
	if *a[v1alpha1.AttributeParent].StringValue != "GPU-0" || *a[v1alpha1.AttributeMIGProfile].StringValue != "1g.10gb" ||
		a[v1alpha1.AttributeMemory].QuantityValue.Value() != 9728<<20 || *a[v1alpha1.AttributeMultiprocessors].IntValue != 14 ||
		*a[v1alpha1.AttributeNUMANode].IntValue != 1 || *a[v1alpha1.AttributeProduct].StringValue != A100_80GB.Product {
		t.Errorf("attributes %v", a)
	}
	// The parent's own index is not a slice's: inherited are only the keys
	// a class selects GPUs and MIG devices alike by.
	if _, ok := a[v1alpha1.AttributeIndex]; ok {
		t.Errorf("index inherited")
	}
	for _, p := range pots {
		gpu, profile, start, ok := ParseSliceID(p.Device.ID)
		if !ok || gpu != "GPU-0" || profile != p.Instance.Profile.Name || start != p.Instance.Start {
			t.Errorf("%s reads back as %s %s %d %v", p.Device.ID, gpu, profile, start, ok)
		}
	}
}

func TestPotentialsOnlyOnDynamicGPUs(t *testing.T) {
	for what, change := range map[string]func(d *v1alpha1.Device){
		"static":       func(d *v1alpha1.Device) { d.MIG.Mode = v1alpha1.MIGStatic },
		"unmarked":     func(d *v1alpha1.Device) { d.MIG.Mode = "" },
		"MIG mode off": func(d *v1alpha1.Device) { d.Attributes[v1alpha1.AttributeMIGEnabled] = v1alpha1.BoolAttribute(false) },
		"no geometry":  func(d *v1alpha1.Device) { d.MIG = nil },
		"a MIG device": func(d *v1alpha1.Device) { d.Kind = v1alpha1.DeviceKindNvidiaMIG },
	} {
		d := dynamicGPU()
		change(d)
		if g, pots, err := Potentials(d); g != nil || pots != nil || err != nil {
			t.Errorf("%s: %v %d %v", what, g, len(pots), err)
		}
	}
	for what, change := range map[string]func(d *v1alpha1.Device){
		"overlapping instances": func(d *v1alpha1.Device) {
			d.MIG.Instances = []v1alpha1.MIGInstance{{Profile: "3g.40gb", Start: 4}, {Profile: "1g.10gb", Start: 5}}
		},
		"a profile name an id cannot carry": func(d *v1alpha1.Device) { d.MIG.Profiles[0].Name = "1g/../x@3" },
		"no profile":                        func(d *v1alpha1.Device) { d.MIG.Profiles = nil },
	} {
		d := dynamicGPU()
		change(d)
		if _, _, err := Potentials(d); err == nil {
			t.Errorf("%s: accepted", what)
		}
	}
}

func TestParseSliceIDRefuses(t *testing.T) {
	for _, id := range []string{
		"GPU-0", "MIG-4b8a", "/mig/1g.10gb@0", "GPU-0/mig/@0", "GPU-0/mig/1g.10gb", "GPU-0/mig/1g.10gb@", "GPU-0/mig/1g.10gb@8",
		"GPU-0/mig/1g.10gb@12", "GPU-0/mig/1g.10gb@-1", "GPU-0/mig/1G.10GB@0", "GPU-0/mig/1g 10gb@0", "GPU-0/mig/a/mig/b@0",
		"GPU-0/mig/" + strings.Repeat("a", 64) + "@0",
	} {
		if gpu, p, s, ok := ParseSliceID(id); ok {
			t.Errorf("%q read as %s %s %d", id, gpu, p, s)
		}
	}
}

func FuzzParseSliceID(f *testing.F) {
	f.Add("GPU-0/mig/1g.10gb@0")
	f.Add("GPU-4b8a/mig/7g.80gb@0")
	f.Add("GPU-0/mig/1g.10gb+me@6")
	f.Fuzz(func(t *testing.T, id string) {
		gpu, profile, start, ok := ParseSliceID(id)
		if !ok {
			return
		}
		if again := SliceID(gpu, profile, start); again != id {
			t.Fatalf("%q reads as %s %s %d, which is %q", id, gpu, profile, start, again)
		}
		if start < 0 || start >= Slots {
			t.Fatal(fmt.Sprint("start ", start))
		}
	})
}
