package mig

import (
	"testing"

	"github.com/resclass/resclass/pkg/internal/arrivals"
)

// BenchmarkMIGPlacement: 32 A100-80GB GPUs in MIG mode and a seeded stream of
// arrivals and departures of six request sizes (one per profile that is not
// limited: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb, the small
// ones more often), each for a random lifetime, at about 1.1 times the
// fleet's slices. Three placements see the same stream:
//   - ours: every GPU's Choose (the smallest accepted profile, the placement
//     that keeps the largest profile creatable), the Better of them across
//     GPUs (bin-packing), instances created and destroyed with the requests;
//   - first-fit: the first GPU where the smallest accepted profile fits, at
//     its lowest free start, created and destroyed likewise;
//   - dra-first-fit: what the stock DRA allocator does with the devices
//     resclass publishes on DRA nodes: the first GPU, in the fleet's
//     order, and on it the first device in PublishOrder that the request
//     accepts and that fits, created and destroyed likewise;
//   - fixed: the mig-manager way, a layout chosen up front and never
//     changed: the fleet's slices divided among the profiles in proportion
//     to the stream's demand in slices, packed GPU by GPU; a request takes a
//     free instance of the smallest accepted profile.
//
// It reports per placement the requests served (served-*) and refused, the
// GPUs that could take a 7g.80gb at the end (whole-*) and on average after
// each arrival (whole-mean-*); MIGPlacement-ratio is served by ours ÷ served
// by fixed.
func BenchmarkMIGPlacement(b *testing.B) {
	const (
		gpus         = 32
		arrivalCount = 6000
		lifetime     = 120 // mean, in arrivals: 120 held × 2.35 slices ≈ 1.1 × 256
	)
	table := A100_80GB
	reqs := requests(table)
	weights := []int{6, 4, 3, 2, 1, 1} // in the order of requests: small ones more often
	if len(weights) != len(reqs) {
		b.Fatalf("%d weights for %d requests", len(weights), len(reqs))
	}
	stream := arrivals.Stream(38, arrivalCount, weights, lifetime)
	run := func(place func(i int) bool, release func(i int), whole func() int) arrivals.Result {
		return arrivals.Replay(stream, place, release, whole)
	}
	largest := &table.Profiles[len(table.Profiles)-1]
	fleet := func() []*GPU {
		out := make([]*GPU, gpus)
		for i := range out {
			out[i] = NewGPU(table)
		}
		return out
	}
	wholeOf := func(fl []*GPU) func() int {
		return func() int {
			n := 0
			for _, g := range fl {
				if g.Fits(largest, 0) {
					n++
				}
			}
			return n
		}
	}
	// dynamic replays the stream creating and destroying instances, choose
	// picking the GPU and the instance.
	dynamic := func(choose func(fl []*GPU, r request) (int, Instance, bool)) arrivals.Result {
		fl := fleet()
		type held struct {
			gpu int
			in  Instance
		}
		holding := map[int]held{}
		return run(func(i int) bool {
			g, in, ok := choose(fl, reqs[stream[i].Kind])
			if !ok {
				return false
			}
			if err := fl[g].Add(in.Profile, in.Start); err != nil {
				b.Fatal(err)
			}
			holding[i] = held{g, in}
			return true
		}, func(i int) {
			h := holding[i]
			delete(holding, i)
			if err := fl[h.gpu].Remove(h.in.Profile, h.in.Start); err != nil {
				b.Fatal(err)
			}
		}, wholeOf(fl))
	}

	var ours, first, dra, fixed arrivals.Result
	order := table.PublishOrder()
	for b.Loop() {
		ours = dynamic(func(fl []*GPU, r request) (int, Instance, bool) {
			best, found := -1, Choice{}
			for gi, g := range fl {
				if c, ok := g.Choose(r.accept); ok && (best < 0 || c.Better(found)) {
					best, found = gi, c
				}
			}
			return best, found.Instance, best >= 0
		})
		first = dynamic(func(fl []*GPU, r request) (int, Instance, bool) {
			for gi, g := range fl {
				if in, ok := firstFit(g, r.accept); ok {
					return gi, in, true
				}
			}
			return 0, Instance{}, false
		})
		dra = dynamic(func(fl []*GPU, r request) (int, Instance, bool) {
			for gi, g := range fl {
				for _, in := range order {
					if r.accept(in.Profile) && g.Fits(in.Profile, in.Start) {
						return gi, in, true
					}
				}
			}
			return 0, Instance{}, false
		})
		l := fixedLayout(table, reqs, weights, gpus)
		got := map[int]int{}
		fixed = run(func(i int) bool {
			slot, ok := l.place(reqs[stream[i].Kind])
			if ok {
				got[i] = slot
			}
			return ok
		}, func(i int) {
			l.release(got[i])
			delete(got, i)
		}, l.whole)
	}
	b.ReportMetric(0, "ns/op")
	ours.Report(b, "ours")
	first.Report(b, "first-fit")
	dra.Report(b, "dra-first-fit")
	fixed.Report(b, "fixed")
	b.ReportMetric(float64(ours.Served)/float64(fixed.Served), "ratio")
}

// layout is a fixed partition: its instances, each free or held.
type layout struct {
	table     *Table
	gpu       []int // instance -> its GPU
	instances []Instance
	busy      []bool
	perGPU    [][]int // GPU -> its instances
}

// fixedLayout partitions gpus GPUs up front in proportion to the requests'
// demand in slices (weight × the slices of the smallest profile each
// accepts), packing each GPU with the profile furthest below its share that
// still fits (Choose places it), until nothing fits.
func fixedLayout(table *Table, reqs []request, weights []int, gpus int) *layout {
	l := &layout{table: table, perGPU: make([][]int, gpus)}
	target := map[*Profile]float64{}
	sum := 0.0
	for k, r := range reqs {
		c, ok := NewGPU(table).Choose(r.accept)
		if !ok {
			continue
		}
		target[c.Profile] += float64(weights[k] * c.Profile.Size)
		sum += float64(weights[k] * c.Profile.Size)
	}
	for p := range target {
		target[p] *= float64(gpus*Slots) / sum
	}
	placed := map[*Profile]float64{}
	for gi := range gpus {
		g := NewGPU(table)
		for {
			var pick *Choice
			for p := range target {
				c, ok := g.Choose(func(q *Profile) bool { return q == p })
				if ok && (pick == nil || target[p]-placed[p] > target[pick.Profile]-placed[pick.Profile] ||
					target[p]-placed[p] == target[pick.Profile]-placed[pick.Profile] && Less(p, pick.Profile)) {
					pick = &c
				}
			}
			if pick == nil {
				break
			}
			if err := g.Add(pick.Profile, pick.Start); err != nil {
				panic(err)
			}
			placed[pick.Profile] += float64(pick.Profile.Size)
			l.perGPU[gi] = append(l.perGPU[gi], len(l.instances))
			l.gpu = append(l.gpu, gi)
			l.instances = append(l.instances, pick.Instance)
			l.busy = append(l.busy, false)
		}
	}
	return l
}

// place takes a free instance of the smallest profile r accepts.
func (l *layout) place(r request) (int, bool) {
	best := -1
	for i, in := range l.instances {
		if !l.busy[i] && r.accept(in.Profile) && (best < 0 || Less(in.Profile, l.instances[best].Profile)) {
			best = i
		}
	}
	if best >= 0 {
		l.busy[best] = true
	}
	return best, best >= 0
}

func (l *layout) release(i int) { l.busy[i] = false }

// whole counts the GPUs that are one free instance of the largest profile.
func (l *layout) whole() int {
	largest := &l.table.Profiles[len(l.table.Profiles)-1]
	n := 0
	for _, ins := range l.perGPU {
		if len(ins) == 1 && l.instances[ins[0]].Profile == largest && !l.busy[ins[0]] {
			n++
		}
	}
	return n
}
