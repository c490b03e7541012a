package nvml

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"slices"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/mig"
)

// migDevices describes the MIG devices of parent, the GPU described as gpu, when
// it is in MIG mode. They are enumerated the way NVIDIA's k8s-device-plugin
// does it (go-nvlib's VisitMigDevices): every index below GetMaxMigDeviceCount,
// an empty slot answering NOT_FOUND or INVALID_ARGUMENT.
//
// A MIG device that cannot be enumerated or whose UUID cannot be read is left out,
// and gpu is marked unhealthy with the reason: it cannot be published without a
// name, and failing the whole discovery would hide every other device of the node,
// when the likely cause is a repartition under way that the next resync sees
// through. A MIG device that is named but not fully described is listed unhealthy,
// as a GPU is.
func (d *Discoverer) migDevices(parent lib.Device, gpu *v1alpha1.Device) []v1alpha1.Device {
	if on, ok := gpu.Attributes[v1alpha1.AttributeMIGEnabled]; !ok || !*on.BoolValue {
		return nil
	}
	var p problems
	defer func() { p.report(gpu) }()
	count, ret := parent.GetMaxMigDeviceCount()
	if !p.check("MIG device count", ret) {
		return nil
	}
	// Looked up once per GPU rather than per MIG device: every MIG device of a GPU
	// draws on the same table.
	profiles := gpuInstanceProfiles(parent)
	if gpuMemory, ok := gpu.Attributes[v1alpha1.AttributeMemory]; ok {
		gpu.MIG = migGeometry(parent, profiles, uint64(gpuMemory.QuantityValue.Value()))
	}
	var out []v1alpha1.Device
	for i := range count {
		handle, ret := parent.GetMigDeviceHandleByIndex(i)
		if ret == lib.ERROR_NOT_FOUND || ret == lib.ERROR_INVALID_ARGUMENT {
			continue
		}
		what := fmt.Sprintf("MIG device %d", i)
		if !p.check(what, ret) {
			continue
		}
		dev, err := describeMIG(parent, handle, gpu, profiles)
		if err != nil {
			p.add(what, err.Error())
			continue
		}
		out = append(out, dev)
	}
	return out
}

// describeMIG describes one MIG device of parent (described as gpu). It fails
// only when the device cannot be named.
func describeMIG(parent, handle lib.Device, gpu *v1alpha1.Device, profiles map[uint32]gpuInstanceProfile) (v1alpha1.Device, error) {
	uuid, ret := handle.GetUUID()
	if ret != lib.SUCCESS {
		return v1alpha1.Device{}, fmt.Errorf("UUID: %s", ret.Error())
	}
	dev := v1alpha1.Device{ID: uuid, Kind: v1alpha1.DeviceKindNvidiaMIG, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{}}
	attrs := dev.Attributes
	attrs[v1alpha1.AttributeParent] = v1alpha1.StringAttribute(gpu.ID)
	for _, name := range mig.Inherited {
		if a, ok := gpu.Attributes[name]; ok {
			attrs[name] = *a.DeepCopy()
		}
	}
	var p problems
	giID, ret := handle.GetGpuInstanceId()
	haveGI := p.check("GPU instance id", ret)
	if haveGI {
		attrs[v1alpha1.AttributeGPUInstanceID] = v1alpha1.IntAttribute(int64(giID))
	}
	if ciID, ret := handle.GetComputeInstanceId(); p.check("compute instance id", ret) {
		attrs[v1alpha1.AttributeComputeInstanceID] = v1alpha1.IntAttribute(int64(ciID))
	}
	if mem, ret := handle.GetMemoryInfo(); p.check("memory", ret) {
		attrs[v1alpha1.AttributeMemory] = v1alpha1.QuantityAttribute(*resource.NewQuantity(int64(mem.Total), resource.BinarySI))
	}
	info, ret := handle.GetAttributes()
	haveInfo := p.check("attributes", ret)
	if haveInfo {
		attrs[v1alpha1.AttributeMultiprocessors] = v1alpha1.IntAttribute(int64(info.MultiprocessorCount))
	}
	// The profile is named after the GPU's memory; without it (the GPU already
	// says why) the name is left out.
	gpuMemory, haveGPUMemory := gpu.Attributes[v1alpha1.AttributeMemory]
	if haveGI && haveInfo && haveGPUMemory {
		if name, err := migProfile(parent, giID, info.ComputeInstanceSliceCount, uint64(gpuMemory.QuantityValue.Value()), profiles); err != nil {
			p.add("MIG profile", err.Error())
		} else {
			attrs[v1alpha1.AttributeMIGProfile] = v1alpha1.StringAttribute(name)
		}
	}
	p.report(&dev)
	return dev, nil
}

// gpuInstanceProfile is one GPU instance profile a GPU offers: index is its
// GPU_INSTANCE_PROFILE_* constant, which tells the variants of a size apart (with
// or without media extensions, say).
type gpuInstanceProfile struct {
	index int
	info  lib.GpuInstanceProfileInfo
}

// gpuInstanceProfiles maps the profile ids of parent's GPU instance profiles
// (what GpuInstanceInfo.ProfileId holds: 19 for 1g.5gb on an A100) to the
// profiles. The id is not the GPU_INSTANCE_PROFILE_* index that
// GetGpuInstanceProfileInfo takes, so every index is asked, as go-nvlib does; an
// index the GPU does not offer answers NOT_SUPPORTED or INVALID_ARGUMENT.
func gpuInstanceProfiles(parent lib.Device) map[uint32]gpuInstanceProfile {
	profiles := map[uint32]gpuInstanceProfile{}
	for i := range lib.GPU_INSTANCE_PROFILE_COUNT {
		if info, ret := parent.GetGpuInstanceProfileInfo(i); ret == lib.SUCCESS {
			profiles[info.Id] = gpuInstanceProfile{index: i, info: info}
		}
	}
	return profiles
}

// migProfile names the profile of the MIG device in GPU instance giID of parent,
// whose compute instance has ciSlices slices.
func migProfile(parent lib.Device, giID int, ciSlices uint32, gpuMemory uint64, profiles map[uint32]gpuInstanceProfile) (string, error) {
	gi, ret := parent.GetGpuInstanceById(giID)
	if ret != lib.SUCCESS {
		return "", fmt.Errorf("GPU instance %d: %s", giID, ret.Error())
	}
	giInfo, ret := gi.GetInfo()
	if ret != lib.SUCCESS {
		return "", fmt.Errorf("GPU instance %d info: %s", giID, ret.Error())
	}
	profile, ok := profiles[giInfo.ProfileId]
	if !ok {
		return "", fmt.Errorf("GPU instance %d has profile %d, which the GPU does not list", giID, giInfo.ProfileId)
	}
	return migProfileName(profile.index, profile.info.SliceCount, ciSlices, profile.info.MemorySizeMB, gpuMemory), nil
}

// migProfileSuffix marks the GPU instance profiles that share their slice count
// and memory with another, as go-nvlib does.
var migProfileSuffix = map[int]string{
	lib.GPU_INSTANCE_PROFILE_1_SLICE_REV1:   "+me", // with media extensions
	lib.GPU_INSTANCE_PROFILE_2_SLICE_REV1:   "+me",
	lib.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: "+me.all",
	lib.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME: "+me.all",
	lib.GPU_INSTANCE_PROFILE_1_SLICE_GFX:    "+gfx",
	lib.GPU_INSTANCE_PROFILE_2_SLICE_GFX:    "+gfx",
	lib.GPU_INSTANCE_PROFILE_4_SLICE_GFX:    "+gfx",
	lib.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME:  "-me",
	lib.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:  "-me",
}

// migProfileName names a MIG profile as nvidia-smi, mig-parted and the
// k8s-device-plugin do, so that a class written against their names ("1g.5gb",
// "1c.3g.20gb", "1g.10gb+me") matches. The rule is go-nvlib's
// (pkg/nvlib/device/mig_profile.go: MigProfileInfo.String and
// getMigMemorySizeGB):
//
//   - "<g>g.<gb>gb", prefixed "<c>c." when the compute instance has fewer slices
//     than its GPU instance, suffixed per migProfileSuffix;
//   - gb is not the profile's memory rounded to GB: it is the profile's share of
//     the GPU's memory, rounded up to eighths, times the GPU's memory in whole GiB
//     (rounded up), rounded to the nearest. A 4864 MiB slice of a 40 GiB A100 is
//     "5gb" either way, but 11008 MiB of a 95830 MiB GPU is 12gb by this rule
//     where 11 by rounding up the MiB.
//
// The arithmetic is go-nvlib's, in integers so that no share that is a whole
// number of eighths is rounded up by a float error.
func migProfileName(profileIndex int, giSlices, ciSlices uint32, profileMB, gpuMemory uint64) string {
	name := fmt.Sprintf("%dg.%dgb", giSlices, migMemoryGB(profileMB, gpuMemory))
	if ciSlices != giSlices {
		name = fmt.Sprintf("%dc.%s", ciSlices, name)
	}
	return name + migProfileSuffix[profileIndex]
}

// migMemoryGB is the "gb" of a profile's name; see migProfileName. NVML's
// answers are not trusted to be sane: the products are taken in 128 bits, so
// no profile or GPU size wraps around into a plausible name.
func migMemoryGB(profileMB, gpuMemory uint64) uint64 {
	const gib = 1 << 30
	if gpuMemory == 0 {
		return 0
	}
	// eighths = ceil(profileMB * 2^20 * 8 / gpuMemory)
	hi, lo := bits.Mul64(profileMB, 8<<20)
	if hi >= gpuMemory {
		return math.MaxUint64 // a profile larger than 2^64 eighths of its GPU
	}
	eighths, rem := bits.Div64(hi, lo, gpuMemory)
	if rem != 0 {
		if eighths == math.MaxUint64 {
			return math.MaxUint64
		}
		eighths++
	}
	gpuGiB := gpuMemory/gib + min(1, gpuMemory%gib)
	// (eighths * gpuGiB + 4) / 8
	hi, lo = bits.Mul64(eighths, gpuGiB)
	lo, carry := bits.Add64(lo, 4, 0)
	hi += carry
	if hi >= 8 {
		return math.MaxUint64
	}
	gb, _ := bits.Div64(hi, lo, 8)
	return gb
}

// migGeometry is parent's MIG geometry: its GPU instance profiles (named as
// migProfileName names a MIG device's), where each may be placed, and the GPU
// instances that exist, for the NodeDevices that lets the scheduler work out
// what can still be created (docs/mig.md). NVML's answers cross a trust
// boundary: a placement outside the GPU's slices or of another size than
// its profile's others, a profile without placements or with a name already
// taken, and an instance that overlaps another are left out, so what is
// published always describes a GPU that could exist. nil when no profile is
// left (the GPU is then published without it, its MIG devices as before).
func migGeometry(parent lib.Device, profiles map[uint32]gpuInstanceProfile, gpuMemory uint64) *v1alpha1.DeviceMIG {
	out := &v1alpha1.DeviceMIG{}
	names := map[string]bool{}
	var used uint16 // the slices the instances listed so far take
	for _, id := range slices.Sorted(maps.Keys(profiles)) {
		profile := profiles[id]
		info := profile.info
		placements, ret := parent.GetGpuInstancePossiblePlacements(&info)
		if ret != lib.SUCCESS || len(placements) == 0 || len(placements) > v1alpha1.MIGSlices {
			continue
		}
		size := placements[0].Size
		var starts []int32
		for _, pl := range placements {
			if pl.Size != size || size == 0 || size > v1alpha1.MIGSlices || pl.Start >= v1alpha1.MIGSlices || pl.Start+pl.Size > v1alpha1.MIGSlices {
				starts = nil
				break
			}
			starts = append(starts, int32(pl.Start))
		}
		name := migProfileName(profile.index, info.SliceCount, info.SliceCount, info.MemorySizeMB, gpuMemory)
		if len(starts) == 0 || names[name] || info.SliceCount < 1 || info.SliceCount > v1alpha1.MIGSlices ||
			info.InstanceCount < 1 || info.InstanceCount > v1alpha1.MIGSlices || info.MemorySizeMB == 0 || info.MemorySizeMB > gpuMemory>>20 {
			continue
		}
		names[name] = true
		slices.Sort(starts)
		out.Profiles = append(out.Profiles, v1alpha1.MIGProfile{
			Name: name, Slices: int32(size), Compute: int32(info.SliceCount),
			Memory:          *resource.NewQuantity(int64(info.MemorySizeMB<<20), resource.BinarySI),
			Multiprocessors: int32(min(info.MultiprocessorCount, 1024)),
			Decoders:        int32(min(info.DecoderCount, 64)), JPEGs: int32(min(info.JpegCount, 64)), OFAs: int32(min(info.OfaCount, 64)),
			Placements: slices.Compact(starts), Max: int32(info.InstanceCount),
		})
		instances, ret := parent.GetGpuInstances(&info)
		if ret != lib.SUCCESS {
			continue
		}
		for _, gi := range instances {
			giInfo, ret := gi.GetInfo()
			if ret != lib.SUCCESS || giInfo.Placement.Size != size || !slices.Contains(starts, int32(giInfo.Placement.Start)) {
				continue
			}
			mask := uint16((1<<size)-1) << giInfo.Placement.Start
			if used&mask != 0 || len(out.Instances) == v1alpha1.MIGSlices {
				continue
			}
			used |= mask
			out.Instances = append(out.Instances, v1alpha1.MIGInstance{Profile: name, Start: int32(giInfo.Placement.Start)})
		}
	}
	if len(out.Profiles) == 0 {
		return nil
	}
	slices.SortFunc(out.Profiles, func(a, b v1alpha1.MIGProfile) int {
		return cmp.Or(cmp.Compare(a.Slices, b.Slices), cmp.Compare(a.Compute, b.Compute), a.Memory.Cmp(b.Memory),
			cmp.Compare(a.Decoders+a.JPEGs+a.OFAs, b.Decoders+b.JPEGs+b.OFAs), cmp.Compare(a.Name, b.Name))
	})
	slices.SortFunc(out.Instances, func(a, b v1alpha1.MIGInstance) int { return cmp.Compare(a.Start, b.Start) })
	return out
}
