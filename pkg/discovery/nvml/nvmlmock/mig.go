package nvmlmock

import (
	"crypto/rand"
	"fmt"
	"slices"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/resclass/resclass/pkg/mig"
)

// MIG on a GPU, as NVML does it and go-nvml's DGX A100 mock does not: the
// mock creates instances anywhere (overlapping placements, no instance
// limit), names no MIG device and knows one table. EnableMIG gives a GPU a
// table of pkg/mig (the A100 or the H100's) and NVML's rules: a GPU instance
// is refused where its slices overlap another's or its profile's limit is
// reached, a GPU instance with compute instances cannot be destroyed, every
// compute instance is a MIG device with its own UUID, and the next creation
// can be made to fail (FailMIGCreate).

// ProfileIDs are the GPU instance profile ids NVML reports on the A100 and
// H100 (nvidia-smi mig -lgip), by GPU_INSTANCE_PROFILE_* index: not the index
// itself, so that code looking a profile up by its id as an index fails here
// as on a GPU.
var ProfileIDs = map[int]uint32{
	lib.GPU_INSTANCE_PROFILE_1_SLICE:      19,
	lib.GPU_INSTANCE_PROFILE_1_SLICE_REV1: 20,
	lib.GPU_INSTANCE_PROFILE_1_SLICE_REV2: 15,
	lib.GPU_INSTANCE_PROFILE_2_SLICE:      14,
	lib.GPU_INSTANCE_PROFILE_3_SLICE:      9,
	lib.GPU_INSTANCE_PROFILE_4_SLICE:      5,
	lib.GPU_INSTANCE_PROFILE_7_SLICE:      0,
}

// profileIndex is the GPU_INSTANCE_PROFILE_* index of a profile of the
// seven-slice tables: by its slices, compute and media extensions.
func profileIndex(p *mig.Profile) (int, bool) {
	media := p.OFAs > 0 && p.Size == 1 && p.Max == 1
	switch {
	case p.Size == 1 && media:
		return lib.GPU_INSTANCE_PROFILE_1_SLICE_REV1, true
	case p.Size == 1:
		return lib.GPU_INSTANCE_PROFILE_1_SLICE, true
	case p.Size == 2 && p.Compute == 1:
		return lib.GPU_INSTANCE_PROFILE_1_SLICE_REV2, true
	case p.Size == 2 && p.Compute == 2:
		return lib.GPU_INSTANCE_PROFILE_2_SLICE, true
	case p.Size == 4 && p.Compute == 3:
		return lib.GPU_INSTANCE_PROFILE_3_SLICE, true
	case p.Size == 4 && p.Compute == 4:
		return lib.GPU_INSTANCE_PROFILE_4_SLICE, true
	case p.Size == 8 && p.Compute == 7:
		return lib.GPU_INSTANCE_PROFILE_7_SLICE, true
	}
	return 0, false
}

// computeProfileIndex is the COMPUTE_INSTANCE_PROFILE_* index of a compute
// instance of compute slices.
var computeProfileIndex = map[int]int{
	1: lib.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: lib.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: lib.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: lib.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	7: lib.COMPUTE_INSTANCE_PROFILE_7_SLICE,
}

// migGPU is a GPU's MIG state.
type migGPU struct {
	dev       *dgxa100.Device
	table     *mig.Table
	slices    *mig.GPU
	instances []*gpuInstance // by id order
	nextGI    uint32
	failNext  lib.Return // the next creation's answer, SUCCESS when none is set
	// midway, if set, runs once between the next GPU instance's creation
	// and its compute instance's (OnMIGCreate).
	midway func()
}

// gpuInstance is one GPU instance and its compute instances.
type gpuInstance struct {
	*mock.GpuInstance
	gpu     *migGPU
	info    lib.GpuInstanceInfo
	profile *mig.Profile
	cis     []*computeInstance
	nextCI  uint32
}

// computeInstance is one compute instance: a MIG device.
type computeInstance struct {
	*mock.ComputeInstance
	gi     *gpuInstance
	info   lib.ComputeInstanceInfo
	uuid   string
	handle *mock.Device
}

// EnableMIG puts the GPU uuid in MIG mode with table's profiles (its name and
// memory become the table's product's) and no instance.
func (s *Server) EnableMIG(gpuUUID string, table *mig.Table) error {
	d, _ := s.device(gpuUUID).(*dgxa100.Device)
	if d == nil {
		return fmt.Errorf("no GPU %s", gpuUUID)
	}
	ids := map[uint32]*mig.Profile{}
	for i := range table.Profiles {
		p := &table.Profiles[i]
		index, ok := profileIndex(p)
		if !ok {
			return fmt.Errorf("%s: profile %s has no NVML index here", table.Product, p.Name)
		}
		ids[ProfileIDs[index]] = p
	}
	g := &migGPU{dev: d, table: table, slices: mig.NewGPU(table), failNext: lib.SUCCESS}
	s.mu.Lock()
	if s.mig == nil {
		s.mig = map[string]*migGPU{}
	}
	s.mig[gpuUUID] = g
	s.mu.Unlock()

	s.mu.Lock()
	d.Name = "Mock " + table.Product
	d.MemoryInfo.Total = uint64(table.MemoryMiB) << 20
	s.mu.Unlock()
	d.MigMode = lib.DEVICE_MIG_ENABLE
	d.GetMigModeFunc = func() (int, int, lib.Return) { return lib.DEVICE_MIG_ENABLE, lib.DEVICE_MIG_ENABLE, lib.SUCCESS }
	d.GetGpuInstanceProfileInfoFunc = func(index int) (lib.GpuInstanceProfileInfo, lib.Return) {
		id, known := ProfileIDs[index]
		p := ids[id]
		if !known || p == nil {
			return lib.GpuInstanceProfileInfo{}, lib.ERROR_NOT_SUPPORTED
		}
		return profileInfo(id, p), lib.SUCCESS
	}
	d.GetGpuInstancePossiblePlacementsFunc = func(info *lib.GpuInstanceProfileInfo) ([]lib.GpuInstancePlacement, lib.Return) {
		p := ids[info.Id]
		if p == nil {
			return nil, lib.ERROR_INVALID_ARGUMENT
		}
		var out []lib.GpuInstancePlacement
		for _, start := range p.Starts {
			out = append(out, lib.GpuInstancePlacement{Start: uint32(start), Size: uint32(p.Size)})
		}
		return out, lib.SUCCESS
	}
	d.CreateGpuInstanceWithPlacementFunc = func(info *lib.GpuInstanceProfileInfo, placement *lib.GpuInstancePlacement) (lib.GpuInstance, lib.Return) {
		p := ids[info.Id]
		if p == nil || placement == nil || placement.Size != uint32(p.Size) {
			return nil, lib.ERROR_INVALID_ARGUMENT
		}
		return s.createGI(g, info.Id, p, int(placement.Start))
	}
	d.CreateGpuInstanceFunc = func(info *lib.GpuInstanceProfileInfo) (lib.GpuInstance, lib.Return) {
		p := ids[info.Id]
		if p == nil {
			return nil, lib.ERROR_INVALID_ARGUMENT
		}
		s.mu.Lock()
		start := -1
		for _, st := range p.Starts {
			if g.slices.Fits(p, st) {
				start = st
				break
			}
		}
		s.mu.Unlock()
		if start < 0 {
			return nil, lib.ERROR_INSUFFICIENT_RESOURCES
		}
		return s.createGI(g, info.Id, p, start)
	}
	d.GetGpuInstancesFunc = func(info *lib.GpuInstanceProfileInfo) ([]lib.GpuInstance, lib.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		var out []lib.GpuInstance
		for _, gi := range g.instances {
			if gi.info.ProfileId == info.Id {
				out = append(out, gi)
			}
		}
		return out, lib.SUCCESS
	}
	d.GetGpuInstanceByIdFunc = func(id int) (lib.GpuInstance, lib.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, gi := range g.instances {
			if gi.info.Id == uint32(id) {
				return gi, lib.SUCCESS
			}
		}
		return nil, lib.ERROR_NOT_FOUND
	}
	d.GetMaxMigDeviceCountFunc = func() (int, lib.Return) { return 7, lib.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(i int) (lib.Device, lib.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		var all []*computeInstance
		for _, gi := range g.instances {
			all = append(all, gi.cis...)
		}
		if i < 0 || i >= len(all) {
			return nil, lib.ERROR_NOT_FOUND
		}
		return all[i].handle, lib.SUCCESS
	}
	return nil
}

// FailMIGCreate makes the next creation of a GPU or compute instance on GPU
// uuid answer ret (ERROR_INSUFFICIENT_RESOURCES, ERROR_UNKNOWN, ...).
func (s *Server) FailMIGCreate(gpuUUID string, ret lib.Return) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.mig[gpuUUID]; g != nil {
		g.failNext = ret
	}
}

// OnMIGCreate runs f once, the next time a compute instance is created on
// GPU gpuUUID: its GPU instance exists, its MIG device not yet. Tests
// stage what happens while a slice is half made.
func (s *Server) OnMIGCreate(gpuUUID string, f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.mig[gpuUUID]; g != nil {
		g.midway = f
	}
}

// MIGInstances lists the GPU instances on GPU uuid as "<profile>@<start>",
// for tests to compare.
func (s *Server) MIGInstances(gpuUUID string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	if g := s.mig[gpuUUID]; g != nil {
		for _, gi := range g.instances {
			out = append(out, fmt.Sprintf("%s@%d", gi.profile.Name, gi.info.Placement.Start))
		}
	}
	return out
}

func profileInfo(id uint32, p *mig.Profile) lib.GpuInstanceProfileInfo {
	return lib.GpuInstanceProfileInfo{
		Id: id, SliceCount: uint32(p.Compute), InstanceCount: uint32(p.Max), MultiprocessorCount: uint32(p.Multiprocessors),
		CopyEngineCount: uint32(p.Compute), DecoderCount: uint32(p.Decoders), JpegCount: uint32(p.JPEGs), OfaCount: uint32(p.OFAs),
		MemorySizeMB: uint64(p.MemoryMiB),
	}
}

// createGI creates a GPU instance of p at start, as NVML: refused where it
// does not fit.
func (s *Server) createGI(g *migGPU, id uint32, p *mig.Profile, start int) (lib.GpuInstance, lib.Return) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ret := g.failNext; ret != lib.SUCCESS {
		g.failNext = lib.SUCCESS
		return nil, ret
	}
	if err := g.slices.Add(p, start); err != nil {
		return nil, lib.ERROR_INSUFFICIENT_RESOURCES
	}
	gi := &gpuInstance{gpu: g, profile: p, info: lib.GpuInstanceInfo{
		Device: g.dev, Id: g.nextGI, ProfileId: id, Placement: lib.GpuInstancePlacement{Start: uint32(start), Size: uint32(p.Size)},
	}}
	g.nextGI++
	gi.GpuInstance = &mock.GpuInstance{
		GetInfoFunc: func() (lib.GpuInstanceInfo, lib.Return) { return gi.info, lib.SUCCESS },
		GetComputeInstanceProfileInfoFunc: func(profile, engine int) (lib.ComputeInstanceProfileInfo, lib.Return) {
			if engine != lib.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED || profile != computeProfileIndex[p.Compute] {
				return lib.ComputeInstanceProfileInfo{}, lib.ERROR_NOT_SUPPORTED
			}
			return lib.ComputeInstanceProfileInfo{Id: uint32(profile), SliceCount: uint32(p.Compute), InstanceCount: 1, MultiprocessorCount: uint32(p.Multiprocessors)}, lib.SUCCESS
		},
		CreateComputeInstanceFunc: func(info *lib.ComputeInstanceProfileInfo) (lib.ComputeInstance, lib.Return) {
			return s.createCI(gi, info)
		},
		GetComputeInstancesFunc: func(info *lib.ComputeInstanceProfileInfo) ([]lib.ComputeInstance, lib.Return) {
			s.mu.Lock()
			defer s.mu.Unlock()
			var out []lib.ComputeInstance
			for _, ci := range gi.cis {
				if ci.info.ProfileId == info.Id {
					out = append(out, ci)
				}
			}
			return out, lib.SUCCESS
		},
		DestroyFunc: func() lib.Return {
			s.mu.Lock()
			defer s.mu.Unlock()
			i := slices.Index(g.instances, gi)
			switch {
			case i < 0:
				return lib.ERROR_INVALID_ARGUMENT
			case len(gi.cis) > 0:
				return lib.ERROR_IN_USE
			}
			if err := g.slices.Remove(p, start); err != nil {
				return lib.ERROR_UNKNOWN
			}
			g.instances = slices.Delete(g.instances, i, i+1)
			return lib.SUCCESS
		},
	}
	g.instances = append(g.instances, gi)
	return gi, lib.SUCCESS
}

// createCI creates the one compute instance a GPU instance takes here (all
// its compute slices), a MIG device with its own UUID.
func (s *Server) createCI(gi *gpuInstance, info *lib.ComputeInstanceProfileInfo) (lib.ComputeInstance, lib.Return) {
	s.mu.Lock()
	midway := gi.gpu.midway
	gi.gpu.midway = nil
	s.mu.Unlock()
	if midway != nil {
		midway()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g := gi.gpu
	if ret := g.failNext; ret != lib.SUCCESS {
		g.failNext = lib.SUCCESS
		return nil, ret
	}
	if info == nil || info.SliceCount != uint32(gi.profile.Compute) {
		return nil, lib.ERROR_INVALID_ARGUMENT
	}
	if len(gi.cis) > 0 {
		return nil, lib.ERROR_INSUFFICIENT_RESOURCES
	}
	p := gi.profile
	ci := &computeInstance{gi: gi, uuid: "MIG-" + rand.Text(),
		info: lib.ComputeInstanceInfo{Device: g.dev, GpuInstance: gi, Id: gi.nextCI, ProfileId: info.Id}}
	gi.nextCI++
	giID, ciID := int(gi.info.Id), int(ci.info.Id)
	ci.handle = &mock.Device{
		GetUUIDFunc:                            func() (string, lib.Return) { return ci.uuid, lib.SUCCESS },
		GetGpuInstanceIdFunc:                   func() (int, lib.Return) { return giID, lib.SUCCESS },
		GetComputeInstanceIdFunc:               func() (int, lib.Return) { return ciID, lib.SUCCESS },
		IsMigDeviceHandleFunc:                  func() (bool, lib.Return) { return true, lib.SUCCESS },
		GetDeviceHandleFromMigDeviceHandleFunc: func() (lib.Device, lib.Return) { return g.dev, lib.SUCCESS },
		GetMemoryInfoFunc: func() (lib.Memory, lib.Return) {
			return lib.Memory{Total: uint64(p.MemoryMiB) << 20, Free: uint64(p.MemoryMiB) << 20}, lib.SUCCESS
		},
		GetAttributesFunc: func() (lib.DeviceAttributes, lib.Return) {
			return lib.DeviceAttributes{
				MultiprocessorCount: uint32(p.Multiprocessors), GpuInstanceSliceCount: uint32(p.Compute),
				ComputeInstanceSliceCount: uint32(p.Compute), MemorySizeMB: uint64(p.MemoryMiB),
				SharedDecoderCount: uint32(p.Decoders), SharedJpegCount: uint32(p.JPEGs), SharedOfaCount: uint32(p.OFAs),
			}, lib.SUCCESS
		},
	}
	ci.ComputeInstance = &mock.ComputeInstance{
		GetInfoFunc: func() (lib.ComputeInstanceInfo, lib.Return) { return ci.info, lib.SUCCESS },
		DestroyFunc: func() lib.Return {
			s.mu.Lock()
			defer s.mu.Unlock()
			i := slices.Index(gi.cis, ci)
			if i < 0 {
				return lib.ERROR_INVALID_ARGUMENT
			}
			gi.cis = slices.Delete(gi.cis, i, i+1)
			return lib.SUCCESS
		},
	}
	gi.cis = append(gi.cis, ci)
	return ci, lib.SUCCESS
}
