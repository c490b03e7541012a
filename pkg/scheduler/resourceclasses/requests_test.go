package resourceclasses

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/utils/ptr"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// fuzzContainers is how many containers a fuzzed pod has: enough for an init
// container, a sidecar and two app containers in any order and mix.
const fuzzContainers = 4

// fuzzPod builds a pod from fuzzed quantities. layout picks, per container i:
// bits 4i..4i+1 its kind (app, init, sidecar, init), bits 4i+2..4i+3 which of the
// classes a and b it asks q[i] of (a, b, both, neither), bit 16+i whether the
// request is a limit (defaulting the request) or a request, bit 20+i whether it
// also asks (i+1)Gi of hugepages-1Gi. Init containers come before app containers
// in the pod, as the kubelet runs them, and keep their relative order.
func fuzzPod(q [fuzzContainers]resource.Quantity, layout uint32) *corev1.Pod {
	p := &corev1.Pod{}
	p.Name, p.Namespace = "fuzz", "default"
	for i := range fuzzContainers {
		kind := (layout >> (4 * i)) & 3
		which := (layout >> (4*i + 2)) & 3
		asLimit := layout>>(16+i)&1 == 1
		pages := layout>>(20+i)&1 == 1
		c := corev1.Container{Name: fmt.Sprintf("c%d", i)}
		list := corev1.ResourceList{}
		if which == 0 || which == 2 {
			list[cls("a")] = q[i]
		}
		if which == 1 || which == 2 {
			list[cls("b")] = q[i]
		}
		if pages {
			list["hugepages-1Gi"] = *resource.NewQuantity(int64(i+1)<<30, resource.BinarySI)
		}
		if asLimit {
			c.Resources.Limits = list
		} else {
			c.Resources.Requests = list
		}
		switch kind {
		case 0:
			p.Spec.Containers = append(p.Spec.Containers, c)
		case 2:
			c.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
			fallthrough
		default:
			p.Spec.InitContainers = append(p.Spec.InitContainers, c)
		}
	}
	return p
}

// kubeletAllocation models the kubelet's device manager for one class, as an
// independent reference for podDemand and assign: containers in order, init
// containers first; each takes every device its earlier non-restartable init
// containers left for reuse, then fresh ones; a non-restartable init container
// adds its devices to the reusable set, any other container removes its own.
// It returns each container's devices (fresh ones named by draw index), the
// number of fresh draws, and whether some container would ask fewer devices
// than are reusable, which the kubelet resolves without the scheduler.
func kubeletAllocation(p *corev1.Pod, class string) (got map[string]sets.Set[string], draws int, ambiguous bool) {
	got = map[string]sets.Set[string]{}
	reuse := sets.New[string]()
	visit := func(c *corev1.Container, init bool) {
		q, ok := requests(c)[cls(class)]
		if !ok {
			return
		}
		n64, _ := q.AsInt64()
		n := int(n64)
		if n == 0 {
			return
		}
		if n < reuse.Len() {
			ambiguous = true
			return
		}
		devs := reuse.Clone()
		for devs.Len() < n {
			devs.Insert(fmt.Sprint(draws))
			draws++
		}
		got[c.Name] = devs
		if init && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
			reuse = reuse.Union(devs)
		} else {
			reuse = reuse.Difference(devs)
		}
	}
	for i := range p.Spec.InitContainers {
		visit(&p.Spec.InitContainers[i], true)
	}
	for i := range p.Spec.Containers {
		visit(&p.Spec.Containers[i], false)
	}
	return got, draws, ambiguous
}

func validCount(q resource.Quantity) bool {
	n, ok := q.AsInt64()
	return ok && n >= 0 && n <= maxDevicesPerRequest
}

// FuzzPodDemand: podDemand never panics, refuses exactly the pods with a count
// that is not a whole number of devices or an ambiguous reuse, and otherwise
// draws what the kubelet will draw; assign then gives every container exactly its
// devices (no device twice within it, every draw used), and the pages charged to
// a pool its containers share are the pod's request as Kubernetes computes it.
func FuzzPodDemand(f *testing.F) {
	f.Add("1", "2", "1", "0", uint32(0x0000_0001))   // init 1 then app 2
	f.Add("2", "1", "0", "0", uint32(0x0000_0001))   // init 2 then app 1: ambiguous
	f.Add("1", "1", "1", "1", uint32(0x00f0_0102))   // sidecar, apps, all with pages
	f.Add("1", "1", "1", "1", uint32(0x00f0_0012))   // sidecar, init, apps
	f.Add("500m", "1", "1", "1", uint32(0))          // not whole
	f.Add("-1", "1", "1", "1", uint32(0))            // negative
	f.Add("1Ki", "2", "3", "4", uint32(0x000f_aaaa)) // both classes, limits only
	f.Add("65537", "0", "0", "0", uint32(0))         // above the bound
	f.Add("3", "3", "2", "4", uint32(0x0050_5959))
	f.Fuzz(func(t *testing.T, s0, s1, s2, s3 string, layout uint32) {
		watchdog.Run(t, func() {
			var q [fuzzContainers]resource.Quantity
			for i, s := range []string{s0, s1, s2, s3} {
				var err error
				if q[i], err = resource.ParseQuantity(s); err != nil {
					return // not a quantity: the apiserver refuses the pod
				}
			}
			pod := fuzzPod(q, layout)
			d, err := podDemand(pod)

			wantErr := false
			for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
				for i := range cs {
					for name, v := range requests(&cs[i]) {
						if strings.HasPrefix(string(name), "class.") && !validCount(v) {
							wantErr = true
						}
					}
				}
			}
			ref := map[string]map[string]sets.Set[string]{}
			refDraws := map[string]int{}
			if !wantErr {
				for _, class := range []string{"a", "b"} {
					got, draws, ambiguous := kubeletAllocation(pod, class)
					wantErr = wantErr || ambiguous
					ref[class], refDraws[class] = got, draws
				}
			}
			if wantErr != (err != nil) {
				t.Fatalf("podDemand(%v): err %v, want an error: %v", pod.Spec, err, wantErr)
			}
			if err != nil {
				return
			}
			if (d == nil) != (refDraws["a"] == 0 && refDraws["b"] == 0) {
				t.Fatalf("demand %+v for reference draws %v", d, refDraws)
			}
			if d == nil {
				return
			}

			for _, class := range []string{"a", "b"} {
				draws := d.draws[class]
				if draws < 0 || draws != refDraws[class] {
					t.Fatalf("class %s: %d draws, the kubelet draws %d", class, draws, refDraws[class])
				}
				if (draws > 0) != slices.Contains(d.classes, class) {
					t.Fatalf("class %s: %d draws, classes %v", class, draws, d.classes)
				}
				if draws == 0 {
					continue
				}
				drawn := make([]string, draws)
				for i := range drawn {
					drawn[i] = fmt.Sprint(i)
				}
				out := d.assign(class, drawn)
				used := sets.New[string]()
				for _, c := range d.containers {
					ids := out[c.name]
					if len(ids) != c.classes[class] {
						t.Fatalf("class %s: container %s got %d devices, asked %d", class, c.name, len(ids), c.classes[class])
					}
					set := sets.New(ids...)
					if set.Len() != len(ids) {
						t.Fatalf("class %s: container %s got a device twice: %v", class, c.name, ids)
					}
					if want := ref[class][c.name]; !set.Equal(want) && (set.Len() > 0 || want != nil) {
						t.Fatalf("class %s: container %s got %v, the kubelet gives it %v", class, c.name, sets.List(set), sets.List(want))
					}
					used = used.Union(set)
				}
				if used.Len() != draws {
					t.Fatalf("class %s: %d of %d draws used", class, used.Len(), draws)
				}
				if extra := sets.KeySet(out).Difference(sets.New(containerNames(d)...)); extra.Len() > 0 {
					t.Fatalf("class %s: devices for unknown containers %v", class, sets.List(extra))
				}
			}

			// All of the demand's containers drawing from one pool: the pool is
			// charged the pod's request, counted over those containers.
			all := make([]*containerDemand, len(d.containers))
			for i := range d.containers {
				all[i] = &d.containers[i]
			}
			only := sets.New(containerNames(d)...)
			sub := pod.DeepCopy()
			keep := func(cs []corev1.Container) []corev1.Container {
				var out []corev1.Container
				for _, c := range cs {
					if only.Has(c.Name) {
						c.Resources.Requests = requests(&c)
						out = append(out, c)
					}
				}
				return out
			}
			sub.Spec.InitContainers, sub.Spec.Containers = keep(sub.Spec.InitContainers), keep(sub.Spec.Containers)
			want := resourcehelper.PodRequests(sub, resourcehelper.PodResourcesOptions{})["hugepages-1Gi"]
			if got := pageBytes(all, "hugepages-1Gi"); got != want.Value() {
				t.Fatalf("pages charged %d, the pod requests %s (containers %v)", got, want.String(), slices.Collect(maps.Keys(only)))
			}
		})
	})
}

func containerNames(d *demand) []string {
	var out []string
	for _, c := range d.containers {
		out = append(out, c.name)
	}
	return out
}

func TestPageBytes(t *testing.T) {
	const gi = 1 << 30
	c := func(init, restartable bool, pages int64) *containerDemand {
		return &containerDemand{init: init, restartable: restartable, hugepages: map[corev1.ResourceName]int64{"hugepages-1Gi": pages * gi}}
	}
	for _, tc := range []struct {
		name       string
		containers []*containerDemand
		want       int64
	}{
		{"apps add up", []*containerDemand{c(false, false, 1), c(false, false, 2)}, 3},
		{"an init container runs alone", []*containerDemand{c(true, false, 4), c(false, false, 1), c(false, false, 1)}, 4},
		{"the apps outgrow the init container", []*containerDemand{c(true, false, 1), c(false, false, 1), c(false, false, 1)}, 2},
		{"a sidecar runs beside later init containers", []*containerDemand{c(true, true, 1), c(true, false, 2), c(false, false, 1)}, 3},
		{"a sidecar after an init container does not", []*containerDemand{c(true, false, 2), c(true, true, 1), c(false, false, 0)}, 2},
		{"sidecars run beside the apps", []*containerDemand{c(true, true, 1), c(true, true, 1), c(false, false, 1)}, 3},
		{"other sizes do not count", []*containerDemand{{hugepages: map[corev1.ResourceName]int64{"hugepages-2Mi": 8 << 20}}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pageBytes(tc.containers, "hugepages-1Gi"); got != tc.want*gi {
				t.Errorf("pageBytes %d, want %dGi", got, tc.want)
			}
		})
	}
}
