package resourceclasses

import (
	"slices"

	"github.com/resclass/resclass/pkg/scheduler/matching"
)

// The Topology strategy (docs/scheduler.md, "Topology"): for each class a pod
// requests, the set of free devices with the best interconnect.
//
// A set's score sums, over every pair of the pod's devices, what joins the
// pair, compared field by field: the NVLinks between the two first (what a
// multi-GPU job's collectives run over), then whether they share a PCIe
// switch (peer-to-peer and GPUDirect RDMA stay below it), then a PCIe root
// complex, then a NUMA node. Among sets of equal score the one whose devices
// have the fewest links of each kind to the devices left free is taken: it
// cuts least into the well-connected sets the next pod may need.

// topoScore is the score of a pair, a set, or a cut, compared lexicographically.
type topoScore struct{ nv, sw, root, numa int32 }

func (a topoScore) add(b topoScore) topoScore {
	return topoScore{a.nv + b.nv, a.sw + b.sw, a.root + b.root, a.numa + b.numa}
}

func (a topoScore) sub(b topoScore) topoScore {
	return topoScore{a.nv - b.nv, a.sw - b.sw, a.root - b.root, a.numa - b.numa}
}

// cmp orders scores: NVLinks first, then switch, root, NUMA.
func (a topoScore) cmp(b topoScore) int {
	for _, d := range [4]int32{a.nv - b.nv, a.sw - b.sw, a.root - b.root, a.numa - b.numa} {
		if d != 0 {
			if d > 0 {
				return 1
			}
			return -1
		}
	}
	return 0
}

// peerLink is an NVLink reach of a GPU: the device at pos, by links links.
type peerLink struct{ pos, links int32 }

// pair is what joins devices i and j. A GPU's NVLinks to a peer are the
// fewer of what the two say, so a device cannot claim links its peer denies.
func (n *nodeState) pair(i, j int) topoScore {
	a, b := n.devices[i], n.devices[j]
	var s topoScore
	if len(a.peers) > 0 && len(b.peers) > 0 {
		s.nv = min(linksTo(a.peers, j), linksTo(b.peers, i))
	}
	if a.sw >= 0 && a.sw == b.sw {
		s.sw = 1
	}
	if a.root >= 0 && a.root == b.root {
		s.root = 1
	}
	if a.numa >= 0 && a.numa == b.numa {
		s.numa = 1
	}
	return s
}

func linksTo(peers []peerLink, pos int) int32 {
	for _, p := range peers {
		if int(p.pos) == pos {
			return p.links
		}
	}
	return 0
}

// pairTable is pair for the devices of one decision, computed once: a search
// asks for the same pairs many times.
type pairTable struct {
	n    *nodeState
	slot []int32 // by device position: its row in w, or -1
	size int
	w    []topoScore
}

// maxPairTable bounds the devices a table holds (64 KiB of scores); pairs of
// others are computed when asked.
const maxPairTable = 64

func (n *nodeState) pairTable(devs []int) *pairTable {
	t := &pairTable{n: n}
	if len(devs) == 0 || len(devs) > maxPairTable {
		return t
	}
	t.slot = make([]int32, len(n.devices))
	for i := range t.slot {
		t.slot[i] = -1
	}
	t.size = len(devs)
	t.w = make([]topoScore, t.size*t.size)
	for x, i := range devs {
		t.slot[i] = int32(x)
		for y := 0; y < x; y++ {
			t.w[x*t.size+y] = n.pair(i, devs[y])
			t.w[y*t.size+x] = t.w[x*t.size+y]
		}
	}
	return t
}

func (t *pairTable) pair(i, j int) topoScore {
	if t.slot != nil {
		if si, sj := t.slot[i], t.slot[j]; si >= 0 && sj >= 0 {
			return t.w[int(si)*t.size+int(sj)]
		}
	}
	return t.n.pair(i, j)
}

// pairQuality rates a pair 0..100 for the node score: NVLink 100, one PCIe
// switch 75, one root complex 50, one NUMA node 25, nothing shared 0.
func pairQuality(s topoScore) int64 {
	switch {
	case s.nv > 0:
		return 100
	case s.sw > 0:
		return 75
	case s.root > 0:
		return 50
	case s.numa > 0:
		return 25
	}
	return 0
}

// quality is the mean pairQuality over the pairs of devices: how well the
// set is connected on a scale that is the same on every node, so that nodes
// can be compared by the best set each offers. One device is 100.
func (n *nodeState) quality(pos []int) int64 {
	if len(pos) < 2 {
		return 100
	}
	var sum, pairs int64
	for x, i := range pos {
		for _, j := range pos[x+1:] {
			sum += pairQuality(n.pair(i, j))
			pairs++
		}
	}
	return sum / pairs
}

// Search limits. A class's sets are enumerated when there are at most
// exhaustiveSets of them: C(8,k) <= 70 for any k, so an 8-GPU or 8-NIC node
// is always decided exactly; C(n,k) grows past it only with more than ten
// candidates. Beyond, the set is grown greedily from each of up to
// greedySeeds starting devices (no optimality claim; docs/scheduler.md).
const (
	exhaustiveSets = 256
	greedySeeds    = 16
	// keptFirstSets are the best sets of a pod's first class that are
	// completed with its other classes, so that a GPU set with a NIC under
	// its switch can win over an equal GPU set without one.
	keptFirstSets = 8
)

// binomialAtMost reports whether C(n, k) <= limit, without overflow.
func binomialAtMost(n, k, limit int) bool {
	k = min(k, n-k)
	c := 1
	for i := 1; i <= k; i++ {
		c = c * (n - k + i) / i
		if c > limit {
			return false
		}
	}
	return true
}

// rankedSet is a candidate set (device positions) with its key.
type rankedSet struct {
	pos        []int
	score, cut topoScore
}

// better orders sets: higher score, then smaller cut, then the earlier
// devices in published order (deterministic).
func (a *rankedSet) better(b *rankedSet) bool {
	if c := a.score.cmp(b.score); c != 0 {
		return c > 0
	}
	if c := a.cut.cmp(b.cut); c != 0 {
		return c < 0
	}
	return slices.Compare(a.pos, b.pos) < 0
}

// bestSets returns up to keep best k-sets of cand, the devices already chosen
// for the pod being base and the node's free exclusive devices freeDev (base
// and cand among them); best first. The score counts pairs within the set and
// with base; the cut, the pairs from the set to the free devices outside the
// set and base.
func (t *pairTable) bestSets(cand []int, k int, base, freeDev []int, keep int) []rankedSet {
	m := len(cand)
	if k <= 0 || k > m {
		return nil
	}
	// Per candidate: toBase, what joins it to base; rest, what joins it to
	// the free devices outside base. Then cut(S) = sum(rest) - 2 W(S).
	toBase := make([]topoScore, m)
	rest := make([]topoScore, m)
	for x, i := range cand {
		for _, b := range base {
			toBase[x] = toBase[x].add(t.pair(i, b))
		}
		for _, f := range freeDev {
			if f != i {
				rest[x] = rest[x].add(t.pair(i, f))
			}
		}
		rest[x] = rest[x].sub(toBase[x])
	}
	// The best keep sets, best first; their position slices are reused, so
	// that the enumeration allocates nothing per set.
	top := make([]rankedSet, 0, keep)
	consider := func(pos []int, score, cut topoScore) {
		r := rankedSet{pos: pos, score: score, cut: cut}
		at := len(top)
		for at > 0 && r.better(&top[at-1]) {
			at--
		}
		if at >= keep {
			return
		}
		if len(top) < keep {
			top = append(top, rankedSet{pos: make([]int, k)})
		}
		buf := top[len(top)-1].pos // the slot that falls off, or the new one
		copy(top[at+1:], top[at:len(top)-1])
		copy(buf, pos)
		top[at] = rankedSet{pos: buf, score: score, cut: cut}
	}
	if binomialAtMost(m, k, exhaustiveSets) {
		w := make([]topoScore, m*m)
		for x := range m {
			for y := x + 1; y < m; y++ {
				w[x*m+y] = t.pair(cand[x], cand[y])
				w[y*m+x] = w[x*m+y]
			}
		}
		picked := make([]int, 0, k) // indices into cand
		pos := make([]int, k)       // their positions
		var walk func(start int, score, cut topoScore)
		walk = func(start int, score, cut topoScore) {
			if len(picked) == k {
				for x, p := range picked {
					pos[x] = cand[p]
				}
				consider(pos, score, cut)
				return
			}
			for x := start; x <= m-(k-len(picked)); x++ {
				s, c := score.add(toBase[x]), cut.add(rest[x])
				for _, y := range picked {
					s = s.add(w[x*m+y])
					c = c.sub(w[x*m+y]).sub(w[x*m+y])
				}
				picked = append(picked, x)
				walk(x+1, s, c)
				picked = picked[:len(picked)-1]
			}
		}
		walk(0, topoScore{}, topoScore{})
		return top
	}
	// Greedy: from each seed, add the candidate that adds most to the score
	// (ties: the one with the least left to cut), until k.
	seeds := make([]int, m)
	for x := range seeds {
		seeds[x] = x
	}
	slices.SortStableFunc(seeds, func(x, y int) int {
		if c := toBase[y].cmp(toBase[x]); c != 0 {
			return c
		}
		return rest[y].cmp(rest[x]) // well-connected regions first
	})
	gain := make([]topoScore, m)
	in := make([]bool, m)
	pos := make([]int, 0, k)
	for _, seed := range seeds[:min(m, greedySeeds)] {
		clear(in)
		copy(gain, toBase)
		pos = pos[:0]
		var score, cut topoScore
		for x := seed; ; {
			in[x] = true
			pos = append(pos, cand[x])
			score, cut = score.add(gain[x]), cut.add(rest[x])
			for y := range m {
				if !in[y] {
					continue
				}
				if y != x {
					cut = cut.sub(t.pair(cand[x], cand[y])).sub(t.pair(cand[x], cand[y]))
				}
			}
			if len(pos) == k {
				break
			}
			next := -1
			for y := range m {
				if in[y] {
					continue
				}
				gain[y] = gain[y].add(t.pair(cand[x], cand[y]))
				if next < 0 {
					next = y
					continue
				}
				if c := gain[y].cmp(gain[next]); c > 0 || c == 0 && rest[y].cmp(rest[next]) < 0 {
					next = y
				}
			}
			x = next
		}
		sorted := slices.Clone(pos)
		slices.Sort(sorted)
		consider(sorted, score, cut)
	}
	return top
}

// topologySets chooses, per exclusive class of d, the devices the Topology
// strategy prefers; nil when it has no preference to give (the plain order
// then decides, and feasibility never depends on this choice: tryPlace's
// matching solves with these devices first and any others after).
func (n *nodeState) topologySets(d *demand, exclusive []string, free []bool, usable func(int) bool) map[string][]int {
	var freeDev []int // free for a whole-device pod
	for i, dev := range n.devices {
		if free[i] && dev.pool == nil && dev.shared == nil {
			freeDev = append(freeDev, i)
		}
	}
	classes := slices.Clone(exclusive)
	slices.SortStableFunc(classes, func(a, b string) int { return d.draws[b] - d.draws[a] })
	candidates := func(class string, taken []int) []int {
		var out []int
		for _, i := range n.matches[class] {
			if usable(i) && !slices.Contains(taken, i) {
				out = append(out, i)
			}
		}
		return out
	}
	alone := len(classes) == 1 && len(n.blocked) == 0
	keep := 1
	if !alone {
		keep = keptFirstSets
	}
	var best map[string][]int
	var bestSet *rankedSet
	t := n.pairTable(freeDev)
	for _, first := range t.bestSets(candidates(classes[0], nil), d.draws[classes[0]], nil, freeDev, keep) {
		chosen := map[string][]int{classes[0]: first.pos}
		taken := slices.Clone(first.pos)
		ok := alone || n.restFits(d, classes[1:], taken, usable, free)
		for ci := 1; ok && ci < len(classes); ci++ {
			ok = false
			for _, s := range t.bestSets(candidates(classes[ci], taken), d.draws[classes[ci]], taken, freeDev, keptFirstSets) {
				if n.restFits(d, classes[ci+1:], append(slices.Clone(taken), s.pos...), usable, free) {
					chosen[classes[ci]] = s.pos
					taken = append(taken, s.pos...)
					ok = true
					break
				}
			}
		}
		if !ok {
			continue
		}
		if alone {
			return chosen
		}
		all := rankedSet{pos: taken}
		all.score, all.cut = t.setScore(taken, freeDev)
		if bestSet == nil || all.better(bestSet) {
			best, bestSet = chosen, &all
		}
	}
	return best
}

// setScore is the score of the set pos and its cut to the other free devices.
func (t *pairTable) setScore(pos, freeDev []int) (score, cut topoScore) {
	for x, i := range pos {
		for _, j := range pos[x+1:] {
			score = score.add(t.pair(i, j))
		}
		for _, f := range freeDev {
			if !slices.Contains(pos, f) {
				cut = cut.add(t.pair(i, f))
			}
		}
	}
	return score, cut
}

// restFits reports whether classes, and the pods whose devices are blocked,
// can still be served once taken is gone.
func (n *nodeState) restFits(d *demand, classes []string, taken []int, usable func(int) bool, free []bool) bool {
	if len(classes) == 0 && len(n.blocked) == 0 {
		return true
	}
	left := slices.Clone(free)
	for _, i := range taken {
		left[i] = false
	}
	prob := matching.Problem{Devices: len(n.devices)}
	for _, class := range classes {
		var cand []int
		for _, i := range n.matches[class] {
			if left[i] && usable(i) {
				cand = append(cand, i)
			}
		}
		prob.Demand = append(prob.Demand, d.draws[class])
		prob.Candidates = append(prob.Candidates, cand)
	}
	demand, cands := blockedRows(n, free)
	for r := range cands {
		cands[r] = slices.DeleteFunc(slices.Clone(cands[r]), func(i int) bool { return !left[i] })
	}
	prob.Demand = append(prob.Demand, demand...)
	prob.Candidates = append(prob.Candidates, cands...)
	_, ok := matching.Solve(prob)
	return ok
}
