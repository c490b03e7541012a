package resourceclasses

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
)

// The custom resources as the scheduler names them for dynamic informers:
// <plural>.<version>.<group>.
const (
	nodeDevicesResource   fwk.EventResource = "nodedevices.v1alpha1.resclass.io"
	resourceClassResource fwk.EventResource = "resourceclasses.v1alpha1.resclass.io"
)

// EventsToRegister: a pod this plugin turned away can fit after devices appear or
// heal (NodeDevices), a class it requests appears or changes, or a pod holding
// devices ends or is deleted.
func (p *Plugin) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: nodeDevicesResource, ActionType: fwk.Add | fwk.Update}, QueueingHintFn: devicesChanged},
		{Event: fwk.ClusterEvent{Resource: resourceClassResource, ActionType: fwk.Add | fwk.Update}, QueueingHintFn: classRequested},
		{Event: fwk.ClusterEvent{Resource: fwk.Pod, ActionType: fwk.Delete}, QueueingHintFn: p.holderGone},
	}, nil
}

// devicesChanged queues on a new NodeDevices and on a change of its devices (not
// of its conditions or summary alone).
func devicesChanged(_ klog.Logger, _ *corev1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	oldU, _ := oldObj.(*unstructured.Unstructured)
	newU, _ := newObj.(*unstructured.Unstructured)
	if oldU == nil || newU == nil {
		return fwk.Queue, nil
	}
	oldDevices, _, _ := unstructured.NestedFieldNoCopy(oldU.Object, "status", "devices")
	newDevices, _, _ := unstructured.NestedFieldNoCopy(newU.Object, "status", "devices")
	if equality.Semantic.DeepEqual(oldDevices, newDevices) {
		return fwk.QueueSkip, nil
	}
	return fwk.Queue, nil
}

// classRequested queues a pod when a class it requests appears or changes.
func classRequested(_ klog.Logger, pod *corev1.Pod, _, newObj any) (fwk.QueueingHint, error) {
	u, ok := newObj.(*unstructured.Unstructured)
	if !ok {
		return fwk.Queue, nil
	}
	name := corev1.ResourceName(v1alpha1.ResourceNamePrefix + u.GetName())
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if _, ok := cs[i].Resources.Limits[name]; ok {
				return fwk.Queue, nil
			}
			if _, ok := cs[i].Resources.Requests[name]; ok {
				return fwk.Queue, nil
			}
		}
	}
	return fwk.QueueSkip, nil
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
