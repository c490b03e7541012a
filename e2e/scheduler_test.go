package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/scheduler/resourceclasses"
)

const resclassScheduler = "resclass-scheduler"

// schedClass creates a ResourceClass of one selector term, removed after the test.
func schedClass(t testing.TB, ctx context.Context, name string, exprs ...v1alpha1.ResourceSelectorRequirement) {
	t.Helper()
	createClassSpec(t, ctx, name, v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: exprs}}})
}

// createClassSpec creates a ResourceClass of spec, removed after the test.
func createClassSpec(t testing.TB, ctx context.Context, name string, spec v1alpha1.ResourceClassSpec) *v1alpha1.ResourceClass {
	t.Helper()
	rcs, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rcs.ResclassV1alpha1().ResourceClasses().Create(ctx, &v1alpha1.ResourceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       spec,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = rcs.ResclassV1alpha1().ResourceClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return rc
}

func req(key string, op v1alpha1.ResourceSelectorOperator, values ...string) v1alpha1.ResourceSelectorRequirement {
	return v1alpha1.ResourceSelectorRequirement{Key: key, Operator: op, Values: values}
}

// schedPod is a pod of one container requesting count devices of each class,
// pinned to nodes labelled pool=<pool>.
func schedPod(ns, name, pool string, classes map[string]int64, extra corev1.ResourceList) *corev1.Pod {
	limits := corev1.ResourceList{}
	for class, n := range classes {
		limits[corev1.ResourceName(v1alpha1.ResourceNamePrefix+class)] = *resource.NewQuantity(n, resource.DecimalSI)
	}
	for k, v := range extra {
		limits[k] = v
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			SchedulerName: resclassScheduler,
			NodeSelector:  map[string]string{"pool": pool},
			Containers:    []corev1.Container{{Name: "main", Image: "registry.example/train:1", Resources: corev1.ResourceRequirements{Limits: limits}}},
		},
	}
}

func boundAssignment(t *testing.T, ctx context.Context, ns, name string) (*corev1.Pod, *assignment.Assignment) {
	t.Helper()
	var pod *corev1.Pod
	poll(t, ctx, 60*time.Second, "pod "+name+" bound", func(ctx context.Context) (bool, error) {
		var err error
		pod, err = cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && pod.Spec.NodeName != "", err
	})
	a, found, err := assignment.FromPod(pod)
	if err != nil || !found {
		t.Fatalf("pod %s bound to %s without a valid assignment (found %v): %v", name, pod.Spec.NodeName, found, err)
	}
	if a.Node != pod.Spec.NodeName {
		t.Fatalf("pod %s: assignment names node %s, bound to %s", name, a.Node, pod.Spec.NodeName)
	}
	return pod, a
}

// TestSchedulerAssignsDevices: class pods land on nodes whose devices serve all
// their classes at once, with the devices in the assignment annotation;
// overlapping classes are decided as a matching, exhaustion leaves a pod Pending
// with an event naming the problem until a holder is deleted, and ResourceClass
// status follows.
func TestSchedulerAssignsDevices(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	const pool = "sched-assign"
	var nodes []string
	for _, profile := range []string{"dgx-a100", "t4-inference"} {
		names, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{Prefix: "sa-" + strings.Split(profile, "-")[0], Count: map[string]int{"dgx-a100": 2, "t4-inference": 1}[profile], Profile: profile, Labels: map[string]string{"pool": pool}})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, names...)
	}
	t.Cleanup(func() { deleteNodes(nodes) })
	// sa-a100 selects the A100s; sa-gpu every NVIDIA GPU (A100s and T4s): they
	// overlap on the A100s.
	schedClass(t, ctx, "sa-a100", req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"), req("memory", v1alpha1.ResourceSelectorOpGtEq, "30G"))
	schedClass(t, ctx, "sa-gpu", req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"))
	schedClass(t, ctx, "sa-nic", req("kind", v1alpha1.ResourceSelectorOpIn, "nic"), req("speed", v1alpha1.ResourceSelectorOpGtEq, "100Gbps"))
	schedClass(t, ctx, "sa-hp", req("kind", v1alpha1.ResourceSelectorOpIn, "huge-pages"), req("size", v1alpha1.ResourceSelectorOpGtEq, "1G"))
	ns := newNamespace(t, ctx, nil)
	pods := cluster.Client.CoreV1().Pods(ns)

	devicesOf := func(node string) map[string]v1alpha1.Device {
		rc, _ := cluster.Resclass()
		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]v1alpha1.Device{}
		for _, d := range nd.Status.Devices {
			out[d.ID] = d
		}
		return out
	}

	// A: 4 A100s, a fast NIC and a hugepage pool, NUMA-aligned (the shipped
	// configuration's strategy): all on one NUMA node of one DGX.
	a := schedPod(ns, "a", pool, map[string]int64{"sa-a100": 4, "sa-nic": 1, "sa-hp": 1},
		corev1.ResourceList{"hugepages-1Gi": resource.MustParse("4Gi"), corev1.ResourceMemory: resource.MustParse("1Gi")})
	if _, err := pods.Create(ctx, a, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	podA, asgA := boundAssignment(t, ctx, ns, "a")
	if !strings.HasPrefix(podA.Spec.NodeName, "sa-dgx") {
		t.Fatalf("pod a on %s, want a DGX", podA.Spec.NodeName)
	}
	devs := devicesOf(podA.Spec.NodeName)
	numas := map[int64]bool{}
	for class, want := range map[string]int{"sa-a100": 4, "sa-nic": 1, "sa-hp": 1} {
		ids := asgA.Devices("main", class)
		if len(ids) != want {
			t.Fatalf("pod a got %d devices of %s, want %d: %v", len(ids), class, want, ids)
		}
		for _, id := range ids {
			d, ok := devs[id]
			if !ok {
				t.Fatalf("pod a: device %s of %s is not on node %s", id, class, podA.Spec.NodeName)
			}
			numas[*d.Attributes["numaNode"].IntValue] = true
		}
	}
	if len(numas) != 1 {
		t.Errorf("pod a's devices span NUMA nodes %v; NUMAAligned should keep them on one", numas)
	}
	if podA.Annotations[assignment.CompatKey("sa-a100", asgA.Devices("main", "sa-a100")[0])] != "1" {
		t.Errorf("pod a lacks the seed-compat annotation; annotations %v", podA.Annotations)
	}

	// B: 5 A100s plus 3 of any GPU = 8 GPUs: only the other DGX has 8 free.
	// Counting per class on A's node (4 A100s free, 4+2 GPUs "free" for sa-gpu
	// if counted separately) would not tell; the matching does.
	if _, err := pods.Create(ctx, schedPod(ns, "b", pool, map[string]int64{"sa-a100": 5, "sa-gpu": 3}, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	podB, asgB := boundAssignment(t, ctx, ns, "b")
	if podB.Spec.NodeName == podA.Spec.NodeName || !strings.HasPrefix(podB.Spec.NodeName, "sa-dgx") {
		t.Fatalf("pod b on %s (a on %s); only the other DGX has 8 free GPUs", podB.Spec.NodeName, podA.Spec.NodeName)
	}
	if got := slices.Concat(asgB.Devices("main", "sa-a100"), asgB.Devices("main", "sa-gpu")); len(got) != 8 || len(uniq(got)) != 8 {
		t.Fatalf("pod b: want 8 distinct GPUs, got %v", got)
	}

	// C: 3 A100s + 2 GPUs = 5 > the 4 left on A's node, although each class
	// alone fits there. Pending, with the reason in the event.
	if _, err := pods.Create(ctx, schedPod(ns, "c", pool, map[string]int64{"sa-a100": 3, "sa-gpu": 2}, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	msg := waitEventOn(t, ctx, ns, "Pod", "c", "FailedScheduling", "Insufficient free devices")
	for _, want := range []string{"together", "Insufficient free devices of class sa-a100"} {
		if !strings.Contains(msg, want) {
			t.Errorf("FailedScheduling of c does not say %q: %s", want, msg)
		}
	}
	if p, _ := pods.Get(ctx, "c", metav1.GetOptions{}); p.Spec.NodeName != "" {
		t.Fatalf("pod c bound to %s although no node has 5 free A100s", p.Spec.NodeName)
	}

	// Status: 16 A100s, 17 healthy GPUs (the T4 node has one unhealthy).
	// Requested is what a new pod of the class cannot get: the 12 A100s a and
	// b hold count in both classes, whichever class they were taken through.
	waitClassStatus(t, ctx, "sa-a100", nodes, 16, 12)
	waitClassStatus(t, ctx, "sa-gpu", nodes, 17, 12)

	// Deleting A frees its node: C schedules there, without any of B's devices.
	if err := pods.Delete(ctx, "a", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	podC, asgC := boundAssignment(t, ctx, ns, "c")
	if podC.Spec.NodeName != podA.Spec.NodeName {
		t.Errorf("pod c on %s, want %s where a's devices were freed", podC.Spec.NodeName, podA.Spec.NodeName)
	}
	if got := slices.Concat(asgC.Devices("main", "sa-a100"), asgC.Devices("main", "sa-gpu")); len(uniq(got)) != 5 {
		t.Errorf("pod c: want 5 distinct GPUs, got %v", got)
	}
	waitClassStatus(t, ctx, "sa-a100", nodes, 16, 13)

	// The PreBind mode (assignmentWrite: PreBind) writes the same assignment
	// with a patch before the default binder binds.
	d := schedPod(ns, "d", pool, map[string]int64{"sa-gpu": 1}, nil)
	d.Spec.SchedulerName = framework.PreBindSchedulerName
	if _, err := pods.Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, asgD := boundAssignment(t, ctx, ns, "d")
	// The profile's device ids repeat on every simulated node: compare per node.
	held := map[string]bool{}
	for _, a := range []*assignment.Assignment{asgB, asgC} {
		for _, id := range a.DeviceIDs() {
			held[a.Node+"/"+id] = true
		}
	}
	if got := asgD.Devices("main", "sa-gpu"); len(got) != 1 || held[asgD.Node+"/"+got[0]] {
		t.Errorf("pod d got %v on %s; want one GPU that b and c do not hold", got, asgD.Node)
	}

	// allocatable − requested is what new pods of the class get: 17 − 14.
	waitClassStatus(t, ctx, "sa-gpu", nodes, 17, 14)
	for i := 0; ; i++ {
		name := fmt.Sprintf("fill-%d", i)
		if _, err := pods.Create(ctx, schedPod(ns, name, pool, map[string]int64{"sa-gpu": 1}, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if i == 3 {
			waitEventOn(t, ctx, ns, "Pod", name, "FailedScheduling", "Insufficient free devices of class sa-gpu")
			break
		}
		boundAssignment(t, ctx, ns, name)
	}
	waitClassStatus(t, ctx, "sa-gpu", nodes, 17, 17)
}

// waitClassStatus waits until class's figures on nodes are allocatable and
// requested, and the status the scheduler wrote agrees. The status holds
// cluster-wide totals only (other tests' nodes share the cluster), so the
// figures on nodes come from what `kubectl resclass capacity --nodes` runs,
// the plugin's own code over the cluster's objects (resourceclasses.Snapshot),
// and the scheduler's totals must equal that code's totals.
func waitClassStatus(t *testing.T, ctx context.Context, class string, nodes []string, allocatable, requested int64) {
	t.Helper()
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	var alloc, req int64
	var last, want v1alpha1.ResourceClassStatus
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		classes, err := rc.ResclassV1alpha1().ResourceClasses().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		nds, err := rc.ResclassV1alpha1().NodeDevices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		pods, err := cluster.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		snap := resourceclasses.NewSnapshot(classes.Items, nds.Items, pods.Items)
		alloc, req = 0, 0
		for _, n := range snap.NodeStatus()[class] {
			if slices.Contains(nodes, n.Name) {
				alloc += n.Allocatable
				req += n.Requested
			}
		}
		want = snap.Status()[class]
		for _, got := range classes.Items {
			if got.Name == class {
				last = got.Status
			}
		}
		return alloc == allocatable && req == requested &&
			last.Allocatable.Value() == want.Allocatable.Value() && last.Requested.Value() == want.Requested.Value() &&
			last.Available.Value() == last.Allocatable.Value()-last.Requested.Value(), nil
	})
	if err != nil {
		t.Fatalf("ResourceClass %s on %v: want allocatable %d requested %d, got %d/%d; status %s/%s, the plugin's figures %s/%s: %v", class, nodes,
			allocatable, requested, alloc, req, last.Allocatable.String(), last.Requested.String(), want.Allocatable.String(), want.Requested.String(), err)
	}
}

func uniq(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// deleteNodes deletes the Nodes, and stops those of them that are kubelet
// nodes (framework.Cluster.StopKubeletNode).
func deleteNodes(names []string) {
	for _, n := range names {
		_ = cluster.StopKubeletNode(n)
		_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{})
	}
}

// TestSchedulerRestartKeepsAssignments: the scheduler is killed while 600 class
// pods are being scheduled; the new one rebuilds its cache from the pods'
// annotations, and no device ends up assigned twice.
//
// RESCLASS_E2E_RESTART_NODES=5000 runs it at scheduler_perf's scale instead
// of 80 nodes (with 2000 pods; docs/scheduler.md): a one-off, too slow for
// `make test`.
func TestSchedulerRestartKeepsAssignments(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	const pool = "sched-restart"
	nodes, pods := 80, 600 // 640 GPUs
	if v := os.Getenv("RESCLASS_E2E_RESTART_NODES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 80 {
			t.Fatalf("RESCLASS_E2E_RESTART_NODES=%q: want a number of nodes, at least 80", v)
		}
		nodes, pods = n, min(2000, n*15/2)
	}
	names, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{Prefix: "sr-dgx", Count: nodes, Profile: "dgx-a100", Labels: map[string]string{"pool": pool}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNodes(names) })
	schedClass(t, ctx, "sr-gpu", req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"))
	ns := newNamespace(t, ctx, nil)
	client := fastClient(t)

	created := make(chan struct{})
	go func() {
		defer close(created)
		createPods(t, ctx, client, pods, func(i int) *corev1.Pod {
			return schedPod(ns, fmt.Sprintf("p-%03d", i), pool, map[string]int64{"sr-gpu": 1}, nil)
		})
	}()
	// Kill it once a third is bound: some pods are bound, some in flight, the
	// rest pending.
	// The waits grow with the pods at a larger scale (not timings: limits).
	scale := time.Duration(pods / 600)
	poll(t, ctx, scale*120*time.Second, "a third of the pods bound", func(ctx context.Context) (bool, error) {
		return countBound(ctx, ns) >= pods/3, nil
	})
	if err := cluster.RestartScheduler(ctx); err != nil {
		t.Fatal(err)
	}
	<-created
	poll(t, ctx, scale*180*time.Second, "all pods bound after the restart", func(ctx context.Context) (bool, error) {
		return countBound(ctx, ns) == pods, nil
	})
	list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]string{} // node/device -> pod
	twice := 0
	for i := range list.Items {
		p := &list.Items[i]
		a, found, err := assignment.FromPod(p)
		if err != nil || !found || a.Node != p.Spec.NodeName {
			t.Fatalf("pod %s on %s: assignment %v found %v err %v", p.Name, p.Spec.NodeName, a, found, err)
		}
		for _, id := range a.DeviceIDs() {
			key := a.Node + "/" + id
			if other, dup := held[key]; dup {
				twice++
				t.Errorf("device %s assigned to %s and %s", key, other, p.Name)
			}
			held[key] = p.Name
		}
	}
	if len(held) != pods {
		t.Errorf("%d devices held by %d pods of 1 GPU each", len(held), pods)
	}
	t.Logf("%d pods bound across the restart, %d devices assigned twice", pods, twice)
}

// fastClient is an admin client without client-side throttling, for bulk work.
func fastClient(t testing.TB) kubernetes.Interface {
	cfg := rest.CopyConfig(cluster.Config)
	cfg.QPS, cfg.Burst = 2000, 4000
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// createPods creates n pods with 16 workers.
func createPods(t testing.TB, ctx context.Context, client kubernetes.Interface, n int, pod func(i int) *corev1.Pod) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				p := pod(i)
				if _, err := client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					t.Errorf("creating pod %s: %v", p.Name, err)
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

func countBound(ctx context.Context, ns string) int {
	list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return -1
	}
	n := 0
	for _, p := range list.Items {
		if p.Spec.NodeName != "" {
			n++
		}
	}
	return n
}
