package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

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
//   - class-topology: the same, with strategy Topology (the plugin's Score
//     runs the topology search on every node, Reserve once more).
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
			batch := make([]*corev1.Pod, pods)
			for i := range batch {
				batch[i] = &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i), Namespace: ns.Name, Labels: map[string]string{"bench-run": ns.Name}},
					Spec: corev1.PodSpec{
						SchedulerName: schedulerName,
						NodeSelector:  map[string]string{"pool": "bench-throughput"},
						Containers: []corev1.Container{{Name: "main", Image: "registry.example/train:1", Resources: corev1.ResourceRequirements{
							Limits: corev1.ResourceList{resourceName: resource.MustParse("1")},
						}}},
					},
				}
			}
			elapsed, _ := scheduleAll(b, ctx, batch, "bench-run="+ns.Name, 10*time.Minute)
			podsPerSecond = pods / elapsed.Seconds()
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
	b.Run("class-topology", func(b *testing.B) {
		run(b, framework.TopologySchedulerName, corev1.ResourceName(v1alpha1.ResourceNamePrefix+class))
	})
}

// scheduleAll creates pods (16 writers on an unthrottled client) once a watch on
// the pods labelled selector has synced, and returns the time from the first
// create until the watch saw the last of them bound, and each pod's node. A
// watch, not polling: listing thousands of pods several times a second would
// load the apiserver the benchmark measures.
func scheduleAll(b *testing.B, ctx context.Context, pods []*corev1.Pod, selector string, timeout time.Duration) (time.Duration, map[string]string) {
	b.Helper()
	client := fastClient(b)
	bound := map[string]string{}
	var done time.Time
	synced := make(chan struct{})
	watchErr := make(chan error, 1)
	waitCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lw := cache.NewFilteredListWatchFromClient(client.CoreV1().RESTClient(), "pods", metav1.NamespaceAll,
		func(o *metav1.ListOptions) { o.LabelSelector = selector })
	go func() {
		_, err := watchtools.UntilWithSync(waitCtx, lw, &corev1.Pod{}, func(cache.Store) (bool, error) {
			close(synced)
			return false, nil
		}, func(ev watch.Event) (bool, error) {
			if p, ok := ev.Object.(*corev1.Pod); ok && p.Spec.NodeName != "" {
				bound[p.Namespace+"/"+p.Name] = p.Spec.NodeName
			}
			if len(bound) == len(pods) {
				done = time.Now()
				return true, nil
			}
			return false, nil
		})
		watchErr <- err
	}()
	select {
	case <-synced:
	case err := <-watchErr:
		b.Fatalf("watching pods: %v", err)
	}
	start := time.Now()
	createPods(b, ctx, client, len(pods), func(i int) *corev1.Pod { return pods[i] })
	if err := <-watchErr; err != nil {
		b.Fatalf("%d of %d pods bound: %v", len(bound), len(pods), err)
	}
	return done.Sub(start), bound
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
