package framework

import (
	"math"
	"testing"
)

func TestInterleaved(t *testing.T) {
	in := Interleaved{
		Baselines: []float64{100, 110, 150, 140},
		Sides:     map[string][]float64{"class": {95, 120, 126}},
	}
	if got := in.Rounds(); got != 3 {
		t.Fatalf("Rounds() = %d, want 3", got)
	}
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }
	for r, want := range []float64{0.10, 150.0/110 - 1, 150.0/140 - 1} {
		if got := in.Spread(r); !near(got, want) {
			t.Errorf("Spread(%d) = %v, want %v", r, got, want)
		}
	}
	// Each run over the mean of the baselines right before and after it.
	for r, want := range []float64{95.0 / 105, 120.0 / 130, 126.0 / 145} {
		if got := in.Ratio("class", r); !near(got, want) {
			t.Errorf("Ratio(class, %d) = %v, want %v", r, got, want)
		}
	}
	if got := in.ValidRounds(0.15); len(got) != 2 || got[0] != 0 || got[1] != 2 {
		t.Errorf("ValidRounds(0.15) = %v, want [0 2]", got)
	}
	if got := (Interleaved{Baselines: []float64{0, 100}}).Spread(0); got <= 1 {
		t.Errorf("Spread with a missing baseline = %v, want it refused", got)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		values []float64
		median float64
		index  int
	}{
		{nil, 0, -1},
		{[]float64{3}, 3, 0},
		{[]float64{5, 1, 3}, 3, 2},
		{[]float64{4, 1, 3, 2}, 2.5, 3}, // lower middle: 2, at index 3
	} {
		if got := Median(c.values); got != c.median {
			t.Errorf("Median(%v) = %v, want %v", c.values, got, c.median)
		}
		if got := MedianIndex(c.values); got != c.index {
			t.Errorf("MedianIndex(%v) = %v, want %v", c.values, got, c.index)
		}
	}
}

func TestSpeedProbe(t *testing.T) {
	if d := SpeedProbe(); d <= 0 {
		t.Fatalf("SpeedProbe() = %v", d)
	}
}
