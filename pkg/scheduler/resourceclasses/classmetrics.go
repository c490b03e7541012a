package resourceclasses

import (
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// The per-class figures, computed from the plugin's cache at scrape time
// (classCollector): the same numbers `kubectl resclass capacity` prints and
// the class status holds, whatever the status writer's interval.
var (
	classDevicesDesc = metrics.NewDesc("resclass_scheduler_class_devices",
		"Each class's devices as kubectl resclass capacity counts them, by state: allocatable (healthy devices it selects that may be given out), "+
			"held (of those, the ones a new pod of the class cannot get: pods hold them, through any class) and free (the rest). "+
			"A device counts in every class that selects it; a share class counts units of its unit instead of devices.",
		[]string{"class", "state"}, nil, metrics.ALPHA, "")
	classPendingDesc = metrics.NewDesc("resclass_scheduler_class_pending_pods",
		"Pods this scheduler is to place (their schedulerName is one of its profiles') that request the class and are not bound yet, nor finished; "+
			"a pod requesting several classes counts in each.",
		[]string{"class"}, nil, metrics.ALPHA, "")
)

// exporting is the scheduler's shared state that the class figures are read
// from: the first one made in the process (New), so that a process running
// several (tests) exports one set, not duplicate series.
var exporting atomic.Pointer[shared]

func init() {
	legacyregistry.CustomMustRegister(&classCollector{source: exporting.Load})
}

// classCollector exports the class figures of source's cache. A scrape
// takes the cache's read lock for one classStatus pass, O(nodes × devices)
// as the status writer's (docs/observability.md measures it), and lists the
// scheduler's pod informer once, O(pods), without its lock.
type classCollector struct {
	metrics.BaseStableCollector
	source func() *shared
}

func (c *classCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- classDevicesDesc
	ch <- classPendingDesc
}

func (c *classCollector) CollectWithStability(ch chan<- metrics.Metric) {
	s := c.source()
	if s == nil {
		return
	}
	status := s.cache.classStatus()
	for class, st := range status {
		held := st.Requested.Value()
		ch <- metrics.NewLazyConstMetric(classDevicesDesc, metrics.GaugeValue, float64(st.Allocatable.Value()), class, "allocatable")
		ch <- metrics.NewLazyConstMetric(classDevicesDesc, metrics.GaugeValue, float64(held), class, "held")
		ch <- metrics.NewLazyConstMetric(classDevicesDesc, metrics.GaugeValue, float64(st.Available.Value()), class, "free")
	}
	pending := make(map[string]int, len(status))
	for class := range status {
		pending[class] = 0
	}
	if s.pods != nil {
		names := s.schedulerNames()
		pods, _ := s.pods.List(labels.Everything())
		for _, pod := range pods {
			if pod.Spec.NodeName != "" || podutil.IsPodTerminal(pod) || !slices.Contains(names, pod.Spec.SchedulerName) {
				continue
			}
			for _, class := range requestedClasses(pod) {
				// Only the classes that exist: a pod naming any other would
				// otherwise add a series per name it invents.
				if _, ok := pending[class]; ok {
					pending[class]++
				}
			}
		}
	}
	for class, n := range pending {
		ch <- metrics.NewLazyConstMetric(classPendingDesc, metrics.GaugeValue, float64(n), class)
	}
}

// requestedClasses are the classes pod requests a nonzero number of, each
// once: what podDemand reads, without building the demand.
func requestedClasses(pod *corev1.Pod) []string {
	var out []string
	add := func(cs []corev1.Container) {
		for i := range cs {
			for name, q := range requests(&cs[i]) {
				if class, ok := strings.CutPrefix(string(name), v1alpha1.ResourceNamePrefix); ok && !q.IsZero() && !slices.Contains(out, class) {
					out = append(out, class)
				}
			}
		}
	}
	add(pod.Spec.InitContainers)
	add(pod.Spec.Containers)
	return out
}

// schedulerNames are the names of the profiles whose plugins share s.
func (s *shared) schedulerNames() []string {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	return slices.Collect(maps.Keys(s.profiles))
}
