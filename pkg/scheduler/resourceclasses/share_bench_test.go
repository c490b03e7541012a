package resourceclasses

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/internal/arrivals"
)

// BenchmarkSharePlacement: 64 GPUs of 80Gi, 8 per node, in MPS mode, and a
// seeded stream of arrivals and departures of shares of 5, 10, 20 and 40Gi
// (with 6, 12, 25 and 50% compute), one class per size, each pod one unit
// of its class for a random lifetime. The offered load is about 1.1 times
// the fleet's memory, so requests are refused for lack of room. Three
// placements see the same stream:
//   - ours: the plugin's cache as the scheduler drives it, nodes scored by
//     BinPack, shares placed with shareStrategy BinPack (placeWith, reserve,
//     release: the real code);
//   - first-fit: the same cache, the first node that fits (by name) and the
//     first GPU there with room (shareStrategy FirstFit);
//   - equal-split: the NVIDIA device plugin's replicas: each GPU is 8
//     opaque replicas of 10Gi; the kubelet counts replicas, not sizes, and a
//     pod gets its memory only with ceil(size/10Gi) replicas on one GPU. It
//     is given the best case: the replicas on the one GPU with the fewest
//     free that has enough (a kubelet that picks anywhere does no better).
//
// It reports, per placement, the requests served (served-*), those refused
// for lack of room (refused-*), the GPUs no share takes at the end
// (whole-*) and on average after each arrival (whole-mean-*: GPUs a whole
// pod or a mode change could have had); SharePlacement-ratio is served by
// ours ÷ served by equal-split.
func BenchmarkSharePlacement(b *testing.B) {
	const (
		nodes, perNode = 8, 8
		gpuMemory      = 80
		arrivalCount   = 6000
		lifetime       = 420 // mean, in arrivals
		replicas       = 8
	)
	sizes := []struct {
		class   string
		memory  int64 // Gi
		compute int32
		weight  int
	}{{"share-5g", 5, 6, 3}, {"share-10g", 10, 12, 4}, {"share-20g", 20, 25, 2}, {"share-40g", 40, 50, 1}}

	// The stream: each arrival's size and the arrival after which it leaves.
	weights := make([]int, len(sizes))
	for i, sz := range sizes {
		weights[i] = sz.weight
	}
	stream := arrivals.Stream(37, arrivalCount, weights, lifetime)
	// run replays the stream: place(i) places arrival i or reports that it
	// does not fit, release(i) ends it, whole() counts the GPUs no share
	// takes.
	run := func(place func(i int) bool, release func(i int), whole func() int) arrivals.Result {
		return arrivals.Replay(stream, place, release, whole)
	}

	names := make([]string, nodes)
	classes := []*v1alpha1.ResourceClass{}
	for _, s := range sizes {
		classes = append(classes, shareClass(s.class, fmt.Sprintf("%dGi", s.memory), s.compute))
	}
	pods := make([]*corev1.Pod, arrivalCount)
	demands := make([]*demand, arrivalCount)
	for i, a := range stream {
		pods[i] = gpuPod(fmt.Sprintf("p%d", i), sizes[a.Kind].class, 1)
		d, err := podDemand(pods[i])
		if err != nil {
			b.Fatal(err)
		}
		demands[i] = d
	}
	fleet := func() *cache {
		c := newCache()
		for _, rc := range classes {
			c.setClass(rc)
		}
		for n := range nodes {
			names[n] = fmt.Sprintf("node-%d", n)
			var devs []v1alpha1.Device
			for g := range perNode {
				devs = append(devs, sharedGPU(fmt.Sprintf("GPU-%d-%d", n, g), int64(g/4), fmt.Sprintf("%dGi", gpuMemory), v1alpha1.SharingMPS))
			}
			c.setNodeDevices(nodeDevices(names[n], devs...))
		}
		return c
	}
	wholeGPUs := func(c *cache) int {
		whole := 0
		for _, n := range c.nodes {
			for _, d := range n.devices {
				if d.shared.used.Memory == 0 && d.shared.used.Compute == 0 {
					whole++
				}
			}
		}
		return whole
	}
	// throughCache replays the stream through the plugin's cache: nodes
	// chosen by choose among those where the pod fits, shares by ss.
	throughCache := func(b *testing.B, choose func(c *cache, fit []string, d *demand) string, ss Strategy) arrivals.Result {
		c := fleet()
		return run(func(i int) bool {
			var fit []string
			for _, name := range names {
				if _, ok := c.fits(name, nil, demands[i]); ok {
					fit = append(fit, name)
				}
			}
			if len(fit) == 0 {
				return false
			}
			if _, u, err := c.reserve(pods[i], choose(c, fit, demands[i]), demands[i], FirstFit, ss); u != nil || err != nil {
				b.Fatalf("reserve after Filter: %v %v", u, err)
			}
			return true
		}, func(i int) { c.release(types.UID("uid-" + pods[i].Name)) }, func() int { return wholeGPUs(c) })
	}
	binPack := func(c *cache, fit []string, d *demand) string {
		scores := c.scores(fit, d, BinPack)
		return fit[slices.Index(scores, slices.Max(scores))]
	}
	firstFit := func(_ *cache, fit []string, _ *demand) string { return fit[0] }

	equalSplit := func() arrivals.Result {
		free := make([]int, nodes*perNode) // replicas free per GPU
		for g := range free {
			free[g] = replicas
		}
		const replica = gpuMemory / replicas
		on := make([]int, arrivalCount)
		need := func(i int) int { return int((sizes[stream[i].Kind].memory + replica - 1) / replica) }
		return run(func(i int) bool {
			best := -1
			for g, f := range free {
				if f >= need(i) && (best < 0 || f < free[best]) {
					best = g
				}
			}
			if best < 0 {
				return false
			}
			free[best] -= need(i)
			on[i] = best
			return true
		}, func(i int) { free[on[i]] += need(i) }, func() int {
			whole := 0
			for _, f := range free {
				if f == replicas {
					whole++
				}
			}
			return whole
		})
	}

	var ours, ff, split arrivals.Result
	for b.Loop() {
		ours = throughCache(b, binPack, BinPack)
		ff = throughCache(b, firstFit, FirstFit)
		split = equalSplit()
	}
	b.ReportMetric(0, "ns/op")
	ours.Report(b, "ours")
	ff.Report(b, "firstfit")
	split.Report(b, "split")
	b.ReportMetric(float64(ours.Served)/float64(split.Served), "ratio")
}
