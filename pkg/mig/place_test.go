package mig

import (
	"fmt"
	"testing"
)

func TestFitsAndExclusions(t *testing.T) {
	g := NewGPU(A100_40GB)
	p := A100_40GB.Profile
	mustAdd := func(name string, start int) {
		t.Helper()
		if err := g.Add(p(name), start); err != nil {
			t.Fatal(err)
		}
	}
	mustAdd("4g.20gb", 0)
	for _, c := range []struct {
		name  string
		start int
		fits  bool
	}{
		{"3g.20gb", 0, false}, // slices 0-3 taken
		{"3g.20gb", 4, true},
		{"2g.10gb", 2, false},
		{"2g.10gb", 4, true},
		{"1g.5gb", 3, false},
		{"1g.5gb", 6, true},
		{"1g.5gb", 7, false}, // not a placement of 1g.5gb
		{"7g.40gb", 0, false},
	} {
		if got := g.Fits(p(c.name), c.start); got != c.fits {
			t.Errorf("with 4g.20gb@0, %s@%d fits %v, want %v", c.name, c.start, got, c.fits)
		}
	}
	mustAdd("1g.5gb+me", 4)
	if g.Fits(p("1g.5gb+me"), 5) {
		t.Error("a second 1g.5gb+me fits: its limit is one")
	}
	if err := g.Remove(p("1g.5gb"), 4); err == nil {
		t.Error("removed a 1g.5gb that is not there")
	}
	if err := g.Remove(p("1g.5gb+me"), 4); err != nil || !g.Fits(p("1g.5gb+me"), 5) {
		t.Errorf("after removing it, another does not fit: %v", err)
	}
	if g.Whole() || g.FreeSlices() != 4 {
		t.Errorf("whole %v, %d free slices; want 4 with 4g.20gb@0", g.Whole(), g.FreeSlices())
	}
}

// request asks for at least a profile's memory and compute, without media
// extensions.
type request struct {
	name    string
	memory  int64
	compute int
}

func (r request) accept(p *Profile) bool {
	return !limited(p) && p.MemoryMiB >= r.memory && p.Compute >= r.compute
}

// limited: the profile's instance limit is below its placements (the media
// extension profiles). Left out of the exhaustive search, so that a GPU's
// state is its slices alone.
func limited(p *Profile) bool { return p.Max < len(p.Starts) }

// requests are one per profile that is not limited: asking for exactly what
// it has.
func requests(t *Table) []request {
	var out []request
	for i := range t.Profiles {
		if p := &t.Profiles[i]; !limited(p) {
			out = append(out, request{p.Name, p.MemoryMiB, p.Compute})
		}
	}
	return out
}

// reachable are the slice masks instances of profiles that are not limited
// can leave a GPU in.
func reachable(t *Table) []uint8 {
	seen := map[uint8]bool{0: true}
	queue := []uint8{0}
	for len(queue) > 0 {
		m := queue[0]
		queue = queue[1:]
		for i := range t.Profiles {
			p := &t.Profiles[i]
			if limited(p) {
				continue
			}
			for _, s := range p.Starts {
				if n := m | p.mask(s); m&p.mask(s) == 0 && !seen[n] {
					seen[n] = true
					queue = append(queue, n)
				}
			}
		}
	}
	out := make([]uint8, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	return out
}

func gpuAt(t *Table, used uint8) *GPU { return &GPU{Table: t, used: used, count: map[string]int{}} }

// TestChooseIsTheStatedObjective: on every state a GPU can be in and for
// every request, Choose gives the smallest accepted profile that fits, and of
// its placements one that leaves the largest profile creatable, as a search
// of every placement finds.
func TestChooseIsTheStatedObjective(t *testing.T) {
	for _, table := range Builtin {
		for _, used := range reachable(table) {
			for _, r := range requests(table) {
				g := gpuAt(table, used)
				c, ok := g.Choose(r.accept)
				bestRank, bestLargest := -1, -1
				for i := range table.Profiles {
					p := &table.Profiles[i]
					if !r.accept(p) {
						continue
					}
					for _, s := range p.Starts {
						if !g.Fits(p, s) {
							continue
						}
						if bestRank == -1 {
							bestRank = i
						}
						if i == bestRank {
							h := gpuAt(table, used|p.mask(s))
							bestLargest = max(bestLargest, h.Largest())
						}
					}
				}
				if ok != (bestRank >= 0) || ok && (c.rank != bestRank || c.largest != bestLargest) {
					t.Fatalf("%s, slices %08b, %s: chose %v (profile %d, largest after %d, ok %v); the search finds profile %d, largest after %d",
						table.Product, used, r.name, c.Instance, c.rank, c.largest, ok, bestRank, bestLargest)
				}
				if ok && (!g.Fits(c.Profile, c.Start) || g.used != used) {
					t.Fatalf("%s: chose %v, which does not fit, or changed the GPU", table.Product, c.Instance)
				}
			}
		}
	}
}

// TestChooseAgainstExhaustiveSearch measures the objective where it matters,
// over sequences: from every state a GPU can be in, for every sequence of
// four requests (each served by the choice, or refused when nothing fits),
// how many Choose serves against the most any sequence of choices could
// serve (a search of every profile and placement at each step), and against
// first fit (the smallest accepted profile at its lowest free start, what a
// placement that looks no further does).
func TestChooseAgainstExhaustiveSearch(t *testing.T) {
	const length = 4
	for _, table := range Builtin {
		reqs := requests(table)
		states := reachable(table)
		var ours, first, best, pairs, oursShort, firstShort int
		seq := make([]int, length)
		var walk func(int)
		walk = func(k int) {
			if k < length {
				for i := range reqs {
					seq[k] = i
					walk(k + 1)
				}
				return
			}
			memo := map[[2]int]int{}
			var opt func(used uint8, i int) int
			opt = func(used uint8, i int) int {
				if i == length {
					return 0
				}
				key := [2]int{int(used), i}
				if v, ok := memo[key]; ok {
					return v
				}
				v := opt(used, i+1)
				r := reqs[seq[i]]
				for pi := range table.Profiles {
					p := &table.Profiles[pi]
					if !r.accept(p) {
						continue
					}
					for _, s := range p.Starts {
						if used&p.mask(s) == 0 {
							v = max(v, 1+opt(used|p.mask(s), i+1))
						}
					}
				}
				memo[key] = v
				return v
			}
			for _, used := range states {
				o, f := serve(table, used, reqs, seq, false), serve(table, used, reqs, seq, true)
				b := opt(used, 0)
				if o > b || f > b {
					t.Fatalf("%s: served more than the search's optimum", table.Product)
				}
				ours, first, best, pairs = ours+o, first+f, best+b, pairs+1
				if o < b {
					oursShort++
				}
				if f < b {
					firstShort++
				}
			}
		}
		walk(0)
		t.Logf("%s: %d states × %d sequences of %d requests: served by Choose %d, first fit %d, the optimum %d (%.4f and %.4f of it); short of the optimum in %d and %d of %d",
			table.Product, len(states), pairs/len(states), length, ours, first, best, float64(ours)/float64(best), float64(first)/float64(best), oursShort, firstShort, pairs)
		if ours < first {
			t.Errorf("%s: Choose served %d, first fit %d", table.Product, ours, first)
		}
	}
}

// serve replays requests seq on a GPU whose slices used are taken, with
// Choose or with first fit, and returns how many it served.
func serve(table *Table, used uint8, reqs []request, seq []int, first bool) int {
	g := gpuAt(table, used)
	n := 0
	for _, i := range seq {
		r := reqs[i]
		var in Instance
		ok := false
		if first {
			in, ok = firstFit(g, r.accept)
		} else {
			var c Choice
			c, ok = g.Choose(r.accept)
			in = c.Instance
		}
		if ok {
			if err := g.Add(in.Profile, in.Start); err != nil {
				panic(fmt.Sprint(err))
			}
			n++
		}
	}
	return n
}

// firstFit is the placement that looks no further: the smallest accepted
// profile that fits, at its lowest free start.
func firstFit(g *GPU, accept func(*Profile) bool) (Instance, bool) {
	for pi := range g.Table.Profiles {
		p := &g.Table.Profiles[pi]
		if !accept(p) {
			continue
		}
		for _, s := range p.Starts {
			if g.Fits(p, s) {
				return Instance{p, s}, true
			}
		}
	}
	return Instance{}, false
}

// TestPublishOrder: every profile and placement once, smallest profile
// first, each profile's first placement the one Choose takes on an empty
// GPU.
func TestPublishOrder(t *testing.T) {
	for _, table := range Builtin {
		order := table.PublishOrder()
		n := 0
		for _, p := range table.Profiles {
			n += len(p.Starts)
		}
		if len(order) != n {
			t.Fatalf("%s: %d devices, want %d", table.Product, len(order), n)
		}
		seen := map[string]bool{}
		for k, in := range order {
			if seen[in.String()] {
				t.Errorf("%s: %s twice", table.Product, in)
			}
			seen[in.String()] = true
			if k > 0 && Less(in.Profile, order[k-1].Profile) {
				t.Errorf("%s: %s after %s", table.Product, in, order[k-1])
			}
			if k == 0 || order[k-1].Profile != in.Profile {
				c, _ := NewGPU(table).Choose(func(q *Profile) bool { return q == in.Profile })
				if c.Start != in.Start {
					t.Errorf("%s: %s first, Choose takes %s", table.Product, in, c.Instance)
				}
			}
		}
	}
	// The A100's 1g.10gb: slices 4-6 first, which keep the 4g.40gb at 0
	// creatable (6 first: slice 7 serves only the 7g.80gb), then the
	// slices of the 4g.40gb.
	if got, want := fmt.Sprint(A100_80GB.PublishOrder()[:7]), "[1g.10gb@6 1g.10gb@4 1g.10gb@5 1g.10gb@0 1g.10gb@1 1g.10gb@2 1g.10gb@3]"; got != want {
		t.Errorf("A100-80GB 1g.10gb order %s, want %s", got, want)
	}
}
