package nvml

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"slices"
	"strings"
	"testing"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/internal/watchdog"
	"github.com/resclass/resclass/pkg/mig"
)

// a100ProfileIDs are the GPU instance profile ids an A100-SXM4-40GB reports.
// The mock uses the GPU_INSTANCE_PROFILE_* indices as ids instead, which would
// hide a lookup of a profile by its id as an index.
var a100ProfileIDs = nvmlmock.ProfileIDs

// gpuInstance is one GPU instance a test creates: its GPU_INSTANCE_PROFILE_*
// index, the memory slice it starts at, and the slice counts of its compute
// instances, one MIG device each.
type gpuInstance struct {
	profile       int
	start         uint32
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
	// The mock finds placements by the index; NVML by the profile's id.
	dev.GetGpuInstancePossiblePlacementsFunc = func(info *lib.GpuInstanceProfileInfo) ([]lib.GpuInstancePlacement, lib.Return) {
		for index, id := range a100ProfileIDs {
			if id == info.Id {
				return dgxa100.MIGPlacements.GpuInstancePossiblePlacements[index], lib.SUCCESS
			}
		}
		return nil, lib.ERROR_INVALID_ARGUMENT
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
		size := dgxa100.MIGPlacements.GpuInstancePossiblePlacements[l.profile][0].Size
		gi, _ := dev.CreateGpuInstanceWithPlacement(&profile, &lib.GpuInstancePlacement{Start: l.start, Size: size})
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
		gpuInstance{lib.GPU_INSTANCE_PROFILE_3_SLICE, 0, []uint32{3}},
		gpuInstance{lib.GPU_INSTANCE_PROFILE_3_SLICE, 4, []uint32{1, 2}})
	partition(t, gpu3,
		gpuInstance{lib.GPU_INSTANCE_PROFILE_1_SLICE, 0, []uint32{1}},
		gpuInstance{lib.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, []uint32{1}},
		gpuInstance{lib.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 2, []uint32{1}},
		gpuInstance{lib.GPU_INSTANCE_PROFILE_2_SLICE, 4, []uint32{2}})
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
	partition(t, gpu0, gpuInstance{lib.GPU_INSTANCE_PROFILE_7_SLICE, 0, []uint32{7}})
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
				gpuInstance{lib.GPU_INSTANCE_PROFILE_3_SLICE, 0, []uint32{3}},
				gpuInstance{lib.GPU_INSTANCE_PROFILE_3_SLICE, 4, []uint32{1, 2}})
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

// TestMIGGeometry: a GPU in MIG mode is published with its profiles, as
// NVML names and places them (the A100-40GB table of pkg/mig, which is
// checked against NVIDIA's figures), and the GPU instances on it; a GPU
// whose MIG mode is off has none. NVML answers that describe no possible
// GPU (a placement past the slices, two instances on one slice) are left out.
func TestMIGGeometry(t *testing.T) {
	server, root := dgx(t)
	gpu3 := server.Devices[3].(*dgxa100.Device)
	partition(t, gpu3,
		gpuInstance{lib.GPU_INSTANCE_PROFILE_1_SLICE, 0, []uint32{1}},
		gpuInstance{lib.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, []uint32{1}},
		gpuInstance{lib.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 2, []uint32{1}},
		gpuInstance{lib.GPU_INSTANCE_PROFILE_2_SLICE, 4, []uint32{2}})
	devices := discover(t, server, root)
	if g := byID(t, devices, server.Devices[1].(*dgxa100.Device).UUID); g.MIG != nil {
		t.Errorf("a GPU whose MIG mode is off has a MIG geometry: %+v", g.MIG)
	}
	got := byID(t, devices, gpu3.UUID).MIG
	if got == nil {
		t.Fatal("the GPU in MIG mode has no geometry")
	}
	want := mig.A100_40GB.API().Profiles
	if !apiequality.Semantic.DeepEqual(got.Profiles, want) {
		t.Errorf("profiles\n%+v\nwant\n%+v", got.Profiles, want)
	}
	wantInstances := []v1alpha1.MIGInstance{{Profile: "1g.5gb", Start: 0}, {Profile: "1g.5gb+me", Start: 1}, {Profile: "1g.10gb", Start: 2}, {Profile: "2g.10gb", Start: 4}}
	if !slices.Equal(got.Instances, wantInstances) {
		t.Errorf("instances %+v, want %+v", got.Instances, wantInstances)
	}

	// NVML lies: 2g.10gb may also start at slice 7 (past the GPU), and a
	// second 1g.5gb sits on slice 0.
	placements := gpu3.GetGpuInstancePossiblePlacementsFunc
	gpu3.GetGpuInstancePossiblePlacementsFunc = func(info *lib.GpuInstanceProfileInfo) ([]lib.GpuInstancePlacement, lib.Return) {
		out, ret := placements(info)
		if info.Id == a100ProfileIDs[lib.GPU_INSTANCE_PROFILE_2_SLICE] {
			out = append(slices.Clone(out), lib.GpuInstancePlacement{Start: 7, Size: 2})
		}
		return out, ret
	}
	profile, _ := gpu3.GetGpuInstanceProfileInfo(lib.GPU_INSTANCE_PROFILE_1_SLICE)
	if _, ret := gpu3.CreateGpuInstanceWithPlacement(&profile, &lib.GpuInstancePlacement{Start: 0, Size: 1}); ret != lib.SUCCESS {
		t.Fatal(ret)
	}
	got = byID(t, discover(t, server, root), gpu3.UUID).MIG
	var names []string
	for _, p := range got.Profiles {
		names = append(names, p.Name)
	}
	if slices.Contains(names, "2g.10gb") || len(names) != len(want)-1 {
		t.Errorf("with a placement past the slices, profiles %v: want every one but 2g.10gb", names)
	}
	if n := len(got.Instances); n != 3 || got.Instances[0] != wantInstances[0] {
		t.Errorf("with two instances on slice 0 and 2g.10gb left out, instances %+v: want one 1g.5gb at 0, 1g.5gb+me, 1g.10gb", got.Instances)
	}
}

// FuzzMIGGeometry reads a GPU's geometry from any answers NVML may give for
// two profiles (placements and instances from the fuzzer's bytes, two bytes
// each: start, size): what is published must describe a GPU that could
// exist, within the CRD's bounds, whatever came in.
func FuzzMIGGeometry(f *testing.F) {
	f.Add([]byte{0, 1, 1, 1, 2, 1}, []byte{0, 2, 2, 2}, []byte{0, 1}, []byte{2, 2})
	f.Add([]byte{7, 2, 255, 255}, []byte{0, 8}, []byte{0, 1, 0, 1}, []byte{0, 8})
	f.Fuzz(func(t *testing.T, placementsA, placementsB, instancesA, instancesB []byte) {
		watchdog.Run(t, func() {
			pairs := func(b []byte) [][2]uint32 {
				var out [][2]uint32
				for i := 0; i+1 < len(b) && len(out) < 64; i += 2 {
					out = append(out, [2]uint32{uint32(b[i]), uint32(b[i+1])})
				}
				return out
			}
			profiles := map[uint32]gpuInstanceProfile{
				19: {index: lib.GPU_INSTANCE_PROFILE_1_SLICE, info: lib.GpuInstanceProfileInfo{Id: 19, SliceCount: 1, InstanceCount: 7, MemorySizeMB: 4864}},
				14: {index: lib.GPU_INSTANCE_PROFILE_2_SLICE, info: lib.GpuInstanceProfileInfo{Id: 14, SliceCount: 2, InstanceCount: 3, MemorySizeMB: 9856}},
			}
			placements := map[uint32][][2]uint32{19: pairs(placementsA), 14: pairs(placementsB)}
			instances := map[uint32][][2]uint32{19: pairs(instancesA), 14: pairs(instancesB)}
			dev := &mock.Device{
				GetGpuInstancePossiblePlacementsFunc: func(info *lib.GpuInstanceProfileInfo) ([]lib.GpuInstancePlacement, lib.Return) {
					var out []lib.GpuInstancePlacement
					for _, p := range placements[info.Id] {
						out = append(out, lib.GpuInstancePlacement{Start: p[0], Size: p[1]})
					}
					return out, lib.SUCCESS
				},
				GetGpuInstancesFunc: func(info *lib.GpuInstanceProfileInfo) ([]lib.GpuInstance, lib.Return) {
					var out []lib.GpuInstance
					for _, p := range instances[info.Id] {
						gi := lib.GpuInstanceInfo{ProfileId: info.Id, Placement: lib.GpuInstancePlacement{Start: p[0], Size: p[1]}}
						out = append(out, &mock.GpuInstance{GetInfoFunc: func() (lib.GpuInstanceInfo, lib.Return) { return gi, lib.SUCCESS }})
					}
					return out, lib.SUCCESS
				},
			}
			got := migGeometry(dev, profiles, 40<<30)
			if got == nil {
				return
			}
			if len(got.Profiles) > 32 || len(got.Instances) > v1alpha1.MIGSlices {
				t.Fatalf("%d profiles, %d instances", len(got.Profiles), len(got.Instances))
			}
			size := map[string]int32{}
			for _, p := range got.Profiles {
				if _, dup := size[p.Name]; dup || p.Slices < 1 || p.Slices > v1alpha1.MIGSlices || len(p.Placements) == 0 || len(p.Placements) > v1alpha1.MIGSlices {
					t.Fatalf("profile %+v", p)
				}
				for _, s := range p.Placements {
					if s < 0 || s+p.Slices > v1alpha1.MIGSlices {
						t.Fatalf("profile %s placed at %d, past the slices", p.Name, s)
					}
				}
				size[p.Name] = p.Slices
			}
			var used uint16
			for _, in := range got.Instances {
				n, ok := size[in.Profile]
				if !ok {
					t.Fatalf("instance of %s, not a profile listed", in.Profile)
				}
				mask := uint16((1<<n)-1) << in.Start
				if used&mask != 0 || in.Start+n > v1alpha1.MIGSlices {
					t.Fatalf("instance %+v overlaps another or passes the slices", in)
				}
				used |= mask
			}
		})
	})
}

// TestMIGMockCreatesAsNVML: the repository's NVML mock creates MIG instances
// as NVML does (nvmlmock.EnableMIG), and discovery reads them: an H100's
// table, overlapping placements and a profile's limit refused, a GPU
// instance with a compute instance kept, an injected failure answered once,
// and each compute instance a MIG device with its own UUID and profile.
func TestMIGMockCreatesAsNVML(t *testing.T) {
	server, root := dgxMock(t)
	gpu := server.Devices[2].(*dgxa100.Device)
	if err := server.EnableMIG(gpu.UUID, mig.H100_80GB); err != nil {
		t.Fatal(err)
	}
	info := func(index int) *lib.GpuInstanceProfileInfo {
		t.Helper()
		p, ret := gpu.GetGpuInstanceProfileInfo(index)
		if ret != lib.SUCCESS {
			t.Fatalf("profile %d: %v", index, ret)
		}
		return &p
	}
	create := func(index int, start, size uint32) (lib.GpuInstance, lib.Return) {
		return gpu.CreateGpuInstanceWithPlacement(info(index), &lib.GpuInstancePlacement{Start: start, Size: size})
	}
	withCI := func(gi lib.GpuInstance, slices uint32) {
		t.Helper()
		ciIndex := map[uint32]int{1: lib.COMPUTE_INSTANCE_PROFILE_1_SLICE, 3: lib.COMPUTE_INSTANCE_PROFILE_3_SLICE}[slices]
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciIndex, lib.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != lib.SUCCESS {
			t.Fatal(ret)
		}
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != lib.SUCCESS {
			t.Fatal(ret)
		}
	}
	big, ret := create(lib.GPU_INSTANCE_PROFILE_3_SLICE, 4, 4)
	if ret != lib.SUCCESS {
		t.Fatal(ret)
	}
	withCI(big, 3)
	if _, ret := create(lib.GPU_INSTANCE_PROFILE_2_SLICE, 4, 2); ret != lib.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("2g.20gb over 3g.40gb@4: %v, want ERROR_INSUFFICIENT_RESOURCES", ret)
	}
	if ret := big.Destroy(); ret != lib.ERROR_IN_USE {
		t.Errorf("destroying a GPU instance with a compute instance: %v, want ERROR_IN_USE", ret)
	}
	small, ret := create(lib.GPU_INSTANCE_PROFILE_1_SLICE, 0, 1)
	if ret != lib.SUCCESS {
		t.Fatal(ret)
	}
	withCI(small, 1)
	if _, ret := create(lib.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 1); ret != lib.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := create(lib.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 2, 1); ret != lib.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("a second 1g.10gb+me: %v, want ERROR_INSUFFICIENT_RESOURCES (its limit is one)", ret)
	}
	server.FailMIGCreate(gpu.UUID, lib.ERROR_UNKNOWN)
	if _, ret := create(lib.GPU_INSTANCE_PROFILE_1_SLICE, 3, 1); ret != lib.ERROR_UNKNOWN {
		t.Errorf("after FailMIGCreate: %v, want ERROR_UNKNOWN", ret)
	}
	if got := server.MIGInstances(gpu.UUID); !slices.Equal(got, []string{"3g.40gb@4", "1g.10gb@0", "1g.10gb+me@1"}) {
		t.Errorf("instances %v", got)
	}

	devices := discover(t, server.Server, root)
	parent := byID(t, devices, gpu.UUID)
	if parent.Attributes[v1alpha1.AttributeProduct].String() != "Mock NVIDIA H100 80GB HBM3" || parent.MIG == nil {
		t.Fatalf("the H100: %v, geometry %+v", attributes(parent), parent.MIG)
	}
	var names []string
	for _, p := range parent.MIG.Profiles {
		names = append(names, p.Name)
	}
	if want := []string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}; !slices.Equal(names, want) {
		t.Errorf("profiles %v, want the H100's %v", names, want)
	}
	wantInstances := []v1alpha1.MIGInstance{{Profile: "1g.10gb", Start: 0}, {Profile: "1g.10gb+me", Start: 1}, {Profile: "3g.40gb", Start: 4}}
	if !slices.Equal(parent.MIG.Instances, wantInstances) {
		t.Errorf("instances %+v, want %+v", parent.MIG.Instances, wantInstances)
	}
	var profiles []string
	for _, d := range devices {
		if d.Kind == v1alpha1.DeviceKindNvidiaMIG {
			if !strings.HasPrefix(d.ID, "MIG-") || d.Attributes[v1alpha1.AttributeParent].String() != gpu.UUID || !d.Healthy {
				t.Errorf("MIG device %s: %v", d.ID, attributes(d))
			}
			profiles = append(profiles, d.Attributes[v1alpha1.AttributeMIGProfile].String())
		}
	}
	if !slices.Equal(profiles, []string{"3g.40gb", "1g.10gb"}) {
		t.Errorf("MIG devices of profiles %v, want one per compute instance: 3g.40gb, 1g.10gb", profiles)
	}
}
