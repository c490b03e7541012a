// Package mig is the geometry of MIG partitioning: the GPU instance profiles
// a GPU offers, where each may be placed, which placements exclude each
// other, and the choice of profile and placement for a request (place.go).
//
// NVML's model is the one used here: a GPU has Slots memory slices; a GPU
// instance of a profile occupies Size consecutive slices from one of the
// profile's placement starts, and creating one fails when its slices overlap
// another's (nvmlDeviceGetGpuInstancePossiblePlacements). That rule alone
// keeps the compute slices within the GPU's seven on the A100, H100 and
// H200 tables, so the slices are the whole state of a GPU.
package mig

import (
	"fmt"
	"slices"
)

// Slots is the number of memory slices of the GPUs this package knows: every
// MIG-capable GPU with seven compute slices (A100, H100, H200).
const Slots = 8

// Profile is one GPU instance profile of a GPU.
type Profile struct {
	// Name is the profile's name as nvidia-smi prints it ("1g.10gb",
	// "1g.10gb+me").
	Name string
	// Compute is its compute slices (the "g"), of the GPU's seven.
	Compute int
	// Size is the memory slices a placement of it spans.
	Size int
	// MemoryMiB is the memory NVML states for the profile
	// (GpuInstanceProfileInfo.MemorySizeMB).
	MemoryMiB int64
	// Multiprocessors, Decoders, JPEGs and OFAs are the profile's
	// streaming multiprocessors and media engines.
	Multiprocessors, Decoders, JPEGs, OFAs int
	// Starts are the slices a placement may start at.
	Starts []int
	// Max is the most instances of the profile a GPU holds at once
	// (GpuInstanceProfileInfo.InstanceCount): a profile with media
	// extensions is limited to one, whatever the slices left.
	Max int
}

// mask is the slices a placement of p at start occupies.
func (p *Profile) mask(start int) uint8 {
	return uint8((1<<p.Size)-1) << start
}

// Table is a GPU product's profiles, smallest first (Less).
type Table struct {
	Product string
	// MemoryMiB is the whole GPU's memory, as NVML states it.
	MemoryMiB int64
	Profiles  []Profile
}

// Profile returns the profile named name, or nil.
func (t *Table) Profile(name string) *Profile {
	for i := range t.Profiles {
		if t.Profiles[i].Name == name {
			return &t.Profiles[i]
		}
	}
	return nil
}

// Less orders profiles from the smallest: fewer memory slices, then fewer
// compute slices, then less memory, then without media extensions before
// with (fewer decoders), then by name. "The smallest profile that satisfies a
// class" is the first in this order.
func Less(a, b *Profile) bool {
	switch {
	case a.Size != b.Size:
		return a.Size < b.Size
	case a.Compute != b.Compute:
		return a.Compute < b.Compute
	case a.MemoryMiB != b.MemoryMiB:
		return a.MemoryMiB < b.MemoryMiB
	case a.Decoders+a.JPEGs+a.OFAs != b.Decoders+b.JPEGs+b.OFAs:
		return a.Decoders+a.JPEGs+a.OFAs < b.Decoders+b.JPEGs+b.OFAs
	}
	return a.Name < b.Name
}

// Validate checks that t is a table this package can place on: every
// placement within the slices and aligned to its size (as NVML's are), at
// least one placement and instance per profile, names unique, profiles in
// Less order.
func (t *Table) Validate() error {
	seen := map[string]bool{}
	for i := range t.Profiles {
		p := &t.Profiles[i]
		if p.Name == "" || seen[p.Name] {
			return fmt.Errorf("%s: profile %d: name %q empty or repeated", t.Product, i, p.Name)
		}
		seen[p.Name] = true
		if p.Size < 1 || p.Size > Slots || p.Compute < 1 || p.Max < 1 || len(p.Starts) == 0 {
			return fmt.Errorf("%s: profile %s: size %d, compute %d, max %d, %d placements", t.Product, p.Name, p.Size, p.Compute, p.Max, len(p.Starts))
		}
		for _, s := range p.Starts {
			if s < 0 || s+p.Size > Slots || s%p.Size != 0 {
				return fmt.Errorf("%s: profile %s: placement at %d of size %d outside the %d slices or not aligned", t.Product, p.Name, s, p.Size, Slots)
			}
		}
		if !slices.IsSorted(p.Starts) {
			return fmt.Errorf("%s: profile %s: placements not in order", t.Product, p.Name)
		}
		if i > 0 && !Less(&t.Profiles[i-1], p) {
			return fmt.Errorf("%s: profiles %s and %s not smallest first", t.Product, t.Profiles[i-1].Name, p.Name)
		}
	}
	return nil
}

// The seven-slice geometry every table below shares; only the memory, the
// multiprocessors and the names differ between products.
var (
	starts1  = []int{0, 1, 2, 3, 4, 5, 6}
	starts2  = []int{0, 2, 4, 6}
	starts2g = []int{0, 2, 4}
	starts3g = []int{0, 4}
	starts0  = []int{0}
)

// Builtin are the tables of the MIG-capable GPUs of NVIDIA's MIG user guide
// ("Supported MIG Profiles"), with the memory and multiprocessors NVML
// reports for each profile. The agent reads a GPU's own table from NVML; these
// serve the NVML mock, the tests and the benchmarks.
var Builtin = []*Table{A100_40GB, A100_80GB, H100_80GB}

// A100_40GB is the A100-SXM4-40GB (go-nvml's DGX A100 mock has the same).
var A100_40GB = &Table{Product: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, Profiles: []Profile{
	{Name: "1g.5gb", Compute: 1, Size: 1, MemoryMiB: 4864, Multiprocessors: 14, Starts: starts1, Max: 7},
	{Name: "1g.5gb+me", Compute: 1, Size: 1, MemoryMiB: 4864, Multiprocessors: 14, Decoders: 1, JPEGs: 1, OFAs: 1, Starts: starts1, Max: 1},
	{Name: "1g.10gb", Compute: 1, Size: 2, MemoryMiB: 9856, Multiprocessors: 14, Decoders: 1, Starts: starts2, Max: 4},
	{Name: "2g.10gb", Compute: 2, Size: 2, MemoryMiB: 9856, Multiprocessors: 28, Decoders: 1, Starts: starts2g, Max: 3},
	{Name: "3g.20gb", Compute: 3, Size: 4, MemoryMiB: 19968, Multiprocessors: 42, Decoders: 2, Starts: starts3g, Max: 2},
	{Name: "4g.20gb", Compute: 4, Size: 4, MemoryMiB: 19968, Multiprocessors: 56, Decoders: 2, Starts: starts0, Max: 1},
	{Name: "7g.40gb", Compute: 7, Size: 8, MemoryMiB: 40192, Multiprocessors: 98, Decoders: 5, JPEGs: 1, OFAs: 1, Starts: starts0, Max: 1},
}}

// A100_80GB is the A100-SXM4-80GB: the 40GB's geometry, twice the memory.
var A100_80GB = &Table{Product: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920, Profiles: []Profile{
	{Name: "1g.10gb", Compute: 1, Size: 1, MemoryMiB: 9728, Multiprocessors: 14, Starts: starts1, Max: 7},
	{Name: "1g.10gb+me", Compute: 1, Size: 1, MemoryMiB: 9728, Multiprocessors: 14, Decoders: 1, JPEGs: 1, OFAs: 1, Starts: starts1, Max: 1},
	{Name: "1g.20gb", Compute: 1, Size: 2, MemoryMiB: 19968, Multiprocessors: 14, Decoders: 1, Starts: starts2, Max: 4},
	{Name: "2g.20gb", Compute: 2, Size: 2, MemoryMiB: 19968, Multiprocessors: 28, Decoders: 1, Starts: starts2g, Max: 3},
	{Name: "3g.40gb", Compute: 3, Size: 4, MemoryMiB: 40192, Multiprocessors: 42, Decoders: 2, Starts: starts3g, Max: 2},
	{Name: "4g.40gb", Compute: 4, Size: 4, MemoryMiB: 40192, Multiprocessors: 56, Decoders: 2, Starts: starts0, Max: 1},
	{Name: "7g.80gb", Compute: 7, Size: 8, MemoryMiB: 80896, Multiprocessors: 98, Decoders: 5, JPEGs: 1, OFAs: 1, Starts: starts0, Max: 1},
}}

// H100_80GB is the H100 80GB HBM3: the A100's geometry, with more
// multiprocessors and media engines per slice.
var H100_80GB = &Table{Product: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, Profiles: []Profile{
	{Name: "1g.10gb", Compute: 1, Size: 1, MemoryMiB: 9984, Multiprocessors: 16, Decoders: 1, JPEGs: 1, Starts: starts1, Max: 7},
	{Name: "1g.10gb+me", Compute: 1, Size: 1, MemoryMiB: 9984, Multiprocessors: 16, Decoders: 1, JPEGs: 1, OFAs: 1, Starts: starts1, Max: 1},
	{Name: "1g.20gb", Compute: 1, Size: 2, MemoryMiB: 20096, Multiprocessors: 26, Decoders: 1, JPEGs: 1, Starts: starts2, Max: 4},
	{Name: "2g.20gb", Compute: 2, Size: 2, MemoryMiB: 20096, Multiprocessors: 32, Decoders: 2, JPEGs: 2, Starts: starts2g, Max: 3},
	{Name: "3g.40gb", Compute: 3, Size: 4, MemoryMiB: 40448, Multiprocessors: 60, Decoders: 3, JPEGs: 3, Starts: starts3g, Max: 2},
	{Name: "4g.40gb", Compute: 4, Size: 4, MemoryMiB: 40448, Multiprocessors: 64, Decoders: 4, JPEGs: 4, Starts: starts0, Max: 1},
	{Name: "7g.80gb", Compute: 7, Size: 8, MemoryMiB: 81152, Multiprocessors: 132, Decoders: 7, JPEGs: 7, OFAs: 1, Starts: starts0, Max: 1},
}}
