package resourceclasses

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// A node's devices are only as alive as its agent, and the kubelet already
// says whether the agent is there, at no write of ours (docs/scheduler.md,
// "Node agent liveness").
//
// The agent serves one device-plugin endpoint per class that selects a device
// of its node, resource class.resclass.io/<class>. When an endpoint goes away
// (the agent is killed, crashes, stops or drains it), the kubelet's device
// manager marks every device of the resource unhealthy at once, and its next
// node status sync (nodeStatusUpdateFrequency, 10 s by default) writes the
// resource's allocatable as 0. After 5 minutes it sets the capacity to 0 too
// and keeps the key, which says the resource is a device plugin's that
// registered before; a restarted kubelet also reports 0 until the plugins
// register again. The agent's NodeDevices, meanwhile, stays as it was last
// written. So a class resource at 0 in the node's allocatable, while
// NodeDevices says the pod fits, means no agent serves the class there, and a
// pod bound there would fail admission. So does a class resource absent
// while another class's is present: the agent has not registered that class
// (a class created while the agent is down, or a moment ago).
//
// A node whose kubelet reports no class resource at all has never had a
// resclass endpoint registered: a simulated node (kwok plays no device
// manager), or a real node before its agent's first registration. It is
// judged by its NodeDevices alone.

// kubeletClasses is what a Node's kubelet reports of the class resources in
// its allocatable, by class name: the cache keeps it per node (setKubelet)
// and folds it into the node's per-class counts (recount), so that Filter
// reads it from memory it reads anyway. Reading the Node's allocatable in
// Filter instead touched memory of its own on each of the hundreds of nodes
// a pod is filtered against: about 100 ns more a node in
// BenchmarkFilterPerNode (docs/scheduler.md, "Node agent liveness"). Never
// changed once made.
type kubeletClasses map[string]int64

// kubeletClassesOf reads node's allocatable class resources; nil when it
// reports none.
func kubeletClassesOf(node *corev1.Node) kubeletClasses {
	var out kubeletClasses
	for r, q := range node.Status.Allocatable {
		if class, ok := strings.CutPrefix(string(r), v1alpha1.ResourceNamePrefix); ok {
			if out == nil {
				out = kubeletClasses{}
			}
			out[class] = q.Value()
		}
	}
	return out
}

// unserves: the kubelet offers none of class, while it reports some class
// resource (so a resclass endpoint registered on the node once).
func (k kubeletClasses) unserves(class string) bool {
	if len(k) == 0 {
		return false
	}
	v, ok := k[class]
	return !ok || v <= 0
}

// notServing is Filter's reason for a node whose agent does not serve class.
// It names no node, so that FailedScheduling counts the nodes under one reason.
func (n *nodeState) notServing(class string) string {
	if n.stopping {
		return "node agent not serving class " + class + " (it is stopping)"
	}
	return "node agent not serving class " + class + " (the kubelet offers no " + v1alpha1.ResourceNamePrefix + class + ")"
}

// agentStopping: the node's agent said that it is stopping, and has not said
// since that it serves again (v1alpha1.ConditionAgentServing). Where the agent
// says nothing of it (an older agent, a simulated node), the kubelet's word
// decides alone. A stopping agent says it before its endpoints go, where the
// kubelet says it at its next node status sync, up to 10 s later: the pods
// bound to the node in between failed admission (TestSoakFleetFaults counts
// them). Only that one write, at the agent's stop, and the one that turns the
// condition back at its start: no write while it runs.
func agentStopping(nd *v1alpha1.NodeDevices) bool {
	c := meta.FindStatusCondition(nd.Status.Conditions, v1alpha1.ConditionAgentServing)
	return c != nil && c.Status == metav1.ConditionFalse
}

// agentBack queues a pod when a node's kubelet starts offering a class the
// pod requests that it did not offer before: the agent (re)registered that
// class's endpoint. Any other change of allocatable leaves the pod where it
// is: CPU, memory, other classes, and a class's count moving while it stays
// above 0 (a device's health, which the agent also publishes in NodeDevices:
// the plugin's handler activates waiting pods when the cache has it). So an
// agent coming back retries the pods of its classes, not every waiting pod.
func (p *Plugin) agentBack(_ klog.Logger, pod *corev1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	n, _ := newObj.(*corev1.Node)
	if n == nil {
		return fwk.QueueSkip, nil
	}
	old, _ := oldObj.(*corev1.Node)
	back := func(r corev1.ResourceName) bool {
		if !strings.HasPrefix(string(r), v1alpha1.ResourceNamePrefix) || !offers(n, r) {
			return false
		}
		return old == nil || !offers(old, r)
	}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			for _, rl := range []corev1.ResourceList{cs[i].Resources.Limits, cs[i].Resources.Requests} {
				for r := range rl {
					if back(r) {
						// The pod is retried as soon as this returns, maybe
						// before the plugin's own Node handler runs: the cache
						// takes the change first (as holderGone does).
						if p.shared != nil {
							p.cache.setKubelet(n)
						}
						return fwk.Queue, nil
					}
				}
			}
		}
	}
	return fwk.QueueSkip, nil
}

// offers: node's allocatable of r is above 0.
func offers(node *corev1.Node, r corev1.ResourceName) bool {
	q, ok := node.Status.Allocatable[r]
	return ok && q.Sign() > 0
}
