package handoff

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/mig"
	"github.com/resclass/resclass/pkg/selector"
)

// Shares of a device (docs/sharing.md): the kubelet counts opaque ids, so a
// device that serves shares is, to each share class that selects it, one
// slot id per unit of the class that fits it, "<device id>/share/<n>". The
// scheduler decides whether a share fits; the slots only keep the kubelet's
// count from refusing what it placed. A container's N units are N slots of
// the one device its assignment names.

// shareInfix separates a device's id from a share slot's number.
const shareInfix = "/share/"

// MaxShareSlots bounds the slots a device is to one share class: a class
// whose unit is tiny (a byte of memory) would otherwise be billions of ids
// to the kubelet. No GPU holds a thousand pods.
const MaxShareSlots = 1000

// ShareSlots is how many units of unit fit capacity c: the fewest over the
// capacities the unit takes, at most MaxShareSlots, 0 when a capacity it
// takes is not published.
func ShareSlots(unit selector.Share, c selector.Capacity) int {
	n := int64(MaxShareSlots)
	for _, p := range [][2]int64{{unit.Memory, c.Memory}, {unit.Compute, c.Compute}} {
		if p[0] <= 0 {
			continue
		}
		if p[1] < 0 {
			return 0
		}
		n = min(n, p[1]/p[0])
	}
	if unit.Memory <= 0 && unit.Compute <= 0 {
		return 0
	}
	return int(n)
}

// ShareSlotIDs are the n share slots of device id.
func ShareSlotIDs(id string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = id + shareInfix + strconv.Itoa(i)
	}
	return ids
}

// slotKind is what a kubelet id is of its device.
type slotKind int

const (
	wholeID   slotKind = iota // the device's own id
	poolSlot                  // "<pool>/<n>"
	shareSlot                 // "<device>/share/<n>"
)

// ParseKubeletID splits a kubelet id into its device's id and what it is of
// it; ok is false for an id of no form the agent advertises. Device ids
// never contain "/" (PCI addresses, UUIDs, pool names), but for MIG slices
// to create, whose ids are their own.
func ParseKubeletID(kid string) (device string, kind slotKind, ok bool) {
	// A MIG slice to create is advertised by its own id, which has "/"
	// (mig.SliceID).
	if _, _, _, slice := mig.ParseSliceID(kid); slice {
		return kid, wholeID, true
	}
	device, rest, slotted := strings.Cut(kid, "/")
	if device == "" {
		return "", 0, false
	}
	if !slotted {
		return device, wholeID, true
	}
	kind = poolSlot
	if n, isShare := strings.CutPrefix(rest, shareInfix[1:]); isShare {
		kind, rest = shareSlot, n
	}
	// Slot numbers are what KubeletIDs and ShareSlotIDs write: decimal,
	// without sign or leading zeros.
	if n, err := strconv.Atoi(rest); err != nil || n < 0 || strconv.Itoa(n) != rest {
		return "", 0, false
	}
	return device, kind, true
}

// Holder is a pod assigned a device: it holds it from its assignment until
// it ends, whether or not it runs yet.
type Holder struct {
	Namespace, Name string
	// Share is set when the pod holds shares of the device rather than the
	// whole device.
	Share bool
}

// Holders lists the live pods bound to the node that are assigned device
// id, in the kubelet's admission order; a pod holding the device both whole
// and in shares (which the scheduler never writes) is a whole holder.
func (a *Allocator) Holders(id string) []Holder {
	objs, _ := a.informer.GetIndexer().ByIndex(byHeld, id)
	pods := make([]*podInfo, 0, len(objs))
	for _, o := range objs {
		if p := o.(*podInfo); p.assignment.Node == a.cfg.Node {
			pods = append(pods, p)
		}
	}
	slices.SortFunc(pods, compare)
	out := make([]Holder, len(pods))
	for i, p := range pods {
		out[i] = Holder{Namespace: p.Namespace, Name: p.Name, Share: !holdsWhole(p.assignment, id)}
	}
	return out
}

// HeldBy lists the pods on this node whose assignment names id, whole or
// in shares, in admission order.
func (a *Allocator) HeldBy(id string) []types.UID {
	objs, _ := a.informer.GetIndexer().ByIndex(byHeld, id)
	var out []types.UID
	for _, o := range objs {
		if p := o.(*podInfo); p.assignment.Node == a.cfg.Node {
			out = append(out, p.UID)
		}
	}
	return out
}

// holdsWhole says whether a assigns id to a class without a share.
func holdsWhole(a *assignment.Assignment, id string) bool {
	for _, c := range a.Containers {
		for class, ids := range c.Classes {
			if _, share := c.Shares[class]; !share && slices.Contains(ids, id) {
				return true
			}
		}
	}
	return false
}

// EnvShareMemory and EnvShareCompute say a container's share in every
// sharing mode: memory in bytes, compute in percent, summed over its share
// classes (the kubelet merges every class's response, and each carries the
// same values).
const (
	EnvShareMemory  = "RESCLASS_SHARE_MEMORY"
	EnvShareCompute = "RESCLASS_SHARE_COMPUTE"
)

// ShareEdits adds to e what a container gets for its shares: shares and
// classes are its assignment's (assignment.Container), the limits are its
// own and no other container's. Each device it holds shares of gets, from
// its kind (devicekind.ShareEditor), the container's shares of it summed.
// The device-plugin path calls it for every class's response; the DRA path
// may too.
func ShareEdits(kinds *devicekind.Registry, h *devicekind.Handoff, shares map[string]assignment.Share, classes map[string][]string, e *devicekind.ContainerEdits) error {
	if len(shares) == 0 {
		return nil
	}
	byDevice := map[string]map[string]int64{}
	var total assignment.Share = map[string]int64{}
	for class, share := range shares {
		ids := classes[class]
		if len(ids) != 1 {
			return fmt.Errorf("the share of class %s is of %d devices, not one", class, len(ids))
		}
		if byDevice[ids[0]] == nil {
			byDevice[ids[0]] = map[string]int64{}
		}
		for name, v := range share {
			byDevice[ids[0]][name] += v
			total[name] += v
		}
	}
	if m := total[v1alpha1.CapacityMemory]; m > 0 {
		e.Env[EnvShareMemory] = strconv.FormatInt(m, 10)
	}
	if c := total[v1alpha1.CapacityCompute]; c > 0 {
		e.Env[EnvShareCompute] = strconv.FormatInt(c, 10)
	}
	for _, id := range slices.Sorted(maps.Keys(byDevice)) {
		d := h.Device(id)
		if d == nil {
			return fmt.Errorf("device %s, of a share of the container, is no longer on this node", id)
		}
		if k, ok := kinds.Kind(d.Kind).(devicekind.ShareEditor); ok {
			if err := k.ShareEdits(h, d, byDevice[id], e); err != nil {
				return fmt.Errorf("share of %s: %w", id, err)
			}
		}
	}
	return nil
}
