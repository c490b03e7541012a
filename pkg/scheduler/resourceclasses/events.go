package resourceclasses

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"

	"github.com/resclass/resclass/pkg/assignment"
)

// EventsToRegister: a pod this plugin turned away can fit after a pod holding
// devices ends or is deleted, or when a node's kubelet offers a class it
// requests again (its agent is back, agentBack). The Node events are those
// of kube-scheduler's own Node informer: registering them costs no watch.
//
// New or healed devices (NodeDevices) and new or changed classes are not
// registered: the plugin's own informers learn of them and activate the pods it
// turned away once the cache has them (Plugin.activateGrown: the pods of a
// class the node gave more room that fit it now; Plugin.activateWaiting for a
// class change: every pod). Registering
// them would make kube-scheduler watch both resources a second time, through
// dynamic informers that keep every object decoded into maps: at 1000 nodes
// that copy of the NodeDevices was 163 MB of the scheduler's 538 MB live heap,
// which every garbage collection marks (docs/scheduler.md, "5000 nodes and the scheduler's heap"). Its
// events could also reach the queue before the cache had the change, so the
// pod retried against the old devices would wait again.
func (p *Plugin) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: fwk.Pod, ActionType: fwk.Delete}, QueueingHintFn: p.holderGone},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeAllocatable}, QueueingHintFn: p.agentBack},
	}, nil
}

// holderGone queues when a pod that held devices is deleted. A pod that finishes
// is a deletion too: the scheduler's pod informer leaves out terminal pods.
//
// Before it answers, the cache lets go of the pod's devices (releaseGone): the
// scheduler retries the waiting pod as soon as this hint returns, and this
// plugin's own informer handler, which also releases them, may not have run
// yet. A preemptor retried then would find the node still full and preempt a
// second victim. The scheduler sends this event for a pod whose binding failed
// too; that pod is not gone (the informer's store still has it running), and
// Unreserve has released what it held.
func (p *Plugin) holderGone(_ klog.Logger, _ *corev1.Pod, oldObj, _ any) (fwk.QueueingHint, error) {
	old, _ := oldObj.(*corev1.Pod)
	if old == nil {
		return fwk.QueueSkip, nil
	}
	if _, held := old.Annotations[assignment.AnnotationKey]; !held || old.Spec.NodeName == "" {
		return fwk.QueueSkip, nil
	}
	if p.gone(old) {
		p.cache.releaseGone(old.UID)
	}
	return fwk.Queue, nil
}

// gone reports whether the scheduler's informer no longer has pod, or has it
// ended.
func (p *Plugin) gone(pod *corev1.Pod) bool {
	if p.pods == nil {
		return false
	}
	now, err := p.pods.Pods(pod.Namespace).Get(pod.Name)
	if err != nil || now.UID != pod.UID {
		return true
	}
	return podutil.IsPodTerminal(now)
}
