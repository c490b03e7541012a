package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/dra/dradevice"
)

// BenchmarkDRASchedulingThroughput compares the two ways a node serves a
// class (docs/dra.md, "Nodes") on the same node shapes, in one run: 500
// simulated DGX A100 nodes (kwok) in device-plugin mode, whose NodeDevices the
// resclass plugin places pods on, and 500 in DRA mode, whose ResourceSlices
// (the same devices through pkg/dra's mapping, published by the benchmark as
// the agent would) the stock DynamicResources plugin allocates from through
// the class's DeviceClass (kept by the scheduler, pkg/dra). Each pod asks for
// one GPU of the class, pinned by node label to one half.
//
//   - baseline-resclass: the device-plugin half (ResourceClasses plugin of
//     the resclass scheduler), the pod asking class.resclass.io/<class>: 1.
//   - dra: the DRA half (DynamicResources of the resclass scheduler's
//     default profile), the pod naming a ResourceClaimTemplate of one device
//     of the class's DeviceClass: the resourceclaim controller makes each
//     pod's claim, the scheduler allocates it (the resclass scheduler runs
//     with DRAExtendedResource off, docs/dra.md).
//   - dra-extended: the DRA half, the pod spec of the baseline (the class as
//     an extended resource) with the stock profile's schedulerName
//     (deploy/scheduler/dra/config.yaml, DRAExtendedResource on): the
//     scheduler makes each pod's claim itself, in PreBind.
//
// Each run reports its breakdown (breakdown_test.go: CPU per pod per process,
// ResourceClasses' and DynamicResources' time per extension point, writes per
// pod; docs/dra.md, "Throughput"). ns/op is suppressed; the ratios are each
// DRA run's figures over the baseline's.
func BenchmarkDRASchedulingThroughput(b *testing.B) {
	const (
		nodes = 500
		pods  = 1000
		class = "bench-dra-gpu"
	)
	ctx := context.Background()
	classResource := corev1.ResourceName(v1alpha1.ResourceNamePrefix + class)
	// The device-plugin nodes advertise the class as their kubelet would
	// (8 GPUs).
	dpNames, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{
		Prefix: "bench-dp", Count: nodes, Profile: "dgx-a100",
		Labels:   map[string]string{"pool": "bench-dp"},
		Capacity: corev1.ResourceList{classResource: resource.MustParse("8")},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { deleteNodes(dpNames) })
	draNames, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{
		Prefix: "bench-dra", Count: nodes,
		Labels: map[string]string{"pool": "bench-dra", v1alpha1.LabelDeviceMode: v1alpha1.DeviceModeDRA},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { deleteNodes(draNames) })
	schedClass(b, ctx, class, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"), req("memory", v1alpha1.ResourceSelectorOpGtEq, "30G"))
	publishBenchSlices(b, ctx, draNames, "")
	// The scheduler's class-status leader creates the class's DeviceClass.
	deviceClass(b, ctx, class)
	if err := cluster.StartDRAScheduler(ctx); err != nil {
		b.Fatal(err)
	}
	client := fastClient(b)
	time.Sleep(5 * time.Second) // the nodes' first heartbeats
	idle := 1.3*clusterCores(b, 3*time.Second) + 0.05
	b.Logf("%d nodes: the cluster idles at %.2f cores or less", 2*nodes, idle)

	run := func(b *testing.B, pool, schedulerName string, claimForm bool) {
		var (
			podsPerSecond float64
			figures       runFigures
		)
		for b.Loop() {
			b.StopTimer()
			settle(b, idle)
			b.StartTimer()
			ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"}}, metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if claimForm {
				tmpl := &resourceapi.ResourceClaimTemplate{
					ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: ns.Name},
					Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
						Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class},
					}}}}},
				}
				if _, err := client.ResourceV1().ResourceClaimTemplates(ns.Name).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			batch := make([]*corev1.Pod, pods)
			for i := range batch {
				batch[i] = &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i), Namespace: ns.Name, Labels: map[string]string{"bench-run": ns.Name}},
					Spec: corev1.PodSpec{
						SchedulerName: schedulerName,
						NodeSelector:  map[string]string{"pool": pool},
						Containers: []corev1.Container{{Name: "main", Image: "registry.example/train:1", Resources: corev1.ResourceRequirements{
							Limits: corev1.ResourceList{classResource: resource.MustParse("1")},
						}}},
					},
				}
				if claimForm {
					batch[i].Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptrTo("gpu")}}
					batch[i].Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}
				}
			}
			elapsed, f := scheduleAllMeasured(b, ctx, batch, "bench-run="+ns.Name, "run", 10*time.Minute)
			podsPerSecond, figures = pods/elapsed.Seconds(), f
			deleteNamespaceAndWait(b, ctx, ns.Name)
		}
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(podsPerSecond, "pods/s")
		figures.report(b)
		if figures.outside > maxOutsideCores {
			disturbed(b, "other work used %.2f cores of the machine during the run (at most %.2f for a figure worth reporting)", figures.outside, maxOutsideCores)
		}
	}
	b.Run("baseline-resclass", func(b *testing.B) { run(b, "bench-dp", corev1.DefaultSchedulerName, false) })
	b.Run("dra", func(b *testing.B) { run(b, "bench-dra", corev1.DefaultSchedulerName, true) })
	b.Run("dra-extended", func(b *testing.B) { run(b, "bench-dra", framework.DRASchedulerName, false) })
}

// publishBenchSlices publishes, for each node, one ResourceSlice of the
// dgx-a100 profile's devices mapped by pkg/dra, as the node agent in DRA mode
// publishes them (a GPU in MIG mode left out), the GPUs in mode sharing
// (framework.ShareGPUs; "" for exclusive).
func publishBenchSlices(b *testing.B, ctx context.Context, nodes []string, sharing v1alpha1.SharingMode) {
	b.Helper()
	status, err := framework.LoadProfile("dgx-a100")
	if err != nil {
		b.Fatal(err)
	}
	framework.ShareGPUs(status.Devices, sharing)
	var allocatable []v1alpha1.Device
	for i := range status.Devices {
		if kinds.Builtin.Allocation(&status.Devices[i]) != devicekind.Unallocatable {
			allocatable = append(allocatable, status.Devices[i])
		}
	}
	devices, refused := dradevice.Devices(allocatable)
	if len(refused) > 0 {
		b.Fatalf("the dgx-a100 profile does not map to DRA: %v", refused)
	}
	client := fastClient(b)
	var wg sync.WaitGroup
	errs := make(chan error, len(nodes))
	next := make(chan string)
	for range 16 {
		wg.Go(func() {
			for node := range next {
				s := &resourceapi.ResourceSlice{
					ObjectMeta: metav1.ObjectMeta{Name: node + "-" + dradevice.DriverName},
					Spec: resourceapi.ResourceSliceSpec{
						Driver: dradevice.DriverName, NodeName: &node,
						Pool:    resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
						Devices: devices,
					},
				}
				if _, err := client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
					errs <- err
				}
			}
		})
	}
	for _, n := range nodes {
		next <- n
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		for _, n := range nodes {
			_ = cluster.Client.ResourceV1().ResourceSlices().Delete(context.Background(), n+"-"+dradevice.DriverName, metav1.DeleteOptions{})
		}
	})
}
