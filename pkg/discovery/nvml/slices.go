package nvml

import (
	"errors"
	"fmt"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/mig"
)

// MIG slices made on demand (docs/mig.md): the node agent creates a GPU
// instance of a profile at a placement and its one compute instance (all
// of the GPU instance's compute slices: a MIG device as nvidia-smi and
// mig-parted make them), and destroys both once no pod holds them. It never
// changes a GPU's MIG mode. Creating and destroying needs the MIG
// configuration capability (/proc/driver/nvidia/capabilities/mig/config),
// which the privileged agent has.

// Slice is a MIG slice the agent created: NVML's GPU instance id and the
// MIG device, described as discovery describes one.
type Slice struct {
	GPUInstance uint32
	Device      v1alpha1.Device
}

// CreateSlice creates the slice of profile at start on the GPU gpu
// describes (as Discover described it: its MIG device inherits its
// attributes). A placement already taken is mig.ErrPlacementTaken. A GPU
// instance whose compute instance cannot be made is destroyed again, so a
// failure leaves nothing behind.
func (d *Discoverer) CreateSlice(gpu *v1alpha1.Device, profile string, start int) (Slice, error) {
	parent, ret := d.lib.DeviceGetHandleByUUID(gpu.ID)
	if ret != lib.SUCCESS {
		return Slice{}, fmt.Errorf("GPU %s: %s", gpu.ID, ret.Error())
	}
	gpuMemory, ok := gpu.Attributes[v1alpha1.AttributeMemory]
	if !ok || gpuMemory.QuantityValue == nil {
		return Slice{}, fmt.Errorf("GPU %s: its memory is not known, so its profiles cannot be named", gpu.ID)
	}
	profiles := gpuInstanceProfiles(parent)
	info, found := lib.GpuInstanceProfileInfo{}, false
	for _, p := range profiles {
		if migProfileName(p.index, p.info.SliceCount, p.info.SliceCount, p.info.MemorySizeMB, uint64(gpuMemory.QuantityValue.Value())) == profile {
			info, found = p.info, true
			break
		}
	}
	if !found {
		return Slice{}, fmt.Errorf("GPU %s offers no MIG profile %s", gpu.ID, profile)
	}
	placements, ret := parent.GetGpuInstancePossiblePlacements(&info)
	if ret != lib.SUCCESS || len(placements) == 0 {
		return Slice{}, fmt.Errorf("GPU %s: placements of %s: %s", gpu.ID, profile, ret.Error())
	}
	placement := lib.GpuInstancePlacement{Start: uint32(start), Size: placements[0].Size}
	gi, ret := parent.CreateGpuInstanceWithPlacement(&info, &placement)
	switch {
	case ret == lib.ERROR_INSUFFICIENT_RESOURCES:
		return Slice{}, fmt.Errorf("GPU %s: %s at %d: %w (%s)", gpu.ID, profile, start, mig.ErrPlacementTaken, ret.Error())
	case ret != lib.SUCCESS:
		return Slice{}, fmt.Errorf("GPU %s: creating the GPU instance %s at %d: %s", gpu.ID, profile, start, ret.Error())
	}
	giInfo, ret := gi.GetInfo()
	if ret != lib.SUCCESS {
		_ = gi.Destroy()
		return Slice{}, fmt.Errorf("GPU %s: the GPU instance %s at %d: %s", gpu.ID, profile, start, ret.Error())
	}
	undo := func(err error) (Slice, error) {
		if ret := gi.Destroy(); ret != lib.SUCCESS {
			return Slice{}, fmt.Errorf("%w; destroying the GPU instance %d again: %s", err, giInfo.Id, ret.Error())
		}
		return Slice{}, err
	}
	ciIndex, ok := computeProfileOf(info.SliceCount)
	if !ok {
		return undo(fmt.Errorf("GPU %s: no compute instance profile of %d slices", gpu.ID, info.SliceCount))
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciIndex, lib.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != lib.SUCCESS {
		return undo(fmt.Errorf("GPU %s: compute instance profile of %s: %s", gpu.ID, profile, ret.Error()))
	}
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != lib.SUCCESS {
		return undo(fmt.Errorf("GPU %s: creating the compute instance of %s at %d: %s", gpu.ID, profile, start, ret.Error()))
	}
	dev, err := d.migDeviceOf(parent, gpu, giInfo.Id, profiles)
	if err != nil {
		return Slice{}, fmt.Errorf("GPU %s: the MIG device of %s at %d (GPU instance %d, kept, the agent's record names it): %w", gpu.ID, profile, start, giInfo.Id, err)
	}
	return Slice{GPUInstance: giInfo.Id, Device: dev}, nil
}

// computeProfileOf is the COMPUTE_INSTANCE_PROFILE_* index of a compute
// instance of slices compute slices.
func computeProfileOf(slices uint32) (int, bool) {
	switch slices {
	case 1:
		return lib.COMPUTE_INSTANCE_PROFILE_1_SLICE, true
	case 2:
		return lib.COMPUTE_INSTANCE_PROFILE_2_SLICE, true
	case 3:
		return lib.COMPUTE_INSTANCE_PROFILE_3_SLICE, true
	case 4:
		return lib.COMPUTE_INSTANCE_PROFILE_4_SLICE, true
	case 6:
		return lib.COMPUTE_INSTANCE_PROFILE_6_SLICE, true
	case 7:
		return lib.COMPUTE_INSTANCE_PROFILE_7_SLICE, true
	case 8:
		return lib.COMPUTE_INSTANCE_PROFILE_8_SLICE, true
	}
	return 0, false
}

// migDeviceOf describes the MIG device of GPU instance giID on parent.
func (d *Discoverer) migDeviceOf(parent lib.Device, gpu *v1alpha1.Device, giID uint32, profiles map[uint32]gpuInstanceProfile) (v1alpha1.Device, error) {
	count, ret := parent.GetMaxMigDeviceCount()
	if ret != lib.SUCCESS {
		return v1alpha1.Device{}, fmt.Errorf("MIG device count: %s", ret.Error())
	}
	for i := range count {
		handle, ret := parent.GetMigDeviceHandleByIndex(i)
		if ret != lib.SUCCESS {
			continue
		}
		if id, ret := handle.GetGpuInstanceId(); ret != lib.SUCCESS || uint32(id) != giID {
			continue
		}
		return describeMIG(parent, handle, gpu, profiles)
	}
	return v1alpha1.Device{}, errors.New("NVML lists no MIG device in it")
}

// DestroySlice destroys GPU instance giID on GPU gpu and its compute
// instances. An instance already gone is not an error: it is what was
// asked.
func (d *Discoverer) DestroySlice(gpu string, giID uint32) error {
	parent, ret := d.lib.DeviceGetHandleByUUID(gpu)
	if ret != lib.SUCCESS {
		return fmt.Errorf("GPU %s: %s", gpu, ret.Error())
	}
	gi, ret := parent.GetGpuInstanceById(int(giID))
	switch {
	case ret == lib.ERROR_NOT_FOUND || ret == lib.ERROR_INVALID_ARGUMENT:
		return nil
	case ret != lib.SUCCESS:
		return fmt.Errorf("GPU %s: GPU instance %d: %s", gpu, giID, ret.Error())
	}
	for ci := range lib.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(ci, lib.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != lib.SUCCESS {
			continue
		}
		cis, ret := gi.GetComputeInstances(&info)
		if ret != lib.SUCCESS {
			continue
		}
		for _, c := range cis {
			if ret := c.Destroy(); ret != lib.SUCCESS {
				return fmt.Errorf("GPU %s: a compute instance of GPU instance %d: %s", gpu, giID, ret.Error())
			}
		}
	}
	if ret := gi.Destroy(); ret != lib.SUCCESS {
		return fmt.Errorf("GPU %s: destroying GPU instance %d: %s", gpu, giID, ret.Error())
	}
	return nil
}

// SliceInstances lists the GPU instances on GPU gpu, for the agent's
// reconciliation (mig.Reconcile): profile (named as the geometry names
// it), start and NVML's id.
func (d *Discoverer) SliceInstances(gpu *v1alpha1.Device) ([]mig.Existing, error) {
	parent, ret := d.lib.DeviceGetHandleByUUID(gpu.ID)
	if ret != lib.SUCCESS {
		return nil, fmt.Errorf("GPU %s: %s", gpu.ID, ret.Error())
	}
	gpuMemory, ok := gpu.Attributes[v1alpha1.AttributeMemory]
	if !ok || gpuMemory.QuantityValue == nil {
		return nil, fmt.Errorf("GPU %s: its memory is not known, so its profiles cannot be named", gpu.ID)
	}
	var out []mig.Existing
	for _, p := range gpuInstanceProfiles(parent) {
		info := p.info
		gis, ret := parent.GetGpuInstances(&info)
		if ret != lib.SUCCESS {
			return nil, fmt.Errorf("GPU %s: instances: %s", gpu.ID, ret.Error())
		}
		name := migProfileName(p.index, info.SliceCount, info.SliceCount, info.MemorySizeMB, uint64(gpuMemory.QuantityValue.Value()))
		for _, gi := range gis {
			giInfo, ret := gi.GetInfo()
			if ret != lib.SUCCESS {
				return nil, fmt.Errorf("GPU %s: an instance of %s: %s", gpu.ID, name, ret.Error())
			}
			out = append(out, mig.Existing{GPU: gpu.ID, Profile: name, Start: int(giInfo.Placement.Start), GPUInstance: giInfo.Id})
		}
	}
	return out, nil
}
