package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// BenchmarkPreemption is scheduler_perf's preemption shape on the embedded
// apiserver: 100 simulated DGX nodes of 8 GPUs (kwok) full of low-priority
// pods of one GPU each, then 200 high-priority pods of one GPU each, every one
// of which must preempt a victim. Measured: high-priority pods bound per
// second, from the first create to the last bound.
//
//   - class: the pods request 1 GPU as class.resclass.io/<class>; victims are
//     found through the plugin's AddPod/RemovePod what-ifs.
//   - baseline-extended-resource: the same binary, the same pods requesting a
//     plain extended resource (example.com/gpu, 8 per node), which the plugin
//     skips: upstream preemption alone.
//
// ns/op means nothing here and is suppressed; the ratio is class pods/s over
// baseline pods/s.
func BenchmarkPreemption(b *testing.B) {
	const (
		nodes = 100
		low   = nodes * 8
		high  = 200
		class = "bench-preempt-gpu"
		plain = corev1.ResourceName("example.com/gpu")
	)
	ctx := context.Background()
	names, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{
		Prefix: "bench-pre", Count: nodes, Profile: "dgx-a100",
		Labels:   map[string]string{"pool": "bench-preemption"},
		Capacity: corev1.ResourceList{plain: resource.MustParse("8")},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { deleteNodes(names) })
	schedClass(b, ctx, class, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"))
	for name, value := range map[string]int32{"bench-low": 100, "bench-high": 1000} {
		_, err := cluster.Client.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
	}
	client := fastClient(b)

	pods := func(ns, prefix, priority, label string, n int, resourceName corev1.ResourceName) []*corev1.Pod {
		out := make([]*corev1.Pod, n)
		for i := range out {
			out[i] = &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%05d", prefix, i), Namespace: ns, Labels: map[string]string{label: ns}},
				Spec: corev1.PodSpec{
					SchedulerName: resclassScheduler, PriorityClassName: priority,
					TerminationGracePeriodSeconds: ptrTo(int64(0)),
					NodeSelector:                  map[string]string{"pool": "bench-preemption"},
					Containers: []corev1.Container{{Name: "main", Image: "registry.example/train:1", Resources: corev1.ResourceRequirements{
						Limits: corev1.ResourceList{resourceName: resource.MustParse("1")},
					}}},
				},
			}
		}
		return out
	}
	run := func(b *testing.B, resourceName corev1.ResourceName) {
		var podsPerSecond float64
		for b.Loop() {
			ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"}}, metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			scheduleAll(b, ctx, pods(ns.Name, "low", "bench-low", "bench-low", low, resourceName), "bench-low="+ns.Name, 10*time.Minute)
			elapsed, _ := scheduleAll(b, ctx, pods(ns.Name, "high", "bench-high", "bench-high", high, resourceName), "bench-high="+ns.Name, 10*time.Minute)
			podsPerSecond = high / elapsed.Seconds()
			deleteNamespaceAndWait(b, ctx, ns.Name)
		}
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(podsPerSecond, "pods/s")
	}
	b.Run("baseline-extended-resource", func(b *testing.B) { run(b, plain) })
	b.Run("class", func(b *testing.B) { run(b, corev1.ResourceName(v1alpha1.ResourceNamePrefix+class)) })
}
