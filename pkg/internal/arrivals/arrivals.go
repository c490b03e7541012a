// Package arrivals is the seeded stream of arrivals and departures that the
// placement benchmarks replay (shares of GPUs, MIG slices): each arrival is
// of a kind drawn by weight and leaves after an exponential lifetime.
package arrivals

import (
	"container/heap"
	"math/rand/v2"
	"testing"
)

// Arrival is one request: its kind (an index into the weights) and the
// arrival after which it leaves, if it was served.
type Arrival struct{ Kind, Leaves int }

// Stream draws n arrivals from a generator seeded with seed: kinds by
// weights, lifetimes exponential with mean lifetime arrivals.
func Stream(seed uint64, n int, weights []int, lifetime float64) []Arrival {
	rng := rand.New(rand.NewPCG(20261128, seed))
	total := 0
	for _, w := range weights {
		total += w
	}
	out := make([]Arrival, n)
	for i := range out {
		w := rng.IntN(total)
		for k := range weights {
			if w -= weights[k]; w < 0 {
				out[i].Kind = k
				break
			}
		}
		out[i].Leaves = i + 1 + int(rng.ExpFloat64()*lifetime)
	}
	return out
}

// Result is what a replay served and refused, and how many of the fleet's
// devices were whole: at the end, and on average between arrivals.
type Result struct {
	Served, Refused, Whole int
	WholeMean              float64
}

// Replay plays stream: before each arrival, the served arrivals due to leave
// are released (release(i)); place(i) serves arrival i or says it does not
// fit; whole() counts the fleet's whole devices, after each arrival.
func Replay(stream []Arrival, place func(i int) bool, release func(i int), whole func() int) (r Result) {
	var departures departureHeap
	sum := 0
	for i, a := range stream {
		if i > 0 {
			sum += whole()
		}
		for len(departures) > 0 && departures[0].at <= i {
			release(heap.Pop(&departures).(departure).arrival)
		}
		if place(i) {
			r.Served++
			heap.Push(&departures, departure{at: a.Leaves, arrival: i})
		} else {
			r.Refused++
		}
	}
	r.Whole = whole()
	r.WholeMean = float64(sum+r.Whole) / float64(len(stream))
	return r
}

// Report reports r as the benchmark's figures for placement name:
// served-, refused-, whole- and whole-mean-<name>.
func (r Result) Report(b *testing.B, name string) {
	b.ReportMetric(float64(r.Served), "served-"+name)
	b.ReportMetric(float64(r.Refused), "refused-"+name)
	b.ReportMetric(float64(r.Whole), "whole-"+name)
	b.ReportMetric(r.WholeMean, "whole-mean-"+name)
}

// departure is when a served arrival leaves.
type departure struct{ at, arrival int }

// departureHeap orders departures by time.
type departureHeap []departure

func (h departureHeap) Len() int           { return len(h) }
func (h departureHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h departureHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *departureHeap) Push(x any)        { *h = append(*h, x.(departure)) }
func (h *departureHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
