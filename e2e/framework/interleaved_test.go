package framework

import (
	"math"
	"testing"
)

func TestBracketed(t *testing.T) {
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }
	for _, c := range []struct {
		b             Bracketed
		spread, ratio float64
	}{
		{Bracketed{Before: 100, Run: 95, After: 110}, 0.10, 95.0 / 105},
		{Bracketed{Before: 150, Run: 120, After: 110}, 150.0/110 - 1, 120.0 / 130},
		{Bracketed{Before: 140, Run: 140, After: 140}, 0, 1},
	} {
		if got := c.b.Spread(); !near(got, c.spread) {
			t.Errorf("%+v: Spread() = %v, want %v", c.b, got, c.spread)
		}
		// The run over the mean of the baselines right before and after it.
		if got := c.b.Ratio(); !near(got, c.ratio) {
			t.Errorf("%+v: Ratio() = %v, want %v", c.b, got, c.ratio)
		}
	}
	if got := (Bracketed{Before: 0, Run: 1, After: 100}).Spread(); got <= 1 {
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
