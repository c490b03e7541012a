package resourceclasses

import (
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// TestNodeDevicesChangeActivatesOnlyPodsItMayHelp: a node's new NodeDevices
// activates the waiting pods of a class it gave more room that fit the node
// now, and nobody else: not for a change that shrinks the node or repeats
// it, not the pods of other classes, not a pod that still does not fit. A
// node deleted and published again activates whom its devices fit.
func TestNodeDevicesChangeActivatesOnlyPodsItMayHelp(t *testing.T) {
	version := 1
	n1 := func(devs ...v1alpha1.Device) *v1alpha1.NodeDevices {
		version++
		nd := nodeDevices("n1", devs...)
		nd.ResourceVersion = strconv.Itoa(version)
		return nd
	}
	gpus := []v1alpha1.Device{gpu("g0", 0, "80Gi"), gpu("g1", 0, "80Gi")}
	devices := func(nicHealthy bool, freePages int64, more ...v1alpha1.Device) []v1alpha1.Device {
		n := nic("nic0", 0)
		if !nicHealthy {
			n = unhealthy(n)
		}
		return append(slices.Concat(gpus, []v1alpha1.Device{n, hugePool("hp0", 0, "1Gi", 8, freePages)}), more...)
	}
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{n1(devices(true, 2)...)}, allClasses)
	h.reserve(gpuPod("first", "gpu", 2), "n1") // both GPUs held

	waiting := map[string]*corev1.Pod{
		"gpu":  gpuPod("gpu-waiting", "gpu", 1),
		"big":  gpuPod("big-waiting", "gpu-big", 1),
		"nic":  gpuPod("nic-waiting", "nic", 2),
		"hp-1": hugePod("hp-waiting", "hp-1g", 1, map[corev1.ResourceName]string{"hugepages-1Gi": "4Gi"}),
	}
	for _, pod := range waiting {
		if _, st := h.fits(pod, "n1"); st.Code() != fwk.Unschedulable {
			t.Fatalf("%s on the full n1: %v, want Unschedulable", pod.Name, st)
		}
	}
	counted := func() float64 {
		v, err := testutil.GetCounterMetricValue(activations.WithLabelValues(activatedNodeDevices))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	for _, step := range []struct {
		name   string
		change func()
		want   []string
	}{
		{"the same devices republished", func() { h.plugin.nodeDevicesChanged(klog.Background(), n1(devices(true, 2)...)) }, nil},
		{"a pool's free pages down, the NIC unhealthy", func() { h.plugin.nodeDevicesChanged(klog.Background(), n1(devices(false, 1)...)) }, nil},
		{"the pool's free pages up, still too few", func() { h.plugin.nodeDevicesChanged(klog.Background(), n1(devices(false, 3)...)) }, nil},
		{"the pool's free pages up, enough", func() { h.plugin.nodeDevicesChanged(klog.Background(), n1(devices(false, 6)...)) },
			[]string{"default/hp-waiting"}},
		{"a new small GPU", func() { h.plugin.nodeDevicesChanged(klog.Background(), n1(devices(false, 6, gpu("g2", 0, "40Gi"))...)) },
			[]string{"default/gpu-waiting"}},
		{"the NIC heals, one of the two the pod wants", func() {
			h.plugin.nodeDevicesChanged(klog.Background(), n1(devices(true, 6, gpu("g2", 0, "40Gi"))...))
		}, nil},
		{"the node's NodeDevices deleted", func() { h.plugin.cache.deleteNodeDevices("n1") }, nil},
		{"and published again", func() { h.plugin.nodeDevicesChanged(klog.Background(), n1(devices(true, 6, gpu("g2", 0, "40Gi"))...)) },
			[]string{"default/gpu-waiting", "default/hp-waiting"}},
	} {
		before, metric := len(h.activator.got()), counted()
		step.change()
		got := h.activator.got()[before:]
		slices.Sort(got)
		if !slices.Equal(got, step.want) {
			t.Errorf("%s: activated %v, want %v", step.name, got, step.want)
		}
		if d := counted() - metric; d != float64(len(step.want)) {
			t.Errorf("%s: %s{reason=%s} went up by %v, want %d", step.name, "resclass_scheduler_pods_activated_total", activatedNodeDevices, d, len(step.want))
		}
	}
}

// TestGrownClasses: which classes a node's new devices gave room, device by
// device (grownClasses), and every class of the node once pods that hold
// devices which ones unknown hold fewer.
func TestGrownClasses(t *testing.T) {
	c := newCache()
	for _, rc := range allClasses {
		c.setClass(rc)
	}
	var grown [][]string
	c.grew = func(node string, classes []string) { grown = append(grown, classes) }
	version := 0
	set := func(devs ...v1alpha1.Device) []string {
		t.Helper()
		version++
		nd := nodeDevices("n1", devs...)
		nd.ResourceVersion = strconv.Itoa(version)
		before := len(grown)
		c.setNodeDevices(nd)
		if len(grown) == before {
			return nil
		}
		return grown[len(grown)-1]
	}
	for _, step := range []struct {
		name string
		devs []v1alpha1.Device
		want []string
	}{
		{"a new node", []v1alpha1.Device{gpu("g0", 0, "40Gi")}, []string{"gpu"}},
		{"the same", []v1alpha1.Device{gpu("g0", 0, "40Gi")}, nil},
		{"the GPU now 80Gi: newly selected by gpu-big", []v1alpha1.Device{gpu("g0", 0, "80Gi")}, []string{"gpu-big"}},
		{"unhealthy", []v1alpha1.Device{unhealthy(gpu("g0", 0, "80Gi"))}, nil},
		{"healed", []v1alpha1.Device{gpu("g0", 0, "80Gi")}, []string{"gpu", "gpu-big"}},
		{"moved to another NUMA node", []v1alpha1.Device{gpu("g0", 1, "80Gi")}, nil},
		{"a pool", []v1alpha1.Device{gpu("g0", 1, "80Gi"), hugePool("hp0", 0, "1Gi", 8, 4)}, []string{"hp-1g"}},
		{"fewer free pages", []v1alpha1.Device{gpu("g0", 1, "80Gi"), hugePool("hp0", 0, "1Gi", 8, 2)}, nil},
		{"more free pages", []v1alpha1.Device{gpu("g0", 1, "80Gi"), hugePool("hp0", 0, "1Gi", 8, 3)}, []string{"hp-1g"}},
		{"another page size", []v1alpha1.Device{gpu("g0", 1, "80Gi"), hugePool("hp0", 0, "2Gi", 8, 1)}, []string{"hp-1g"}},
		{"the GPU gone", []v1alpha1.Device{hugePool("hp0", 0, "2Gi", 8, 1)}, nil},
	} {
		if got := set(step.devs...); !slices.Equal(got, step.want) {
			t.Errorf("%s: grew %v, want %v", step.name, got, step.want)
		}
	}

	// The agent says it stops: nothing grows, though the devices are as
	// before; it serves again: every class of the node has room again.
	serving := func(status metav1.ConditionStatus) []string {
		t.Helper()
		version++
		nd := nodeDevices("n1", gpu("g0", 1, "80Gi"), hugePool("hp0", 0, "2Gi", 8, 1))
		nd.ResourceVersion = strconv.Itoa(version)
		nd.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionAgentServing, Status: status}}
		before := len(grown)
		c.setNodeDevices(nd)
		if len(grown) == before {
			return nil
		}
		return grown[len(grown)-1]
	}
	set(gpu("g0", 1, "80Gi"), hugePool("hp0", 0, "2Gi", 8, 1))
	if got := serving(metav1.ConditionFalse); got != nil {
		t.Errorf("the agent stopping: grew %v, want nothing", got)
	}
	if got, want := serving(metav1.ConditionTrue), []string{"gpu", "gpu-big", "hp-1g"}; !slices.Equal(got, want) {
		t.Errorf("the agent serving again: grew %v, want %v", got, want)
	}

	// A pod whose assignment names a device the node does not publish holds
	// its request there, which device unknown; once the device appears, the
	// assignment is believed and the pod holds just that device: every class
	// of the node may have room again.
	set(gpu("g0", 0, "80Gi"), nic("nic0", 0))
	c.hold(holdingFromPod(boundPod(t, "holder", "n1", "n1", "gpu", "g1")))
	c.mu.RLock()
	blocked := len(c.nodes["n1"].blocked)
	c.mu.RUnlock()
	if blocked == 0 {
		t.Fatal("a pod whose assignment names a device n1 does not publish: nothing blocked")
	}
	if got, want := set(gpu("g0", 0, "80Gi"), gpu("g1", 0, "80Gi"), nic("nic0", 0)), []string{"gpu", "gpu-big", "nic"}; !slices.Equal(got, want) {
		t.Errorf("the assignment believed, nothing blocked: grew %v, want %v", got, want)
	}
}
