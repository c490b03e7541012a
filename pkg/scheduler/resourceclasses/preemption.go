package resourceclasses

import (
	"context"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
)

// Preemption and nominated pods ask the plugin "what if": the scheduler's
// DefaultPreemption removes a node's lower-priority pods and adds some back
// (RemovePod, AddPod) to find the fewest victims, and every Filter counts the
// pods nominated to a node with at least the pod's priority (AddPod), so that
// a pod waiting for its victims to leave is not robbed by a lower one. These
// what-ifs live in the cycle state, one nodeView per node, and Filter answers
// from the node's devices as the view changes them; the shared cache is never
// touched.

// nodeView is one node's what-if for one scheduling cycle.
type nodeView struct {
	// removed are pods the cache holds on the node that count as gone.
	removed map[types.UID]bool
	// added are pods not bound to the node (nominated to it) whose demand
	// counts as held there.
	added []addedPod
}

type addedPod struct {
	uid    types.UID
	demand *demand
}

func (v *nodeView) clone() *nodeView {
	return &nodeView{removed: maps.Clone(v.removed), added: slices.Clone(v.added)}
}

func (v *nodeView) empty() bool { return len(v.removed) == 0 && len(v.added) == 0 }

// view returns the cycle's what-if of node, created on first use.
func (s *state) view(node string) *nodeView {
	if s.views == nil {
		s.views = map[string]*nodeView{}
	}
	v := s.views[node]
	if v == nil {
		v = &nodeView{removed: map[types.UID]bool{}}
		s.views[node] = v
	}
	return v
}

// AddPod counts pod as placed on nodeInfo's node in this cycle: a victim added
// back, or a nominated pod whose devices are not chosen yet (its demand
// counts as held, which devices unknown).
func (p *Plugin) AddPod(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, podInfoToAdd fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	s, ok := getState(cs)
	if !ok {
		return nil
	}
	pod, node := podInfoToAdd.GetPod(), nodeInfo.Node().Name
	v := s.view(node)
	if v.removed[pod.UID] {
		delete(v.removed, pod.UID)
		return nil
	}
	if p.cache.holdsOn(pod.UID, node) || slices.ContainsFunc(v.added, func(a addedPod) bool { return a.uid == pod.UID }) {
		return nil // already counted
	}
	d, err := podDemand(pod)
	if err != nil || d == nil {
		return nil // holds no devices of any class
	}
	v.added = append(v.added, addedPod{uid: pod.UID, demand: d})
	return nil
}

// RemovePod counts pod as gone from nodeInfo's node in this cycle.
func (p *Plugin) RemovePod(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, podInfoToRemove fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	s, ok := getState(cs)
	if !ok {
		return nil
	}
	pod, node := podInfoToRemove.GetPod(), nodeInfo.Node().Name
	v := s.view(node)
	if i := slices.IndexFunc(v.added, func(a addedPod) bool { return a.uid == pod.UID }); i >= 0 {
		v.added = slices.Delete(v.added, i, i+1)
		return nil
	}
	if p.cache.holdsOn(pod.UID, node) {
		v.removed[pod.UID] = true
	}
	return nil
}

// viewLocked returns node n as v changes it: a copy sharing every device that
// v leaves as it is. It reads the pods' holdings: the cache calls it under its
// lock (cache.fits).
func (c *cache) viewLocked(name string, n *nodeState, v *nodeView) *nodeState {
	if n == nil || v == nil || v.empty() {
		return n
	}
	out := *n
	out.devices = slices.Clone(n.devices)
	out.blocked = maps.Clone(n.blocked)
	own := func(i int) *deviceState {
		if out.devices[i] == n.devices[i] {
			d := *n.devices[i]
			if d.pool != nil {
				pool := *d.pool
				d.pool = &pool
			}
			if d.shared != nil {
				shared := *d.shared
				d.shared = &shared
			}
			out.devices[i] = &d
		}
		return out.devices[i]
	}
	for uid := range v.removed {
		if h := c.pods[uid]; h != nil && h.node == name {
			if h.chargedOn != nil {
				out.removeBlocked(h.blocked)
				out.chargeShares(h.blockedShares, -1, own)
				continue
			}
			chargeDevices(&out, h, -1, own)
		}
	}
	// Nominated pods hold what they ask, which devices unknown, as pods whose
	// assignment is not believed do (blockedRows): whatever the pod being
	// placed takes must leave room for them. Their victims may still be
	// leaving, one by one; until then the rows ask only for the free devices,
	// so a lower pod gets none of those either. Hugepage pools and shared
	// devices are shared and not reserved (pages and shares are charged
	// once the pod is bound): which device a share would take is unknown.
	for _, a := range v.added {
		out.addBlocked(a.demand.draws)
	}
	return &out
}

// chargeDevices adds (sign 1) or removes (sign -1) a trusted holding's devices,
// pool pages and shares on n, through own, which returns the device to change:
// what cache.charge does to the shared state, for a view.
func chargeDevices(n *nodeState, h *holding, sign int, own func(i int) *deviceState) {
	held := false
	for _, ids := range h.devices {
		for _, id := range ids {
			if i, ok := n.index[id]; ok && n.devices[i].pool == nil && n.devices[i].shared == nil {
				own(i).holders += sign
				held = true
			}
		}
	}
	if held {
		n.recount()
	}
	for id, users := range h.users {
		if i, ok := n.index[id]; ok && n.devices[i].pool != nil {
			d := own(i)
			d.pool.charged += int64(sign) * pageBytes(users, d.pool.resourceName)
		}
	}
	n.chargeShares(h.shares, sign, own)
}

// preemptedByScheduler: the scheduler's preemption marks a victim with the
// DisruptionTarget condition before deleting it.
func preemptedByScheduler(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && c.Reason == corev1.PodReasonPreemptionByScheduler {
			return true
		}
	}
	return false
}

// reportPreempted says, once, in the victim's terms what its preemption
// frees: upstream's Event names the preemptor, this one the devices and
// classes (kubectl describe pod shows both).
func (p *Plugin) reportPreempted(pod *corev1.Pod) {
	devices, node, ok := p.cache.markPreempted(pod.UID)
	if !ok {
		return
	}
	preemptedPods.Inc()
	if r := p.handle.EventRecorder(); r != nil {
		r.Eventf(pod, nil, corev1.EventTypeNormal, "DevicesPreempted", "Scheduling",
			"preempted for a higher-priority pod: the devices %s on node %s are freed for it once this pod is gone", devices, node)
	}
}
