package mig

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// API is t as the node agent publishes it for a GPU with instances: what
// FromAPI reads back.
func (t *Table) API(instances ...v1alpha1.MIGInstance) *v1alpha1.DeviceMIG {
	m := &v1alpha1.DeviceMIG{Instances: instances}
	for _, p := range t.Profiles {
		var placements []int32
		for _, s := range p.Starts {
			placements = append(placements, int32(s))
		}
		m.Profiles = append(m.Profiles, v1alpha1.MIGProfile{Name: p.Name, Slices: int32(p.Size), Compute: int32(p.Compute),
			Memory: *resource.NewQuantity(p.MemoryMiB<<20, resource.BinarySI), Multiprocessors: int32(p.Multiprocessors),
			Decoders: int32(p.Decoders), JPEGs: int32(p.JPEGs), OFAs: int32(p.OFAs), Placements: placements, Max: int32(p.Max)})
	}
	return m
}

// FromAPI is the GPU a NodeDevices' MIG geometry describes (what the node
// agent publishes for a GPU in MIG mode): its table, in Less order, and its
// GPU instances. What another writer could have put there is checked as the
// agent checks NVML: a table Validate refuses, an instance of a profile not
// listed or that does not fit, is an error that says which.
func FromAPI(product string, m *v1alpha1.DeviceMIG) (*GPU, error) {
	t := &Table{Product: product}
	for _, p := range m.Profiles {
		starts := make([]int, len(p.Placements))
		for i, s := range p.Placements {
			starts[i] = int(s)
		}
		t.Profiles = append(t.Profiles, Profile{Name: p.Name, Compute: int(p.Compute), Size: int(p.Slices), MemoryMiB: p.Memory.Value() >> 20,
			Multiprocessors: int(p.Multiprocessors), Decoders: int(p.Decoders), JPEGs: int(p.JPEGs), OFAs: int(p.OFAs), Starts: starts, Max: int(p.Max)})
	}
	slices.SortStableFunc(t.Profiles, func(a, b Profile) int {
		switch {
		case Less(&a, &b):
			return -1
		case Less(&b, &a):
			return 1
		}
		return 0
	})
	if err := t.Validate(); err != nil {
		return nil, err
	}
	g := NewGPU(t)
	for _, in := range m.Instances {
		p := t.Profile(in.Profile)
		if p == nil {
			return nil, fmt.Errorf("%s: an instance of %q, which the GPU does not list", product, in.Profile)
		}
		if err := g.Add(p, int(in.Start)); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// Instances lists the GPU's instances, by start.
func (g *GPU) Instances() []Instance {
	var out []Instance
	for start := 0; start < Slots; start++ {
		for i := range g.Table.Profiles {
			p := &g.Table.Profiles[i]
			if g.at[start] == p {
				out = append(out, Instance{p, start})
			}
		}
	}
	return out
}

// Creatable is how many instances of p could be created now, one at a time
// (the placements of p free now, within p's limit, counting that each one
// created takes its slices).
func (g *GPU) Creatable(p *Profile) int {
	used, n := g.used, 0
	for _, s := range p.Starts {
		if g.count[p.Name]+n >= p.Max {
			break
		}
		if used&p.mask(s) == 0 {
			used |= p.mask(s)
			n++
		}
	}
	return n
}
