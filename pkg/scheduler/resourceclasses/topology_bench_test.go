package resourceclasses

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// BenchmarkTopologyPlacement: the Topology strategy deciding one pod on a node
// of 8 GPUs and 8 NICs (the hybrid cube mesh with a second NIC under each
// PCIe switch), in the states a random sequence of arrivals and departures
// leaves: pods of 1, 2, 4 or 8 GPUs, half of them with NICs.
//
// ns/op is the decision time per node (n.place, as Reserve and Score call
// it). ratio is the achieved over the optimal set score summed over the
// sequence's placements, the optimum found by exhaustive search over every
// GPU set and NIC set of the pod's sizes (score scalarised lexicographically:
// NVLinks, switch, root, NUMA). It is 1 where the search is exact (one
// class); below 1 it measures what completing the first class's best sets
// with the other classes costs.
func BenchmarkTopologyPlacement(b *testing.B) {
	_, n, _ := eightByEight(b)
	gpus, nics := n.matches[gpuClass.Name], n.matches[nicClass.Name]
	type arrival struct {
		held []int
		d    *demand
	}
	rng := rand.New(rand.NewPCG(22, 4))
	var cases []arrival
	var achieved, optimal float64
	var running [][]int
	scalar := func(s topoScore) float64 {
		return float64(s.nv)*1e9 + float64(s.sw)*1e6 + float64(s.root)*1e3 + float64(s.numa)
	}
	for len(cases) < 400 {
		if len(running) > 0 && rng.IntN(2) == 0 {
			x := rng.IntN(len(running))
			for _, i := range running[x] {
				n.devices[i].holders = 0
			}
			running = slices.Delete(running, x, x+1)
			continue
		}
		k := []int{1, 2, 4, 8}[rng.IntN(4)]
		m := []int{0, max(1, k/2)}[rng.IntN(2)]
		limits := map[corev1.ResourceName]string{cls(gpuClass.Name): strconv.Itoa(k)}
		if m > 0 {
			limits[cls(nicClass.Name)] = strconv.Itoa(m)
		}
		d, err := podDemand(testPod("p", ctr{name: "app", limits: limits}))
		if err != nil {
			b.Fatal(err)
		}
		var held []int
		for i, dev := range n.devices {
			if dev.holders > 0 {
				held = append(held, i)
			}
		}
		p, u := n.place(d, Topology)
		if u != nil {
			continue
		}
		cases = append(cases, arrival{held: held, d: d})
		set := append(placed(n, p, gpuClass.Name), placed(n, p, nicClass.Name)...)
		score, _ := n.pairTable(nil).setScore(set, nil)
		best := topoScore{-1, 0, 0, 0}
		free := func(idx []int) []int {
			return slices.DeleteFunc(slices.Clone(idx), func(i int) bool { return n.devices[i].holders > 0 })
		}
		subsets(free(gpus), k, func(g []int) {
			g = slices.Clone(g)
			consider := func(all []int) {
				if s, _ := n.pairTable(nil).setScore(all, nil); s.cmp(best) > 0 {
					best = s
				}
			}
			if m == 0 {
				consider(g)
				return
			}
			subsets(free(nics), m, func(c []int) { consider(append(slices.Clone(g), c...)) })
		})
		if score.cmp(best) > 0 {
			b.Fatalf("placed %v with score %v above the exhaustive optimum %v", set, score, best)
		}
		achieved += scalar(score)
		optimal += scalar(best)
		for _, i := range set {
			n.devices[i].holders = 1
		}
		running = append(running, set)
	}
	clearHeld := func() {
		for _, dev := range n.devices {
			dev.holders = 0
		}
	}
	i := 0
	for b.Loop() {
		c := cases[i%len(cases)]
		i++
		clearHeld()
		for _, h := range c.held {
			n.devices[h].holders = 1
		}
		if _, u := n.place(c.d, Topology); u != nil {
			b.Fatal(u.reason)
		}
	}
	b.ReportMetric(achieved/optimal, "ratio")
}

// eightByEight is the hybrid cube mesh profile with a second NIC under each
// PCIe switch: 8 GPUs and 8 NICs.
func eightByEight(b testing.TB) (*cache, *nodeState, []v1alpha1.Device) {
	_, n, devs := profileNode(b, "dgx1-hybrid-mesh")
	_ = n
	var extra []v1alpha1.Device
	for _, d := range devs {
		if d.Kind == v1alpha1.DeviceKindNIC {
			e := *d.DeepCopy()
			e.ID = d.ID[:len(d.ID)-1] + "1"
			e.Attributes[v1alpha1.AttributePCIAddress] = v1alpha1.StringAttribute(e.ID)
			e.Attributes[v1alpha1.AttributeInterface] = v1alpha1.StringAttribute(fmt.Sprintf("%s-1", *d.Attributes[v1alpha1.AttributeInterface].StringValue))
			extra = append(extra, e)
		}
	}
	all := append(slices.Clone(devs), extra...)
	c := newCache()
	c.setClass(gpuClass)
	c.setClass(nicClass)
	c.setNodeDevices(nodeDevices("eight", all...))
	n = c.nodes["eight"]
	if len(n.matches[gpuClass.Name]) != 8 || len(n.matches[nicClass.Name]) != 8 {
		b.Fatalf("%d GPUs and %d NICs, want 8 and 8", len(n.matches[gpuClass.Name]), len(n.matches[nicClass.Name]))
	}
	return c, n, all
}
