package resourceclasses

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
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

// classResources are the kubelet's resource names of classes, in order.
func classResources(classes []string) []corev1.ResourceName {
	out := make([]corev1.ResourceName, len(classes))
	for i, class := range classes {
		out[i] = corev1.ResourceName(v1alpha1.ResourceNamePrefix + class)
	}
	return out
}

// unserved returns the index of the first of resources that the node's
// kubelet, by its allocatable (the scheduler's NodeInfo form: extended
// resources as integers), has no agent serving. One lookup per resource on a
// node whose kubelet reports them; the scan of the node's resources is paid
// only where none of them is reported.
func unserved(allocatable map[corev1.ResourceName]int64, resources []corev1.ResourceName) (int, bool) {
	missing, reported := -1, false
	for i, r := range resources {
		v, ok := allocatable[r]
		switch {
		case !ok:
			if missing < 0 {
				missing = i
			}
		case v <= 0:
			return i, true
		default:
			reported = true
		}
	}
	if missing < 0 {
		return 0, false
	}
	if !reported {
		reported = reportsClasses(allocatable)
	}
	return missing, reported
}

// reportsClasses: the kubelet reports some class resource, so a resclass
// endpoint registered on the node once.
func reportsClasses(allocatable map[corev1.ResourceName]int64) bool {
	for r := range allocatable {
		if strings.HasPrefix(string(r), v1alpha1.ResourceNamePrefix) {
			return true
		}
	}
	return false
}

// notServing is Filter's reason for a node whose agent does not serve class.
// It names no node, so that FailedScheduling counts the nodes under one reason.
func notServing(class string) string {
	return "node agent not serving class " + class + " (the kubelet offers no " + v1alpha1.ResourceNamePrefix + class + ")"
}

// scalarAllocatable is a Node's allocatable class resources in the form the
// scheduler's NodeInfo keeps them, for the tools that read Nodes (Snapshot).
func scalarAllocatable(node *corev1.Node) map[corev1.ResourceName]int64 {
	out := map[corev1.ResourceName]int64{}
	for r, q := range node.Status.Allocatable {
		if strings.HasPrefix(string(r), v1alpha1.ResourceNamePrefix) {
			out[r] = q.Value()
		}
	}
	return out
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
