package resourceclasses

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// TestIncrementalIndexMatchesRebuild: after every NodeDevices update or
// deletion, classNodes and numaUnsure, moved node by node (indexNode), are
// what a rebuild over every node makes (indexOf), through a random sequence
// of node updates (devices appearing, going, healing, pools' free pages
// moving, NUMA nodes published or not) mixed with class changes, which
// rebuild. The seed is printed: set indexSeed to replay a failure.
func TestIncrementalIndexMatchesRebuild(t *testing.T) {
	seed := uint64(indexSeed)
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))

	classes := []*v1alpha1.ResourceClass{
		gpuClass, bigGPUClass, nicClass, hpClass,
		// Membership that follows the churn itself: a pool with many free pages.
		rclass("hp-roomy", expr("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindHugePages), expr(v1alpha1.AttributePagesFree, v1alpha1.ResourceSelectorOpGtEq, "32")),
	}
	// A changed class: the same name, another selector.
	changed := rclass("gpu-big", expr("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindNvidiaGPU), expr(v1alpha1.AttributeMemory, v1alpha1.ResourceSelectorOpGtEq, "40Gi"))
	changed.Generation = 2

	randomDevices := func() []v1alpha1.Device {
		var devs []v1alpha1.Device
		numa := func() int64 { return int64(rng.IntN(3)) - 1 } // -1: none published
		for i := range rng.IntN(4) {
			d := gpu(fmt.Sprintf("g%d", i), numa(), []string{"40Gi", "80Gi"}[rng.IntN(2)])
			if rng.IntN(5) == 0 {
				d = unhealthy(d)
			}
			devs = append(devs, d)
		}
		for i := range rng.IntN(2) {
			devs = append(devs, nic(fmt.Sprintf("nic%d", i), numa()))
		}
		for i := range rng.IntN(3) {
			devs = append(devs, hugePool(fmt.Sprintf("hp%d", i), numa(), "1Gi", 64, rng.Int64N(65)))
		}
		return devs
	}

	c := newCache()
	for _, rc := range classes {
		c.setClass(rc)
	}
	version := 0
	check := func(step string) {
		t.Helper()
		if c.dirty {
			return // the next reader rebuilds
		}
		wantNodes, wantUnsure := indexOf(c.nodes)
		if !maps.EqualFunc(c.classNodes, wantNodes, sets.Set[string].Equal) {
			t.Fatalf("seed %d, %s: classNodes %v, a rebuild makes %v", seed, step, c.classNodes, wantNodes)
		}
		if !maps.Equal(c.numaUnsure, wantUnsure) {
			t.Fatalf("seed %d, %s: numaUnsure %v, a rebuild makes %v", seed, step, c.numaUnsure, wantUnsure)
		}
	}
	for step := range 5000 {
		node := "n" + strconv.Itoa(rng.IntN(30))
		var what string
		switch r := rng.IntN(100); {
		case r < 85:
			version++
			nd := nodeDevices(node, randomDevices()...)
			nd.ResourceVersion = strconv.Itoa(version)
			c.setNodeDevices(nd)
			what = "NodeDevices " + node + " updated"
		case r < 95:
			c.deleteNodeDevices(node)
			what = "NodeDevices " + node + " deleted"
		case r < 97:
			rc := classes[rng.IntN(len(classes))]
			if rc == bigGPUClass && rng.IntN(2) == 0 {
				rc = changed
			}
			c.setClass(rc)
			what = "class " + rc.Name + " set"
		default:
			rc := classes[rng.IntN(len(classes))]
			c.deleteClass(rc.Name)
			what = "class " + rc.Name + " deleted"
		}
		check(fmt.Sprintf("step %d (%s)", step, what))
		// Readers rebuild after class changes, so that most node updates
		// find the index built and move it.
		c.numaCertain("gpu")
		check(fmt.Sprintf("step %d (%s), read", step, what))
	}
}

// indexSeed seeds TestIncrementalIndexMatchesRebuild.
const indexSeed = 20261127
