package resourceclasses

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/resclass/resclass/pkg/scheduler/matching"
	"github.com/resclass/resclass/pkg/selector"
)

// placement is a pod's devices on one node: per class, one device id per draw
// (a pool id may serve several draws); for a share class, one device per
// container that requests it, in the pod's order, with its share.
type placement struct {
	drawn     map[string][]string
	shares    map[string][]placedShare // share class -> per entry of drawn; nil without shares
	numas     int                      // distinct NUMA nodes among the chosen devices
	aligned   bool                     // all on one NUMA node
	util      int64                    // 0..100: share of the requested classes' devices in use once placed
	quality   int64                    // 0..100: how well the exclusive devices are connected (Topology only)
	exclusive int                      // how many exclusive devices (Topology only)
}

// placedShare is one container's share: its units of the class and what
// they take of the device.
type placedShare struct {
	units  int64
	amount selector.Share
}

// unfit says why a pod does not fit a node. unresolvable means no change to the
// node's devices would help (the pod itself must change).
type unfit struct {
	reason       string
	unresolvable bool
	// shareRoom: a container's share found no device with room for it.
	shareRoom bool
}

// eligible is PreFilter's decision: every class d requests exists (else the
// set is nil), and the nodes where each of them selects a device (nodesFor),
// not none (else the set is empty). The plugin and Snapshot both ask it.
func (c *cache) eligible(d *demand) (sets.Set[string], *unfit) {
	if class, missing := c.missingClass(d.classes); missing {
		return nil, &unfit{unresolvable: true, reason: fmt.Sprintf("ResourceClass %q does not exist", class)}
	}
	eligible := c.nodesFor(d.classes)
	if eligible.Len() == 0 {
		return eligible, &unfit{unresolvable: true, reason: "no node has devices of class " + strings.Join(d.classes, ", ")}
	}
	return eligible, nil
}

// place chooses pod's devices on node n with strategy s, and shares in the
// order BinPack gives them (placeWith).
func (n *nodeState) place(d *demand, s Strategy) (*placement, *unfit) {
	return n.placeWith(d, s, BinPack)
}

// placeWith chooses pod's devices on node n with strategy s, and its shares
// with share strategy ss (BinPack, Spread; FirstFit in published order). It
// only reads n: the cache calls it under its lock (cache.fits, cache.score,
// cache.reserve).
func (n *nodeState) placeWith(d *demand, s, ss Strategy) (*placement, *unfit) {
	if n == nil {
		return nil, &unfit{reason: "node publishes no devices (no NodeDevices)"}
	}
	var c placeClasses
	c.shareOrder = ss
	for _, class := range d.classes {
		if d.draws[class] == 0 {
			continue
		}
		if _, ok := n.shareUnits[class]; ok {
			c.shares = append(c.shares, class)
		} else if n.selectsSlices(class) {
			c.slices = append(c.slices, class)
			c.exclusive = append(c.exclusive, class)
		} else if slices.ContainsFunc(n.matches[class], func(i int) bool { return n.devices[i].pool != nil }) {
			c.pools = append(c.pools, class)
		} else {
			c.exclusive = append(c.exclusive, class)
		}
	}
	for _, class := range c.pools {
		if u := d.checkPoolRequests(class); u != nil {
			return nil, u
		}
	}
	for _, class := range c.shares {
		if u := d.checkShareRequests(class); u != nil {
			return nil, u
		}
	}
	free := make([]bool, len(n.devices))
	freeInNUMA := map[int]int{}
	for i, dev := range n.devices {
		free[i] = dev.givable()
		if free[i] && dev.pool == nil && dev.shared == nil {
			freeInNUMA[dev.numa]++
		}
	}
	try := func(onlyNUMA int, order func([]int) []int) (*placement, *unfit) {
		return n.tryPlace(d, c, free, onlyNUMA, func(_ string, idx []int) []int { return order(idx) })
	}
	byNUMAFree := func(fullestFirst bool) func([]int) []int {
		return func(idx []int) []int {
			out := slices.Clone(idx)
			slices.SortStableFunc(out, func(a, b int) int {
				fa, fb := freeInNUMA[n.devices[a].numa], freeInNUMA[n.devices[b].numa]
				if fullestFirst {
					return fa - fb
				}
				return fb - fa
			})
			return out
		}
	}
	var p *placement
	var u *unfit
	switch s {
	case BinPack:
		p, u = try(anyNUMA, byNUMAFree(true))
	case Spread:
		p, u = try(anyNUMA, byNUMAFree(false))
	case NUMAAligned:
		// The fullest NUMA node that takes the whole pod keeps the emptier ones
		// whole for later pods; failing that, the emptiest first uses the fewest.
		numas := numaNodes(n)
		slices.SortStableFunc(numas, func(a, b int) int { return freeInNUMA[a] - freeInNUMA[b] })
		for _, numa := range numas {
			if p, _ = try(numa, byNUMAFree(true)); p != nil {
				break
			}
		}
		if p == nil {
			p, u = try(anyNUMA, byNUMAFree(false))
		}
	case Topology:
		p, u = n.placeTopology(d, c, free)
	default:
		p, u = try(anyNUMA, slices.Clone[[]int])
	}
	if p == nil && u.shareRoom && ss != BinPack {
		// Shares in another order than BinPack's may leave no room for a
		// pod's later containers where BinPack's does: Filter's answer
		// (cache.fits) stands.
		return n.placeWith(d, s, BinPack)
	}
	if p == nil {
		return nil, u
	}
	p.util = n.utilization(d, p)
	return p, nil
}

// placeClasses are a pod's classes on a node by how they are placed.
type placeClasses struct {
	exclusive []string // whole devices, by the matching
	pools     []string // hugepage pools: pages
	shares    []string // share classes: amounts of shared devices
	// slices are classes that select potential MIG slices: placeSlices
	// serves what draws it can, the matching the rest with whole devices
	// (they are among exclusive too).
	slices []string
	// shareOrder is the share strategy (placeWith).
	shareOrder Strategy
}

const anyNUMA = -2

func numaNodes(n *nodeState) []int {
	var out []int
	for _, d := range n.devices {
		if d.numa >= 0 && !slices.Contains(out, d.numa) {
			out = append(out, d.numa)
		}
	}
	slices.Sort(out)
	return out
}

// placeTopology places with the devices topologySets prefers first: the
// matching still decides feasibility, so a node fits with Topology exactly
// when it fits with any other strategy.
func (n *nodeState) placeTopology(d *demand, c placeClasses, free []bool) (*placement, *unfit) {
	exclusive := c.exclusive
	var prefer map[string][]int
	if len(exclusive) > 0 {
		prefer = n.topologySets(d, exclusive, free, func(i int) bool { return free[i] })
	}
	p, u := n.tryPlace(d, c, free, anyNUMA, func(class string, idx []int) []int {
		first := prefer[class]
		if len(first) == 0 {
			return slices.Clone(idx)
		}
		out := make([]int, 0, len(idx))
		for _, i := range first {
			if slices.Contains(idx, i) {
				out = append(out, i)
			}
		}
		for _, i := range idx {
			if !slices.Contains(first, i) {
				out = append(out, i)
			}
		}
		return out
	})
	if p == nil {
		return nil, u
	}
	var pos []int
	for _, class := range exclusive {
		for _, id := range p.drawn[class] {
			pos = append(pos, n.index[id])
		}
	}
	p.quality, p.exclusive = n.quality(pos), len(pos)
	return p, nil
}

// tryPlace solves the matching of d's exclusive classes on n, each class's
// candidates in the order order gives them, then picks its pools and its
// shares.
func (n *nodeState) tryPlace(d *demand, c placeClasses, free []bool, onlyNUMA int, order func(class string, idx []int) []int) (*placement, *unfit) {
	exclusive, pools := c.exclusive, c.pools
	usable := func(i int) bool { return free[i] && (onlyNUMA == anyNUMA || n.devices[i].numa == onlyNUMA) }
	p := &placement{drawn: map[string][]string{}}
	bySlices := n.placeSlices(d, c.slices, usable, p)
	prob := matching.Problem{Devices: len(n.devices)}
	for _, class := range exclusive {
		var cand []int
		for _, i := range n.matches[class] {
			if usable(i) && n.devices[i].slice == nil {
				cand = append(cand, i)
			}
		}
		prob.Demand = append(prob.Demand, d.draws[class]-bySlices[class])
		prob.Candidates = append(prob.Candidates, order(class, cand))
	}
	// Pods whose assignment is not believed hold devices of their classes,
	// which ones unknown: they join the matching, so that whatever this pod
	// takes leaves enough for them.
	demand, cands := blockedRows(n, free)
	prob.Demand = append(prob.Demand, demand...)
	prob.Candidates = append(prob.Candidates, cands...)
	got, ok := matching.Solve(prob)
	if !ok {
		rows := len(prob.Demand) - len(demand)
		if _, alone := matching.Solve(matching.Problem{Devices: prob.Devices, Demand: prob.Demand[:rows], Candidates: prob.Candidates[:rows]}); len(demand) > 0 && alone {
			return nil, &unfit{reason: "Insufficient free devices of class " + strings.Join(exclusive, ", ") + ": some are held by pods whose assignment the scheduler does not believe, or kept for higher-priority pods nominated to the node, which ones unknown"}
		}
		return nil, explainShortage(exclusive, prob)
	}
	for ci, class := range exclusive {
		for _, i := range got[ci] {
			p.drawn[class] = append(p.drawn[class], n.devices[i].id)
		}
	}
	// Pools are shared: each draw takes a pool of its class whose free pages
	// cover the native request of its containers together with this pod's
	// earlier draws from the same pool. The pod's request is not the sum of its
	// draws' (an init container's pages are back before the app containers
	// start), so it is counted over all of them, as the pool will be charged.
	onPool := map[int][]*containerDemand{}
	for _, class := range pools {
		draws := d.drawUsers(class)
		for _, users := range draws {
			chosen := -1
			sized := false // a usable pool of a size the containers request exists
			for _, i := range order(class, n.matches[class]) {
				pool := n.devices[i].pool
				if pool == nil || !usable(i) {
					continue
				}
				sized = sized || requestsAll(users, pool)
				all := d.inPodOrder(onPool[i], users)
				if pageBytes(users, pool.resourceName) > 0 && pool.freeBytes() >= pageBytes(all, pool.resourceName) && requestsAll(users, pool) {
					chosen = i
					onPool[i] = all
					break
				}
			}
			if chosen < 0 && !sized {
				// Node-dependent (another node may have pools of that size), so
				// not unresolvable; the same reason on every such node.
				return nil, &unfit{reason: fmt.Sprintf("no hugepage pool of class %s has the page size its containers request as hugepages-<size>", class)}
			}
			if chosen < 0 {
				return nil, &unfit{reason: fmt.Sprintf("no hugepage pool of class %s has the free pages its containers request", class)}
			}
			p.drawn[class] = append(p.drawn[class], n.devices[chosen].id)
		}
	}
	if u := n.placeShares(d, c.shares, c.shareOrder, usable, p); u != nil {
		return nil, u
	}
	used := map[int]bool{}
	unknown := false
	for _, ids := range p.drawn {
		for _, id := range ids {
			if numa := n.devices[n.index[id]].numa; numa >= 0 {
				used[numa] = true
			} else {
				unknown = true
			}
		}
	}
	p.numas = len(used)
	if unknown {
		p.numas = 0 // a device without a NUMA node: alignment unknown
	}
	p.aligned = p.numas == 1
	return p, nil
}

// placeShares gives each container of d that requests a share class one
// device of the class for its units times the class's unit: a shared
// device that is usable and whose free capacity, less the shares of this
// pod placed on it before, covers the whole share. A share is never spread
// over devices (docs/sharing.md). ss orders the devices that take it:
// BinPack the one with the least room left (so that emptier devices stay
// whole), Spread the one with the most, FirstFit the first published. Each
// container takes the device that ss prefers for it alone, in the pod's
// order; cache.fits asks with BinPack, and placeWith falls back to it.
func (n *nodeState) placeShares(d *demand, classes []string, ss Strategy, usable func(int) bool, p *placement) *unfit {
	var taken map[int]selector.Share // this pod's shares so far, by device
	for _, class := range classes {
		unit := n.shareUnits[class]
		for ci := range d.containers {
			c := &d.containers[ci]
			units := int64(c.classes[class])
			if units == 0 {
				continue
			}
			chosen, sized := n.chooseShare(class, unit, units, ss, usable, taken)
			if chosen < 0 {
				return shareUnfit(c.name, class, unit, units, sized)
			}
			amount := unit.Times(units)
			if taken == nil {
				taken = map[int]selector.Share{}
			}
			taken[chosen] = addShare(taken[chosen], 1, amount)
			if p.shares == nil {
				p.shares = map[string][]placedShare{}
			}
			p.drawn[class] = append(p.drawn[class], n.devices[chosen].id)
			p.shares[class] = append(p.shares[class], placedShare{units: units, amount: amount})
		}
	}
	return nil
}

// chooseShare is the device of class (-1: none) that ss prefers for units of
// unit among the usable ones (nil: those givable now) whose free capacity,
// less taken, covers them; sized reports whether any device of the class
// could hold them empty.
func (n *nodeState) chooseShare(class string, unit selector.Share, units int64, ss Strategy, usable func(int) bool, taken map[int]selector.Share) (chosen int, sized bool) {
	chosen = -1
	var best selector.Capacity
	for _, i := range n.matches[class] {
		dev := n.devices[i]
		if dev.shared == nil {
			continue
		}
		// unitsIn, not Fits: Fits says why not, which Filter does not ask on
		// every node.
		if units > unitsIn(unit, dev.shared.capacity) {
			continue
		}
		sized = true
		if (usable == nil && !dev.givable()) || (usable != nil && !usable(i)) {
			continue
		}
		room := less(dev.shared.free(), taken[i])
		if units <= unitsIn(unit, room) && (chosen < 0 || preferredRoom(ss, unit, room, best)) {
			chosen, best = i, room
		}
	}
	return chosen, sized
}

// shareUnfit is why container's units of class found no device: larger than
// any device of the class on the node (sized false), or than any has free.
func shareUnfit(container, class string, unit selector.Share, units int64, sized bool) *unfit {
	if !sized {
		// Node-dependent (another node may have larger devices), so
		// unresolvable here only: preemption frees no capacity.
		return &unfit{unresolvable: true, reason: fmt.Sprintf("container %q asks %d units of class %s (%s): more than one GPU of the class has", container, units, class, inReason(describeUnits(unit, units)))}
	}
	return &unfit{shareRoom: true, reason: fmt.Sprintf("Insufficient free share capacity of class %s: container %q asks %d units (%s), more than any GPU of the class has free", class, container, units, inReason(describeUnits(unit, units)))}
}

// oneShare answers Filter for the common share pod, one container asking
// one share class, on a node as it is, without building a placement: it
// allocates nothing when the pod fits. handled is false for any other pod.
func (n *nodeState) oneShare(d *demand) (u *unfit, handled bool) {
	if len(d.classes) != 1 || len(d.containers) != 1 {
		return nil, false
	}
	class := d.classes[0]
	unit, ok := n.shareUnits[class]
	if !ok {
		return nil, false
	}
	if u := d.checkShareRequests(class); u != nil {
		return u, true
	}
	c := &d.containers[0]
	units := int64(c.classes[class])
	chosen, sized := n.chooseShare(class, unit, units, FirstFit, nil, nil)
	if chosen < 0 {
		return shareUnfit(c.name, class, unit, units, sized), true
	}
	return nil, true
}

// preferredRoom reports whether a device with room a is preferred to one
// with room b under share strategy ss: by the capacity the unit takes
// (memory before compute), the least room for BinPack, the most for Spread;
// FirstFit keeps the first.
func preferredRoom(ss Strategy, unit selector.Share, a, b selector.Capacity) bool {
	first, second := [2]int64{a.Memory, a.Compute}, [2]int64{b.Memory, b.Compute}
	if unit.Memory == 0 {
		first, second = [2]int64{a.Compute, a.Memory}, [2]int64{b.Compute, b.Memory}
	}
	cmp := 0
	for k := range first {
		if first[k] != second[k] {
			cmp = 1
			if first[k] < second[k] {
				cmp = -1
			}
			break
		}
	}
	switch ss {
	case BinPack:
		return cmp < 0
	case Spread:
		return cmp > 0
	}
	return false
}

// checkShareRequests: a share is one container's; an init container that is
// not a sidecar hands its devices on to the containers after it.
func (d *demand) checkShareRequests(class string) *unfit {
	for _, c := range d.containers {
		if c.classes[class] > 0 && c.init && !c.restartable {
			return &unfit{unresolvable: true, reason: fmt.Sprintf("init container %q requests class %s, which takes shares of a GPU: a share is one container's, and the kubelet hands an init container's devices to the containers after it; request it in the containers that use it, or make the init container a sidecar (restartPolicy: Always)", c.name, class)}
		}
	}
	return nil
}

// describeUnits says what units of unit take, e.g. "90Gi memory, 225%
// compute".
func describeUnits(unit selector.Share, units int64) string {
	var parts []string
	if unit.Memory > 0 {
		if units <= math.MaxInt64/unit.Memory {
			parts = append(parts, resource.NewQuantity(unit.Memory*units, resource.BinarySI).String()+" memory")
		} else {
			parts = append(parts, fmt.Sprintf("%d × %s memory", units, resource.NewQuantity(unit.Memory, resource.BinarySI).String()))
		}
	}
	if unit.Compute > 0 {
		parts = append(parts, fmt.Sprintf("%d%% compute", unit.Compute*units))
	}
	return strings.Join(parts, ", ")
}

// inReason spells a percentage in words for a reason of a refusal: the
// scheduler's FailedScheduling Event takes its message as a format string
// (upstream's schedule_one.go), where "125% compute" became
// "125%!c(MISSING)ompute".
func inReason(s string) string {
	return strings.ReplaceAll(s, "%", " percent")
}

// describeShare says what share s takes.
func describeShare(s selector.Share) string {
	return describeUnits(s, 1)
}

// blockedRows are the rows of n's blocked devices (nodeState.blocked) in the
// matching: per class, its free exclusive devices on any NUMA node. When
// they cannot all be served even alone (the free devices are fewer, e.g.
// because a blocked pod's device is also named by a trusted assignment), the
// rows ask only for what can be: blocked devices never make a node refuse
// more than its free devices.
func blockedRows(n *nodeState, free []bool) ([]int, [][]int) {
	if len(n.blocked) == 0 {
		return nil, nil
	}
	var demand []int
	var cands [][]int
	for _, class := range slices.Sorted(maps.Keys(n.blocked)) {
		var cand []int
		for _, i := range n.matches[class] {
			if free[i] && n.devices[i].pool == nil && n.devices[i].shared == nil && n.devices[i].slice == nil {
				cand = append(cand, i)
			}
		}
		demand = append(demand, min(n.blocked[class], len(cand)))
		cands = append(cands, cand)
	}
	for {
		if _, ok := matching.Solve(matching.Problem{Devices: len(n.devices), Demand: demand, Candidates: cands}); ok {
			return demand, cands
		}
		demand[slices.Index(demand, slices.Max(demand))]--
	}
}

// requestsAll reports whether every container drawing from a pool requests its
// page size natively: without that request the kubelet sets the container's
// hugetlb limit to 0 and the first page it touches kills it.
func requestsAll(users []*containerDemand, pool *poolState) bool {
	for _, u := range users {
		if u.hugepages[pool.resourceName] <= 0 {
			return false
		}
	}
	return true
}

// explainShortage names the class that lacks devices, or, when each class alone
// would fit, the classes that compete for the same devices. The reasons are the
// same on every node with the same shortage, so the scheduler's FailedScheduling
// message counts nodes per reason, as for "Insufficient nvidia.com/gpu".
func explainShortage(classes []string, prob matching.Problem) *unfit {
	var short []string
	for ci, class := range classes {
		if len(prob.Candidates[ci]) < prob.Demand[ci] {
			short = append(short, class)
		}
	}
	if len(short) > 0 {
		return &unfit{reason: "Insufficient free devices of class " + strings.Join(short, ", ")}
	}
	return &unfit{reason: "Insufficient free devices for classes " + strings.Join(classes, ", ") + " together (they select the same devices)"}
}

// utilization is the share (0..100) of the devices the pod's classes select on n
// that are held once p is placed: what BinPack maximises and Spread minimises.
// A shared device counts as held in the part its shares take (permille). For
// a pod with shares it is 90% how full the fullest GPU its shares take is
// once placed, 10% the node's: BinPack then puts a share where it fits most
// tightly across nodes, as it does within one (placeShares), which kept
// more room in BenchmarkSharePlacement (262 of 6000 requests refused, 292
// with the node's share alone).
func (n *nodeState) utilization(d *demand, p *placement) int64 {
	var placed map[int]selector.Share // this pod's shares, by device
	for class, shares := range p.shares {
		for k, s := range shares {
			if placed == nil {
				placed = map[int]selector.Share{}
			}
			i := n.index[p.drawn[class][k]]
			placed[i] = addShare(placed[i], 1, s.amount)
		}
	}
	seen := map[int]bool{}
	var total, used int64 // in thousandths of a device
	for _, class := range d.classes {
		for _, i := range n.matches[class] {
			dev := n.devices[i]
			if seen[i] || dev.pool != nil || dev.slice != nil || dev.excluded || !dev.healthy {
				continue
			}
			seen[i] = true
			total += 1000
			switch {
			case dev.shared != nil:
				used += dev.shared.permille(placed[i])
			case dev.holders > 0:
				used += 1000
			}
		}
	}
	for _, ids := range p.drawn {
		for _, id := range ids {
			if dev := n.devices[n.index[id]]; dev.pool == nil && dev.shared == nil && dev.slice == nil {
				used += 1000
			}
		}
	}
	st, su := n.sliceUtil(d, p)
	total, used = total+st, used+su
	if total == 0 {
		return 0
	}
	util := min(100, used*100/total)
	if placed == nil {
		return util
	}
	var fullest int64
	for i, s := range placed {
		fullest = max(fullest, n.devices[i].shared.permille(s))
	}
	return (fullest*9 + util*10) / 100 // permille and percent: 0..100
}

// checkPoolRequests: a hugepage class is a placement class, one unit per
// container (docs/hugepages.md).
func (d *demand) checkPoolRequests(class string) *unfit {
	for _, c := range d.containers {
		if n := c.classes[class]; n > 1 {
			return &unfit{unresolvable: true, reason: fmt.Sprintf("class %s selects hugepage pools: a container requests 1 of it (the pool) and the pages as hugepages-<size>; container %q requests %d", class, c.name, n)}
		}
		if c.classes[class] == 1 && len(c.hugepages) == 0 {
			return &unfit{unresolvable: true, reason: fmt.Sprintf("class %s selects hugepage pools but container %q requests no hugepages-<size>: add the pages it needs, e.g. hugepages-1Gi: 2Gi", class, c.name)}
		}
	}
	return nil
}

// drawUsers lists, per draw of class, the containers that use the device drawn.
func (d *demand) drawUsers(class string) [][]*containerDemand {
	n := d.draws[class]
	ids := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	perContainer := d.assign(class, ids)
	out := make([][]*containerDemand, n)
	for ci := range d.containers {
		c := &d.containers[ci]
		for _, id := range perContainer[c.name] {
			i, _ := strconv.Atoi(id)
			out[i] = append(out[i], c)
		}
	}
	return out
}

// maxNUMA bounds the NUMA nodes the quick path tells apart; devices on others
// (or on none) are counted together.
const maxNUMA = 16

// quickCounts sums up the devices a class selects on a node, for quick.
type quickCounts struct {
	// divisible: a device that several pods share (a hugepage pool, a GPU
	// serving shares) among them: quick does not answer, placement counts
	// what is left of it.
	divisible         bool
	total, held, free int // healthy and allocatable ones; of those, held and free
	// perNUMA counts the free ones by NUMA node; perNUMA[maxNUMA] those on
	// another NUMA node or on none.
	perNUMA [maxNUMA + 1]int
	// unserved: the node's agent said it is stopping, or its kubelet offers
	// none of the class, so its agent does not serve it (liveness.go); set
	// by recount.
	unserved bool
}

// count sums up the devices idx of n.
func (n *nodeState) count(idx []int) *quickCounts {
	q := &quickCounts{}
	for _, i := range idx {
		dev := n.devices[i]
		if dev.pool != nil || dev.shared != nil || dev.slice != nil {
			q.divisible = true
		}
		if !dev.healthy || dev.excluded {
			continue
		}
		q.total++
		if dev.holders > 0 {
			q.held++
			continue
		}
		q.free++
		numa := dev.numa
		if numa < 0 || numa >= maxNUMA {
			numa = maxNUMA
		}
		q.perNUMA[numa]++
	}
	return q
}

// classCounts is one class's quickCounts on a node.
type classCounts struct {
	class string
	quickCounts
}

// recount sums up every class's devices on n again, after devices were
// taken or given back or a class's selection changed. It replaces n.counts
// rather than changing it: a view (viewLocked) shares the slice with the
// cache's node state until then.
func (n *nodeState) recount() {
	counts := make([]classCounts, 0, len(n.matches))
	for class, idx := range n.matches {
		q := *n.count(idx)
		q.unserved = n.stopping || n.kubelet.unserves(class)
		counts = append(counts, classCounts{class: class, quickCounts: q})
	}
	slices.SortFunc(counts, func(a, b classCounts) int { return strings.Compare(a.class, b.class) })
	n.counts = counts
}

// countsOf is class's counts on n, nil where it selects no device.
func (n *nodeState) countsOf(class string) *quickCounts {
	i := sort.Search(len(n.counts), func(i int) bool { return n.counts[i].class >= class })
	if i < len(n.counts) && n.counts[i].class == class {
		return &n.counts[i].quickCounts
	}
	return nil
}

// quick answers Filter and Score without building a placement for the common
// pod: one class of exclusive devices (not pools, not shares). Filter and Score run for every pod on
// hundreds of nodes, so this path must not allocate, and it reads the node's
// counts (quickCounts) rather than its devices; Reserve, once per pod,
// always takes the full path. handled is false for any other pod.
func (n *nodeState) quick(d *demand) (fits bool, util int64, numas int, handled bool) {
	if n == nil || len(d.classes) != 1 || len(n.blocked) > 0 {
		return false, 0, 0, false
	}
	class := d.classes[0]
	return n.countsOf(class).answer(d.draws[class])
}

// fits is answer's first value alone, for Filter: whether want of the
// class's devices are free, without the figures Score needs.
func (q *quickCounts) fits(want int) (fits, handled bool) {
	if q == nil {
		return want <= 0, true
	}
	if q.divisible {
		return false, false
	}
	return q.free >= want, true
}

// answer is quick's answer from a class's counts on a node (nil: the class
// selects nothing there) for a pod that wants want of its devices.
func (q *quickCounts) answer(want int) (fits bool, util int64, numas int, handled bool) {
	if fits, handled := q.fits(want); !fits || !handled || q == nil {
		return fits, 0, 0, handled
	}
	total, held, perNUMA := q.total, q.held, q.perNUMA
	if total > 0 {
		util = min(100, int64(held+want)*100/int64(total))
	}
	// The fewest NUMA nodes that hold want free devices, largest first.
	if perNUMA[maxNUMA] == 0 {
		counts := perNUMA[:maxNUMA]
		for left := want; left > 0; numas++ {
			best := 0
			for i := range counts {
				if counts[i] > counts[best] {
					best = i
				}
			}
			left -= counts[best]
			counts[best] = 0
		}
	}
	return true, util, numas, true
}
