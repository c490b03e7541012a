package mig

import (
	"fmt"
	"maps"
	"math/bits"
)

// GPU is one GPU in MIG mode as placement sees it: its table and the GPU
// instances on it.
type GPU struct {
	Table *Table
	used  uint8           // the memory slices instances occupy
	count map[string]int  // instances by profile name
	at    [Slots]*Profile // the profile of the instance starting at each slice
}

// NewGPU is t's GPU with no instance.
func NewGPU(t *Table) *GPU { return &GPU{Table: t, count: map[string]int{}} }

// Instance is a GPU instance, existing or to be created: a profile of the
// GPU's table at one of its placement starts.
type Instance struct {
	Profile *Profile
	Start   int
}

func (i Instance) String() string { return fmt.Sprintf("%s@%d", i.Profile.Name, i.Start) }

// Fits says whether an instance of p can be created at start: start is one of
// p's placements, p's instance limit is not reached, and its slices are free.
func (g *GPU) Fits(p *Profile, start int) bool {
	if g.count[p.Name] >= p.Max {
		return false
	}
	for _, s := range p.Starts {
		if s == start {
			return g.used&p.mask(start) == 0
		}
	}
	return false
}

// Add records an instance of p at start; it fails if it does not fit.
func (g *GPU) Add(p *Profile, start int) error {
	if !g.Fits(p, start) {
		return fmt.Errorf("%s: %s at %d does not fit (slices in use %08b)", g.Table.Product, p.Name, start, g.used)
	}
	g.used |= p.mask(start)
	g.count[p.Name]++
	g.at[start] = p
	return nil
}

// Remove forgets the instance of p at start; it fails if none is there.
func (g *GPU) Remove(p *Profile, start int) error {
	m := p.mask(start)
	if start < 0 || start >= Slots || g.at[start] != p || g.used&m != m {
		return fmt.Errorf("%s: no %s at %d", g.Table.Product, p.Name, start)
	}
	g.used &^= m
	g.count[p.Name]--
	g.at[start] = nil
	return nil
}

// Whole says whether the GPU has no instance: it could still take the
// largest profile.
func (g *GPU) Whole() bool { return g.used == 0 }

// FreeSlices is the memory slices no instance occupies.
func (g *GPU) FreeSlices() int { return Slots - bits.OnesCount8(g.used) }

// Largest is the index in the table of the largest profile (Less order) of
// which an instance could still be created, -1 if none.
func (g *GPU) Largest() int {
	for i := len(g.Table.Profiles) - 1; i >= 0; i-- {
		if g.creatable(&g.Table.Profiles[i]) > 0 {
			return i
		}
	}
	return -1
}

// creatable is the placements of p free now.
func (g *GPU) creatable(p *Profile) int {
	if g.count[p.Name] >= p.Max {
		return 0
	}
	n := 0
	for _, s := range p.Starts {
		if g.used&p.mask(s) == 0 {
			n++
		}
	}
	return n
}

// placements is the placements of every profile free now.
func (g *GPU) placements() int {
	n := 0
	for i := range g.Table.Profiles {
		n += g.creatable(&g.Table.Profiles[i])
	}
	return n
}

// Choice is an instance to create on a GPU, with what it leaves.
type Choice struct {
	Instance
	// rank is the profile's index in the table (smaller first).
	rank int
	// free is the GPU's free slices before it.
	free int
	// largest and placements are what the GPU can still create after it:
	// the index of its largest profile, and placements of any profile.
	largest, placements int
}

// Choose picks, for a request that profiles accept, the smallest accepted
// profile with a free placement on g, and of its placements the one after
// which the largest profile still creatable on g is the largest; then the one
// that leaves the most placements of any profile; then the lowest start.
// ok is false when no accepted profile fits.
func (g *GPU) Choose(accept func(*Profile) bool) (c Choice, ok bool) {
	for i := range g.Table.Profiles {
		p := &g.Table.Profiles[i]
		if !accept(p) || g.count[p.Name] >= p.Max {
			continue
		}
		for _, s := range p.Starts {
			m := p.mask(s)
			if g.used&m != 0 {
				continue
			}
			g.used |= m
			g.count[p.Name]++
			cand := Choice{Instance: Instance{p, s}, rank: i, free: Slots - bits.OnesCount8(g.used&^m), largest: g.Largest(), placements: g.placements()}
			g.used &^= m
			g.count[p.Name]--
			if !ok || cand.largest > c.largest || cand.largest == c.largest && cand.placements > c.placements {
				c, ok = cand, true
			}
		}
		if ok {
			return c, true
		}
	}
	return c, false
}

// Better says whether c is a better choice than d, on GPUs of one table: the
// smaller profile; then the fuller GPU (fewer free slices), so that whole
// GPUs stay whole for the largest profiles (bin-packing, as shares are
// placed); then the choice that keeps the larger profile creatable, then
// more placements.
func (c Choice) Better(d Choice) bool {
	switch {
	case c.rank != d.rank:
		return c.rank < d.rank
	case c.free != d.free:
		return c.free < d.free
	case c.largest != d.largest:
		return c.largest > d.largest
	}
	return c.placements > d.placements
}

// Clone is a copy of g that changes apart from it (the table shared).
func (g *GPU) Clone() *GPU {
	c := *g
	c.count = maps.Clone(g.count)
	return &c
}

// Has says whether an instance of p starts at start.
func (g *GPU) Has(p *Profile, start int) bool {
	return start >= 0 && start < Slots && g.at[start] == p
}

// PublishOrder is the order in which a GPU of t's potential slices are
// published on DRA nodes (docs/mig.md, "DRA nodes"), where the stock
// allocator takes the first device that a claim's class accepts and whose
// slices are free: the smallest profile first (Less), and within a profile
// its placements in the order Choose takes them, one after another, on an
// empty GPU; placements Choose never reaches (past the profile's limit)
// follow, lowest first. First fit over this order takes the smallest
// profile a class accepts, at the placement ours would take on an empty
// GPU.
func (t *Table) PublishOrder() []Instance {
	var out []Instance
	for i := range t.Profiles {
		p := &t.Profiles[i]
		g := NewGPU(t)
		taken := map[int]bool{}
		for {
			c, ok := g.Choose(func(q *Profile) bool { return q == p })
			if !ok {
				break
			}
			_ = g.Add(c.Profile, c.Start) // Choose chose it free
			taken[c.Start] = true
			out = append(out, c.Instance)
		}
		for _, s := range p.Starts {
			if !taken[s] {
				out = append(out, Instance{p, s})
			}
		}
	}
	return out
}
