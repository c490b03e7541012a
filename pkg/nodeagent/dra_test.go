package nodeagent

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
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
		res := driverResources("node-1", devices)
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
