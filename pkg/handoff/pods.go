package handoff

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
)

// podInfo is what the allocator keeps of a pod on its node: the informer's
// transform replaces each Pod by one, so the cache holds a few hundred bytes
// per pod, with the assignment decoded once per pod update rather than once per
// kubelet call.
type podInfo struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	phase         corev1.PodPhase
	schedulerName string
	// assignment is the pod's decoded resclass.io/assignment; nil when it has
	// none, or a malformed one (assignmentErr).
	assignment    *assignment.Assignment
	assignmentErr error
	// requested: the classes the pod's containers request, so a pod that
	// requests a class but has no assignment can be told why it gets nothing.
	requested []string
	// counts: how many of each class each container requests; a share
	// class's count is the slots the kubelet passes for it, which tells two
	// containers with shares of one device apart.
	counts []classCount
}

type classCount struct {
	container, class string
	n                int64
}

// count is how many of class container requests, 0 when it requests none.
func (p *podInfo) count(container, class string) int64 {
	for _, c := range p.counts {
		if c.container == container && c.class == class {
			return c.n
		}
	}
	return 0
}

// DeepCopyObject returns a shallow copy: a podInfo is never modified once made.
func (p *podInfo) DeepCopyObject() runtime.Object {
	c := *p
	return &c
}

func (p *podInfo) terminal() bool {
	return p.phase == corev1.PodSucceeded || p.phase == corev1.PodFailed
}

func (p *podInfo) ref() *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: p.UID}
}

// toPodInfo is the informer's transform.
func toPodInfo(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	p := &podInfo{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID,
			ResourceVersion: pod.ResourceVersion, CreationTimestamp: pod.CreationTimestamp,
		},
		phase:         pod.Status.Phase,
		schedulerName: pod.Spec.SchedulerName,
	}
	if s, ok := pod.Annotations[assignment.AnnotationKey]; ok {
		p.assignment, p.assignmentErr = assignment.Decode(s)
	}
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		for name, q := range c.Resources.Limits {
			class, ok := strings.CutPrefix(string(name), v1alpha1.ResourceNamePrefix)
			if !ok {
				continue
			}
			if !slices.Contains(p.requested, class) {
				p.requested = append(p.requested, class)
			}
			p.counts = append(p.counts, classCount{container: c.Name, class: class, n: q.Value()})
		}
	}
	return p, nil
}

// Index names.
const (
	// byDevice: "<class>\x00<device id>" for every device a live pod is assigned.
	byDevice = "device"
	// byClass: the classes a live pod is assigned devices of.
	byClass = "class"
	// byUnassigned: the classes a live pod requests without having an assignment.
	byUnassigned = "unassigned"
	// byUID: the pod's UID (the kubelet's checkpoint names pods by UID).
	byUID = "uid"
	// byHeld: every device a live pod is assigned, whole or in shares (the
	// node agent waits for them before changing a device's sharing mode).
	byHeld = "held"
)

func deviceKey(class, id string) string { return class + "\x00" + id }

var indexers = cache.Indexers{
	byDevice: func(obj any) ([]string, error) {
		p := obj.(*podInfo)
		if p.terminal() || p.assignment == nil {
			return nil, nil
		}
		var keys []string
		for _, c := range p.assignment.Containers {
			for class, ids := range c.Classes {
				for _, id := range ids {
					keys = append(keys, deviceKey(class, id))
				}
			}
		}
		return keys, nil
	},
	byClass: func(obj any) ([]string, error) {
		p := obj.(*podInfo)
		if p.terminal() || p.assignment == nil {
			return nil, nil
		}
		var keys []string
		for _, c := range p.assignment.Containers {
			for class := range c.Classes {
				if !slices.Contains(keys, class) {
					keys = append(keys, class)
				}
			}
		}
		return keys, nil
	},
	byUnassigned: func(obj any) ([]string, error) {
		p := obj.(*podInfo)
		if p.terminal() || p.assignment != nil {
			return nil, nil
		}
		return p.requested, nil
	},
	byHeld: func(obj any) ([]string, error) {
		p := obj.(*podInfo)
		if p.terminal() || p.assignment == nil {
			return nil, nil
		}
		var keys []string
		for _, c := range p.assignment.Containers {
			for _, ids := range c.Classes {
				for _, id := range ids {
					if !slices.Contains(keys, id) {
						keys = append(keys, id)
					}
				}
			}
		}
		return keys, nil
	},
	byUID: func(obj any) ([]string, error) {
		return []string{string(obj.(*podInfo).UID)}, nil
	},
}

// compare orders pods as the kubelet admits them: oldest first, then by
// namespace and name, so every choice among several pods is deterministic.
func compare(a, b *podInfo) int {
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c
	}
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

func before(a, b *podInfo) bool { return compare(a, b) < 0 }

// earliest returns the first of pods by compare, nil if there are none.
func earliest(pods []any) *podInfo {
	var first *podInfo
	for _, o := range pods {
		if p := o.(*podInfo); first == nil || before(p, first) {
			first = p
		}
	}
	return first
}
