package framework

import (
	"crypto/sha256"
	"slices"
	"sync"
	"time"
)

// Bracketed is one run of a measured side and the two baseline runs right
// before and right after it (docs/scheduler.md, "Interleaved rounds"), in the
// same unit (pods/s).
type Bracketed struct {
	Before, Run, After float64
}

// Spread is how far apart the two baselines are: the larger over the
// smaller, minus one. It bounds how much the machine's speed moved around
// the run.
func (b Bracketed) Spread() float64 {
	if min(b.Before, b.After) <= 0 {
		return 1e9 // no baseline: nothing to compare with
	}
	return max(b.Before, b.After)/min(b.Before, b.After) - 1
}

// Ratio is the run over the mean of its two baselines.
func (b Bracketed) Ratio() float64 {
	return b.Run / ((b.Before + b.After) / 2)
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
