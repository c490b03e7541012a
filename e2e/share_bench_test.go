package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/dra"
	"github.com/resclass/resclass/pkg/dra/dradevice"
)

// BenchmarkShareSchedulingThroughput compares, in one run and on the same
// node shapes (simulated DGX A100s, kwok: 8 GPUs of 40Gi), pods that ask for
// a whole GPU with pods that ask for a share of one (docs/sharing.md), on
// device-plugin nodes and on DRA nodes; 500 nodes per pool, 1000 pods per
// run, each pod pinned by node label to its pool:
//
//   - baseline-whole: device-plugin nodes whose GPUs are exclusive, the pod
//     asking class.resclass.io/<whole>: 1 of a class without a share (the
//     ResourceClasses plugin, as DRASchedulingThroughput's baseline).
//   - share: device-plugin nodes whose GPUs are in TimeSlicing mode
//     (framework.SimulatedNodes.GPUSharing: the NodeDevices the agent
//     publishes for them, capacity 40Gi and 100% each, and the 4 slots per
//     GPU the agent advertises to the kubelet for the class), the pod asking
//     class.resclass.io/<share>: 1 of a share class of 10Gi and 25%: the
//     ResourceClasses plugin's share accounting (docs/scheduler.md, "Sharing
//     GPUs").
//   - dra-share: DRA nodes whose ResourceSlices publish the same GPUs shared
//     (pkg/dra/dradevice: allowMultipleAllocations and the share
//     capacities), the pod naming a ResourceClaimTemplate whose request asks
//     the share class's DeviceClass (kept by the scheduler) for 10Gi and 25
//     of share.resclass.io/memory and compute (docs/dra.md, "Share
//     classes"): the resclass scheduler binary's DynamicResources with
//     consumable capacity.
//
// The pods stay Pending once bound (framework.SimulatedPendingLabel), as in
// SchedulingThroughput. Before the measured runs, warmUpSharePods pods of
// each side are scheduled unmeasured, so that the first side does not pay
// for a fresh cluster's first pods. Each side runs once (-benchtime 1x),
// measured from the first create to the last pod bound, once the cluster is
// back to idle, and reports pods/s and its breakdown (breakdown_test.go);
// ns/op is suppressed, and hack/bench.sh prints each side's figures over the
// baseline's. A run during which other processes used more than
// maxOutsideCores is refused (disturbed; RESCLASS_BENCH_ALLOW_DISTURBED=1
// reports it anyway).
func BenchmarkShareSchedulingThroughput(b *testing.B) {
	const (
		nodes = 500
		pods  = 1000
		whole = "bench-share-whole"
		share = "bench-share-unit"
	)
	ctx := context.Background()
	selectorTerms := []v1alpha1.ResourcePropertySelector{{MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
		req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"), req("memory", v1alpha1.ResourceSelectorOpGtEq, "30G"),
	}}}
	memory, compute := resource.MustParse("10Gi"), int32(25)
	wholeClass := benchResourceClass(b, ctx, &v1alpha1.ResourceClass{
		ObjectMeta: metav1.ObjectMeta{Name: whole},
		Spec:       v1alpha1.ResourceClassSpec{ResourceSelector: selectorTerms},
	})
	shareClass := benchResourceClass(b, ctx, &v1alpha1.ResourceClass{
		ObjectMeta: metav1.ObjectMeta{Name: share},
		Spec:       v1alpha1.ResourceClassSpec{ResourceSelector: selectorTerms, Share: &v1alpha1.ResourceShare{Memory: &memory, Compute: &compute}},
	})
	addPool := func(opts framework.SimulatedNodes) {
		names, err := cluster.AddSimulatedNodes(ctx, opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { deleteNodes(names) })
		if opts.Profile == "" {
			publishBenchSlices(b, ctx, names, opts.GPUSharing)
		}
	}
	// The kubelet's capacity of each class is what the agent advertises: 8
	// GPUs whole, 8 × 4 slots of the share class.
	addPool(framework.SimulatedNodes{
		Prefix: "bench-sh-whole", Count: nodes, Profile: "dgx-a100",
		Labels:  map[string]string{"pool": "bench-sh-whole"},
		Classes: []*v1alpha1.ResourceClass{wholeClass},
	})
	addPool(framework.SimulatedNodes{
		Prefix: "bench-sh-share", Count: nodes, Profile: "dgx-a100", GPUSharing: v1alpha1.SharingTimeSlicing,
		Labels:  map[string]string{"pool": "bench-sh-share"},
		Classes: []*v1alpha1.ResourceClass{shareClass},
	})
	// No profile: DRA nodes publish no NodeDevices, their ResourceSlices
	// (the GPUs time-sliced) are published by addPool.
	addPool(framework.SimulatedNodes{
		Prefix: "bench-sh-dra", Count: nodes, GPUSharing: v1alpha1.SharingTimeSlicing,
		Labels: map[string]string{"pool": "bench-sh-dra", v1alpha1.LabelDeviceMode: v1alpha1.DeviceModeDRA},
	})
	checkCapacity(b, ctx, "bench-sh-whole-0", whole, 8)
	checkCapacity(b, ctx, "bench-sh-share-0", share, 32)
	shareDeviceClass(b, ctx, shareClass)

	client := fastClient(b)
	// A side's pods in namespace ns, and what they need there first.
	type side struct {
		pool  string
		pod   func(ns string, i int) *corev1.Pod
		setup func(ns string)
	}
	classPod := func(pool, class string) func(ns string, i int) *corev1.Pod {
		return func(ns string, i int) *corev1.Pod {
			return benchPod(ns, i, resclassScheduler, corev1.ResourceName(v1alpha1.ResourceNamePrefix+class), pool)
		}
	}
	sides := map[string]side{
		"baseline-whole": {pool: "bench-sh-whole", pod: classPod("bench-sh-whole", whole)},
		"share":          {pool: "bench-sh-share", pod: classPod("bench-sh-share", share)},
		"dra-share": {
			pool: "bench-sh-dra",
			pod: func(ns string, i int) *corev1.Pod {
				p := benchPod(ns, i, resclassScheduler, "", "bench-sh-dra")
				p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "share", ResourceClaimTemplateName: ptrTo("share")}}
				p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "share"}}}
				return p
			},
			setup: func(ns string) {
				// docs/dra.md, "Share classes": one unit is asked for as
				// the unit's amounts of the share capacities.
				tmpl := &resourceapi.ResourceClaimTemplate{
					ObjectMeta: metav1.ObjectMeta{Name: "share", Namespace: ns},
					Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
						Name: "share", Exactly: &resourceapi.ExactDeviceRequest{
							DeviceClassName: share,
							Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
								dradevice.ShareCapacity(v1alpha1.CapacityMemory):  memory,
								dradevice.ShareCapacity(v1alpha1.CapacityCompute): *resource.NewQuantity(int64(compute), resource.DecimalSI),
							}},
						},
					}}}}},
				}
				if _, err := client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
			},
		},
	}
	order := []string{"baseline-whole", "share", "dra-share"}

	// schedule runs n pods of s in a fresh namespace, measured or not, and
	// deletes them.
	schedule := func(b *testing.B, s side, n int, measured bool) (float64, runFigures) {
		ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"}}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if s.setup != nil {
			s.setup(ns.Name)
		}
		batch := make([]*corev1.Pod, n)
		for i := range batch {
			batch[i] = s.pod(ns.Name, i)
		}
		var (
			podsPerSecond float64
			figures       runFigures
		)
		if measured {
			elapsed, f := scheduleAllMeasured(b, ctx, batch, "bench-run="+ns.Name, s.pool, 10*time.Minute)
			podsPerSecond, figures = float64(n)/elapsed.Seconds(), f
		} else {
			scheduleAll(b, ctx, batch, "bench-run="+ns.Name, 10*time.Minute)
		}
		stayedPending(b, ctx, ns.Name)
		// The pods go at once, before the namespace (scheduleRun says why).
		if err := client.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)}, metav1.ListOptions{}); err != nil {
			b.Fatal(err)
		}
		deleteNamespaceAndWait(b, ctx, ns.Name)
		return podsPerSecond, figures
	}
	for _, name := range order {
		start := time.Now()
		schedule(b, sides[name], warmUpSharePods, false)
		benchLog(b, "warm-up %s: %d pods in %v", name, warmUpSharePods, time.Since(start).Round(100*time.Millisecond))
	}
	time.Sleep(5 * time.Second)
	idle := 1.3*clusterCores(b, 3*time.Second) + 0.05
	benchLog(b, "%d nodes: the cluster idles at %.2f cores or less", 3*nodes, idle)

	for _, name := range order {
		b.Run(name, func(b *testing.B) {
			var (
				podsPerSecond float64
				figures       runFigures
			)
			for b.Loop() {
				b.StopTimer()
				settle(b, idle)
				b.StartTimer()
				podsPerSecond, figures = schedule(b, sides[name], pods, true)
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(podsPerSecond, "pods/s")
			figures.report(b)
			benchLog(b, "%.1f pods/s; other work %.2f cores; CPU ms per pod: %s", podsPerSecond, figures.outside, fmtMap(figures.cpuMS, "%.2f"))
			if figures.outside > maxOutsideCores {
				disturbed(b, "other work used %.2f cores of the machine during the run (at most %.2f for a figure worth reporting)", figures.outside, maxOutsideCores)
			}
		})
	}
}

// warmUpSharePods of each side of ShareSchedulingThroughput are scheduled
// before its first measured run.
const warmUpSharePods = 200

// benchResourceClass creates rc, removed after the benchmark, and returns it
// as created.
func benchResourceClass(b *testing.B, ctx context.Context, rc *v1alpha1.ResourceClass) *v1alpha1.ResourceClass {
	b.Helper()
	client, err := cluster.Resclass()
	if err != nil {
		b.Fatal(err)
	}
	created, err := client.ResclassV1alpha1().ResourceClasses().Create(ctx, rc, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = client.ResclassV1alpha1().ResourceClasses().Delete(context.Background(), rc.Name, metav1.DeleteOptions{})
	})
	return created
}

// checkCapacity fails b unless node's allocatable of class is want.
func checkCapacity(b *testing.B, ctx context.Context, node, class string, want int64) {
	b.Helper()
	n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	q := n.Status.Allocatable[corev1.ResourceName(v1alpha1.ResourceNamePrefix+class)]
	if q.Value() != want {
		b.Fatalf("node %s has %s of %s allocatable, want %d", node, q.String(), class, want)
	}
}

// shareDeviceClass waits for the scheduler's class controller to make the
// share class rc's DeviceClass: pkg/dra's translation, without an extended
// resource name (docs/dra.md, "Share classes").
func shareDeviceClass(b *testing.B, ctx context.Context, rc *v1alpha1.ResourceClass) {
	b.Helper()
	want, err := dra.DeviceClass(rc)
	if err != nil {
		b.Fatal(err)
	}
	var got *resourceapi.DeviceClass
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err = cluster.Client.ResourceV1().DeviceClasses().Get(ctx, rc.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		b.Fatalf("the scheduler never created the DeviceClass of %s: %v", rc.Name, err)
	}
	if got.Spec.ExtendedResourceName != nil || len(got.Spec.Selectors) != 1 || got.Spec.Selectors[0].CEL == nil ||
		got.Spec.Selectors[0].CEL.Expression != want.Spec.Selectors[0].CEL.Expression {
		b.Fatalf("DeviceClass %s is %+v, want pkg/dra's translation %+v", rc.Name, got.Spec, want.Spec)
	}
}
