package resourceclasses

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// quickByWalk is what quick answers, with the counts made the way quick did
// before they were kept: by walking the devices the class selects on the
// node. It is the oracle of TestQuickCountsFollowTheDevices and the baseline
// of BenchmarkQuickFilter.
func quickByWalk(n *nodeState, d *demand) (fits bool, util int64, numas int, handled bool) {
	if n == nil || len(d.classes) != 1 || len(n.blocked) > 0 {
		return false, 0, 0, false
	}
	class := d.classes[0]
	var q *quickCounts
	if idx := n.matches[class]; len(idx) > 0 {
		q = n.count(idx)
	}
	return q.answer(d.draws[class])
}

// checkCounts fails t unless every class's counts on n are what its devices
// say, and quick answers every demand as the walk over the devices does.
func checkCounts(t *testing.T, step string, n *nodeState, demands []*demand) {
	t.Helper()
	for class, idx := range n.matches {
		if got, want := n.countsOf(class), n.count(idx); got == nil || *got != *want {
			t.Fatalf("%s: counts of class %s %+v, the devices say %+v", step, class, got, want)
		}
	}
	for i, c := range n.counts {
		if len(n.matches[c.class]) == 0 {
			t.Fatalf("%s: counts of class %s, which selects no device on the node", step, c.class)
		}
		if i > 0 && n.counts[i-1].class >= c.class {
			t.Fatalf("%s: counts not sorted by class: %s before %s", step, n.counts[i-1].class, c.class)
		}
	}
	for _, d := range demands {
		f1, u1, m1, h1 := n.quick(d)
		f2, u2, m2, h2 := quickByWalk(n, d)
		if f1 != f2 || u1 != u2 || m1 != m2 || h1 != h2 {
			t.Fatalf("%s: quick(%v) = %v %d %d %v, the walk over the devices %v %d %d %v", step, d.draws, f1, u1, m1, h1, f2, u2, m2, h2)
		}
	}
}

// TestQuickCountsFollowTheDevices: the per-class counts that Filter and Score
// read stay what the devices say through every change the cache makes:
// pods reserved and released, a class created, changed and deleted, a node's
// devices replaced (some unhealthy), and preemption's what-if views, which
// must leave the cache's own counts alone.
func TestQuickCountsFollowTheDevices(t *testing.T) {
	c := newCache()
	c.setClass(gpuClass)
	c.setClass(bigGPUClass)
	devices := func(unhealthyAt int) *v1alpha1.NodeDevices {
		var devs []v1alpha1.Device
		for i := range 8 {
			mem := "40Gi"
			if i%2 == 0 {
				mem = "80Gi"
			}
			d := gpu(fmt.Sprintf("g%d", i), int64(i/4), mem)
			if i == unhealthyAt {
				d = unhealthy(d)
			}
			devs = append(devs, d)
		}
		nd := nodeDevices("n1", devs...)
		nd.ResourceVersion = fmt.Sprint(unhealthyAt + 10)
		return nd
	}
	c.setNodeDevices(devices(-1))
	var demands []*demand
	for _, class := range []string{gpuClass.Name, bigGPUClass.Name} {
		for k := 1; k <= 5; k++ {
			d, err := podDemand(gpuPod("probe", class, k))
			if err != nil {
				t.Fatal(err)
			}
			demands = append(demands, d)
		}
	}
	rng := rand.New(rand.NewPCG(24, 1))
	var held []types.UID
	for step := range 300 {
		what := ""
		switch r := rng.IntN(10); {
		case r < 5: // a pod reserved
			class := []string{gpuClass.Name, bigGPUClass.Name}[rng.IntN(2)]
			pod := gpuPod(fmt.Sprintf("p%d", step), class, 1+rng.IntN(2))
			d, err := podDemand(pod)
			if err != nil {
				t.Fatal(err)
			}
			if _, u, err := c.reserve(pod, "n1", d, FirstFit, BinPack); err != nil {
				t.Fatal(err)
			} else if u == nil {
				held = append(held, pod.UID)
			}
			what = "reserve " + pod.Name
		case r < 8 && len(held) > 0: // a pod gone
			i := rng.IntN(len(held))
			c.release(held[i])
			held = append(held[:i], held[i+1:]...)
			what = "release"
		case r < 9: // the node's devices replaced, one of them unhealthy or none
			c.setNodeDevices(devices(rng.IntN(9) - 1))
			what = "new devices"
		default: // the big class deleted, or created again
			if c.classes[bigGPUClass.Name] != nil {
				c.deleteClass(bigGPUClass.Name)
				what = "class deleted"
			} else {
				c.setClass(bigGPUClass)
				what = "class created"
			}
		}
		n := c.nodes["n1"]
		checkCounts(t, fmt.Sprintf("step %d (%s)", step, what), n, demands)
		if len(held) > 0 {
			before := slices.Clone(n.counts)
			c.mu.RLock()
			view := c.viewLocked("n1", n, &nodeView{removed: map[types.UID]bool{held[0]: true}})
			c.mu.RUnlock()
			checkCounts(t, fmt.Sprintf("step %d: the view without %s", step, held[0]), view, demands)
			if !slices.Equal(before, n.counts) {
				t.Fatalf("step %d: a view changed the cache's counts: %+v, were %+v", step, n.counts, before)
			}
		}
	}
}

// BenchmarkQuickFilter: Filter's and Score's question for a one-class pod,
// asked of 1000 nodes of 8 GPUs (two NUMA nodes) in varied states of use, as
// the scheduler asks it of every node it filters and scores. ns/op is per
// node. baseline-device-walk walks the devices the class selects, as quick
// did before; counts reads the node's per-class counts.
func BenchmarkQuickFilter(b *testing.B) {
	c := newCache()
	c.setClass(gpuClass)
	const nodes = 1000
	names := make([]string, nodes)
	for i := range names {
		names[i] = fmt.Sprintf("bench-dgx-%05d", i)
		var devs []v1alpha1.Device
		for g := range 8 {
			devs = append(devs, gpu(fmt.Sprintf("g%d", g), int64(g/4), "80Gi"))
		}
		c.setNodeDevices(nodeDevices(names[i], devs...))
		for p := range i % 8 {
			pod := gpuPod(fmt.Sprintf("p-%d-%d", i, p), gpuClass.Name, 1)
			d, err := podDemand(pod)
			if err != nil {
				b.Fatal(err)
			}
			if _, u, err := c.reserve(pod, names[i], d, FirstFit, BinPack); err != nil || u != nil {
				b.Fatalf("reserve: %v %v", err, u)
			}
		}
	}
	d, err := podDemand(gpuPod("p", gpuClass.Name, 1))
	if err != nil {
		b.Fatal(err)
	}
	run := func(b *testing.B, quick func(*nodeState, *demand) (bool, int64, int, bool)) {
		i, fit := 0, 0
		for b.Loop() {
			c.mu.RLock()
			if ok, _, _, _ := quick(c.nodes[names[i%nodes]], d); ok {
				fit++
			}
			c.mu.RUnlock()
			i++
		}
		if fit == 0 {
			b.Fatal("no node fits")
		}
	}
	b.Run("baseline-device-walk", func(b *testing.B) { run(b, quickByWalk) })
	b.Run("counts", func(b *testing.B) { run(b, (*nodeState).quick) })
}
