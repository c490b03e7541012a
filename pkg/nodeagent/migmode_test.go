package nodeagent

import (
	"strings"
	"testing"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/mig"
)

// TestMIGModesFromLabels: the node's label marks every GPU in MIG mode, a
// GPU's own label wins, a misspelt value and a GPU whose MIG mode is off
// are said so, and devices other than GPUs are left alone.
func TestMIGModesFromLabels(t *testing.T) {
	gpu := func(id string, migOn bool) v1alpha1.Device {
		d := v1alpha1.Device{ID: id, Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{
			v1alpha1.AttributeMIGEnabled: v1alpha1.BoolAttribute(migOn)}}
		if migOn {
			d.MIG = mig.A100_80GB.API()
		}
		return d
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   []string // per device: mode, and "+msg" when a message is published; "-" for no MIG block
	}{
		{"unmarked", nil, []string{"Static", "Static", "-", "-"}},
		{"node dynamic", map[string]string{v1alpha1.LabelGPUMIG: "dynamic"}, []string{"Dynamic", "Dynamic", "Static+msg", "-"}},
		{"one GPU static over the node", map[string]string{v1alpha1.LabelGPUMIG: "dynamic", v1alpha1.LabelGPUMIGDevicePrefix + "GPU-B": "static"}, []string{"Dynamic", "Static", "Static+msg", "-"}},
		{"one GPU dynamic", map[string]string{v1alpha1.LabelGPUMIGDevicePrefix + "GPU-B": "dynamic"}, []string{"Static", "Dynamic", "-", "-"}},
		{"misspelt", map[string]string{v1alpha1.LabelGPUMIG: "Dynamic"}, []string{"Static+msg", "Static+msg", "-", "-"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devices := []v1alpha1.Device{gpu("GPU-A", true), gpu("GPU-B", true), gpu("GPU-C", false),
				{ID: "0000:3b:00.0", Kind: v1alpha1.DeviceKindNIC, Healthy: true}}
			applyMIGModes(tc.labels, devices)
			for i, d := range devices {
				got := "-"
				if d.MIG != nil {
					got = string(d.MIG.Mode)
					if d.MIG.Message != "" {
						got += "+msg"
					}
				}
				if got != tc.want[i] {
					t.Errorf("%s: %s (%+v), want %s", d.ID, got, d.MIG, tc.want[i])
				}
			}
			if m := devices[2].MIG; m != nil && !strings.Contains(m.Message, "MIG mode is off") {
				t.Errorf("GPU-C: %q", m.Message)
			}
		})
	}
}
