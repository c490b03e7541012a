package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/e2e/framework"
)

// BenchmarkNamespaceSelectorAntiAffinity is the scheduler's throughput (pods/s)
// for the KEP-2249 SaaS workload at scale: pods spread over 10 namespaces, each
// with required anti-affinity on kubernetes.io/hostname to the shared workload
// label across those namespaces, so every pod needs a node of its own. Timed: from
// the first pod's creation until every pod is bound, seen through a watch; nodes
// and namespaces are set up before. ns/op means nothing here and is suppressed.
//
// baseline-namespaces-list is the same workload with the term listing the 10
// namespaces by name instead of selecting them by label: the ratio is what the
// namespaceSelector costs (the scheduler resolves it against its namespace
// informer for each pod, and matches existing pods' selector terms against the
// incoming pod's namespace labels).
//
// 200 pods on 200 nodes: 1:1 as in the story, so the last pods have few feasible
// nodes left. The size keeps a run (two variants, each creating and deleting its
// nodes) well under two minutes on a 2-core machine, node creation and kwok
// making them Ready being most of it.
func BenchmarkNamespaceSelectorAntiAffinity(b *testing.B) {
	const (
		nodes      = 200
		pods       = 200
		namespaces = 10
	)
	b.Run("namespaceSelector", func(b *testing.B) {
		benchAntiAffinity(b, nodes, pods, namespaces, func(_ []string, nsLabels map[string]string) corev1.PodAffinityTerm {
			return corev1.PodAffinityTerm{NamespaceSelector: &metav1.LabelSelector{MatchLabels: nsLabels}}
		})
	})
	b.Run("baseline-namespaces-list", func(b *testing.B) {
		benchAntiAffinity(b, nodes, pods, namespaces, func(names []string, _ map[string]string) corev1.PodAffinityTerm {
			return corev1.PodAffinityTerm{Namespaces: names}
		})
	})
}

// benchAntiAffinity runs one variant; scope gives the term its namespaces, from
// the namespaces' names and the labels they all carry (and no other namespace).
func benchAntiAffinity(b *testing.B, nodeCount, podCount, nsCount int, scope func(names []string, nsLabels map[string]string) corev1.PodAffinityTerm) {
	ctx := context.Background()
	run := "affbench-" + utilrand.String(5)
	// Each variant has its own nodes, namespaces and pods, and removes them and
	// waits until they are gone, so the next variant starts on a quiet cluster.
	b.Cleanup(func() { cleanupAffinityBench(b, run) })

	_, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{
		Prefix: run, Count: nodeCount, Labels: map[string]string{affinityNodeLabel: run},
	})
	if err != nil {
		b.Fatal(err)
	}
	nsLabels := map[string]string{affinityNodeLabel: run}
	var nsNames []string
	for range nsCount {
		ns, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
			ObjectMeta: metav1.ObjectMeta{GenerateName: run + "-", Labels: nsLabels},
		}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		nsNames = append(nsNames, ns.Name)
	}

	workload := map[string]string{"app": run}
	term := scope(nsNames, nsLabels)
	term.LabelSelector = &metav1.LabelSelector{MatchLabels: workload}
	term.TopologyKey = corev1.LabelHostname
	podsToCreate := make([]*corev1.Pod, podCount)
	for i := range podsToCreate {
		podsToCreate[i] = &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", i), Namespace: nsNames[i%nsCount], Labels: workload},
			Spec: corev1.PodSpec{
				NodeSelector: map[string]string{affinityNodeLabel: run},
				Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
					RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term},
				}},
				Containers: []corev1.Container{{
					Name:  "main",
					Image: "registry.example/app:1",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse("10m"),
					}},
				}},
			},
		}
	}
	elapsed, bound := scheduleAll(b, ctx, podsToCreate, "app="+run, 3*time.Minute)

	// The workload's point: no two pods share a node.
	perNode := map[string]string{}
	for pod, node := range bound {
		if other, ok := perNode[node]; ok {
			b.Fatalf("pods %s and %s share node %s", other, pod, node)
		}
		perNode[node] = pod
	}

	for b.Loop() {
	}
	// After b.Loop, whose timer reset would drop them.
	b.ReportMetric(float64(podCount)/elapsed.Seconds(), "pods/s")
	b.ReportMetric(0, "ns/op")
}

// cleanupAffinityBench deletes a variant's pods (at once: kwok would take its
// time over graceful deletions), namespaces and nodes, and waits until all are
// gone.
func cleanupAffinityBench(b *testing.B, run string) {
	ctx := context.Background()
	core := cluster.Client.CoreV1()
	selector := metav1.ListOptions{LabelSelector: affinityNodeLabel + "=" + run}
	nsList, err := core.Namespaces().List(ctx, selector)
	if err != nil {
		b.Errorf("listing namespaces %s-*: %v", run, err)
		return
	}
	zero := int64(0)
	for _, ns := range nsList.Items {
		if err := core.Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
			b.Errorf("deleting pods in %s: %v", ns.Name, err)
		}
		if err := core.Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil {
			b.Errorf("deleting namespace %s: %v", ns.Name, err)
		}
	}
	if err := core.Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, selector); err != nil {
		b.Errorf("deleting nodes %s-*: %v", run, err)
	}
	gone := func(what string, list func(ctx context.Context) (runtime.Object, error)) {
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			obj, err := list(ctx)
			if err != nil {
				return false, nil
			}
			return meta.LenList(obj) == 0, nil
		})
		if err != nil {
			b.Errorf("%s of %s still there: %v", what, run, err)
		}
	}
	gone("namespaces", func(ctx context.Context) (runtime.Object, error) { return core.Namespaces().List(ctx, selector) })
	gone("nodes", func(ctx context.Context) (runtime.Object, error) { return core.Nodes().List(ctx, selector) })
}
