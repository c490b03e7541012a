package dradevice

import (
	"fmt"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/mig"
)

// MIG slices made on demand on DRA nodes (docs/mig.md, "DRA nodes"), as
// partitionable devices (KEP-4815, DRAPartitionableDevices, beta and on by
// default in Kubernetes 1.36): a GPU marked for dynamic MIG publishes a
// counter set of its own, one counter per memory slice and one per profile
// with an instance limit, and one device per profile and placement (its
// potential slices, mig.Potentials) that consumes the counters of the memory
// slices the placement spans and, for a limited profile, one of its limit.
// The stock allocator then never gives two overlapping placements, nor more
// instances of a profile than the GPU holds, and the kubelet plugin makes
// the slice when it prepares the claim.

const (
	// MIGDomain holds AttributePotential, a bool attribute true on every
	// potential slice: a class without createMIG selects only devices
	// without it (pkg/dra), as pkg/selector never evaluates such a class on
	// a potential slice. A domain of its own, because the driver's domain
	// carries the device's attributes, which a selector may name freely.
	MIGDomain          = "mig.resclass.io"
	AttributePotential = "potential"

	// migMaxCounters: the slice counters and a limit counter per profile
	// must fit in one counter set.
	migMaxCounters = resourceapi.ResourceSliceMaxCountersPerCounterSet
)

// MIGGPU is what a GPU marked for dynamic MIG publishes on a DRA node.
type MIGGPU struct {
	// Counters is the GPU's counter set, published in a slice with no
	// device (the API keeps counters and devices in separate slices).
	Counters resourceapi.CounterSet
	// Devices are its potential slices, in the order mig.Table.PublishOrder
	// gives (the stock allocator takes the first that fits), each consuming
	// Counters.
	Devices []resourceapi.Device
	// Potentials are the same slices as resclass devices, in the same
	// order: what the kubelet plugin prepares.
	Potentials []v1alpha1.Device
}

// MIGCounterSet is the name of gpu's counter set: a DNS label derived from
// its id.
func MIGCounterSet(gpu string) string { return DeviceName(gpu + "/mig") }

// migSliceCounter is the counter of memory slice i.
func migSliceCounter(i int) string { return "slice-" + strconv.Itoa(i) }

// migLimitCounter is the counter of profile's instance limit.
func migLimitCounter(profile string) string { return "limit-" + DeviceName(profile) }

// MIGPotentials maps gpu's potential slices (nil, nil for a GPU that is not
// mig.Dynamic). The memory slices and instance limits that the instances
// resclass did not make take (an operator's, Created false) are published
// as counters of 0, so that the devices published never change with the
// instances on the GPU, and a slice resclass made is held by the claim
// allocated its device. A geometry that cannot be believed, or a slice the
// mapping refuses, is an error: the GPU's potential slices are then not
// published at all.
func MIGPotentials(gpu *v1alpha1.Device) (*MIGGPU, error) {
	g, pots, err := mig.Potentials(gpu)
	if err != nil || g == nil {
		return nil, err
	}
	t := g.Table
	set := resourceapi.CounterSet{Name: MIGCounterSet(gpu.ID), Counters: map[string]resourceapi.Counter{}}
	free := [mig.Slots]int64{}
	for i := range free {
		free[i] = 1
	}
	limits := map[string]int64{}
	for i := range t.Profiles {
		p := &t.Profiles[i]
		if p.Max < len(p.Starts) {
			limits[p.Name] = int64(p.Max)
		}
	}
	if mig.Slots+len(limits) > migMaxCounters {
		return nil, fmt.Errorf("GPU %s: %d profiles with an instance limit do not fit in one DRA counter set", gpu.ID, len(limits))
	}
	for _, in := range gpu.MIG.Instances {
		if in.Created {
			continue
		}
		p := t.Profile(in.Profile)
		if p == nil {
			continue // FromAPI refused it already
		}
		for s := int(in.Start); s < int(in.Start)+p.Size && s < mig.Slots; s++ {
			free[s] = 0
		}
		if _, ok := limits[p.Name]; ok {
			limits[p.Name] = max(limits[p.Name]-1, 0)
		}
	}
	for i, v := range free {
		set.Counters[migSliceCounter(i)] = resourceapi.Counter{Value: *resource.NewQuantity(v, resource.DecimalSI)}
	}
	for name, v := range limits {
		set.Counters[migLimitCounter(name)] = resourceapi.Counter{Value: *resource.NewQuantity(v, resource.DecimalSI)}
	}
	byPlace := map[string]*v1alpha1.Device{}
	for i := range pots {
		byPlace[pots[i].Instance.String()] = &pots[i].Device
	}
	out := &MIGGPU{Counters: set}
	one := resource.NewQuantity(1, resource.DecimalSI)
	for _, in := range t.PublishOrder() {
		pot := byPlace[in.String()]
		if pot == nil {
			continue
		}
		d, err := Device(pot)
		if err != nil {
			return nil, err
		}
		yes := true
		d.Attributes[qualified(MIGDomain, AttributePotential)] = resourceapi.DeviceAttribute{BoolValue: &yes}
		consumed := map[string]resourceapi.Counter{}
		for s := in.Start; s < in.Start+in.Profile.Size; s++ {
			consumed[migSliceCounter(s)] = resourceapi.Counter{Value: one.DeepCopy()}
		}
		if _, ok := limits[in.Profile.Name]; ok {
			consumed[migLimitCounter(in.Profile.Name)] = resourceapi.Counter{Value: one.DeepCopy()}
		}
		d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: set.Name, Counters: consumed}}
		out.Devices = append(out.Devices, d)
		out.Potentials = append(out.Potentials, *pot)
	}
	if len(out.Devices) > resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
		return nil, fmt.Errorf("GPU %s: %d potential MIG slices; a ResourceSlice holds at most %d", gpu.ID, len(out.Devices), resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures)
	}
	return out, nil
}
