package nvml

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strings"
	"testing"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// a100ProfileIDs are the GPU instance profile ids an A100-SXM4-40GB reports
// (nvidia-smi mig -lgip). The mock uses the GPU_INSTANCE_PROFILE_* indices as ids
// instead, which would hide a lookup of a profile by its id as an index.
var a100ProfileIDs = map[int]uint32{
	lib.GPU_INSTANCE_PROFILE_1_SLICE:      19,
	lib.GPU_INSTANCE_PROFILE_1_SLICE_REV1: 20,
	lib.GPU_INSTANCE_PROFILE_1_SLICE_REV2: 15,
	lib.GPU_INSTANCE_PROFILE_2_SLICE:      14,
	lib.GPU_INSTANCE_PROFILE_3_SLICE:      9,
	lib.GPU_INSTANCE_PROFILE_4_SLICE:      5,
	lib.GPU_INSTANCE_PROFILE_7_SLICE:      0,
}

// gpuInstance is one GPU instance a test creates: its GPU_INSTANCE_PROFILE_*
// index and the slice counts of its compute instances, one MIG device each.
type gpuInstance struct {
	profile       int
	computeSlices []uint32
}

// partition puts dev in MIG mode with the given GPU instances (numbered from 0 in
// order) and makes NVML hand out a MIG device per compute instance, in order, as
// GetMigDeviceHandleByIndex does on a GPU. It returns the MIG devices' mocks, each
// named "MIG-<GPU index>-<GI>-<CI>".
func partition(t *testing.T, dev *dgxa100.Device, layout ...gpuInstance) []*mock.Device {
	t.Helper()
	dev.MigMode = lib.DEVICE_MIG_ENABLE
	profileInfo := dev.GetGpuInstanceProfileInfoFunc
	dev.GetGpuInstanceProfileInfoFunc = func(i int) (lib.GpuInstanceProfileInfo, lib.Return) {
		info, ret := profileInfo(i)
		info.Id = a100ProfileIDs[i]
		return info, ret
	}
	dev.GetGpuInstanceByIdFunc = func(id int) (lib.GpuInstance, lib.Return) {
		dev.RLock()
		defer dev.RUnlock()
		for gi := range dev.GpuInstances {
			if gi.Info.Id == uint32(id) {
				return gi, lib.SUCCESS
			}
		}
		return nil, lib.ERROR_NOT_FOUND
	}
	var migs []*mock.Device
	for _, l := range layout {
		profile, ret := dev.GetGpuInstanceProfileInfo(l.profile)
		if ret != lib.SUCCESS {
			t.Fatalf("profile %d: %v", l.profile, ret)
		}
		gi, _ := dev.CreateGpuInstance(&profile)
		giInfo, _ := gi.GetInfo()
		for ci, slices := range l.computeSlices {
			migs = append(migs, migDevice(fmt.Sprintf("MIG-%d-%d-%d", dev.Index, giInfo.Id, ci), int(giInfo.Id), ci, profile, slices))
		}
	}
	dev.GetMaxMigDeviceCountFunc = func() (int, lib.Return) { return 7, lib.SUCCESS }
	dev.GetMigDeviceHandleByIndexFunc = func(i int) (lib.Device, lib.Return) {
		if i < len(migs) {
			return migs[i], lib.SUCCESS
		}
		return nil, lib.ERROR_NOT_FOUND
	}
	return migs
}

// migDevice is a MIG device handle: compute instance ci, of ciSlices slices, in
// GPU instance gi of the given profile.
func migDevice(uuid string, gi, ci int, profile lib.GpuInstanceProfileInfo, ciSlices uint32) *mock.Device {
	return &mock.Device{
		GetUUIDFunc:              func() (string, lib.Return) { return uuid, lib.SUCCESS },
		GetGpuInstanceIdFunc:     func() (int, lib.Return) { return gi, lib.SUCCESS },
		GetComputeInstanceIdFunc: func() (int, lib.Return) { return ci, lib.SUCCESS },
		GetMemoryInfoFunc: func() (lib.Memory, lib.Return) {
			return lib.Memory{Total: profile.MemorySizeMB << 20}, lib.SUCCESS
		},
		GetAttributesFunc: func() (lib.DeviceAttributes, lib.Return) {
			return lib.DeviceAttributes{
				MultiprocessorCount:       profile.MultiprocessorCount / profile.SliceCount * ciSlices,
				GpuInstanceSliceCount:     profile.SliceCount,
				ComputeInstanceSliceCount: ciSlices,
				MemorySizeMB:              profile.MemorySizeMB,
			}, lib.SUCCESS
		},
	}
}

// attributes renders a device's attributes as strings.
func attributes(d v1alpha1.Device) map[string]string {
	out := map[string]string{}
	for name, a := range d.Attributes {
		out[name] = a.String()
	}
	return out
}

// migIDs lists the ids of the MIG devices among devices.
func migIDs(devices []v1alpha1.Device) []string {
	var ids []string
	for _, d := range devices {
		if d.Kind == v1alpha1.DeviceKindNvidiaMIG {
			ids = append(ids, d.ID)
		}
	}
	return ids
}

func byID(t *testing.T, devices []v1alpha1.Device, id string) v1alpha1.Device {
	t.Helper()
	for _, d := range devices {
		if d.ID == id {
			return d
		}
	}
	t.Fatalf("no device %s", id)
	return v1alpha1.Device{}
}

func TestMIGDevices(t *testing.T) {
	server, root := dgx(t)
	gpu0, gpu3 := server.Devices[0].(*dgxa100.Device), server.Devices[3].(*dgxa100.Device)
	partition(t, gpu0,
		gpuInstance{lib.GPU_INSTANCE_PROFILE_3_SLICE, []uint32{3}},
		gpuInstance{lib.GPU_INSTANCE_PROFILE_3_SLICE, []uint32{1, 2}})
	partition(t, gpu3,
		gpuInstance{lib.GPU_INSTANCE_PROFILE_1_SLICE, []uint32{1}},
		gpuInstance{lib.GPU_INSTANCE_PROFILE_1_SLICE_REV1, []uint32{1}},
		gpuInstance{lib.GPU_INSTANCE_PROFILE_1_SLICE_REV2, []uint32{1}},
		gpuInstance{lib.GPU_INSTANCE_PROFILE_2_SLICE, []uint32{2}})
	devices := discover(t, server, root)

	var order []string
	for _, d := range devices {
		order = append(order, d.ID)
	}
	want := []string{gpu0.UUID, "MIG-0-0-0", "MIG-0-1-0", "MIG-0-1-1"}
	for _, d := range server.Devices[1:3] {
		want = append(want, d.(*dgxa100.Device).UUID)
	}
	want = append(want, gpu3.UUID, "MIG-3-0-0", "MIG-3-1-0", "MIG-3-2-0", "MIG-3-3-0")
	for _, d := range server.Devices[4:] {
		want = append(want, d.(*dgxa100.Device).UUID)
	}
	if strings.Join(order, " ") != strings.Join(want, " ") {
		t.Fatalf("devices\n%v\nwant each GPU followed by its MIG devices\n%v", order, want)
	}

	// A GPU in MIG mode stays listed, as the parent.
	if g := devices[0]; g.Kind != v1alpha1.DeviceKindNvidiaGPU || !g.Healthy || g.Attributes[v1alpha1.AttributeMIGEnabled].String() != "true" {
		t.Errorf("GPU 0: %+v", g)
	}
	parent := attributes(devices[0])
	inherited := map[string]string{}
	for _, name := range []string{
		v1alpha1.AttributeProduct, v1alpha1.AttributeArchitecture, v1alpha1.AttributeComputeCapability,
		v1alpha1.AttributeDriverVersion, v1alpha1.AttributeCUDADriverVersion, v1alpha1.AttributeNUMANode,
		v1alpha1.AttributePCIAddress,
	} {
		inherited[name] = parent[name]
	}
	if inherited[v1alpha1.AttributePCIAddress] != "0000:00:00.0" || inherited[v1alpha1.AttributeNUMANode] != "0" {
		t.Fatalf("GPU 0 attributes %v", parent)
	}

	for _, tc := range []struct {
		id, parent, profile, gi, ci, memory, multiprocessors string
	}{
		{"MIG-0-0-0", gpu0.UUID, "3g.20gb", "0", "0", "19968Mi", "42"},
		{"MIG-0-1-0", gpu0.UUID, "1c.3g.20gb", "1", "0", "19968Mi", "14"},
		{"MIG-0-1-1", gpu0.UUID, "2c.3g.20gb", "1", "1", "19968Mi", "28"},
		{"MIG-3-0-0", gpu3.UUID, "1g.5gb", "0", "0", "4864Mi", "14"},
		{"MIG-3-1-0", gpu3.UUID, "1g.5gb+me", "1", "0", "4864Mi", "14"},
		{"MIG-3-2-0", gpu3.UUID, "1g.10gb", "2", "0", "9856Mi", "14"},
		{"MIG-3-3-0", gpu3.UUID, "2g.10gb", "3", "0", "9856Mi", "28"},
	} {
		t.Run(tc.id, func(t *testing.T) {
			mig := byID(t, devices, tc.id)
			if mig.Kind != v1alpha1.DeviceKindNvidiaMIG || !mig.Healthy {
				t.Errorf("kind %s, healthy %v (%s)", mig.Kind, mig.Healthy, mig.Reason)
			}
			want := map[string]string{
				v1alpha1.AttributeParent:            tc.parent,
				v1alpha1.AttributeMIGProfile:        tc.profile,
				v1alpha1.AttributeGPUInstanceID:     tc.gi,
				v1alpha1.AttributeComputeInstanceID: tc.ci,
				v1alpha1.AttributeMemory:            tc.memory,
				v1alpha1.AttributeMultiprocessors:   tc.multiprocessors,
			}
			for name, v := range inherited {
				want[name] = v
			}
			if tc.parent == gpu3.UUID {
				want[v1alpha1.AttributePCIAddress] = "0000:03:00.0"
			}
			got := attributes(mig)
			for name, w := range want {
				if got[name] != w {
					t.Errorf("%s = %q, want %q", name, got[name], w)
				}
			}
			if len(got) != len(want) {
				t.Errorf("attributes %v, want %v", got, want)
			}
			for name, a := range mig.Attributes {
				if wk, ok := wellKnown[name]; ok && a.Type() != wk {
					t.Errorf("%s published as %s, the contract says %s", name, a.Type(), wk)
				}
			}
		})
	}
}

func TestMIGDisabledListsNoMIGDevices(t *testing.T) {
	server, root := dgx(t)
	gpu0 := server.Devices[0].(*dgxa100.Device)
	partition(t, gpu0, gpuInstance{lib.GPU_INSTANCE_PROFILE_7_SLICE, []uint32{7}})
	gpu0.MigMode = lib.DEVICE_MIG_DISABLE
	devices := discover(t, server, root)
	if ids := migIDs(devices); len(ids) != 0 || len(devices) != 8 {
		t.Errorf("%d devices, MIG devices %v; want the 8 GPUs alone", len(devices), ids)
	}
	if n := len(gpu0.GetMaxMigDeviceCountCalls()); n != 0 {
		t.Errorf("MIG devices enumerated %d times on a GPU not in MIG mode", n)
	}
}

// TestMIGEnumerationProblems: a MIG device that cannot be named is left out and
// its GPU says why; one that is named but not fully described is listed
// unhealthy; an empty slot is nothing.
func TestMIGEnumerationProblems(t *testing.T) {
	for _, tc := range []struct {
		name          string
		breakIt       func(gpu *dgxa100.Device, migs []*mock.Device)
		wantMIGs      []string
		parentProblem string            // "" for a healthy GPU
		migProblems   map[string]string // MIG device → its reason
	}{{
		name:     "empty slot",
		breakIt:  func(gpu *dgxa100.Device, migs []*mock.Device) { failHandle(gpu, 1, lib.ERROR_NOT_FOUND) },
		wantMIGs: []string{"MIG-0-0-0", "MIG-0-1-1"},
	}, {
		name:          "handle fails",
		breakIt:       func(gpu *dgxa100.Device, migs []*mock.Device) { failHandle(gpu, 1, lib.ERROR_UNKNOWN) },
		wantMIGs:      []string{"MIG-0-0-0", "MIG-0-1-1"},
		parentProblem: "MIG device 1: ERROR_UNKNOWN",
	}, {
		name: "UUID unreadable",
		breakIt: func(gpu *dgxa100.Device, migs []*mock.Device) {
			migs[1].GetUUIDFunc = func() (string, lib.Return) { return "", lib.ERROR_UNKNOWN }
		},
		wantMIGs:      []string{"MIG-0-0-0", "MIG-0-1-1"},
		parentProblem: "MIG device 1: UUID: ERROR_UNKNOWN",
	}, {
		name: "MIG device count unreadable",
		breakIt: func(gpu *dgxa100.Device, migs []*mock.Device) {
			gpu.GetMaxMigDeviceCountFunc = func() (int, lib.Return) { return 0, lib.ERROR_UNKNOWN }
		},
		parentProblem: "MIG device count: ERROR_UNKNOWN",
	}, {
		name: "memory unreadable",
		breakIt: func(gpu *dgxa100.Device, migs []*mock.Device) {
			migs[1].GetMemoryInfoFunc = func() (lib.Memory, lib.Return) { return lib.Memory{}, lib.ERROR_UNKNOWN }
		},
		wantMIGs:    []string{"MIG-0-0-0", "MIG-0-1-0", "MIG-0-1-1"},
		migProblems: map[string]string{"MIG-0-1-0": "memory: ERROR_UNKNOWN"},
	}, {
		name: "GPU instance gone",
		breakIt: func(gpu *dgxa100.Device, migs []*mock.Device) {
			gpu.GetGpuInstanceByIdFunc = func(int) (lib.GpuInstance, lib.Return) { return nil, lib.ERROR_NOT_FOUND }
		},
		wantMIGs: []string{"MIG-0-0-0", "MIG-0-1-0", "MIG-0-1-1"},
		migProblems: map[string]string{
			"MIG-0-0-0": "MIG profile: GPU instance 0: ERROR_NOT_FOUND",
			"MIG-0-1-0": "MIG profile: GPU instance 1: ERROR_NOT_FOUND",
			"MIG-0-1-1": "MIG profile: GPU instance 1: ERROR_NOT_FOUND",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			server, root := dgx(t)
			gpu0 := server.Devices[0].(*dgxa100.Device)
			migs := partition(t, gpu0,
				gpuInstance{lib.GPU_INSTANCE_PROFILE_3_SLICE, []uint32{3}},
				gpuInstance{lib.GPU_INSTANCE_PROFILE_3_SLICE, []uint32{1, 2}})
			tc.breakIt(gpu0, migs)
			devices := discover(t, server, root)
			if got := migIDs(devices); strings.Join(got, " ") != strings.Join(tc.wantMIGs, " ") {
				t.Errorf("MIG devices %v, want %v", got, tc.wantMIGs)
			}
			if g := devices[0]; g.Healthy != (tc.parentProblem == "") || !strings.Contains(g.Reason, tc.parentProblem) {
				t.Errorf("GPU 0 healthy=%v reason=%q, want problem %q", g.Healthy, g.Reason, tc.parentProblem)
			}
			for _, id := range migIDs(devices) {
				mig, problem := byID(t, devices, id), tc.migProblems[id]
				if mig.Healthy != (problem == "") || !strings.Contains(mig.Reason, problem) {
					t.Errorf("%s healthy=%v reason=%q, want problem %q", id, mig.Healthy, mig.Reason, problem)
				}
			}
		})
	}
}

// failHandle makes the GPU's MIG device slot i answer ret.
func failHandle(gpu *dgxa100.Device, i int, ret lib.Return) {
	handle := gpu.GetMigDeviceHandleByIndexFunc
	gpu.GetMigDeviceHandleByIndexFunc = func(j int) (lib.Device, lib.Return) {
		if j == i {
			return nil, ret
		}
		return handle(j)
	}
}

func TestMIGProfileName(t *testing.T) {
	const a100 = 40 << 30 // bytes
	for _, tc := range []struct {
		name               string
		profile            int
		giSlices, ciSlices uint32
		profileMB, gpu     uint64
		want               string
	}{
		{"smallest", lib.GPU_INSTANCE_PROFILE_1_SLICE, 1, 1, 4864, a100, "1g.5gb"},
		{"media extensions", lib.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 1, 4864, a100, "1g.5gb+me"},
		{"double memory", lib.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 1, 1, 9856, a100, "1g.10gb"},
		{"two slices", lib.GPU_INSTANCE_PROFILE_2_SLICE, 2, 2, 9856, a100, "2g.10gb"},
		{"three slices", lib.GPU_INSTANCE_PROFILE_3_SLICE, 3, 3, 19968, a100, "3g.20gb"},
		{"part of a GPU instance", lib.GPU_INSTANCE_PROFILE_3_SLICE, 3, 1, 19968, a100, "1c.3g.20gb"},
		{"four slices", lib.GPU_INSTANCE_PROFILE_4_SLICE, 4, 4, 19968, a100, "4g.20gb"},
		{"whole GPU", lib.GPU_INSTANCE_PROFILE_7_SLICE, 7, 7, 40192, a100, "7g.40gb"},
		{"exactly half", lib.GPU_INSTANCE_PROFILE_4_SLICE, 4, 4, 20480, a100, "4g.20gb"},
		// Rounding the profile's 10.75 GiB up would say 11gb: the share is
		// rounded to eighths of a 94 GiB GPU instead.
		{"eighths of the GPU, not MiB rounded up", lib.GPU_INSTANCE_PROFILE_1_SLICE, 1, 1, 11008, 95830 << 20, "1g.12gb"},
		{"graphics", lib.GPU_INSTANCE_PROFILE_2_SLICE_GFX, 2, 2, 9856, a100, "2g.10gb+gfx"},
		{"all media extensions", lib.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, 1, 1, 4864, a100, "1g.5gb+me.all"},
		{"no media extensions", lib.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, 1, 1, 4864, a100, "1g.5gb-me"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := migProfileName(tc.profile, tc.giSlices, tc.ciSlices, tc.profileMB, tc.gpu); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// FuzzMIGProfileName names profiles from any figures NVML may answer: the
// name must have the profile grammar and a bounded length, and the memory
// figure must be the exact rule (checked in big integers), never a value that
// wrapped around 2^64.
func FuzzMIGProfileName(f *testing.F) {
	f.Add(lib.GPU_INSTANCE_PROFILE_1_SLICE, uint32(1), uint32(1), uint64(4864), uint64(40<<30))
	f.Add(lib.GPU_INSTANCE_PROFILE_3_SLICE, uint32(3), uint32(1), uint64(19968), uint64(95830<<20))
	f.Add(-1, uint32(0), uint32(7), uint64(1<<63), uint64(1))
	f.Add(1<<30, ^uint32(0), uint32(0), ^uint64(0), ^uint64(0))
	f.Add(0, uint32(1), uint32(1), uint64(1<<44), uint64(40<<30)) // wrapped to 0gb before 128-bit products
	name := regexp.MustCompile(`^([0-9]+c\.)?[0-9]+g\.[0-9]+gb(\+me|\+me\.all|\+gfx|-me)?$`)
	f.Fuzz(func(t *testing.T, profile int, gi, ci uint32, profileMB, gpu uint64) {
		watchdog.Run(t, func() {
			got := migProfileName(profile, gi, ci, profileMB, gpu)
			if !name.MatchString(got) || len(got) > 64 {
				t.Fatalf("%q", got)
			}
			if gpu == 0 {
				return
			}
			// The rule in big integers: ceil(MB*2^20*8/gpu) eighths, times
			// the GPU's GiB rounded up, /8 rounded to nearest.
			g := new(big.Int).SetUint64(gpu)
			eighths := new(big.Int).Mul(new(big.Int).SetUint64(profileMB), big.NewInt(8<<20))
			eighths.Add(eighths, new(big.Int).Sub(g, big.NewInt(1))).Div(eighths, g)
			gib := new(big.Int).Add(g, big.NewInt(1<<30-1))
			gib.Div(gib, big.NewInt(1<<30))
			want := new(big.Int).Mul(eighths, gib)
			want.Add(want, big.NewInt(4)).Div(want, big.NewInt(8))
			if gb := migMemoryGB(profileMB, gpu); want.IsUint64() && gb != want.Uint64() || !want.IsUint64() && gb != math.MaxUint64 {
				t.Fatalf("migMemoryGB(%d, %d) = %d, want %s", profileMB, gpu, gb, want)
			}
		})
	})
}
