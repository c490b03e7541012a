package dra

import (
	"errors"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// attributeOf builds an attribute of type t (0-5: string, int, bool,
// quantity, bandwidth, version) from s and i; ok is false when s is not a
// value of that type as the API schema would let it through.
func attributeOf(t uint8, s string, i int64) (v1alpha1.DeviceAttribute, bool) {
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

// FuzzDevice: whatever a NodeDevices status holds, Device either refuses the
// device (with ErrRefused) or returns one the apiserver accepts, named by a DNS
// label, carrying the device's id.
func FuzzDevice(f *testing.F) {
	f.Add("GPU-6513270e-269e-4d37-b2a7-4de452e6b438", "nvidia-gpu", "memory", uint8(3), "40Gi", int64(0), "driverVersion", uint8(5), "535.104.05")
	f.Add("0000:3b:00.0", "nic", "speed", uint8(4), "100Gbps", int64(1), "mtu", uint8(1), "")
	f.Add("hugepages-1Gi-numa0", "huge-pages", "size", uint8(3), "1Gi", int64(8), "pcieRoot", uint8(0), "pci0000:00")
	f.Add("x", "custom", "firmware", uint8(5), "1.2.3.4", int64(0), "uplink", uint8(4), "0.5bps")
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
			got, err := Device(&d)
			if err != nil {
				if !errors.Is(err, ErrRefused) {
					t.Fatalf("an error that is not a refusal: %v", err)
				}
				return
			}
			if back, ok := ID(&got); !ok || back != id {
				t.Fatalf("id %q came back as %q", id, back)
			}
			if errs := sliceErrors(t, []resourceapi.Device{got}); len(errs) > 0 {
				t.Fatalf("the apiserver would refuse %+v: %v", got, errs.ToAggregate())
			}
		})
	})
}
