package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// BenchmarkSchedulingThroughput is scheduler_perf's question on the embedded
// apiserver: how many pods per second the resclass scheduler binds, on 1000
// simulated DGX nodes of 8 GPUs (kwok; no kubelet is needed to bind).
//
//   - class: pods request 1 GPU as class.resclass.io/<class>; the
//     ResourceClasses plugin picks node and device and writes the assignment.
//   - class-prebind: the same, with the assignment written by a PreBind patch
//     instead of in the Binding (assignmentWrite: PreBind), one more write.
//   - baseline-extended-resource: the same binary schedules the same pods
//     requesting a plain extended resource (example.com/gpu, 8 per node), which
//     the plugin skips: what kube-scheduler does without device selection.
//
// Each run creates the pods (16 writers) and measures from the first create to
// the last pod bound; ns/op means nothing here and is suppressed. The ratio is
// class pods/s over baseline pods/s.
func BenchmarkSchedulingThroughput(b *testing.B) {
	const (
		nodes = 1000
		pods  = 2000
		class = "bench-gpu"
		plain = corev1.ResourceName("example.com/gpu")
	)
	ctx := context.Background()
	names, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{
		Prefix: "bench-dgx", Count: nodes, Profile: "dgx-a100",
		Labels:   map[string]string{"pool": "bench-throughput"},
		Capacity: corev1.ResourceList{plain: resource.MustParse("8")},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { deleteNodes(names) })
	schedClass(b, ctx, class, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"), req("memory", v1alpha1.ResourceSelectorOpGtEq, "30G"))
	client := fastClient(b)

	run := func(b *testing.B, schedulerName string, resourceName corev1.ResourceName) {
		var podsPerSecond float64
		for b.Loop() {
			ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"}}, metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			bound := watchBound(b, ctx, ns.Name, pods)
			start := time.Now()
			createPods(b, ctx, client, pods, func(i int) *corev1.Pod {
				return &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i), Namespace: ns.Name},
					Spec: corev1.PodSpec{
						SchedulerName: schedulerName,
						NodeSelector:  map[string]string{"pool": "bench-throughput"},
						Containers: []corev1.Container{{Name: "main", Image: "registry.example/train:1", Resources: corev1.ResourceRequirements{
							Limits: corev1.ResourceList{resourceName: resource.MustParse("1")},
						}}},
					},
				}
			})
			last, err := bound(10 * time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			podsPerSecond = pods / last.Sub(start).Seconds()
			deleteNamespaceAndWait(b, ctx, ns.Name)
		}
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(podsPerSecond, "pods/s")
	}
	b.Run("baseline-extended-resource", func(b *testing.B) { run(b, resclassScheduler, plain) })
	b.Run("class", func(b *testing.B) { run(b, resclassScheduler, corev1.ResourceName(v1alpha1.ResourceNamePrefix+class)) })
	b.Run("class-prebind", func(b *testing.B) {
		run(b, framework.PreBindSchedulerName, corev1.ResourceName(v1alpha1.ResourceNamePrefix+class))
	})
}

// watchBound watches the pods of ns and returns a function that waits until n
// of them are bound and returns when the last binding was seen. A watch, not
// polling: listing thousands of pods several times a second would load the
// apiserver the benchmark measures.
func watchBound(b *testing.B, ctx context.Context, ns string, n int) func(timeout time.Duration) (time.Time, error) {
	b.Helper()
	ctx, cancel := context.WithCancel(ctx)
	bound := map[string]bool{}
	done := make(chan time.Time, 1)
	var mu sync.Mutex
	informer := cache.NewSharedIndexInformer(cache.NewListWatchFromClient(cluster.Client.CoreV1().RESTClient(), "pods", ns, fields.Everything()), &corev1.Pod{}, 0, cache.Indexers{})
	_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { see(obj, &mu, bound, n, done) },
		UpdateFunc: func(_, obj any) { see(obj, &mu, bound, n, done) },
	})
	if err != nil {
		b.Fatal(err)
	}
	go informer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		b.Fatal("pod watch did not sync")
	}
	return func(timeout time.Duration) (time.Time, error) {
		defer cancel()
		select {
		case t := <-done:
			return t, nil
		case <-time.After(timeout):
			mu.Lock()
			defer mu.Unlock()
			return time.Time{}, fmt.Errorf("%d of %d pods bound after %v", len(bound), n, timeout)
		}
	}
}

func see(obj any, mu *sync.Mutex, bound map[string]bool, n int, done chan time.Time) {
	pod := obj.(*corev1.Pod)
	if pod.Spec.NodeName == "" {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	if !bound[pod.Name] {
		bound[pod.Name] = true
		if len(bound) == n {
			done <- time.Now()
		}
	}
}

// deleteNamespaceAndWait deletes ns and waits until its pods are gone, so the
// devices they held are free for the next run.
func deleteNamespaceAndWait(b *testing.B, ctx context.Context, ns string) {
	b.Helper()
	if err := cluster.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		b.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil && len(list.Items) == 0, nil
	})
	if err != nil {
		b.Fatalf("pods of namespace %s not gone: %v", ns, err)
	}
}
