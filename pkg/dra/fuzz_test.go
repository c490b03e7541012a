package dra

import (
	"errors"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/dra/dradevice"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// attributeOf builds an attribute of type t (0-5: string, int, bool,
// quantity, bandwidth, version) from s and i; ok is false when s is not a
// value of that type as the API schema would let it through.
func attributeOf(t uint8, s string, i int64) (v1alpha1.DeviceAttribute, bool) {
	if len(s) > 256 {
		return v1alpha1.DeviceAttribute{}, false
	}
	switch t % 6 {
	case 0:
		return v1alpha1.StringAttribute(s), len(s) <= 256
	case 1:
		return v1alpha1.IntAttribute(i), true
	case 2:
		return v1alpha1.BoolAttribute(i%2 == 0), true
	case 3:
		if len(s) > 64 {
			return v1alpha1.DeviceAttribute{}, false
		}
		q, err := resource.ParseQuantity(s)
		return v1alpha1.QuantityAttribute(q), err == nil
	case 4:
		return v1alpha1.BandwidthAttribute(s), true
	default:
		return v1alpha1.VersionAttribute(s), true
	}
}

// sharingOf derives a device's sharing from fuzz input: none, or a mode
// (t/6: MPS, time-slicing, exclusive waiting for MPS) with a memory capacity
// read from s (when it is a quantity) and a compute capacity of i modulo
// 202, -1 leaving it out (so more than 100 percent occurs).
func sharingOf(t uint8, s string, i int64) *v1alpha1.DeviceSharing {
	modes := []v1alpha1.DeviceSharing{{Mode: v1alpha1.SharingMPS}, {Mode: v1alpha1.SharingTimeSlicing}, {Mode: v1alpha1.SharingExclusive, RequestedMode: v1alpha1.SharingMPS}}
	m := int(t/6) % (len(modes) + 1)
	if m == len(modes) {
		return nil
	}
	out := modes[m]
	out.Capacity = map[string]resource.Quantity{}
	if q, err := resource.ParseQuantity(s); err == nil && len(s) <= 64 {
		out.Capacity[v1alpha1.CapacityMemory] = q
	}
	if c := i%202 - 1; c >= 0 {
		out.Capacity[v1alpha1.CapacityCompute] = *resource.NewQuantity(c, resource.DecimalSI)
	}
	return &out
}

// FuzzDevice: whatever a NodeDevices status holds, sharing included, Device
// either refuses the device (with ErrRefused) or returns one the apiserver
// accepts, named by a DNS
// label, carrying the device's id.
func FuzzDevice(f *testing.F) {
	f.Add("GPU-6513270e-269e-4d37-b2a7-4de452e6b438", "nvidia-gpu", "memory", uint8(3), "40Gi", int64(0), "driverVersion", uint8(5), "535.104.05")
	f.Add("0000:3b:00.0", "nic", "speed", uint8(4), "100Gbps", int64(1), "mtu", uint8(1), "")
	f.Add("hugepages-1Gi-numa0", "huge-pages", "size", uint8(3), "1Gi", int64(8), "pcieRoot", uint8(0), "pci0000:00")
	f.Add("x", "custom", "firmware", uint8(5), "1.2.3.4", int64(0), "uplink", uint8(4), "0.5bps")
	f.Add("GPU-1", "nvidia-gpu", "memory", uint8(9), "80Gi", int64(101), "scratch", uint8(3), "80Gi")
	f.Add("GPU-2", "nvidia-gpu", "memory", uint8(15), "40Gi", int64(0), "scratch", uint8(3), "0.5")
	f.Add("GPU-3", "nvidia-gpu", "size", uint8(21), "-1", int64(50), "x", uint8(3), "1")
	f.Fuzz(func(t *testing.T, id, kind, n1 string, t1 uint8, s1 string, i int64, n2 string, t2 uint8, s2 string) {
		watchdog.Run(t, func() {
			d := v1alpha1.Device{ID: id, Kind: kind, Healthy: i%3 != 0, Attributes: map[string]v1alpha1.DeviceAttribute{}}
			if len(id) == 0 || len(id) > 128 || len(kind) == 0 || len(validation.IsDNS1123Label(kind)) > 0 {
				return // the schema refuses the NodeDevices
			}
			a1, ok1 := attributeOf(t1, s1, i)
			a2, ok2 := attributeOf(t2, s2, i)
			if !ok1 || !ok2 {
				return
			}
			d.Attributes[n1] = a1
			d.Attributes[n2] = a2
			d.Sharing = sharingOf(t1, s2, i)
			got, err := dradevice.Device(&d)
			if err != nil {
				if !errors.Is(err, dradevice.ErrRefused) {
					t.Fatalf("an error that is not a refusal: %v", err)
				}
				return
			}
			if back, ok := dradevice.ID(&got); !ok || back != id {
				t.Fatalf("id %q came back as %q", id, back)
			}
			if errs := sliceErrors(t, []resourceapi.Device{got}); len(errs) > 0 {
				t.Fatalf("the apiserver would refuse %+v: %v", got, errs.ToAggregate())
			}
		})
	})
}

// FuzzSelectorCELEquivalence generates a class (two selectors, ORed; the
// first with two expressions, ANDed; a share or none) and a device whose
// attributes are named by the class's keys (and a sharing or none), and checks, on that device and the hand-made ones of
// every type, that the DeviceClass's CEL (upstream DRA CEL library) selects
// exactly what selector.Matches selects. A disagreement or a CEL runtime
// error fails.
func FuzzSelectorCELEquivalence(f *testing.F) {
	f.Add("memory", uint8(6), "30G", "", "kind", uint8(0), "nvidia-gpu", uint8(3), "40Gi", int64(0), uint8(0), "x")
	f.Add("custom", uint8(0), "5", "5.0.0", "Kind", uint8(1), "nic", uint8(1), "", int64(5), uint8(5), "5")
	f.Add("firmware", uint8(5), "1.2.3.4", "", "firmware", uint8(8), "1.2.2", uint8(5), "1.2.3", int64(0), uint8(5), "1.2.4")
	f.Add("uplink", uint8(7), "30m", "", "scratch", uint8(2), "30m", uint8(4), "30Mbps", int64(0), uint8(3), "30m")
	f.Add("flag", uint8(0), "TRUE", "false", "id", uint8(0), "c-1", uint8(2), "", int64(0), uint8(0), "true")
	f.Add("pcieRoot", uint8(1), "pci0000:00", "pci0000:3a", "absent", uint8(4), "", uint8(0), "pci0000:00", int64(0), uint8(1), "")
	f.Add("a-b", uint8(1), "x", "", "count", uint8(7), "-9223372036854775808", uint8(1), "", int64(-9223372036854775808), uint8(4), "5bps")
	f.Add("kind", uint8(0), "nvidia-gpu", "", "memory", uint8(6), "40Gi", uint8(9), "10Gi", int64(26), uint8(9), "40Gi")
	f.Add("kind", uint8(3), "", "", "memory", uint8(6), "40Gi", uint8(15), "10Gi", int64(25), uint8(3), "9Gi")
	devices := func() []v1alpha1.Device {
		out := append(extraDevices(), sharedDevices()...)
		for _, ds := range profileDevices(f) {
			out = append(out, ds[0])
		}
		return append(out, h100())
	}()
	fixed := prepare(f, devices)
	f.Fuzz(func(t *testing.T, key1 string, op1 uint8, v1, v2, key2 string, op2 uint8, v3 string,
		type1 uint8, value1 string, i int64, type2 uint8, value2 string) {
		watchdog.Run(t, func() {
			values := func(op v1alpha1.ResourceSelectorOperator, vs ...string) []string {
				switch op {
				case "In", "NotIn":
					return vs
				case "Exists", "DoesNotExist":
					return nil
				}
				return vs[:1]
			}
			o1, o2 := operators[int(op1)%len(operators)], operators[int(op2)%len(operators)]
			spec := specOf(
				[]v1alpha1.ResourceSelectorRequirement{req(key1, o1, values(o1, v1, v2)...), req(key2, o2, values(o2, v3, v1)...)},
				[]v1alpha1.ResourceSelectorRequirement{req(key2, o1, values(o1, v2, v3)...)},
			)
			d := v1alpha1.Device{ID: "fuzz", Kind: "custom", Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{}}
			if a, ok := attributeOf(type1, value1, i); ok {
				d.Attributes[key1] = a
			}
			if a, ok := attributeOf(type2, value2, i); ok {
				d.Attributes[key2] = a
			}
			d.Sharing = sharingOf(type2, value2, i)
			switch type1 / 6 % 3 {
			case 1:
				if q, err := resource.ParseQuantity(value1); err == nil && len(value1) <= 64 {
					spec.Share = &v1alpha1.ResourceShare{Memory: &q}
				}
			case 2:
				c := int32(i % 102)
				spec.Share = &v1alpha1.ResourceShare{Compute: &c}
			}
			all := append(prepare(t, []v1alpha1.Device{d}), fixed...)
			checkEquivalent(t, "fuzz", spec, all)
		})
	})
}
