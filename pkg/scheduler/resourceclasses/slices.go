package resourceclasses

import (
	"fmt"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/mig"
	"github.com/resclass/resclass/pkg/selector"
)

// MIG slices made on demand (docs/mig.md). A GPU marked for dynamic MIG
// publishes its geometry; the cache adds one device per profile and
// placement (its potential slices, mig.Potentials) behind the node's
// published devices, which classes with createMIG select like any device.
// Potential slices exclude each other, so they are never counted or matched
// as whole devices: a class that selects some on a node is placed by
// placeSlices, with the GPU's state worked out from what the GPU publishes
// (its instances) and the slices pods hold (holders), never kept apart, so
// that charging a pod and a preemption's view work as for any device.

// sliceRef is a potential slice: its GPU and the instance it would be.
type sliceRef struct {
	gpu  *sliceGPU
	inst mig.Instance
}

// sliceGPU is a GPU marked for dynamic MIG on a node.
type sliceGPU struct {
	id string
	// base is the GPU as published: its table and the instances on it,
	// created for pods or not. Never changed: state clones it.
	base *mig.GPU
	// members are the positions of its potential slices in the node's
	// devices.
	members []int
}

// addPotentials adds d's potential slices to n when d is a GPU marked for
// dynamic MIG; a geometry that cannot be believed makes d invalid, with the
// reason.
func (n *nodeState) addPotentials(d *v1alpha1.Device) {
	base, pots, err := mig.Potentials(d)
	if err != nil {
		n.invalid = append(n.invalid, invalidDevice{id: d.ID, reason: "MIG geometry: " + err.Error()})
		return
	}
	if len(pots) == 0 {
		return
	}
	g := &sliceGPU{id: d.ID, base: base}
	for k := range pots {
		p := &pots[k]
		if _, dup := n.index[p.Device.ID]; dup {
			continue
		}
		ds := &deviceState{id: p.Device.ID, healthy: p.Device.Healthy, numa: -1, root: -1, sw: -1, sel: selector.NewPotentialDevice(&p.Device),
			slice: &sliceRef{gpu: g, inst: p.Instance}}
		if v := p.Device.Attributes[v1alpha1.AttributeNUMANode].IntValue; v != nil {
			ds.numa = int(*v)
		}
		g.members = append(g.members, len(n.devices))
		n.index[ds.id] = len(n.devices)
		n.devices = append(n.devices, ds)
	}
}

// state is g's GPU now: its published instances and the slices pods hold
// on it. A held slice that overlaps what is there adds nothing more: its
// slices are taken either way (checkSlices reports such a holding).
func (n *nodeState) state(g *sliceGPU) *mig.GPU {
	s := g.base.Clone()
	for _, i := range g.members {
		if d := n.devices[i]; d.holders > 0 && !s.Has(d.slice.inst.Profile, d.slice.inst.Start) {
			_ = s.Add(d.slice.inst.Profile, d.slice.inst.Start)
		}
	}
	return s
}

// sliceFits says whether potential slice i of n could be created now.
func (n *nodeState) sliceFits(i int) bool {
	d := n.devices[i]
	return d.givable() && n.state(d.slice.gpu).Fits(d.slice.inst.Profile, d.slice.inst.Start)
}

// slicesOf are the dynamic GPUs with a potential slice in idx, in order.
func (n *nodeState) slicesOf(idx []int) []*sliceGPU {
	var out []*sliceGPU
	for _, i := range idx {
		if s := n.devices[i].slice; s != nil && (len(out) == 0 || out[len(out)-1] != s.gpu) {
			out = append(out, s.gpu)
		}
	}
	return out
}

// selectsSlices says whether class selects a potential slice on n.
func (n *nodeState) selectsSlices(class string) bool {
	for _, i := range n.matches[class] {
		if n.devices[i].slice != nil {
			return true
		}
	}
	return false
}

// placeSlices serves as many of each class's draws as it can with slices
// to create, one at a time: on each GPU the class selects slices of, the
// smallest profile the class accepts at the placement mig.GPU.Choose
// prefers, and of those GPUs the choice mig.Choice.Better prefers (the
// fuller GPU). usable says which slices this placement may take (health,
// NUMA node). It returns how many draws of each class it served; the
// rest are the matching's, on whole devices of the class.
func (n *nodeState) placeSlices(d *demand, classes []string, usable func(int) bool, p *placement) map[string]int {
	if len(classes) == 0 {
		return nil
	}
	states := map[*sliceGPU]*mig.GPU{}
	served := map[string]int{}
	for _, class := range classes {
		gpus := n.slicesOf(n.matches[class])
		// accepted[g][profile]: the class selects a usable slice of it on g.
		accepted := map[*sliceGPU]map[*mig.Profile]bool{}
		for _, i := range n.matches[class] {
			if s := n.devices[i].slice; s != nil && usable(i) {
				if accepted[s.gpu] == nil {
					accepted[s.gpu] = map[*mig.Profile]bool{}
				}
				accepted[s.gpu][s.inst.Profile] = true
			}
		}
		for served[class] < d.draws[class] {
			var best mig.Choice
			var on *sliceGPU
			for _, g := range gpus {
				if accepted[g] == nil {
					continue
				}
				s := states[g]
				if s == nil {
					s = n.state(g)
					states[g] = s
				}
				c, ok := s.Choose(func(pr *mig.Profile) bool { return accepted[g][pr] })
				if ok && (on == nil || c.Better(best)) {
					best, on = c, g
				}
			}
			if on == nil {
				break
			}
			_ = states[on].Add(best.Profile, best.Start) // Choose chose it free
			p.drawn[class] = append(p.drawn[class], mig.SliceID(on.id, best.Profile.Name, best.Start))
			served[class]++
		}
	}
	return served
}

// checkSlices: the potential slices a holding names can be on their GPUs
// together with what is there: each either exists already (created for
// the pod) or fits beside the GPU's instances and the slices other pods
// hold.
func (n *nodeState) checkSlices(ids []string) *inconsistency {
	states := map[*sliceGPU]*mig.GPU{}
	for _, id := range ids {
		i, ok := n.index[id]
		if !ok || n.devices[i].slice == nil {
			continue
		}
		s := n.devices[i].slice
		st := states[s.gpu]
		if st == nil {
			st = n.state(s.gpu)
			states[s.gpu] = st
		}
		if s.gpu.base.Has(s.inst.Profile, s.inst.Start) {
			continue
		}
		if err := st.Add(s.inst.Profile, s.inst.Start); err != nil {
			return &inconsistency{reason: "device", detail: fmt.Sprintf("MIG slice %s overlaps another instance or slice held on GPU %s", id, s.gpu.id)}
		}
	}
	return nil
}

// sliceCapacity is status's count for the potential slices among idx
// (those a class selects on n): per dynamic GPU, how many slices of the
// smallest profile the class accepts the GPU holds when empty (alloc), and
// how many could be created now (room).
func (n *nodeState) sliceCapacity(idx []int) (alloc, room int64) {
	smallest := map[*sliceGPU]*mig.Profile{}
	var gpus []*sliceGPU
	for _, i := range idx {
		d := n.devices[i]
		if d.slice == nil || !d.healthy || d.excluded {
			continue
		}
		g, p := d.slice.gpu, d.slice.inst.Profile
		if cur, ok := smallest[g]; !ok {
			gpus = append(gpus, g)
			smallest[g] = p
		} else if mig.Less(p, cur) {
			smallest[g] = p
		}
	}
	for _, g := range gpus {
		alloc += int64(mig.NewGPU(g.base.Table).Creatable(smallest[g]))
		room += int64(n.state(g).Creatable(smallest[g]))
	}
	return alloc, room
}

// sliceUtil is utilization's share for dynamic GPUs: each GPU d's classes
// select slices of counts as one device (total, in thousandths), used in
// proportion to its memory slices taken once p's slices are created.
func (n *nodeState) sliceUtil(d *demand, p *placement) (total, used int64) {
	seen := map[*sliceGPU]bool{}
	taken := map[*sliceGPU]int{}
	for _, ids := range p.drawn {
		for _, id := range ids {
			if s := n.devices[n.index[id]].slice; s != nil {
				taken[s.gpu] += s.inst.Profile.Size
			}
		}
	}
	for _, class := range d.classes {
		for _, g := range n.slicesOf(n.matches[class]) {
			if seen[g] {
				continue
			}
			seen[g] = true
			total += 1000
			used += int64(min(mig.Slots, mig.Slots-n.state(g).FreeSlices()+taken[g])) * 1000 / mig.Slots
		}
	}
	return total, used
}
