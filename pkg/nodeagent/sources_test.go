package nodeagent

import (
	"testing"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
)

func TestApplyHealth(t *testing.T) {
	devices := []v1alpha1.Device{
		{ID: "GPU-a", Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true},
		{ID: "MIG-a1", Kind: v1alpha1.DeviceKindNvidiaMIG, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{v1alpha1.AttributeParent: v1alpha1.StringAttribute("GPU-a")}},
		{ID: "GPU-b", Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true},
		{ID: "GPU-c", Kind: v1alpha1.DeviceKindNvidiaGPU, Reason: "NVML: memory: ERROR_UNKNOWN"},
	}
	unhealthy := map[string]string{"GPU-a": "XID 79", "GPU-c": "XID 48"}
	applyHealth(kinds.Builtin, devices, func(id string) (string, bool) { r, ok := unhealthy[id]; return r, ok })
	want := []struct {
		healthy bool
		reason  string
	}{{false, "XID 79"}, {false, "GPU GPU-a: XID 79"}, {true, ""}, {false, "NVML: memory: ERROR_UNKNOWN"}}
	for i, w := range want {
		if devices[i].Healthy != w.healthy || devices[i].Reason != w.reason {
			t.Errorf("%s: healthy=%v reason=%q, want %v %q", devices[i].ID, devices[i].Healthy, devices[i].Reason, w.healthy, w.reason)
		}
	}
}

func TestCloneDevicesLeavesTheOriginal(t *testing.T) {
	orig := []v1alpha1.Device{{ID: "GPU-a", Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{"x": v1alpha1.IntAttribute(1)}}}
	c := cloneDevices(orig)
	applyHealth(kinds.Builtin, c, func(id string) (string, bool) { return "XID 79", id == "GPU-a" })
	c[0].Attributes["y"] = v1alpha1.IntAttribute(2)
	if !orig[0].Healthy || len(orig[0].Attributes) != 1 {
		t.Errorf("the cached GPU list changed: %+v", orig[0])
	}
}
