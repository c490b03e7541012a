package framework

import (
	"crypto/sha256"
	"slices"
	"sync"
	"time"
)

// Interleaved is a benchmark's throughput over rounds of interleaved runs
// (docs/scheduler.md, "Interleaved rounds"): Baselines[r] and Baselines[r+1]
// were measured right before and right after round r, whose runs of each
// measured side are Sides[name][r]. So len(Baselines) is one more than the
// rounds.
type Interleaved struct {
	Baselines []float64
	Sides     map[string][]float64
}

// Rounds is how many rounds the figures hold.
func (in Interleaved) Rounds() int { return max(len(in.Baselines)-1, 0) }

// Spread is how far apart the two baselines bracketing round r are: the
// larger over the smaller, minus one. It bounds how much the machine's speed
// moved around the round's runs.
func (in Interleaved) Spread(r int) float64 {
	a, b := in.Baselines[r], in.Baselines[r+1]
	if min(a, b) <= 0 {
		return 1e9 // no baseline: nothing to compare with
	}
	return max(a, b)/min(a, b) - 1
}

// Ratio is side's run in round r over the mean of the baselines that bracket
// it.
func (in Interleaved) Ratio(side string, r int) float64 {
	return in.Sides[side][r] / ((in.Baselines[r] + in.Baselines[r+1]) / 2)
}

// ValidRounds are the rounds whose bracketing baselines are at most
// maxSpread apart.
func (in Interleaved) ValidRounds(maxSpread float64) []int {
	var valid []int
	for r := range in.Rounds() {
		if in.Spread(r) <= maxSpread {
			valid = append(valid, r)
		}
	}
	return valid
}

// Median is the median of values: the middle one, or the mean of the two
// middle ones. 0 for none.
func Median(values []float64) float64 {
	if len(values) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(values))
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// MedianIndex is the index in values of its median element, the lower of the
// two middle ones for an even count: the run whose other figures (a
// breakdown) stand for the median. -1 for none.
func MedianIndex(values []float64) int {
	if len(values) == 0 {
		return -1
	}
	idx := make([]int, len(values))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case values[a] < values[b]:
			return -1
		case values[a] > values[b]:
			return 1
		}
		return 0
	})
	return idx[(len(idx)-1)/2]
}

// probeBuffer is what SpeedProbe hashes: 8 MiB, the same bytes every time
// (made on first use: the package is in every e2e binary).
var probeBuffer = sync.OnceValue(func() []byte {
	buf := make([]byte, 8<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	return buf
})

// SpeedProbe times a fixed CPU-only workload, sha256 over probeBuffer, best of
// three: how fast the machine runs the same instructions now. The best of
// three leaves out a preemption by another process; what stays is the speed
// the CPU gives when it runs the probe (docs/scheduler.md, "The machine-speed
// probe").
func SpeedProbe() time.Duration {
	buf := probeBuffer()
	best := time.Duration(1<<63 - 1)
	for range 3 {
		start := time.Now()
		sha256.Sum256(buf)
		best = min(best, time.Since(start))
	}
	return best
}
