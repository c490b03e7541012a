package mig

import (
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

func TestBuiltinTablesAreValid(t *testing.T) {
	for _, table := range Builtin {
		if err := table.Validate(); err != nil {
			t.Error(err)
		}
	}
	bad := &Table{Product: "bad", Profiles: []Profile{{Name: "2g", Compute: 2, Size: 2, Starts: []int{1}, Max: 1}}}
	if err := bad.Validate(); err == nil {
		t.Error("a placement not aligned to its size was accepted")
	}
	bad = &Table{Product: "bad", Profiles: []Profile{{Name: "4g", Compute: 4, Size: 4, Starts: []int{0}, Max: 1}, {Name: "1g", Compute: 1, Size: 1, Starts: []int{0}, Max: 1}}}
	if err := bad.Validate(); err == nil {
		t.Error("profiles out of order were accepted")
	}
}

// The A100-40GB table is what go-nvml's DGX A100 mock (NVIDIA's own figures)
// answers for each GPU instance profile: slices, memory, multiprocessors,
// media engines, instance count and placements.
func TestA100TableIsNVMLs(t *testing.T) {
	byIndex := map[int]string{
		nvml.GPU_INSTANCE_PROFILE_1_SLICE: "1g.5gb", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: "1g.5gb+me",
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: "1g.10gb", nvml.GPU_INSTANCE_PROFILE_2_SLICE: "2g.10gb",
		nvml.GPU_INSTANCE_PROFILE_3_SLICE: "3g.20gb", nvml.GPU_INSTANCE_PROFILE_4_SLICE: "4g.20gb",
		nvml.GPU_INSTANCE_PROFILE_7_SLICE: "7g.40gb",
	}
	if len(byIndex) != len(dgxa100.MIGProfiles.GpuInstanceProfiles) || len(byIndex) != len(A100_40GB.Profiles) {
		t.Fatalf("the mock has %d profiles, the table %d", len(dgxa100.MIGProfiles.GpuInstanceProfiles), len(A100_40GB.Profiles))
	}
	for index, name := range byIndex {
		info := dgxa100.MIGProfiles.GpuInstanceProfiles[index]
		p := A100_40GB.Profile(name)
		if p == nil {
			t.Fatalf("no profile %s", name)
		}
		var starts []int
		size := 0
		for _, pl := range dgxa100.MIGPlacements.GpuInstancePossiblePlacements[index] {
			starts = append(starts, int(pl.Start))
			size = int(pl.Size)
		}
		got := []int{p.Compute, p.Size, int(p.MemoryMiB), p.Multiprocessors, p.Decoders, p.JPEGs, p.OFAs, p.Max}
		want := []int{int(info.SliceCount), size, int(info.MemorySizeMB), int(info.MultiprocessorCount), int(info.DecoderCount), int(info.JpegCount), int(info.OfaCount), int(info.InstanceCount)}
		if !slices.Equal(got, want) || !slices.Equal(p.Starts, starts) {
			t.Errorf("%s: compute, size, MiB, SMs, decoders, JPEGs, OFAs, max %v at %v; NVML says %v at %v", name, got, p.Starts, want, starts)
		}
	}
}
