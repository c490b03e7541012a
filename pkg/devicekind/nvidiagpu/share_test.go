package nvidiagpu

import (
	"strings"
	"testing"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
)

func TestShareEdits(t *testing.T) {
	mps := &v1alpha1.Device{ID: "GPU-a", Kind: v1alpha1.DeviceKindNvidiaGPU, Sharing: &v1alpha1.DeviceSharing{Mode: v1alpha1.SharingMPS}}
	e := &devicekind.ContainerEdits{Env: map[string]string{}}
	k := Kind{MPSDir: "/var/mps"}
	// Less than a MiB of memory is one MiB: the limit takes no bytes.
	if err := k.ShareEdits(nil, mps, map[string]int64{v1alpha1.CapacityMemory: 1000, v1alpha1.CapacityCompute: 30}, e); err != nil {
		t.Fatal(err)
	}
	if e.Env[EnvMPSMemLimit] != "0=1M" || e.Env[EnvMPSThreads] != "30" || e.Env[EnvMPSPipeDirectory] != "/run/resclass/mps/GPU-a/pipe" {
		t.Errorf("env %v", e.Env)
	}
	if len(e.Mounts) != 2 || e.Mounts[0].HostPath != "/var/mps/GPU-a/pipe" || e.Mounts[1].HostPath != "/var/mps/shm" || e.Mounts[1].ContainerPath != "/dev/shm" {
		t.Errorf("mounts %+v", e.Mounts)
	}
	// A second MPS GPU for the same container has no server to share.
	other := &v1alpha1.Device{ID: "GPU-b", Kind: v1alpha1.DeviceKindNvidiaGPU, Sharing: &v1alpha1.DeviceSharing{Mode: v1alpha1.SharingMPS}}
	if err := k.ShareEdits(nil, other, map[string]int64{v1alpha1.CapacityCompute: 10}, e); err == nil || !strings.Contains(err.Error(), "two GPUs") {
		t.Errorf("two MPS GPUs: %v", err)
	}
	// Time-sliced: nothing of the kind's own.
	ts := &v1alpha1.Device{ID: "GPU-c", Kind: v1alpha1.DeviceKindNvidiaGPU, Sharing: &v1alpha1.DeviceSharing{Mode: v1alpha1.SharingTimeSlicing}}
	e = &devicekind.ContainerEdits{Env: map[string]string{}}
	if err := k.ShareEdits(nil, ts, map[string]int64{v1alpha1.CapacityCompute: 10}, e); err != nil || len(e.Env) != 0 || len(e.Mounts) != 0 {
		t.Errorf("time-sliced: %v %v %v", err, e.Env, e.Mounts)
	}
}

func TestLabelMPS(t *testing.T) {
	a := &v1alpha1.Device{ID: "GPU-a", Kind: v1alpha1.DeviceKindNvidiaGPU, Sharing: &v1alpha1.DeviceSharing{Mode: v1alpha1.SharingTimeSlicing}}
	b := &v1alpha1.Device{ID: "GPU-b", Kind: v1alpha1.DeviceKindNvidiaGPU, Sharing: &v1alpha1.DeviceSharing{Mode: v1alpha1.SharingExclusive, RequestedMode: v1alpha1.SharingMPS}}
	if l := (Kind{}).Labels([]*v1alpha1.Device{a, b}); l[LabelMPS] != "" {
		t.Errorf("no GPU in MPS mode (one asked for): %v", l)
	}
	b.Sharing = &v1alpha1.DeviceSharing{Mode: v1alpha1.SharingMPS, RequestedMode: v1alpha1.SharingExclusive}
	if l := (Kind{}).Labels([]*v1alpha1.Device{a, b}); l[LabelMPS] != "true" {
		t.Errorf("a GPU in MPS mode (leaving it): %v", l)
	}
}
