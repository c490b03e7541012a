package resourceclasses

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// demand is what a pod asks of resource classes, in the kubelet's terms.
//
// The kubelet's device manager allocates container by container, init containers
// first, and lets a container reuse the devices earlier (non-restartable) init
// containers had: it takes *all* reusable devices of the resource first and only
// then asks the device plugin for more. So per class a pod holds a number of
// "draws" (devices it takes fresh), and each container gets the reusable devices
// plus some of the draws. The scheduler chooses a device for every draw and
// writes each container's devices exactly as the kubelet will form them, so that
// Allocate can match them (docs/scheduler.md, "Init containers").
type demand struct {
	containers []containerDemand // in the kubelet's allocation order
	classes    []string          // the requested classes, sorted
	draws      map[string]int    // class -> devices taken fresh
}

type containerDemand struct {
	name        string
	init        bool
	restartable bool                          // a sidecar: keeps its devices
	classes     map[string]int                // class -> count
	hugepages   map[corev1.ResourceName]int64 // native hugepages-<size> -> bytes
}

// podDemand reads pod's class requests. A pod without any returns nil, nil.
func podDemand(pod *corev1.Pod) (*demand, error) {
	d := &demand{draws: map[string]int{}}
	add := func(c *corev1.Container, init bool) error {
		cd := containerDemand{name: c.Name, init: init,
			restartable: init && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways}
		for name, q := range requests(c) {
			switch {
			case strings.HasPrefix(string(name), v1alpha1.ResourceNamePrefix):
				class := strings.TrimPrefix(string(name), v1alpha1.ResourceNamePrefix)
				n, ok := q.AsInt64()
				if !ok || n < 0 || n > maxDevicesPerRequest {
					return fmt.Errorf("container %q: %s: %s is not a whole number of devices between 0 and %d", c.Name, name, q.String(), maxDevicesPerRequest)
				}
				if n == 0 {
					continue
				}
				if cd.classes == nil {
					cd.classes = map[string]int{}
				}
				cd.classes[class] = int(n)
			case strings.HasPrefix(string(name), corev1.ResourceHugePagesPrefix):
				if cd.hugepages == nil {
					cd.hugepages = map[corev1.ResourceName]int64{}
				}
				cd.hugepages[name] = q.Value()
			}
		}
		if len(cd.classes) > 0 {
			d.containers = append(d.containers, cd)
		}
		return nil
	}
	for i := range pod.Spec.InitContainers {
		if err := add(&pod.Spec.InitContainers[i], true); err != nil {
			return nil, err
		}
	}
	for i := range pod.Spec.Containers {
		if err := add(&pod.Spec.Containers[i], false); err != nil {
			return nil, err
		}
	}
	if len(d.containers) == 0 {
		return nil, nil
	}
	// Simulate the kubelet's reuse per class to count the fresh draws.
	reusable := map[string]int{}
	for _, c := range d.containers {
		for class, n := range c.classes {
			r := reusable[class]
			if n < r {
				// The kubelet would pick n of the r reusable devices at random,
				// without asking the device plugin: no assignment can say which.
				return nil, fmt.Errorf("container %q requests %d %s%s but earlier init containers leave %d of them for reuse: the kubelet would choose among those at random, so the devices cannot be assigned; request at least %d, or give the init containers no more than the next container",
					c.name, n, v1alpha1.ResourceNamePrefix, class, r, r)
			}
			d.draws[class] += n - r
			if c.init && !c.restartable {
				reusable[class] = n
			} else {
				reusable[class] = 0
			}
		}
		for class := range c.classes {
			if !slices.Contains(d.classes, class) {
				d.classes = append(d.classes, class)
			}
		}
	}
	slices.Sort(d.classes)
	return d, nil
}

// maxDevicesPerRequest bounds one container's request of one class: far above any
// node's device count, low enough that nothing downstream overflows.
const maxDevicesPerRequest = 1 << 16

// requests are a container's requests, falling back to limits as the apiserver
// defaults extended resources (and hugepages) when only limits are set.
func requests(c *corev1.Container) corev1.ResourceList {
	out := corev1.ResourceList{}
	for name, q := range c.Resources.Limits {
		out[name] = q
	}
	for name, q := range c.Resources.Requests {
		out[name] = q
	}
	return out
}

// assign forms each container's devices of class from the draws' devices, as the
// kubelet will: the reusable devices first, then the next fresh ones.
func (d *demand) assign(class string, drawn []string) map[string][]string {
	out := map[string][]string{}
	var reusable []string
	next := 0
	for _, c := range d.containers {
		n := c.classes[class]
		if n == 0 {
			continue
		}
		devs := slices.Clone(reusable)
		devs = append(devs, drawn[next:next+n-len(reusable)]...)
		next += n - len(reusable)
		out[c.name] = devs
		if c.init && !c.restartable {
			reusable = devs
		} else {
			reusable = nil
		}
	}
	return out
}

// pageBytes is how many bytes of hugepages of resource name the containers using
// a pool charge it, counted as the kubelet counts a pod's request (containers in
// the pod's order): each init container runs alone beside the sidecars started
// before it, then the app containers run beside all sidecars.
func pageBytes(containers []*containerDemand, name corev1.ResourceName) int64 {
	var initMax, sidecars, apps int64
	for _, c := range containers {
		v := c.hugepages[name]
		switch {
		case c.restartable:
			sidecars += v
		case c.init:
			initMax = max(initMax, sidecars+v)
		default:
			apps += v
		}
	}
	return max(initMax, sidecars+apps)
}

// inPodOrder lists the containers in a or b once each, in the pod's order, which
// pageBytes needs.
func (d *demand) inPodOrder(a, b []*containerDemand) []*containerDemand {
	var out []*containerDemand
	for i := range d.containers {
		if c := &d.containers[i]; slices.Contains(a, c) || slices.Contains(b, c) {
			out = append(out, c)
		}
	}
	return out
}
