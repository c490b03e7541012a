package handoff

import (
	"testing"
)

// A record whose pod left the cache without its deletion reaching forget (an
// Allocate that found its pod just before the pod was deleted records it
// after) is swept; records of live pods stay.
func TestSweepForgetsRecordsOfPodsGone(t *testing.T) {
	a := pod("a", map[string]map[string][]string{"train": {"nvidia.high.mem": {"GPU-0"}}})
	b := pod("b", map[string]map[string][]string{"train": {"nvidia.high.mem": {"GPU-1"}}})
	f := newFixture(t, a, b)
	for _, id := range []string{"GPU-0", "GPU-1"} {
		if _, err := f.allocate(highMem, id); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.alloc.sweep(); n != 0 {
		t.Fatalf("swept %d records of live pods", n)
	}
	// Gone from the cache, no handler told.
	obj, ok, err := f.alloc.informer.GetIndexer().GetByKey("ml/a")
	if err != nil || !ok {
		t.Fatalf("pod a not in the cache: %v", err)
	}
	if err := f.alloc.informer.GetIndexer().Delete(obj); err != nil {
		t.Fatal(err)
	}
	if n := f.alloc.sweep(); n != 1 {
		t.Fatalf("swept %d records, want pod a's", n)
	}
	var left []string
	for _, r := range f.alloc.Allocations() {
		left = append(left, r.Name)
	}
	if len(left) != 1 || left[0] != "b" {
		t.Errorf("allocations after the sweep: %v, want b's only", left)
	}
}
