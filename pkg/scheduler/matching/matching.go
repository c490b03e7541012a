// Package matching decides whether a node's free devices can serve all of a pod's
// class requests at once, and which devices serve which class.
//
// Classes overlap: one GPU may match both "nvidia.high.mem" and "nvidia.any", so
// counting free devices per class accepts pods that do not fit (two classes each
// see the same device) and, choosing greedily, rejects pods that do (a device
// spent on the wrong class). The question is a bipartite b-matching: classes on
// one side with their demand, devices on the other with capacity one, an edge
// where the class selects the device. Solve finds a matching that serves every
// demand if one exists (augmenting paths, as in Ford-Fulkerson), and it tries
// each class's candidates in the order given, so the caller's strategy decides
// which devices are preferred.
package matching

// Problem is one pod's exclusive device demand on one node. Devices are numbered
// 0..Devices-1 by the caller.
type Problem struct {
	Devices int
	// Demand[c] is how many devices class c needs.
	Demand []int
	// Candidates[c] are the free devices class c selects, most preferred first.
	Candidates [][]int
}

// Solve returns, for each class, the devices that serve it (len(result[c]) ==
// Demand[c], no device twice across all classes), and true; or nil and false when
// no such choice exists. Devices a class can have without taking one from another
// class are taken in the order of its candidates.
func Solve(p Problem) ([][]int, bool) {
	owner := make([]int, p.Devices) // class that holds the device, or -1
	for i := range owner {
		owner[i] = -1
	}
	got := make([][]int, len(p.Demand))
	// Most constrained class first: its choices are fewest, so it should not have
	// to displace others. Feasibility does not depend on the order; only which
	// devices the preference order yields does.
	order := make([]int, 0, len(p.Demand))
	for c := range p.Demand {
		if p.Demand[c] > 0 {
			order = append(order, c)
		}
	}
	slack := func(c int) int { return len(p.Candidates[c]) - p.Demand[c] }
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && slack(order[j]) < slack(order[j-1]); j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	visited := make([]bool, p.Devices)
	for _, c := range order {
		if len(p.Candidates[c]) < p.Demand[c] {
			return nil, false
		}
		for range p.Demand[c] {
			clear(visited)
			if !augment(&p, c, owner, got, visited) {
				return nil, false
			}
		}
	}
	return got, true
}

// augment gives class c one more device: a free candidate, or one held by another
// class that can itself move to a different device.
func augment(p *Problem, c int, owner []int, got [][]int, visited []bool) bool {
	// A free device first, in preference order: only when none is free does c
	// displace another class.
	for _, d := range p.Candidates[c] {
		if owner[d] == -1 && !visited[d] {
			owner[d] = c
			got[c] = append(got[c], d)
			return true
		}
	}
	for _, d := range p.Candidates[c] {
		if visited[d] || owner[d] == c {
			continue
		}
		visited[d] = true
		other := owner[d]
		if other >= 0 && augment(p, other, owner, got, visited) {
			// other moved to a new device; d is c's now.
			got[other] = remove(got[other], d)
			owner[d] = c
			got[c] = append(got[c], d)
			return true
		}
	}
	return false
}

func remove(s []int, v int) []int {
	for i, x := range s {
		if x == v {
			return append(s[:i], s[i+1:]...)
		}
	}
	return s
}
