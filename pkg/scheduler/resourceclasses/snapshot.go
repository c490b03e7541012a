package resourceclasses

import (
	"errors"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/selector"
)

// Snapshot is the plugin's device cache built once from listed objects, so
// that a tool (kubectl resclass) answers with the scheduler's own decisions:
// which devices a class selects and why not, which are held, whether a pod's
// class requests fit a node (PreFilter and Filter), and class status. It is
// built as after a scheduler restart, from the pods' annotations alone; it
// runs no informer and writes nothing. It is not safe for concurrent use.
type Snapshot struct {
	c *cache
	// sharing is what each shared device publishes beyond what the cache
	// keeps (enforcement, message), by node and device id: the scheduler
	// never reads it, a tool shows it.
	sharing map[string]map[string]*v1alpha1.DeviceSharing
}

// NewSnapshot builds the cache from classes, every node's devices and the
// pods (the scheduler's own view: every pod of every namespace).
func NewSnapshot(classes []v1alpha1.ResourceClass, nodes []v1alpha1.NodeDevices, pods []corev1.Pod) *Snapshot {
	c := newCache()
	for i := range classes {
		c.setClass(&classes[i])
	}
	sharing := map[string]map[string]*v1alpha1.DeviceSharing{}
	for i := range nodes {
		c.setNodeDevices(&nodes[i])
		for j := range nodes[i].Status.Devices {
			if d := &nodes[i].Status.Devices[j]; d.Sharing != nil {
				if sharing[nodes[i].Name] == nil {
					sharing[nodes[i].Name] = map[string]*v1alpha1.DeviceSharing{}
				}
				sharing[nodes[i].Name][d.ID] = d.Sharing
			}
		}
	}
	for i := range pods {
		if h := holdingFromPod(&pods[i]); h != nil {
			c.hold(h)
		}
	}
	return &Snapshot{c: c, sharing: sharing}
}

// WithNodes lets Fit judge, as Filter does, whether each node's agent serves
// the pod's classes, from the Nodes' allocatable (liveness.go). Without it,
// Fit answers from the devices alone. It returns s.
func (s *Snapshot) WithNodes(nodes []corev1.Node) *Snapshot {
	for i := range nodes {
		s.c.setKubelet(&nodes[i])
	}
	return s
}

// SnapshotDevice is one published device as a class sees it.
type SnapshotDevice struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`
	// Selected: the class selects the device (the scheduler's matches).
	Selected bool `json:"selected"`
	// NotSelected says why not, per selector, in selector.Explain's words;
	// for a device whose attributes cannot be read, what is wrong with them.
	NotSelected []string `json:"notSelected,omitempty"`
	Healthy     bool     `json:"healthy"`
	// Unusable is why the scheduler gives the device to no pod, when it says
	// so: a GPU in MIG mode (its MIG devices are given instead).
	Unusable string `json:"unusable,omitempty"`
	// HeldBy are the pods (namespace/name) the scheduler counts as holding it.
	HeldBy []string `json:"heldBy,omitempty"`
	// Free: a new pod of the class could get it now (a hugepage pool: it has
	// free pages left; a shared device: one unit of the class fits what it
	// has free).
	Free bool `json:"free"`
	// Share is set for a device that serves shares (docs/sharing.md).
	Share *SnapshotShare `json:"share,omitempty"`
}

// SnapshotShare is what the shares of one shared device take.
type SnapshotShare struct {
	Mode v1alpha1.SharingMode `json:"mode"`
	// RequestedMode, Enforcement and Message are the device's, as its node
	// agent publishes them (v1alpha1.DeviceSharing).
	RequestedMode v1alpha1.SharingMode          `json:"requestedMode,omitempty"`
	Enforcement   []v1alpha1.SharingEnforcement `json:"enforcement,omitempty"`
	Message       string                        `json:"message,omitempty"`
	// Capacity is what all shares may take together; Used, what the shares
	// the scheduler counts take; Free, the rest.
	Capacity ShareAmounts `json:"capacity"`
	Used     ShareAmounts `json:"used"`
	Free     ShareAmounts `json:"free"`
	// Units and FreeUnits are the units of the class (a share class) that
	// fit Capacity and Free.
	Units     int64 `json:"units,omitempty"`
	FreeUnits int64 `json:"freeUnits,omitempty"`
}

// ShareAmounts are amounts of a shared device's capacities: memory in bytes,
// compute in percent; nil for a capacity the device does not publish.
type ShareAmounts struct {
	Memory  *int64 `json:"memory,omitempty"`
	Compute *int64 `json:"compute,omitempty"`
}

// amounts are memory and compute, of the capacities a device that
// publishes c has.
func amounts(c selector.Capacity, memory, compute int64) ShareAmounts {
	var out ShareAmounts
	if c.Memory >= 0 {
		out.Memory = &memory
	}
	if c.Compute >= 0 {
		out.Compute = &compute
	}
	return out
}

// SnapshotNode is one node's devices as a class sees them.
type SnapshotNode struct {
	Node    string           `json:"node"`
	Devices []SnapshotDevice `json:"devices"`
	// Blocked is how many devices of the class pods hold whose assignment the
	// scheduler does not believe, which ones unknown.
	Blocked int `json:"blocked,omitempty"`
}

// Devices lists every node's devices, by node name, with class's verdict on
// each. ok is false when the snapshot has no class of that name.
func (s *Snapshot) Devices(class string) (nodes []SnapshotNode, ok bool) {
	c := s.c
	c.mu.RLock()
	defer c.mu.RUnlock()
	cl := c.classes[class]
	if cl == nil {
		return nil, false
	}
	for _, name := range slices.Sorted(maps.Keys(c.nodes)) {
		n := c.nodes[name]
		heldBy := map[string][]string{}
		for _, h := range c.byNode[name] {
			if !h.trusted || h.ref == nil {
				continue
			}
			seen := map[string]bool{}
			for _, ids := range h.devices {
				for _, id := range ids {
					if !seen[id] {
						seen[id] = true
						heldBy[id] = append(heldBy[id], h.ref.Namespace+"/"+h.ref.Name)
					}
				}
			}
		}
		out := SnapshotNode{Node: name, Blocked: n.blocked[class]}
		invalid := map[string]string{}
		for _, d := range n.invalid {
			invalid[d.id] = d.reason
		}
		for i, d := range n.devices {
			v := SnapshotDevice{ID: d.id, Kind: d.sel.Kind, Selected: slices.Contains(n.matches[class], i), Healthy: d.healthy}
			switch {
			case d.invalid:
				v.NotSelected = []string{"its attributes cannot be read, so no class selects it: " + invalid[d.id]}
			case cl.compiled == nil:
				v.NotSelected = []string{"the class does not compile, so it selects no device"}
			case !v.Selected:
				_, v.NotSelected = cl.compiled.Explain(d.sel)
			}
			switch {
			case d.draining:
				v.Unusable = "its sharing mode is to change, which waits for the pods that hold it: it takes no new pod"
			case d.excluded && !d.invalid:
				v.Unusable = "a GPU in MIG mode is given out as its MIG devices"
			}
			v.HeldBy = heldBy[d.id]
			slices.Sort(v.HeldBy)
			switch {
			case d.shared != nil:
				sh := d.shared
				free := sh.free()
				v.Share = &SnapshotShare{Mode: sh.mode, Capacity: amounts(sh.capacity, sh.capacity.Memory, sh.capacity.Compute),
					Used: amounts(sh.capacity, sh.used.Memory, sh.used.Compute), Free: amounts(sh.capacity, free.Memory, free.Compute)}
				if cl.share {
					v.Share.Units, v.Share.FreeUnits = unitsIn(cl.unit, sh.capacity), unitsIn(cl.unit, free)
				}
				if p := s.sharing[name][d.id]; p != nil {
					v.Share.RequestedMode, v.Share.Enforcement, v.Share.Message = p.RequestedMode, p.Enforcement, p.Message
				}
				v.Free = v.Selected && d.healthy && !d.excluded && v.Share.FreeUnits > 0
			case d.pool != nil:
				v.Free = v.Selected && d.healthy && !d.excluded && d.pool.freeBytes() > 0
			default:
				v.Free = v.Selected && d.healthy && !d.excluded && d.holders == 0
			}
			out.Devices = append(out.Devices, v)
		}
		nodes = append(nodes, out)
	}
	return nodes, true
}

// ShareUnit says what one unit of class takes of a GPU, e.g. "10Gi memory,
// 12% compute", for a share class (docs/sharing.md); ok is false for a class
// of whole devices or none.
func (s *Snapshot) ShareUnit(class string) (unit string, ok bool) {
	s.c.mu.RLock()
	defer s.c.mu.RUnlock()
	u := s.c.classes[class].shareUnit()
	if u == nil {
		return "", false
	}
	return describeUnits(*u, 1), true
}

// Status is every class's status as the scheduler writes it (classStatus):
// allocatable, requested (what a new pod cannot get) and available, per node.
func (s *Snapshot) Status() map[string]v1alpha1.ResourceClassStatus {
	return s.c.classStatus()
}

// NodeStatus is what Status sums, per class and node (sorted by node name):
// the per-node breakdown the class status does not hold.
func (s *Snapshot) NodeStatus() map[string][]NodeStatus {
	return s.c.classNodeStatus()
}

// NodeFit is the plugin's answer for a pod on one node.
type NodeFit struct {
	Node string `json:"node"`
	Fits bool   `json:"fits"`
	// Reason is why not, in the words of the scheduler's FailedScheduling.
	Reason string `json:"reason,omitempty"`
	// Unresolvable: no change to the node's devices would help (the pod must
	// change); preemption does not try the node.
	Unresolvable bool `json:"unresolvable,omitempty"`
}

// Fit runs the plugin's PreFilter and Filter for pod against every node that
// publishes devices, sorted by name. Whether a node's agent serves the
// classes is judged only after WithNodes, for the nodes it had. draws are the
// devices per class the pod takes fresh (nil: the pod requests no class, and
// the plugin skips it). err
// is PreFilter's refusal of the pod itself, before any node: requests it
// cannot read or a class that does not exist. Devices kept for pods
// nominated by preemption are not counted: they live in the scheduler's
// queue, not in any object.
func (s *Snapshot) Fit(pod *corev1.Pod) (draws map[string]int, fits []NodeFit, err error) {
	d, err := podDemand(pod)
	if err != nil || d == nil {
		return nil, nil, err
	}
	c := s.c
	eligible, u := c.eligible(d)
	if u != nil && eligible == nil {
		return maps.Clone(d.draws), nil, errors.New(u.reason)
	}
	for _, name := range c.nodeNames() {
		f := NodeFit{Node: name}
		if !eligible.Has(name) {
			f.Unresolvable = true
			f.Reason = noDeviceOfClass(c.classesWithout(name, d.classes))
		} else if why, ok := c.fits(name, nil, d); !ok {
			f.Reason, f.Unresolvable = why.reason, why.unresolvable
		} else {
			f.Fits = true
		}
		fits = append(fits, f)
	}
	return maps.Clone(d.draws), fits, nil
}
