package nodeagent

import (
	"fmt"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/dra/dradevice"
	"github.com/resclass/resclass/pkg/mig"
)

// TestDriverResourcesSlices: one pool named after the node, in slices of at
// most 64 devices (the limit once a device is tainted), in order; a node
// without devices publishes one empty slice (its pool stays, empty).
func TestDriverResourcesSlices(t *testing.T) {
	for _, n := range []int{0, 1, 64, 65, 200} {
		devices := make([]resourceapi.Device, n)
		for i := range devices {
			devices[i].Name = fmt.Sprintf("d-%d", i)
		}
		res := driverResources("node-1", devices, nil)
		pool, ok := res.Pools["node-1"]
		if len(res.Pools) != 1 || !ok {
			t.Fatalf("%d devices: pools %v", n, res.Pools)
		}
		want := max(1, (n+63)/64)
		if len(pool.Slices) != want {
			t.Errorf("%d devices: %d slices, want %d", n, len(pool.Slices), want)
		}
		i := 0
		for _, s := range pool.Slices {
			if len(s.Devices) > resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
				t.Errorf("%d devices: a slice of %d", n, len(s.Devices))
			}
			for _, d := range s.Devices {
				if d.Name != fmt.Sprintf("d-%d", i) {
					t.Errorf("%d devices: %s at position %d", n, d.Name, i)
				}
				i++
			}
		}
		if i != n {
			t.Errorf("%d devices: %d published", n, i)
		}
	}
}

// TestDRAInventory: a DRA-mode node's NodeDevices keeps the discovery
// conditions and lists no device, so the resclass scheduler counts none.
func TestDRAInventory(t *testing.T) {
	status := v1alpha1.NodeDevicesStatus{
		Devices:    []v1alpha1.Device{{ID: "GPU-a", Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true}},
		Summary:    v1alpha1.DeviceSummary{GPUs: 1},
		Conditions: []metav1.Condition{{Type: "NVMLAvailable", Status: metav1.ConditionTrue}},
	}
	got := draInventory(status)
	if len(got.Devices) != 0 || got.Summary != (v1alpha1.DeviceSummary{}) || len(got.Conditions) != 1 {
		t.Errorf("draInventory = %+v", got)
	}
	if len(status.Devices) != 1 {
		t.Error("draInventory changed its argument's devices")
	}
}

// TestDriverResourcesMIG: the counter sets of the GPUs marked for dynamic
// MIG in slices of their own, at most 8 each, and each GPU's potential
// slices in a slice of its own, after the other devices.
func TestDriverResourcesMIG(t *testing.T) {
	var migs []*dradevice.MIGGPU
	for i := range 10 {
		g, err := dradevice.MIGPotentials(dynamicGPU(fmt.Sprintf("GPU-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		migs = append(migs, g)
	}
	res := driverResources("node-1", []resourceapi.Device{{Name: "nic-0"}}, migs)
	var sets, perGPU []int
	for _, s := range res.Pools["node-1"].Slices[1:] {
		switch {
		case len(s.SharedCounters) > 0 && len(s.Devices) > 0:
			t.Fatal("a slice with counters and devices")
		case len(s.SharedCounters) > 0:
			sets = append(sets, len(s.SharedCounters))
		default:
			perGPU = append(perGPU, len(s.Devices))
		}
	}
	if !slices.Equal(sets, []int{8, 2}) {
		t.Errorf("counter sets by slice %v, want [8 2]", sets)
	}
	if len(perGPU) != 10 || slices.ContainsFunc(perGPU, func(n int) bool { return n != len(migs[0].Devices) }) {
		t.Errorf("potential slices by slice %v, want 10 of %d", perGPU, len(migs[0].Devices))
	}
	if got := res.Pools["node-1"].Slices[0].Devices; len(got) != 1 || got[0].Name != "nic-0" {
		t.Errorf("first slice %v, want the other devices", got)
	}
}

func dynamicGPU(id string) *v1alpha1.Device {
	m := mig.A100_40GB.API()
	m.Mode = v1alpha1.MIGDynamic
	return &v1alpha1.Device{ID: id, Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, MIG: m, Attributes: map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeMIGEnabled: v1alpha1.BoolAttribute(true),
		v1alpha1.AttributeProduct:    v1alpha1.StringAttribute(mig.A100_40GB.Product),
	}}
}
