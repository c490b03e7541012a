package resourceclasses

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation/field"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"
	v1helper "k8s.io/kubernetes/pkg/apis/core/v1/helper"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/mig"
	"github.com/resclass/resclass/pkg/selector"
)

// cache is the plugin's view of devices: every node's published devices, every
// class's compiled selector and, per (class, device), whether it matches, and
// which devices pods hold. It is fed by informers (NodeDevices, ResourceClasses,
// pods) and by the plugin's own Reserve/Unreserve, so after a restart it is
// rebuilt from the pods' assignment annotations alone.
type cache struct {
	mu      sync.RWMutex
	nodes   map[string]*nodeState
	classes map[string]*classState
	pods    map[types.UID]*holding
	byNode  map[string]map[types.UID]*holding
	// gone are pods released because the scheduler's event handler reported
	// them deleted (releaseGone) before this plugin's own handler delivered
	// the deletion: an older update of theirs still on its way must not hold
	// their devices again. The plugin's handler removes them (releaseDeleted).
	gone map[types.UID]struct{}

	// classNodes[class] are the nodes where class selects a device. A set is
	// never changed in place (PreFilter hands them out): a node that joins or
	// leaves a class replaces the class's set with a changed copy.
	classNodes map[string]sets.Set[string]
	// numaUnsure[class] counts the nodes where some device the class selects
	// is a hugepage pool or publishes no NUMA node we count. Without one, a
	// one-device pod of the class scores the same on every node where it fits
	// under NUMAAligned (numaCertain).
	numaUnsure map[string]int
	// dirty: a class changed since classNodes and numaUnsure were built, so
	// the next reader rebuilds them over every node (rLockIndexed). A node's
	// change only moves that node's part of them (indexNode): agents
	// republish often (a hugepage pool's free pages, a NIC's link), and a
	// rebuild per change would hold the write lock, which Filter waits on,
	// for a pass over every node (docs/scheduler.md, "NodeDevices churn").
	dirty bool
	// classGen counts class changes, so that a node matched outside the lock
	// knows whether its snapshot of the classes is still current.
	classGen uint64
	// invalidDevices counts published devices given to nobody (invalidDevice).
	invalidDevices int
	// kubelet is what each Node's kubelet reports of the class resources, by
	// node name, kept apart from nodes: a Node can come before its
	// NodeDevices (liveness.go).
	kubelet map[string]kubeletClasses

	// freed is called, outside the lock, after a change that may let any
	// waiting pod fit, with why for the metric: devices released, a class
	// created or changed.
	freed func(why string)
	// grew is called, outside the lock, after a node's new NodeDevices gave
	// classes room they did not have there (grownClasses): only a pod of one
	// of them can fit now where it did not, and only on that node.
	grew func(node string, classes []string)
	// changed is called, outside the lock, after any change that moves a class's
	// status.
	changed func()
	// untrusted is called, under the lock (it must not block), when a pod's
	// annotation is not believed.
	untrusted func(h *holding, why *inconsistency)
}

type nodeState struct {
	resourceVersion string
	devices         []*deviceState
	index           map[string]int   // device id -> position
	matches         map[string][]int // class -> devices it selects, in published order
	// counts sums up matches[class]'s devices per class for the quick path
	// (quickCounts, read with countsOf), so that Filter and Score, which ask
	// for every pod on hundreds of nodes, read one entry instead of walking
	// the devices. setMatches keeps it in step with matches, chargeDevices
	// with holders. A slice sorted by class, the counts inline: at 5000 nodes
	// Filter's time went to cache misses, and a map of pointers cost two
	// more per node than this (docs/scheduler.md, "Filter at 5000 nodes").
	counts  []classCounts
	invalid []invalidDevice // in published order
	// shareUnits[class] is the unit of each share class that selects a
	// device of n (docs/sharing.md): placement and status read it where they
	// read matches. Nil on the many nodes without one.
	shareUnits map[string]selector.Share
	// blocked[class] is how many devices of class pods hold whose assignment
	// cannot be trusted: which ones is unknown (see holding.blocked).
	blocked map[string]int
	// kubelet is the Node's kubelet's report of the class resources, which
	// recount folds into counts (quickCounts.unserved).
	kubelet kubeletClasses
	// stopping: the node's agent said it is stopping (AgentServing False),
	// which recount folds into counts as well (liveness.go).
	stopping bool
}

type deviceState struct {
	id       string
	healthy  bool
	numa     int // -1: unknown
	excluded bool
	invalid  bool // an attribute cannot be read: selected by no class
	sel      *selector.Device
	pool     *poolState  // huge-pages only
	shared   *shareState // a GPU in a sharing mode (devicekind.Shared) only
	slice    *sliceRef   // a potential MIG slice only (slices.go)
	holders  int         // pods holding an exclusive device (more than 1 is a conflict)
	// draining: the device's sharing mode is to change and waits for the
	// pods that hold it (Sharing.RequestedMode). It takes no new pod of
	// either kind, so it is excluded as well; its holders stay charged.
	draining bool
	// Where it sits, for the Topology strategy: its PCIe root complex and
	// switch, numbered per node (-1: not published), and its NVLink peers.
	root, sw int
	peers    []peerLink
}

// poolState is a hugepage pool: shared by the pods it serves, which draw pages.
type poolState struct {
	resourceName corev1.ResourceName
	total, free  int64 // bytes: pagesTotal, pagesFree
	charged      int64 // bytes the pods assigned to it request natively
}

// freeBytes is what a new pod may still draw: the published free pages lag
// behind pods that have not touched theirs yet, so the charge of assigned pods
// bounds it too (docs/hugepages.md).
func (p *poolState) freeBytes() int64 {
	return max(0, min(p.free, p.total-p.charged))
}

// shareState is a device that serves shares: what the shares of it may take
// together and what the shares pods hold take now. Shares are placed and
// charged by amount, as a pool's pages are, not by holders.
type shareState struct {
	mode     v1alpha1.SharingMode
	capacity selector.Capacity // -1: a capacity the device does not publish
	used     selector.Share
}

// free is what a new share may still take of the device.
func (s *shareState) free() selector.Capacity {
	return less(s.capacity, s.used)
}

// permille is how much of the device its shares and extra take, in
// thousandths: of the fuller of its capacities.
func (s *shareState) permille(extra selector.Share) int64 {
	u := addShare(s.used, 1, extra)
	var f int64
	if s.capacity.Memory > 0 {
		f = u.Memory / max(1, s.capacity.Memory/1000) // no overflow, whatever the capacity
	}
	if s.capacity.Compute > 0 {
		f = max(f, u.Compute*1000/s.capacity.Compute)
	}
	return min(1000, f)
}

// less is c less what s takes of it, never below 0; a capacity c does not
// publish stays unpublished (-1).
func less(c selector.Capacity, s selector.Share) selector.Capacity {
	if c.Memory >= 0 {
		c.Memory = max(0, c.Memory-s.Memory)
	}
	if c.Compute >= 0 {
		c.Compute = max(0, c.Compute-s.Compute)
	}
	return c
}

// addShare is a plus sign times b.
func addShare(a selector.Share, sign int, b selector.Share) selector.Share {
	return selector.Share{Memory: a.Memory + int64(sign)*b.Memory, Compute: a.Compute + int64(sign)*b.Compute}
}

// unitsIn is how many units of unit fit in c.
func unitsIn(unit selector.Share, c selector.Capacity) int64 {
	n := int64(math.MaxInt64)
	if unit.Memory > 0 {
		n = min(n, max(0, c.Memory)/unit.Memory)
	}
	if unit.Compute > 0 {
		n = min(n, max(0, c.Compute)/unit.Compute)
	}
	if n == math.MaxInt64 {
		return 0 // a unit takes something: compiled classes never get here
	}
	return n
}

type classState struct {
	uid        types.UID
	generation int64
	compiled   *selector.Class // nil: the class does not compile and selects nothing
	// unit is the class's share unit when share is set (a share class): its
	// requests are placed as amounts on one shared device each.
	unit  selector.Share
	share bool
}

// shareUnit is the class's unit, nil for a class of whole devices (or none).
func (cl *classState) shareUnit() *selector.Share {
	if cl == nil || !cl.share {
		return nil
	}
	return &cl.unit
}

// holding is what one pod holds: its devices per class and, for hugepage pools,
// which containers draw pages from them (charged by the pool's page size).
//
// What the pod's annotation says is believed only when it is consistent with
// the pod (docs/scheduler.md, "Trust model"): tenants may be able to write it.
// A holding is trusted when this scheduler decided it (Reserve), or when it was
// learned from a bound pod's annotation and found consistent with the pod and
// the node's inventory. A trusted holding stays what it is until the pod ends,
// whatever the annotation says later: a changed, garbled or removed annotation
// neither frees the devices the pod runs on nor adds any. An untrusted one
// (inconsistent from the first sight, as after a restart) is blocked: the pod
// holds draws[class] devices of each class on its node, which ones unknown,
// never more than it requests.
type holding struct {
	uid     types.UID
	node    string
	ref     *corev1.ObjectReference       // the pod, for Events
	assumed bool                          // Reserved by this scheduler, not yet seen bound
	trusted bool                          // decided by Reserve, or learned and found consistent
	devices map[string][]string           // class -> distinct devices across the pod's containers
	users   map[string][]*containerDemand // device id -> the containers using it, for pool charges
	shares  map[string]selector.Share     // device id -> what the pod's shares take of it, as assigned
	raw     string                        // the annotation the devices come from (annotationState), to tell changes apart

	// For a holding learned from a pod's annotation:
	fresh map[string][]string // class -> the devices of the pod's fresh draws, as the annotation has them
	draws map[string]int      // class -> the pod's fresh draws: what it holds when blocked
	flaw  *inconsistency      // why the annotation does not fit the pod itself; nil if it does
	// claims are the containers' devices of each class, with the share the
	// annotation gives them: checked against the classes when charged, and
	// charged to the shared devices they name when not believed.
	claims []shareClaim

	// What charge did, so that uncharging undoes exactly that: blocked counts
	// per class on the node state chargedOn.
	blocked   map[string]int
	chargedOn *nodeState
	// blockedShares is what block charged to the shared devices of chargedOn
	// for claims not believed, by device id.
	blockedShares map[string]selector.Share
	// reported is the annotation value last reported as not believed, so that a
	// pod's status updates do not report it again.
	reported string
	// preemptionReported: the pod's preemption was reported (reportPreempted).
	preemptionReported bool
}

// annotationState is how holding.raw and holding.reported spell a pod's
// assignment annotation: "=" and its value, or absentAnnotation when it has
// none. notReported ("") is no state, so any value a tenant writes can be told
// from "nothing reported yet" and from "no annotation".
func annotationState(pod *corev1.Pod) string {
	if v, ok := pod.Annotations[assignment.AnnotationKey]; ok {
		return presentAnnotation(v)
	}
	return absentAnnotation
}

func presentAnnotation(value string) string { return "=" + value }

const (
	absentAnnotation = "-"
	notReported      = ""
)

// shareClaim is one container's devices of one class in a learned
// annotation, and the share it says the container takes (claimed: it says
// one).
type shareClaim struct {
	container, class string
	ids              []string
	amount           selector.Share
	claimed          bool
	units            int64 // what the container requests of the class
}

// inconsistency is why a pod's annotation is not believed: reason is the
// metric's label, detail what the Event and the log say.
type inconsistency struct {
	reason, detail string
}

func newCache() *cache {
	return &cache{
		nodes:     map[string]*nodeState{},
		kubelet:   map[string]kubeletClasses{},
		classes:   map[string]*classState{},
		pods:      map[types.UID]*holding{},
		byNode:    map[string]map[types.UID]*holding{},
		freed:     func(string) {},
		grew:      func(string, []string) {},
		changed:   func() {},
		untrusted: func(*holding, *inconsistency) {},
		dirty:     true,
	}
}

// nodesFor returns the nodes where every class selects at least one device.
// The set is shared: callers must not change it.
func (c *cache) nodesFor(classes []string) sets.Set[string] {
	c.rLockIndexed()
	defer c.mu.RUnlock()
	out := c.classNodes[classes[0]]
	for _, class := range classes[1:] {
		out = out.Intersection(c.classNodes[class])
	}
	if out == nil {
		out = sets.New[string]()
	}
	return out
}

// numaCertain reports whether class selects only devices that publish a NUMA
// node (and no hugepage pool), on every node. A pod that wants one device of
// it then scores MaxScore under NUMAAligned wherever it fits: its device is on
// one NUMA node.
func (c *cache) numaCertain(class string) bool {
	c.rLockIndexed()
	defer c.mu.RUnlock()
	_, selects := c.classNodes[class]
	return selects && c.numaUnsure[class] == 0
}

// rLockIndexed read-locks the cache with classNodes and numaUnsure current:
// rebuilt, if a class changed since, under the write lock.
func (c *cache) rLockIndexed() {
	c.mu.RLock()
	if !c.dirty {
		return
	}
	c.mu.RUnlock()
	c.mu.Lock()
	if c.dirty {
		c.classNodes, c.numaUnsure = indexOf(c.nodes)
		c.dirty = false
	}
	c.mu.Unlock()
	c.mu.RLock()
}

// indexOf is classNodes and numaUnsure built over nodes.
func indexOf(nodes map[string]*nodeState) (map[string]sets.Set[string], map[string]int) {
	classNodes, unsure := map[string]sets.Set[string]{}, map[string]int{}
	for name, n := range nodes {
		for class := range n.matches {
			if classNodes[class] == nil {
				classNodes[class] = sets.New[string]()
			}
			classNodes[class].Insert(name)
			if n.numaUnsure(class) {
				unsure[class]++
			}
		}
	}
	return classNodes, unsure
}

// indexNode moves node name's part of classNodes and numaUnsure from what
// old (nil: none) contributed to what n (nil: none) does. The caller holds
// the write lock. A set is copied only when the node joins or leaves its
// class, not when only the devices' counts change; numaUnsure is a count of
// nodes, so one node's part comes off without looking at the others.
func (c *cache) indexNode(name string, old, n *nodeState) {
	if c.dirty {
		return // the rebuild counts n
	}
	before, after := old.classMatches(), n.classMatches()
	for class := range before {
		if _, still := after[class]; !still {
			s := c.classNodes[class].Clone()
			s.Delete(name)
			if s.Len() == 0 {
				delete(c.classNodes, class)
			} else {
				c.classNodes[class] = s
			}
		}
		if old.numaUnsure(class) {
			if c.numaUnsure[class]--; c.numaUnsure[class] <= 0 {
				delete(c.numaUnsure, class)
			}
		}
	}
	for class := range after {
		if _, was := before[class]; !was {
			s := c.classNodes[class].Clone()
			s.Insert(name)
			c.classNodes[class] = s
		}
		if n.numaUnsure(class) {
			c.numaUnsure[class]++
		}
	}
}

// classMatches is n.matches; nil for no node.
func (n *nodeState) classMatches() map[string][]int {
	if n == nil {
		return nil
	}
	return n.matches
}

// numaUnsure reports whether some device class selects on n is a hugepage
// pool or publishes no NUMA node we count.
func (n *nodeState) numaUnsure(class string) bool {
	for _, i := range n.matches[class] {
		if dev := n.devices[i]; dev.pool != nil || dev.numa < 0 || dev.numa >= maxNUMA {
			return true
		}
	}
	return false
}

// invalidDevice is a published device the scheduler gives to nobody because
// some attribute cannot be read (out of its bounds, or of the wrong type).
type invalidDevice struct {
	id, reason string
}

// setNodeDevices replaces a node's devices. Unchanged objects (same
// resourceVersion) are ignored, so replays are cheap. The devices are decoded
// and matched against a snapshot of the classes outside the write lock, so that
// what a NodeDevices object holds never stalls Filter and Reserve; only classes
// that changed meanwhile are matched under it. It returns the node's invalid
// devices when they differ from what the node published before.
func (c *cache) setNodeDevices(nd *v1alpha1.NodeDevices) (invalid []invalidDevice, changed bool) {
	c.mu.RLock()
	old := c.nodes[nd.Name]
	if old != nil && old.resourceVersion == nd.ResourceVersion {
		c.mu.RUnlock()
		return nil, false
	}
	classes, gen, kubelet := maps.Clone(c.classes), c.classGen, c.kubelet[nd.Name]
	c.mu.RUnlock()

	n := newNodeState(nd)
	n.kubelet = kubelet
	for name, cl := range classes {
		n.setMatches(name, n.selectedBy(cl), cl)
	}

	c.mu.Lock()
	if c.classGen != gen {
		for name, cl := range c.classes {
			if classes[name] != cl {
				n.setMatches(name, n.selectedBy(cl), cl)
			}
		}
		for name := range classes {
			if c.classes[name] == nil {
				n.setMatches(name, nil, nil)
			}
		}
	}
	if k := c.kubelet[nd.Name]; !maps.Equal(k, kubelet) {
		n.kubelet = k
		n.recount()
	}
	c.invalidDevices += len(n.invalid) - len(c.nodes[nd.Name].invalidOrNil())
	old = c.nodes[nd.Name]
	var oldBlocked map[string]int
	if old != nil {
		oldBlocked = maps.Clone(old.blocked) // charging n takes the blocked holdings off old
	}
	oldShareFree := old.shareFree() // and their shares
	c.nodes[nd.Name] = n
	c.indexNode(nd.Name, old, n)
	for _, h := range c.byNode[nd.Name] {
		c.charge(n, h, 1)
	}
	grown := grownClasses(old, oldBlocked, oldShareFree, n)
	invalidNow := c.invalidDevices
	c.mu.Unlock()
	invalidDevices.Set(float64(invalidNow))
	if len(grown) > 0 {
		c.grew(nd.Name, grown)
	}
	c.changed()
	return n.invalid, !slices.Equal(n.invalid, old.invalidOrNil())
}

// newNodeState decodes a node's published devices.
func newNodeState(nd *v1alpha1.NodeDevices) *nodeState {
	n := &nodeState{resourceVersion: nd.ResourceVersion, index: map[string]int{}, matches: map[string][]int{}, stopping: agentStopping(nd)}
	places := map[string]int{} // PCIe roots and switches, numbered
	place := func(a v1alpha1.DeviceAttribute) int {
		if a.StringValue == nil {
			return -1
		}
		if _, ok := places[*a.StringValue]; !ok {
			places[*a.StringValue] = len(places)
		}
		return places[*a.StringValue]
	}
	gpuAt := map[int64]int{}                   // NVML index -> position
	peerLinks := map[int]nvidiagpu.PeerLinks{} // position -> its NVLink peers by NVML index
	for i := range nd.Status.Devices {
		d := &nd.Status.Devices[i]
		if _, dup := n.index[d.ID]; dup {
			continue // ids are unique on a node; the first one wins
		}
		ds := &deviceState{id: d.ID, healthy: d.Healthy, numa: -1, root: -1, sw: -1, sel: selector.NewDevice(d)}
		n.index[d.ID] = len(n.devices)
		n.devices = append(n.devices, ds)
		problems := ds.sel.Problems()
		if a, ok := d.Attributes[v1alpha1.AttributeNVLinkPeerLinks]; ok && a.StringValue != nil && len(problems) == 0 {
			links, err := nvidiagpu.ParsePeerLinks(*a.StringValue)
			if err != nil {
				problems = append(problems, err)
			}
			peerLinks[len(n.devices)-1] = links
		}
		// The device's kind says how it is counted (a GPU in MIG mode, for
		// one, is given out only through its MIG devices).
		allocation := kinds.Builtin.Allocation(d)
		mode, capacity, shares := ds.sel.Sharing()
		if shares && allocation != devicekind.Shared {
			// Its kind serves no shares (a NIC, a GPU in MIG mode): given as
			// shares it would serve two pods what one may take.
			problems = append(problems, fmt.Errorf("it publishes sharing mode %s, but a %s device in its state serves no shares", mode, d.Kind))
		}
		if len(problems) > 0 {
			// Nothing else reads the attributes of such a device: a pool's
			// size, for one, is only safe to convert once it is in bounds.
			ds.excluded, ds.invalid = true, true
			n.invalid = append(n.invalid, invalidDevice{id: d.ID, reason: errors.Join(problems...).Error()})
			continue
		}
		if v := d.Attributes[v1alpha1.AttributeNUMANode].IntValue; v != nil {
			ds.numa = int(*v)
		}
		ds.root = place(d.Attributes[v1alpha1.AttributePCIeRoot])
		ds.sw = place(d.Attributes[v1alpha1.AttributePCIeSwitch])
		if v, ok := nvidiagpu.PeerIndex(d); ok {
			if _, dup := gpuAt[v]; !dup {
				gpuAt[v] = len(n.devices) - 1
			}
		}
		switch allocation {
		case devicekind.Unallocatable:
			ds.excluded = true
		case devicekind.Pool:
			ds.pool = newPool(d)
			if ds.pool == nil {
				ds.healthy = false
			}
		case devicekind.Shared:
			ds.shared = &shareState{mode: mode, capacity: capacity}
		}
		if s := d.Sharing; s != nil && s.RequestedMode != "" && s.RequestedMode != s.Mode {
			ds.draining, ds.excluded = true, true
		}
	}
	// Potential MIG slices go behind every published device, so that the
	// published ones keep their positions.
	published := len(n.devices)
	for i := range nd.Status.Devices {
		if d := &nd.Status.Devices[i]; mig.Dynamic(d) {
			if j, ok := n.index[d.ID]; ok && j < published && !n.devices[j].invalid {
				n.addPotentials(d)
			}
		}
	}
	// Peers are named by NVML index; one no GPU of the node has is left out.
	for i, links := range peerLinks {
		if n.devices[i].invalid {
			continue
		}
		for index, count := range links {
			if j, ok := gpuAt[int64(index)]; ok && j != i {
				n.devices[i].peers = append(n.devices[i].peers, peerLink{pos: int32(j), links: int32(count)})
			}
		}
		slices.SortFunc(n.devices[i].peers, func(a, b peerLink) int { return int(a.pos - b.pos) })
	}
	return n
}

// grownClasses are the classes that n, a node's new devices, gives room that
// old, its devices before (nil: none), did not: a device the class selects
// that a pod may be given now and could not before (new, healed, no longer
// held, newly selected by the class), or a pool of the class with more free
// pages, or pages of another size, or a shared device with room for more
// units of the class. Whether a pod fits only grows with these
// (the matching's candidates and the pools' free bytes), so a pod none of
// whose classes is among them fits n only if it fitted old: a change that
// shrinks or only repeats a node's devices names none. Where pods hold
// devices that are not known (blocked), their rows compete for the devices
// of every class, so any growth, or fewer blocked, names every class of n.
// oldBlocked is old's blocked, and oldShareFree what its shared devices had
// free (shareFree), as they were before n was charged.
func grownClasses(old *nodeState, oldBlocked map[string]int, oldShareFree map[string]selector.Capacity, n *nodeState) []string {
	var grown []string
	for class, idx := range n.matches {
		if slices.ContainsFunc(idx, func(i int) bool { return n.newRoom(class, i, old, oldShareFree) }) {
			grown = append(grown, class)
		}
	}
	fewerBlocked := false
	for class, k := range oldBlocked {
		fewerBlocked = fewerBlocked || n.blocked[class] < k
	}
	if fewerBlocked || (len(grown) > 0 && len(n.blocked) > 0) || (old != nil && old.stopping && !n.stopping) {
		grown = slices.Collect(maps.Keys(n.matches))
	}
	slices.Sort(grown)
	return grown
}

// newRoom reports whether device i of n, which class selects, gives class
// room on n that it did not have on old (grownClasses).
func (n *nodeState) newRoom(class string, i int, old *nodeState, oldShareFree map[string]selector.Capacity) bool {
	dev := n.devices[i]
	if !dev.givable() {
		return false
	}
	if old == nil {
		return true
	}
	j, ok := old.index[dev.id]
	if !ok {
		return true
	}
	was := old.devices[j]
	if dev.slice != nil {
		// A slice that could not be created before and can now (an
		// instance destroyed, a pod gone), or a GPU whose instances changed.
		return n.sliceFits(i) && (was.slice == nil || !old.sliceFits(j) || !slices.Contains(old.matches[class], j) ||
			was.slice.gpu.base.FreeSlices() < dev.slice.gpu.base.FreeSlices())
	}
	if !was.givable() || !slices.Contains(old.matches[class], j) || (dev.pool == nil) != (was.pool == nil) || (dev.shared == nil) != (was.shared == nil) {
		return true
	}
	if dev.shared != nil {
		// A share released, or capacity grown: room for more units of the
		// class than before.
		unit := n.shareUnits[class]
		return unitsIn(unit, dev.shared.free()) > unitsIn(unit, oldShareFree[dev.id])
	}
	return dev.pool != nil && (dev.pool.resourceName != was.pool.resourceName || dev.pool.freeBytes() > was.pool.freeBytes())
}

// shareFree is what each shared device of n (nil: none) has free, by id;
// nil where n has none.
func (n *nodeState) shareFree() map[string]selector.Capacity {
	var out map[string]selector.Capacity
	if n == nil {
		return nil
	}
	for _, d := range n.devices {
		if d.shared != nil {
			if out == nil {
				out = map[string]selector.Capacity{}
			}
			out[d.id] = d.shared.free()
		}
	}
	return out
}

// givable: a pod may be given d now: healthy, allocatable and, unless pods
// share it (a pool, a shared device), held by nobody.
func (d *deviceState) givable() bool {
	return d.healthy && !d.excluded && (d.pool != nil || d.shared != nil || d.holders == 0)
}

func (n *nodeState) invalidOrNil() []invalidDevice {
	if n == nil {
		return nil
	}
	return n.invalid
}

func newPool(d *v1alpha1.Device) *poolState {
	a := d.Attributes
	size, total, free, name := a[v1alpha1.AttributeSize].QuantityValue, a[v1alpha1.AttributePagesTotal].IntValue, a[v1alpha1.AttributePagesFree].IntValue, a[v1alpha1.AttributeResourceName].StringValue
	if size == nil || total == nil || free == nil || size.Value() <= 0 {
		return nil // a pool the scheduler cannot account for serves nobody
	}
	s := size.Value()
	// Pages are counted in bytes: a count whose bytes do not fit an int64 is
	// no pool either.
	if *total < 0 || *free < 0 || *free > *total || *total > math.MaxInt64/s {
		return nil
	}
	p := &poolState{resourceName: v1helper.HugePageResourceName(*size), total: *total * s, free: *free * s}
	if name != nil {
		p.resourceName = corev1.ResourceName(*name)
	}
	return p
}

func (c *cache) deleteNodeDevices(name string) {
	c.mu.Lock()
	old := c.nodes[name]
	c.invalidDevices -= len(old.invalidOrNil())
	invalidNow := c.invalidDevices
	delete(c.nodes, name)
	c.indexNode(name, old, nil)
	c.mu.Unlock()
	invalidDevices.Set(float64(invalidNow))
	c.changed()
}

// setKubelet takes in what node's kubelet reports of the class resources
// (liveness.go). It changes the cache only when that changed: the kubelet
// writes its status on other changes too.
func (c *cache) setKubelet(node *corev1.Node) {
	k := kubeletClassesOf(node)
	c.mu.RLock()
	old, known := c.kubelet[node.Name]
	c.mu.RUnlock()
	if known && maps.Equal(old, k) {
		return
	}
	c.mu.Lock()
	c.kubelet[node.Name] = k
	if n := c.nodes[node.Name]; n != nil {
		n.kubelet = k
		n.recount()
	}
	c.mu.Unlock()
}

// deleteKubelet forgets a deleted Node's report.
func (c *cache) deleteKubelet(name string) {
	c.mu.Lock()
	delete(c.kubelet, name)
	if n := c.nodes[name]; n != nil && n.kubelet != nil {
		n.kubelet = nil
		n.recount()
	}
	c.mu.Unlock()
}

// selectedBy lists the devices of n that cl selects, in published order. A
// device that is invalid is selected by no class.
func (n *nodeState) selectedBy(cl *classState) []int {
	var idx []int
	if cl.compiled != nil {
		for i, d := range n.devices {
			if !d.invalid && cl.compiled.Matches(d.sel) {
				idx = append(idx, i)
			}
		}
	}
	return idx
}

// setMatches records the devices class (cl, nil once deleted) selects on n.
// It changes n in place: only for the cache's own node states, under its
// write lock, never for a view (viewLocked).
func (n *nodeState) setMatches(class string, idx []int, cl *classState) {
	if len(idx) == 0 {
		delete(n.matches, class)
	} else {
		n.matches[class] = idx
	}
	if unit := cl.shareUnit(); unit != nil && len(idx) > 0 {
		if n.shareUnits == nil {
			n.shareUnits = map[string]selector.Share{}
		}
		n.shareUnits[class] = *unit
	} else {
		delete(n.shareUnits, class)
	}
	n.recount()
}

// setClass compiles rc once and recomputes which devices it selects on every
// node: selection is never evaluated per pod. Both happen outside the write
// lock, against a snapshot of the nodes; a node replaced meanwhile is matched
// under it.
func (c *cache) setClass(rc *v1alpha1.ResourceClass) {
	c.mu.RLock()
	// Status writes change the resourceVersion, not the generation: only a new
	// spec (a re-created class) needs recomputing.
	if old := c.classes[rc.Name]; old != nil && old.uid == rc.UID && old.generation == rc.Generation {
		c.mu.RUnlock()
		return
	}
	nodes := maps.Clone(c.nodes)
	c.mu.RUnlock()

	cl := &classState{uid: rc.UID, generation: rc.Generation}
	if compiled, errs := selector.Compile(&rc.Spec, field.NewPath("spec")); len(errs) == 0 {
		cl.compiled = compiled
		cl.unit, cl.share = compiled.Share()
	}
	selected := make(map[string][]int, len(nodes))
	for name, n := range nodes {
		selected[name] = n.selectedBy(cl)
	}

	c.mu.Lock()
	c.classes[rc.Name] = cl
	c.classGen++
	for name, n := range c.nodes {
		if nodes[name] == n {
			n.setMatches(rc.Name, selected[name], cl)
		} else {
			n.setMatches(rc.Name, n.selectedBy(cl), cl)
		}
	}
	c.dirty = true
	c.mu.Unlock()
	c.freed(activatedClass)
	c.changed()
}

func (c *cache) deleteClass(name string) {
	c.mu.Lock()
	delete(c.classes, name)
	c.classGen++
	for _, n := range c.nodes {
		n.setMatches(name, nil, nil)
	}
	c.dirty = true
	c.mu.Unlock()
	c.changed()
}

// charge adds (sign 1) or removes (sign -1) h's hold on n's devices. Adding
// decides, for a holding not yet trusted, whether the node's inventory and
// classes bear out its annotation: then it is trusted from now on; else it is
// blocked and reported.
func (c *cache) charge(n *nodeState, h *holding, sign int) {
	if sign > 0 {
		c.unblock(h)
		if !h.trusted {
			flaw := h.flaw
			if flaw == nil {
				flaw = h.checkOn(n, c.classes)
			}
			if flaw == nil {
				// A trusted holding stays what it is: its claims are read no more.
				h.trusted, h.claims = true, nil
			} else {
				c.block(n, h)
				c.reportLocked(h, flaw)
				return
			}
		}
	} else if h.chargedOn != nil {
		c.unblock(h)
		return
	}
	chargeDevices(n, h, sign, func(i int) *deviceState { return n.devices[i] })
}

// block charges h's draws of exclusive devices to n as devices held, which
// ones unknown (addBlocked), and its claimed shares to the shared devices
// they name (claimedShares).
func (c *cache) block(n *nodeState, h *holding) {
	h.chargedOn, h.blocked = n, n.addBlocked(h.draws)
	h.blockedShares = n.claimedShares(h.claims, c.classes)
	n.chargeShares(h.blockedShares, 1, n.deviceAt)
}

// unblock undoes block, on the node state it was charged to.
func (c *cache) unblock(h *holding) {
	if n := h.chargedOn; n != nil {
		n.removeBlocked(h.blocked)
		n.chargeShares(h.blockedShares, -1, n.deviceAt)
	}
	h.chargedOn, h.blocked, h.blockedShares = nil, nil, nil
}

// deviceAt is n's device i itself, for chargeDevices and chargeShares on the
// cache's own node states.
func (n *nodeState) deviceAt(i int) *deviceState { return n.devices[i] }

// claimedShares is what an annotation not believed is charged on the shared
// devices of n it names, one per container and class: the larger of the
// share it claims and what the container requests of the class as it is
// now, at most the device's capacity. A forged smaller share never makes the
// scheduler count less than the pod may take; which device a container that
// names none runs on is unknown, and nothing is charged for it (docs/scheduler.md,
// "Sharing GPUs").
func (n *nodeState) claimedShares(claims []shareClaim, classes map[string]*classState) map[string]selector.Share {
	var out map[string]selector.Share
	for _, cl := range claims {
		if len(cl.ids) != 1 {
			continue
		}
		i, ok := n.index[cl.ids[0]]
		if !ok || n.devices[i].shared == nil {
			continue
		}
		capacity := n.devices[i].shared.capacity
		amount := cl.amount
		if unit := classes[cl.class].shareUnit(); unit != nil {
			want := selector.Share{Memory: max(0, capacity.Memory), Compute: max(0, capacity.Compute)}
			if fits, _ := unit.Fits(cl.units, capacity); fits {
				want = unit.Times(cl.units)
			}
			amount = selector.Share{Memory: max(amount.Memory, want.Memory), Compute: max(amount.Compute, want.Compute)}
		}
		amount = selector.Share{Memory: min(amount.Memory, max(0, capacity.Memory)), Compute: min(amount.Compute, max(0, capacity.Compute))}
		if out == nil {
			out = map[string]selector.Share{}
		}
		out[cl.ids[0]] = addShare(out[cl.ids[0]], 1, amount)
	}
	return out
}

// chargeShares adds (sign 1) or removes (sign -1) amounts, by device id, on
// n's shared devices, through own, which returns the device to change.
func (n *nodeState) chargeShares(amounts map[string]selector.Share, sign int, own func(i int) *deviceState) {
	for id, amount := range amounts {
		if i, ok := n.index[id]; ok && n.devices[i].shared != nil {
			d := own(i)
			d.shared.used = addShare(d.shared.used, sign, amount)
		}
	}
}

// addBlocked counts draws (class -> devices) as held on n, which devices
// unknown: rows of the matching that whatever a pod takes must leave room for
// (blockedRows). Pools and shared devices serve many pods, and a row of the
// matching takes a device whole: pool classes are not counted (the node agent
// publishes their free pages), nor share classes (a share is charged to the
// device its annotation names, claimedShares). It returns what it counted,
// for removeBlocked.
func (n *nodeState) addBlocked(draws map[string]int) map[string]int {
	added := map[string]int{}
	for class, k := range draws {
		idx := n.matches[class]
		if k == 0 || len(idx) == 0 || slices.ContainsFunc(idx, func(i int) bool { return n.devices[i].pool != nil || n.devices[i].shared != nil }) {
			continue
		}
		if n.blocked == nil {
			n.blocked = map[string]int{}
		}
		n.blocked[class] += k
		added[class] = k
	}
	return added
}

// removeBlocked undoes addBlocked.
func (n *nodeState) removeBlocked(added map[string]int) {
	for class, k := range added {
		if n.blocked[class] -= k; n.blocked[class] <= 0 {
			delete(n.blocked, class)
		}
	}
}

// recheck charges again every holding not trusted yet, after the classes
// changed: whether a class selects a device decides whether the annotation is
// believed, and the pods' informer may have delivered them before the classes.
func (c *cache) recheck() {
	c.mu.Lock()
	changed := false
	for _, h := range c.pods {
		if n := c.nodes[h.node]; !h.trusted && n != nil {
			c.charge(n, h, -1)
			c.charge(n, h, 1)
			changed = changed || h.trusted
		}
	}
	c.mu.Unlock()
	if changed {
		c.freed(activatedClass)
		c.changed()
	}
}

// reportLocked reports, once per annotation value, that h's annotation is not
// believed. It runs under c.mu: the report must not block.
func (c *cache) reportLocked(h *holding, why *inconsistency) {
	if h.reported == h.raw {
		return
	}
	h.reported = h.raw
	c.untrusted(h, why)
}

// hold records h, replacing what the same pod held before. A pod already
// reported deleted holds nothing.
func (c *cache) hold(h *holding) {
	c.mu.Lock()
	if _, gone := c.gone[h.uid]; gone {
		c.mu.Unlock()
		return
	}
	if old := c.pods[h.uid]; old != nil && old.node == h.node && old.raw == h.raw {
		// The informer confirming what Reserve assumed, or a status update of a
		// pod whose devices did not change.
		old.assumed = old.assumed && h.assumed
		c.mu.Unlock()
		return
	}
	freed := c.holdLocked(h)
	c.mu.Unlock()
	if freed {
		c.freed(activatedReleased)
	}
	c.changed()
}

// keep handles a bound pod whose devices the cache already trusts: the
// informer confirming what Reserve assumed, or the pod's annotation changed
// since. What the scheduler decided or believed stays the truth until the pod
// ends; a different annotation is only reported. It returns false when the
// pod holds nothing trusted on that node: then its annotation is read. raw
// is the pod's annotationState.
func (c *cache) keep(pod *corev1.Pod, raw string) bool {
	c.mu.Lock()
	h := c.pods[pod.UID]
	if h == nil || !h.trusted || h.node != pod.Spec.NodeName {
		c.mu.Unlock()
		return false
	}
	h.assumed = false
	if raw == h.raw || raw == h.reported {
		c.mu.Unlock()
		return true
	}
	h.reported = raw
	why := &inconsistency{reason: "changed", detail: "the annotation changed after the scheduler accepted it"}
	switch _, err := assignment.Decode(strings.TrimPrefix(raw, "=")); {
	case raw == absentAnnotation:
		why = &inconsistency{reason: "removed", detail: "the annotation was removed after the scheduler accepted it"}
	case err != nil:
		why = &inconsistency{reason: "garbled", detail: "the annotation no longer decodes (" + err.Error() + ")"}
	}
	c.untrusted(h, why)
	c.mu.Unlock()
	return true
}

func describeDevices(devices map[string][]string) string {
	var parts []string
	for _, class := range slices.Sorted(maps.Keys(devices)) {
		parts = append(parts, class+"="+strings.Join(devices[class], ","))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// holdLocked records h; it reports whether the pod held other devices before.
func (c *cache) holdLocked(h *holding) bool {
	freed := c.releaseLocked(h.uid)
	c.pods[h.uid] = h
	if c.byNode[h.node] == nil {
		c.byNode[h.node] = map[types.UID]*holding{}
	}
	c.byNode[h.node][h.uid] = h
	if n := c.nodes[h.node]; n != nil {
		c.charge(n, h, 1)
	}
	return freed
}

// releaseGone releases a pod the scheduler's own event handler reported
// deleted (or ended), ahead of this plugin's handler, which receives the same
// event independently and may deliver it later. The scheduler requeues pods
// waiting for devices on that event: retried against a cache that still counts
// the deleted pod's devices, a pod that had preempted it would find its node
// full again and preempt a second victim. It does not call freed: it runs in
// the scheduler's queueing hint, under the queue's lock, which Activate takes.
//
// Only a pod still held is remembered as gone: if this plugin's handler has
// delivered the deletion already, nothing of the pod arrives any more, and
// nothing would forget it. The hint runs once per waiting pod; after the
// first, the read lock answers.
func (c *cache) releaseGone(uid types.UID) {
	c.mu.RLock()
	_, held := c.pods[uid]
	c.mu.RUnlock()
	if !held {
		return
	}
	c.mu.Lock()
	released := c.releaseLocked(uid)
	if released {
		if c.gone == nil {
			c.gone = map[types.UID]struct{}{}
		}
		c.gone[uid] = struct{}{}
	}
	c.mu.Unlock()
	if released {
		c.changed()
	}
}

// releaseDeleted is release for this plugin's own report that pod uid was
// deleted or ended: the last event of the pod, after which nothing of it
// arrives, so it is no longer remembered as gone.
//
// Both happen under one lock: between them, the hint for the same deletion
// would find the pod still held and remember it as gone, for ever.
func (c *cache) releaseDeleted(uid types.UID) bool {
	return c.releaseAndForget(uid, true)
}

// release forgets what pod uid holds; it reports whether it held anything.
func (c *cache) release(uid types.UID) bool {
	return c.releaseAndForget(uid, false)
}

func (c *cache) releaseAndForget(uid types.UID, deleted bool) bool {
	c.mu.Lock()
	if deleted {
		delete(c.gone, uid)
	}
	freed := c.releaseLocked(uid)
	c.mu.Unlock()
	if freed {
		c.freed(activatedReleased)
		c.changed()
	}
	return freed
}

func (c *cache) releaseLocked(uid types.UID) bool {
	h := c.pods[uid]
	if h == nil {
		return false
	}
	delete(c.pods, uid)
	delete(c.byNode[h.node], uid)
	if len(c.byNode[h.node]) == 0 {
		delete(c.byNode, h.node)
	}
	if n := c.nodes[h.node]; n != nil {
		c.charge(n, h, -1)
	}
	return true
}

// holds reports whether uid already holds, bound, what the annotation raw says
// on node, or has had raw reported as not believed: then a pod update need not
// decode it again.
func (c *cache) holds(uid types.UID, node, raw string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	h := c.pods[uid]
	return h != nil && !h.assumed && h.node == node && (h.raw == raw || h.reported == raw)
}

// isAssumed reports whether uid holds devices through Reserve only.
func (c *cache) isAssumed(uid types.UID) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	h := c.pods[uid]
	return h != nil && h.assumed
}

// missingClass returns the first of classes that does not exist.
func (c *cache) missingClass(classes []string) (string, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, class := range classes {
		if c.classes[class] == nil {
			return class, true
		}
	}
	return "", false
}

// fits decides whether node name, as the pod's preemption view v changes it
// (nil: as it is), serves every class request of d with strategy s; when it
// does not, why says why. It runs for every pod on every node: on the common
// path (quick) it allocates nothing.
func (c *cache) fits(name string, v *nodeView, d *demand) (why unfit, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	// PreFilter leaves such nodes out only when that narrows the nodes a lot
	// (Plugin.PreFilter): no change of devices in use makes them fit.
	// A node without NodeDevices is another matter: its agent may not have
	// published yet (place says so).
	shared := c.nodes[name]
	// The common pod, one class, on a node as it is: one lookup of the
	// class's counts answers both questions below.
	if shared != nil && len(d.classes) == 1 && len(shared.blocked) == 0 && (v == nil || v.empty()) {
		class := d.classes[0]
		q := shared.countsOf(class)
		if q == nil {
			return unfit{unresolvable: true, reason: noDeviceOfClass(d.classes)}, false
		}
		if fits, handled := q.fits(d.draws[class]); handled {
			if !fits {
				return unfit{reason: "Insufficient free devices of class " + class}, false
			}
			if q.unserved {
				return unfit{unresolvable: true, reason: shared.notServing(class)}, false
			}
			return unfit{}, true
		}
	}
	// The common share pod: one share on a node as it is.
	if shared != nil && (v == nil || v.empty()) {
		if u, handled := shared.oneShare(d); handled {
			if u != nil {
				return *u, false
			}
			return shared.served(d)
		}
	}
	if shared != nil {
		if missing := shared.classesWithout(d.classes); len(missing) > 0 {
			return unfit{unresolvable: true, reason: noDeviceOfClass(missing)}, false
		}
	}
	n := c.viewLocked(name, shared, v)
	if fits, _, _, handled := n.quick(d); handled {
		if !fits {
			return unfit{reason: "Insufficient free devices of class " + d.classes[0]}, false
		}
		return n.served(d)
	}
	// Whether the pod fits is the matching's answer, the same in any order:
	// the plain order, whatever the strategy, so that no strategy's search
	// runs on every node in Filter.
	if _, u := n.place(d, FirstFit); u != nil {
		return *u, false
	}
	return n.served(d)
}

// served is fits' answer for a node where d's devices fit: whether the
// node's agent serves every class of d, as its kubelet reports. Asked only
// there, a refusal for devices being the more useful word. Unresolvable:
// preemption frees no endpoint, and a full node whose agent is gone is
// refused here when preemption tries it without its victims, so nothing is
// evicted for it.
func (n *nodeState) served(d *demand) (unfit, bool) {
	if n != nil {
		for _, class := range d.classes {
			if q := n.countsOf(class); q != nil && q.unserved {
				return unfit{unresolvable: true, reason: n.notServing(class)}, false
			}
		}
	}
	return unfit{}, true
}

// noDeviceOfClass is why a node where classes select no device does not fit.
func noDeviceOfClass(classes []string) string {
	return "no device of class " + strings.Join(classes, ", ") + " on the node"
}

// nodeNames are the nodes that publish devices, sorted.
func (c *cache) nodeNames() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return slices.Sorted(maps.Keys(c.nodes))
}

// classesWithout are those of classes that select no device on node name.
func (c *cache) classesWithout(name string, classes []string) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.classesWithoutLocked(name, classes)
}

func (c *cache) classesWithoutLocked(name string, classes []string) []string {
	if n := c.nodes[name]; n != nil {
		return n.classesWithout(classes)
	}
	return classes
}

// classesWithout are those of classes that select no device on n.
func (n *nodeState) classesWithout(classes []string) []string {
	var none []string
	for _, class := range classes {
		if len(n.matches[class]) == 0 {
			none = append(none, class)
		}
	}
	return none
}

// holdsOn reports whether the cache counts pod uid as holding devices on node.
func (c *cache) holdsOn(uid types.UID, node string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	h := c.pods[uid]
	return h != nil && h.node == node
}

// classStatus is every class's status (status.go), from one consistent view
// of the nodes and the pods' holdings.
func (c *cache) classStatus() map[string]v1alpha1.ResourceClassStatus {
	c.mu.RLock()
	defer c.mu.RUnlock()
	status, _ := c.classStatusLocked(false)
	return status
}

// classNodeStatus is every class's status per node (status.go).
func (c *cache) classNodeStatus() map[string][]NodeStatus {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, nodes := c.classStatusLocked(true)
	return nodes
}

// scores are the strategy's scores of d on each of names (strategyScore),
// under one read lock.
func (c *cache) scores(names []string, d *demand, s Strategy) []int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]int64, len(names))
	for i, name := range names {
		fits, util, numas, quality := c.scoreLocked(name, d, s)
		out[i] = strategyScore(s, fits, util, numas, quality)
	}
	return out
}

// scoreLocked reports whether d fits on node name with strategy s, how much
// of the devices its classes select there would be held (0..100), over how
// many NUMA nodes it would spread (0: unknown) and, for Topology, how well the
// set it would get is connected (0..100). The caller holds c.mu.
func (c *cache) scoreLocked(name string, d *demand, s Strategy) (fits bool, util int64, numas int, quality int64) {
	n := c.nodes[name]
	// Topology scores by the set's connectivity, which the quick path does
	// not know, except for one device: quality 100 on any node.
	if fits, util, numas, handled := n.quick(d); handled && (s != Topology || d.draws[d.classes[0]] == 1) {
		return fits, util, numas, 100
	}
	pl, u := n.place(d, s)
	if u != nil {
		return false, 0, 0, 0
	}
	return true, pl.util, pl.numas, pl.quality
}

// reservation is what Reserve decided for a pod.
type reservation struct {
	placement   *placement
	assignment  *assignment.Assignment
	annotations map[string]string // that carry the assignment to the node agent
}

// reserve chooses d's devices on node name with strategy s (and its shares
// with share strategy ss) and holds them for pod (assumed until the pod is
// seen bound), in one step under the write lock: nothing comes between the
// choice and the hold. u says why d does not fit; err that the assignment
// cannot be written.
func (c *cache) reserve(pod *corev1.Pod, name string, d *demand, s, ss Strategy) (r reservation, u *unfit, err error) {
	c.mu.Lock()
	pl, u := c.nodes[name].placeWith(d, s, ss)
	if u != nil {
		c.mu.Unlock()
		return r, u, nil
	}
	a := d.assignment(name, pl)
	anns, err := reservationAnnotations(a, pl)
	if err != nil {
		c.mu.Unlock()
		return r, nil, err
	}
	h := newHolding(pod.UID, a, d)
	h.assumed, h.raw = true, presentAnnotation(anns[assignment.AnnotationKey])
	h.ref = &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	c.holdLocked(h)
	c.mu.Unlock()
	c.changed()
	return reservation{placement: pl, assignment: a, annotations: anns}, nil, nil
}

// markPreempted records, once, that pod uid is being preempted: ok is false
// when it was already recorded or the pod holds no devices; else devices
// describes what it holds on node.
func (c *cache) markPreempted(uid types.UID) (devices, node string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.pods[uid]
	if h == nil || h.preemptionReported || len(h.devices) == 0 {
		return "", "", false
	}
	h.preemptionReported = true
	return describeDevices(h.devices), h.node, true
}

// holdingFromPod turns a bound pod's annotation into a holding learned from
// it, not trusted yet: charge checks it against the node's inventory and
// classes. Pods that hold nothing (finished, not bound, or neither requesting
// devices nor carrying an assignment) return nil. A pod that requests devices
// but whose annotation is missing, garbled or does not fit its requests holds
// its draws, blocked: it may run on devices it got before the annotation
// changed, and it never holds more than it requests.
func holdingFromPod(pod *corev1.Pod) *holding {
	if pod.Spec.NodeName == "" || podutil.IsPodTerminal(pod) {
		return nil
	}
	d, err := podDemand(pod)
	if err != nil {
		d = nil // a pod the scheduler would refuse; it can be bound by another
	}
	value, has := pod.Annotations[assignment.AnnotationKey]
	if d == nil && !has {
		return nil
	}
	h := &holding{uid: pod.UID, node: pod.Spec.NodeName, raw: annotationState(pod), reported: notReported, devices: map[string][]string{}, users: map[string][]*containerDemand{},
		ref: &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}}
	if d != nil {
		h.draws = d.draws
	}
	if !has {
		h.flaw = &inconsistency{reason: "missing", detail: "the pod requests devices but carries no assignment"}
		return h
	}
	a, err := assignment.Decode(value)
	if err != nil {
		h.flaw = &inconsistency{reason: "garbled", detail: err.Error()}
		return h
	}
	h.claims = claimsOf(a, d)
	if a.Node != pod.Spec.NodeName {
		h.flaw = &inconsistency{reason: "node", detail: "the assignment names node " + a.Node + " but the pod is bound to " + pod.Spec.NodeName}
		return h
	}
	if h.flaw = checkAgainstDemand(a, d); h.flaw != nil {
		return h
	}
	learned := newHolding(pod.UID, a, d)
	h.devices, h.users, h.shares, h.fresh = learned.devices, learned.users, learned.shares, freshDraws(a, d)
	return h
}

// claimsOf lists each container's devices of each class in a, with the
// share a gives it and what it requests of the class in d (nil: nothing).
func claimsOf(a *assignment.Assignment, d *demand) []shareClaim {
	var out []shareClaim
	for _, ac := range a.Containers {
		var requested map[string]int
		if d != nil {
			if i := slices.IndexFunc(d.containers, func(c containerDemand) bool { return c.name == ac.Name }); i >= 0 {
				requested = d.containers[i].classes
			}
		}
		for _, class := range slices.Sorted(maps.Keys(ac.Classes)) {
			share, claimed := ac.Shares[class]
			out = append(out, shareClaim{container: ac.Name, class: class, ids: ac.Classes[class],
				amount: shareOf(share), claimed: claimed, units: int64(requested[class])})
		}
	}
	return out
}

// shareOf is an assignment's share in numbers.
func shareOf(s assignment.Share) selector.Share {
	return selector.Share{Memory: s[v1alpha1.CapacityMemory], Compute: s[v1alpha1.CapacityCompute]}
}

// assignmentShare is s as an assignment writes it: the capacities it takes.
func assignmentShare(s selector.Share) assignment.Share {
	out := assignment.Share{}
	if s.Memory > 0 {
		out[v1alpha1.CapacityMemory] = s.Memory
	}
	if s.Compute > 0 {
		out[v1alpha1.CapacityCompute] = s.Compute
	}
	return out
}

// checkAgainstDemand: every container the assignment names requests devices of
// each class it names, and holds exactly as many as it requests, formed as the
// kubelet forms them (the devices earlier init containers leave for reuse
// first, demand.assign).
func checkAgainstDemand(a *assignment.Assignment, d *demand) *inconsistency {
	bad := func(format string, args ...any) *inconsistency {
		return &inconsistency{reason: "requests", detail: fmt.Sprintf(format, args...)}
	}
	if d == nil {
		return bad("the pod requests no devices the scheduler can assign")
	}
	for _, ac := range a.Containers {
		i := slices.IndexFunc(d.containers, func(c containerDemand) bool { return c.name == ac.Name })
		if i < 0 {
			return bad("container %q requests no devices", ac.Name)
		}
		for class := range ac.Classes {
			if d.containers[i].classes[class] == 0 {
				return bad("container %q does not request class %s", ac.Name, class)
			}
		}
		// A share is one container's, on one device, whatever its units
		// (whether the class takes shares is checked against the class, checkOn).
		for class := range ac.Shares {
			if c := d.containers[i]; c.init && !c.restartable {
				return bad("init container %q holds a share of class %s: a share is one container's, and the kubelet hands an init container's devices on", ac.Name, class)
			}
		}
	}
	for _, class := range d.classes {
		var reusable []string
		for _, c := range d.containers {
			n := c.classes[class]
			if n == 0 {
				continue
			}
			ids := a.Devices(c.name, class)
			if hasShare(a, c.name, class) {
				if len(reusable) > 0 {
					return bad("container %q holds a share of class %s, whose devices earlier init containers leave for reuse", c.name, class)
				}
				n = 1
			}
			if len(ids) != n {
				return bad("container %q holds %d devices of class %s but requests %d", c.name, len(ids), class, n)
			}
			if !slices.Equal(ids[:len(reusable)], reusable) {
				return bad("container %q does not begin with the devices of class %s its init containers leave for reuse", c.name, class)
			}
			if c.init && !c.restartable {
				reusable = ids
			} else {
				reusable = nil
			}
		}
	}
	return nil
}

// hasShare reports whether a gives container a share of class.
func hasShare(a *assignment.Assignment, container, class string) bool {
	for _, c := range a.Containers {
		if c.Name == container {
			_, ok := c.Shares[class]
			return ok
		}
	}
	return false
}

// freshDraws lists, per class, the devices of the pod's fresh draws in a (a
// consistent with d): each container's devices after those it reuses.
func freshDraws(a *assignment.Assignment, d *demand) map[string][]string {
	out := map[string][]string{}
	for _, class := range d.classes {
		reused := 0
		for _, c := range d.containers {
			n := c.classes[class]
			if n == 0 {
				continue
			}
			out[class] = append(out[class], a.Devices(c.name, class)[reused:]...)
			if c.init && !c.restartable {
				reused = n
			} else {
				reused = 0
			}
		}
	}
	return out
}

// checkOn checks a learned assignment against n and the classes: every
// device exists there and is selected by its class, no exclusive device
// serves two draws of the pod (the kubelet gives each draw its own), and
// each container's share of a share class is on one shared device and is
// what it requests of the class as the class is now (checkShares).
func (h *holding) checkOn(n *nodeState, classes map[string]*classState) *inconsistency {
	seen := map[string]string{}
	for _, class := range slices.Sorted(maps.Keys(h.fresh)) {
		for _, id := range h.fresh[class] {
			i, ok := n.index[id]
			if !ok {
				return &inconsistency{reason: "device", detail: fmt.Sprintf("device %s of class %s does not exist on node %s", id, class, h.node)}
			}
			if !slices.Contains(n.matches[class], i) {
				return &inconsistency{reason: "class", detail: fmt.Sprintf("class %s does not select device %s of node %s", class, id, h.node)}
			}
			if n.devices[i].pool != nil || n.devices[i].shared != nil {
				continue // a pool or a shared device serves many draws
			}
			if other, dup := seen[id]; dup {
				return &inconsistency{reason: "requests", detail: fmt.Sprintf("device %s serves two draws (classes %s and %s)", id, other, class)}
			}
			seen[id] = class
		}
	}
	if why := n.checkSlices(slices.Sorted(maps.Keys(seen))); why != nil {
		return why
	}
	return h.checkShares(n, classes)
}

// checkShares: a container's devices of a share class are one device that
// serves shares, with the share the container requests (its units times the
// class's unit, which fit the device); a class of whole devices has no share.
func (h *holding) checkShares(n *nodeState, classes map[string]*classState) *inconsistency {
	for _, cl := range h.claims {
		unit := classes[cl.class].shareUnit()
		if unit == nil {
			if cl.claimed {
				return &inconsistency{reason: "class", detail: fmt.Sprintf("container %q holds a share of class %s, which takes whole devices", cl.container, cl.class)}
			}
			continue
		}
		if !cl.claimed || len(cl.ids) != 1 {
			return &inconsistency{reason: "requests", detail: fmt.Sprintf("class %s takes shares, and container %q holds no share of one device of it", cl.class, cl.container)}
		}
		i, ok := n.index[cl.ids[0]]
		if !ok || n.devices[i].shared == nil {
			return &inconsistency{reason: "class", detail: fmt.Sprintf("device %s of class %s does not serve shares", cl.ids[0], cl.class)}
		}
		if fits, _ := unit.Fits(cl.units, n.devices[i].shared.capacity); !fits || cl.amount != unit.Times(cl.units) {
			return &inconsistency{reason: "requests", detail: fmt.Sprintf("container %q holds a share of class %s of %s, not the %d units it requests (%s)",
				cl.container, cl.class, describeShare(cl.amount), cl.units, describeUnits(*unit, cl.units))}
		}
	}
	return nil
}

// newHolding collects what a holds, trusted: what Reserve decided. Pools are
// told apart from devices when charged, by the node's inventory: here every id
// is listed under its class.
func newHolding(uid types.UID, a *assignment.Assignment, d *demand) *holding {
	h := &holding{uid: uid, node: a.Node, trusted: true, reported: notReported, devices: map[string][]string{}, users: map[string][]*containerDemand{}}
	for _, ac := range a.Containers {
		var cd *containerDemand
		if d != nil {
			if i := slices.IndexFunc(d.containers, func(c containerDemand) bool { return c.name == ac.Name }); i >= 0 {
				cd = &d.containers[i]
			}
		}
		for class, ids := range ac.Classes {
			for _, id := range ids {
				if !slices.Contains(h.devices[class], id) {
					h.devices[class] = append(h.devices[class], id)
				}
				if cd != nil && !slices.Contains(h.users[id], cd) {
					h.users[id] = append(h.users[id], cd)
				}
			}
		}
		// Validate made each share's class one device.
		for class, share := range ac.Shares {
			if h.shares == nil {
				h.shares = map[string]selector.Share{}
			}
			id := ac.Classes[class][0]
			h.shares[id] = addShare(h.shares[id], 1, shareOf(share))
		}
	}
	return h
}
