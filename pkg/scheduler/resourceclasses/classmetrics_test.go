package resourceclasses

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

const classMetricsHeader = `# HELP resclass_scheduler_class_devices [ALPHA] Each class's devices as kubectl resclass capacity counts them, by state: allocatable (healthy devices it selects that may be given out), held (of those, the ones a new pod of the class cannot get: pods hold them, through any class) and free (the rest). A device counts in every class that selects it; a share class counts units of its unit instead of devices.
# TYPE resclass_scheduler_class_devices gauge
`

const pendingHeader = `# HELP resclass_scheduler_class_pending_pods [ALPHA] Pods this scheduler is to place (their schedulerName is one of its profiles') that request the class and are not bound yet, nor finished; a pod requesting several classes counts in each.
# TYPE resclass_scheduler_class_pending_pods gauge
`

// TestClassMetrics: the class figures are the cache's class status, and the
// pending pods those of the scheduler's profiles, unbound and unfinished, once
// per class they request; both follow the pods as they go.
func TestClassMetrics(t *testing.T) {
	held := boundPod(t, "held", "n1", "n1", "gpu", "G0")
	pending := func(name, scheduler string, classes ...string) *corev1.Pod {
		p := testPod(name)
		for _, class := range classes {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: class, Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{cls(class): resource.MustParse("1")}}})
		}
		p.Spec.SchedulerName = scheduler
		return p
	}
	finished := pending("finished", "default-scheduler", "gpu")
	finished.Status.Phase = corev1.PodFailed
	pods := []*corev1.Pod{
		held,
		pending("one", "default-scheduler", "gpu"),
		pending("two-classes", "default-scheduler", "gpu", "gpu-big"),
		pending("second-profile", "second", "gpu"),
		pending("other-scheduler", "other", "gpu"),
		pending("no-such-class", "default-scheduler", "nosuch"),
		finished,
	}
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", gpu("G0", 0, "80Gi"), gpu("G1", 0, "40Gi"), sharedGPU("S0", 0, "80Gi", v1alpha1.SharingMPS))},
		[]*v1alpha1.ResourceClass{gpuClass, bigGPUClass, gpu10g}, pods...)
	h.profile("second", `{"statusUpdateInterval":"0s"}`)
	reg := metrics.NewKubeRegistry()
	reg.CustomMustRegister(&classCollector{source: func() *shared { return h.plugin.shared }})
	expect := func(devices, pending string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := testutil.GatherAndCompare(reg, strings.NewReader(classMetricsHeader+devices+pendingHeader+pending), "resclass_scheduler_class_devices", "resclass_scheduler_class_pending_pods")
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// gpu has the two whole GPUs, gpu-big the one of 80Gi; the shared GPU
	// serves shares only: gpu-10g's 8 units (10Gi and 12% of 80Gi and 100%).
	expect(`resclass_scheduler_class_devices{class="gpu",state="allocatable"} 2
resclass_scheduler_class_devices{class="gpu",state="free"} 1
resclass_scheduler_class_devices{class="gpu",state="held"} 1
resclass_scheduler_class_devices{class="gpu-10g",state="allocatable"} 8
resclass_scheduler_class_devices{class="gpu-10g",state="free"} 8
resclass_scheduler_class_devices{class="gpu-10g",state="held"} 0
resclass_scheduler_class_devices{class="gpu-big",state="allocatable"} 1
resclass_scheduler_class_devices{class="gpu-big",state="free"} 0
resclass_scheduler_class_devices{class="gpu-big",state="held"} 1
`, `resclass_scheduler_class_pending_pods{class="gpu"} 3
resclass_scheduler_class_pending_pods{class="gpu-10g"} 0
resclass_scheduler_class_pending_pods{class="gpu-big"} 1
`)
	for _, name := range []string{"held", "one", "two-classes", "second-profile"} {
		if err := h.client.CoreV1().Pods("default").Delete(h.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	expect(`resclass_scheduler_class_devices{class="gpu",state="allocatable"} 2
resclass_scheduler_class_devices{class="gpu",state="free"} 2
resclass_scheduler_class_devices{class="gpu",state="held"} 0
resclass_scheduler_class_devices{class="gpu-10g",state="allocatable"} 8
resclass_scheduler_class_devices{class="gpu-10g",state="free"} 8
resclass_scheduler_class_devices{class="gpu-10g",state="held"} 0
resclass_scheduler_class_devices{class="gpu-big",state="allocatable"} 1
resclass_scheduler_class_devices{class="gpu-big",state="free"} 1
resclass_scheduler_class_devices{class="gpu-big",state="held"} 0
`, `resclass_scheduler_class_pending_pods{class="gpu"} 0
resclass_scheduler_class_pending_pods{class="gpu-10g"} 0
resclass_scheduler_class_pending_pods{class="gpu-big"} 0
`)
}

// BenchmarkClassMetricsScrape is one scrape of the class figures at 5000
// nodes of 8 GPUs (half whole, half shared, a pod on most), with 1000 pods
// pending among 40000: the cost docs/observability.md gives.
func BenchmarkClassMetricsScrape(b *testing.B) {
	const nodes, pendingPods, boundPods = 5000, 1000, 40000
	c := newCache()
	for _, rc := range shareClasses {
		c.setClass(rc)
	}
	for i := range nodes {
		name := fmt.Sprintf("node-%05d", i)
		var devs []v1alpha1.Device
		for g := range 8 {
			d := gpu(fmt.Sprintf("GPU-%d-%d", i, g), int64(g/4), "80Gi")
			if g >= 4 {
				d = sharedGPU(d.ID, int64(g/4), "80Gi", v1alpha1.SharingMPS)
			}
			devs = append(devs, d)
		}
		c.setNodeDevices(nodeDevices(name, devs...))
		for p, class := range []string{"gpu", "gpu-10g"}[:1+i%2] {
			pod := gpuPod(fmt.Sprintf("p-%d-%d", i, p), class, 1)
			d, err := podDemand(pod)
			if err != nil {
				b.Fatal(err)
			}
			if _, u, err := c.reserve(pod, name, d, FirstFit, BinPack); err != nil || u != nil {
				b.Fatalf("reserve: %v %v", err, u)
			}
		}
	}
	indexer := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})
	for i := range pendingPods + boundPods {
		p := gpuPod(fmt.Sprintf("q-%d", i), "gpu", 1)
		p.Spec.SchedulerName = "resclass-scheduler"
		if i >= pendingPods {
			p.Spec.NodeName = "node-00000"
		}
		if err := indexer.Add(p); err != nil {
			b.Fatal(err)
		}
	}
	s := &shared{cache: c, pods: corelisters.NewPodLister(indexer), profiles: map[string]bool{"resclass-scheduler": true}}
	reg := metrics.NewKubeRegistry()
	reg.CustomMustRegister(&classCollector{source: func() *shared { return s }})
	for b.Loop() {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}
