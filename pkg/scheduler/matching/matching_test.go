package matching

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// TestOverlapDefeatsCounting: the cases where counting or greedy choice is wrong.
func TestOverlapDefeatsCounting(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Problem
		want bool
	}{{
		// Each class alone sees 2 free devices, but they are the same 2: counting
		// per class would accept a pod that needs 3 devices.
		name: "same devices counted twice",
		p:    Problem{Devices: 2, Demand: []int{2, 1}, Candidates: [][]int{{0, 1}, {0, 1}}},
		want: false,
	}, {
		// "any" listed first would greedily take device 0, the only one "high"
		// can use; the matching gives "any" device 1 instead.
		name: "greedy first choice is wrong",
		p:    Problem{Devices: 2, Demand: []int{1, 1}, Candidates: [][]int{{0, 1}, {0}}},
		want: true,
	}, {
		// The most constrained-first order alone does not save this one: both
		// classes have slack 0, and the augmenting path must move "a" off device 1.
		name: "needs an augmenting path",
		p:    Problem{Devices: 3, Demand: []int{2, 1}, Candidates: [][]int{{0, 1, 2}, {1}}},
		want: true,
	}, {
		name: "zero demand",
		p:    Problem{Devices: 0, Demand: []int{0}, Candidates: [][]int{nil}},
		want: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Solve(tc.p)
			if ok != tc.want {
				t.Fatalf("Solve = %v, want %v", ok, tc.want)
			}
			if ok {
				checkSolution(t, tc.p, got)
			}
		})
	}
}

// TestPreferenceOrder: without contention each class gets its first candidates.
func TestPreferenceOrder(t *testing.T) {
	got, ok := Solve(Problem{Devices: 6, Demand: []int{2, 1}, Candidates: [][]int{{5, 3, 1}, {0, 2}}})
	if !ok {
		t.Fatal("infeasible")
	}
	if !slices.Equal(got[0], []int{5, 3}) || !slices.Equal(got[1], []int{0}) {
		t.Errorf("got %v, want [[5 3] [0]]", got)
	}
}

// TestAgainstBruteForce compares Solve with an exhaustive search on random small
// problems: same answer to "does it fit", and every solution is valid.
func TestAgainstBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		p := randomProblem(r)
		got, ok := Solve(p)
		if want := bruteForce(p); ok != want {
			t.Fatalf("case %d %+v: Solve = %v, exhaustive search = %v", i, p, ok, want)
		}
		if ok {
			checkSolution(t, p, got)
		}
	}
}

func FuzzSolve(f *testing.F) {
	f.Add(uint64(1), uint64(2))
	f.Fuzz(func(t *testing.T, a, b uint64) {
		watchdog.Run(t, func() {
			p := randomProblem(rand.New(rand.NewPCG(a, b)))
			got, ok := Solve(p)
			if want := bruteForce(p); ok != want {
				t.Fatalf("%+v: Solve = %v, exhaustive search = %v", p, ok, want)
			}
			if ok {
				checkSolution(t, p, got)
			}
		})
	})
}

func randomProblem(r *rand.Rand) Problem {
	p := Problem{Devices: r.IntN(7)}
	classes := 1 + r.IntN(3)
	for range classes {
		var cand []int
		for d := range p.Devices {
			if r.IntN(2) == 0 {
				cand = append(cand, d)
			}
		}
		r.Shuffle(len(cand), func(i, j int) { cand[i], cand[j] = cand[j], cand[i] })
		p.Candidates = append(p.Candidates, cand)
		p.Demand = append(p.Demand, r.IntN(4))
	}
	return p
}

func checkSolution(t *testing.T, p Problem, got [][]int) {
	t.Helper()
	used := map[int]int{}
	for c, devs := range got {
		if len(devs) != p.Demand[c] {
			t.Fatalf("%+v: class %d got %d devices, wants %d", p, c, len(devs), p.Demand[c])
		}
		for _, d := range devs {
			if !slices.Contains(p.Candidates[c], d) {
				t.Fatalf("%+v: class %d got device %d it does not select", p, c, d)
			}
			if prev, ok := used[d]; ok {
				t.Fatalf("%+v: device %d given to classes %d and %d", p, d, prev, c)
			}
			used[d] = c
		}
	}
}

// bruteForce tries every way to give each device to one class or none.
func bruteForce(p Problem) bool {
	need := slices.Clone(p.Demand)
	var try func(d int) bool
	try = func(d int) bool {
		if d == p.Devices {
			for _, n := range need {
				if n > 0 {
					return false
				}
			}
			return true
		}
		if try(d + 1) {
			return true
		}
		for c := range need {
			if need[c] > 0 && slices.Contains(p.Candidates[c], d) {
				need[c]--
				ok := try(d + 1)
				need[c]++
				if ok {
					return true
				}
			}
		}
		return false
	}
	return try(0)
}
