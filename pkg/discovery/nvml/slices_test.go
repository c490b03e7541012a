package nvml

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/mig"
)

// migGPU is the mock's GPU index in MIG mode with table, NVML open on the
// mock, and the GPU as described.
func migGPU(t *testing.T, index int, table *mig.Table) (*nvmlmock.Server, *Discoverer, v1alpha1.Device) {
	t.Helper()
	server, root := dgxMock(t)
	uuid := server.Devices[index].(*dgxa100.Device).UUID
	if err := server.EnableMIG(uuid, table); err != nil {
		t.Fatal(err)
	}
	d, devices := openDiscover(t, server, root)
	return server, d, byID(t, devices, uuid)
}

// TestSlicesCreatedAndDestroyed: a slice is created at the placement asked
// (GPU and compute instance), described as discovery describes its MIG
// device, listed, and destroyed with its compute instance; a placement
// taken is ErrPlacementTaken; a compute instance that cannot be made leaves
// no GPU instance behind; destroying what is gone is no error.
func TestSlicesCreatedAndDestroyed(t *testing.T) {
	server, d, gpu := migGPU(t, 2, mig.A100_80GB)
	uuid := gpu.ID

	s, err := d.CreateSlice(&gpu, "3g.40gb", 4)
	if err != nil {
		t.Fatal(err)
	}
	a := s.Device.Attributes
	if !strings.HasPrefix(s.Device.ID, "MIG-") || s.Device.Kind != v1alpha1.DeviceKindNvidiaMIG || *a[v1alpha1.AttributeParent].StringValue != uuid ||
		*a[v1alpha1.AttributeMIGProfile].StringValue != "3g.40gb" || *a[v1alpha1.AttributeGPUInstanceID].IntValue != int64(s.GPUInstance) {
		t.Errorf("slice %+v", s)
	}
	if got := server.MIGInstances(uuid); fmt.Sprint(got) != "[3g.40gb@4]" {
		t.Errorf("instances %v", got)
	}
	// 4g.40gb starts only at 0 and overlaps nothing there; 2g.20gb at 4
	// overlaps the slice.
	if _, err := d.CreateSlice(&gpu, "2g.20gb", 4); !errors.Is(err, mig.ErrPlacementTaken) {
		t.Errorf("an overlapping slice: %v", err)
	}
	server.FailMIGCreate(uuid, lib.ERROR_UNKNOWN)
	if _, err := d.CreateSlice(&gpu, "9g.1tb", 0); err == nil || !strings.Contains(err.Error(), "offers no MIG profile 9g.1tb") {
		t.Errorf("an unknown profile: %v", err)
	}
	// The failure injected hits the GPU instance.
	if _, err := d.CreateSlice(&gpu, "1g.10gb", 0); err == nil {
		t.Error("an injected failure: created")
	}
	existing, err := d.SliceInstances(&gpu)
	if err != nil {
		t.Fatal(err)
	}
	if len(existing) != 1 || existing[0] != (mig.Existing{GPU: uuid, Profile: "3g.40gb", Start: 4, GPUInstance: s.GPUInstance}) {
		t.Errorf("existing %+v", existing)
	}
	if err := d.DestroySlice(uuid, s.GPUInstance); err != nil {
		t.Fatal(err)
	}
	if got := server.MIGInstances(uuid); len(got) != 0 {
		t.Errorf("instances after destroying: %v", got)
	}
	if err := d.DestroySlice(uuid, s.GPUInstance); err != nil {
		t.Errorf("destroying again: %v", err)
	}
	// The whole GPU, then: every slice is free again.
	if _, err := d.CreateSlice(&gpu, "7g.80gb", 0); err != nil {
		t.Fatal(err)
	}
	if got := server.MIGInstances(uuid); !slices.Equal(got, []string{"7g.80gb@0"}) {
		t.Errorf("instances %v", got)
	}
}

// TestSliceComputeFailureLeavesNothing: the compute instance refused, the
// GPU instance made for it is destroyed again.
func TestSliceComputeFailureLeavesNothing(t *testing.T) {
	server, d, gpu := migGPU(t, 0, mig.H100_80GB)
	uuid := gpu.ID
	dev := server.Devices[0].(*dgxa100.Device)
	create := dev.CreateGpuInstanceWithPlacementFunc
	dev.CreateGpuInstanceWithPlacementFunc = func(info *lib.GpuInstanceProfileInfo, p *lib.GpuInstancePlacement) (lib.GpuInstance, lib.Return) {
		gi, ret := create(info, p)
		server.FailMIGCreate(uuid, lib.ERROR_UNKNOWN) // the compute instance's turn
		return gi, ret
	}
	if _, err := d.CreateSlice(&gpu, "2g.20gb", 2); err == nil || !strings.Contains(err.Error(), "compute instance") {
		t.Fatalf("created, or another failure: %v", err)
	}
	if got := server.MIGInstances(uuid); len(got) != 0 {
		t.Errorf("left behind: %v", got)
	}
}
