package draplugin

import (
	"fmt"
	"maps"
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/dra/dradevice"
	"github.com/resclass/resclass/pkg/selector"
)

// Shares on DRA nodes (docs/dra.md, "Share classes"; docs/sharing.md, "On
// DRA nodes"): a device that serves shares is published allowing several
// allocations, with the consumable capacities of dradevice.ShareDomain, and
// the allocator records in each result what the claim consumes of them
// (consumedCapacity). That is the claim's share: the plugin hands the
// container the same variables, mounts and MPS client limits as the
// device-plugin path (handoff.ShareEdits), from the claim's own result, so
// that two claims on one GPU each get their own.
//
// consumedCapacity is read strictly: it is written by whoever may write a
// claim's status, and it sets a container's limits. A result is refused,
// with a message that says why, when it does not say exactly a share the
// device can hold.

// maxConsumed bounds the entries of a result's consumedCapacity: a device
// has at most this many attributes and capacities together.
const maxConsumed = resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice

// shareCapacity is what the shares of d may take together; ok is false for
// a device served whole. It reads the device as the selector and the DRA
// mapping do.
func shareCapacity(d *v1alpha1.Device) (selector.Capacity, bool) {
	_, c, ok := selector.NewDevice(d).Sharing()
	return c, ok
}

// readShare is the share that result r takes of device d, nil when d is
// served whole. It refuses:
//   - a share of a device served whole, or the whole of one that serves
//     shares (the device's mode changed since the allocation);
//   - more than maxConsumed entries;
//   - a share capacity the device publishes that is missing, or one that is
//     not a whole number from 0 to the device's capacity;
//   - any amount of another capacity (the device's own, which no claim
//     consumes: dradevice gives them the policy "only 0");
//   - a share that takes nothing (a claim that requested no capacity).
func readShare(r *resourceapi.DeviceRequestAllocationResult, d *v1alpha1.Device) (assignment.Share, error) {
	c, shared := shareCapacity(d)
	if !shared {
		if len(r.ConsumedCapacity) > 0 || r.ShareID != nil {
			return nil, fmt.Errorf("device %s was allocated as a share, but it is served whole now", r.Device)
		}
		return nil, nil
	}
	if len(r.ConsumedCapacity) == 0 {
		return nil, fmt.Errorf("device %s serves shares, and the claim was allocated no share of it (no consumedCapacity): it was allocated while the device was served whole", r.Device)
	}
	if n := len(r.ConsumedCapacity); n > maxConsumed {
		return nil, fmt.Errorf("device %s: consumedCapacity has %d entries, a device at most %d", r.Device, n, maxConsumed)
	}
	limits := map[resourceapi.QualifiedName]capacityLimit{}
	for _, l := range limitsOf(c) {
		if l.limit >= 0 {
			limits[dradevice.ShareCapacity(l.name)] = l
		}
	}
	share := assignment.Share{}
	// Sorted, so that the message does not depend on map order.
	for _, key := range slices.Sorted(maps.Keys(r.ConsumedCapacity)) {
		q := r.ConsumedCapacity[key]
		l, isShare := limits[key]
		if !isShare {
			if !q.IsZero() {
				return nil, fmt.Errorf("device %s: consumedCapacity %.64s is %.64s; a claim consumes only the share capacities (%s/%s, %s/%s) of a shared device",
					r.Device, key, q.String(), dradevice.ShareDomain, v1alpha1.CapacityMemory, dradevice.ShareDomain, v1alpha1.CapacityCompute)
			}
			continue
		}
		v, exact := q.AsInt64()
		if !exact || v < 0 || v > l.limit {
			return nil, fmt.Errorf("device %s: consumedCapacity %s is %.64s, not a whole number from 0 to the device's %d", r.Device, key, q.String(), l.limit)
		}
		if v > 0 {
			share[l.name] = v
		}
	}
	for key := range limits {
		if _, ok := r.ConsumedCapacity[key]; !ok {
			return nil, fmt.Errorf("device %s: consumedCapacity has no %s, which the device publishes", r.Device, key)
		}
	}
	if len(share) == 0 {
		return nil, fmt.Errorf("device %s: the claim takes no share of it: request %s/%s, %s/%s or both in the request's capacity.requests (N units of the class)",
			r.Device, dradevice.ShareDomain, v1alpha1.CapacityMemory, dradevice.ShareDomain, v1alpha1.CapacityCompute)
	}
	return share, nil
}

// capacityLimit is a share capacity of a device: its name
// (v1alpha1.CapacityMemory, v1alpha1.CapacityCompute) and what all shares
// may take of it, -1 when the device does not publish it.
type capacityLimit struct {
	name  string
	limit int64
}

func limitsOf(c selector.Capacity) []capacityLimit {
	return []capacityLimit{{v1alpha1.CapacityMemory, c.Memory}, {v1alpha1.CapacityCompute, c.Compute}}
}

// fitsWith refuses share of device d when, with the shares of it already
// prepared (taken), it takes more than the device's capacity: the last line
// of defence the DRA API asks of a driver, as against one device in two
// claims.
func fitsWith(device string, d *v1alpha1.Device, taken []assignment.Share, share assignment.Share) error {
	c, _ := shareCapacity(d)
	for _, l := range limitsOf(c) {
		limit := max(l.limit, 0)
		// Each amount is at most 1Ei (the checkpoint's bound) and the sum
		// stops past the limit (at most 4Ei): it never overflows.
		sum := share[l.name]
		for _, s := range taken {
			if sum > limit {
				break
			}
			sum += s[l.name]
		}
		if sum > limit {
			return fmt.Errorf("device %s: with the shares already prepared on it, the claim's would take more than its %d of %s", device, limit, l.name)
		}
	}
	return nil
}
