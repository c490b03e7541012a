package e2e

import (
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	"github.com/resclass/resclass/pkg/inventory"
)

// BenchmarkSchedulingUnderChurn: how many class pods per second the resclass
// scheduler binds while every node's NodeDevices changes, against the same
// without the changes, in one run (docs/scheduler.md, "NodeDevices churn").
// The nodes are SchedulingThroughput's simulated DGX nodes (8 GPUs and two
// 1Gi hugepage pools each); the pods request 1 GPU of a class.
//
//   - baseline-no-churn: the pods, nothing else.
//   - churn: the same while every node's hugepage pools' free pages change
//     once per RESCLASS_BENCH_CHURN_PERIOD (default 10s, the node agent's
//     --poll-interval: the most often an agent writes them), the nodes'
//     writes spread evenly over the period, each a server-side apply of the
//     NodeDevices status as the agent's publisher (pkg/inventory) makes it.
//     It reports, besides pods/s and the ratio, the NodeDevices writes per
//     second the churn made (nodedevices-writes/s): the machine may not keep
//     up with the period, and this says what was measured.
//   - 5000-nodes/...: the same once more nodes joined the pool, to 5000,
//     unless RESCLASS_BENCH_NODES_5000=0; RESCLASS_BENCH_NODES_5000=only
//     runs these alone.
//
// Throughout both sides, RESCLASS_BENCH_CHURN_WAITING pods (default 100)
// wait for capacity that never comes: 9 GPUs of the class, on nodes of 8. A
// cluster with pods pending for devices is the common case, and they are
// whom a NodeDevices change used to re-activate, each for a scheduling cycle
// over every node.
//
// RESCLASS_BENCH_CHURN_NODES sets the first pool's nodes (default 1000), for
// a quick look on a small cluster; a run has 1000 pods, or 4 per node when
// that is fewer. The runs interleave as SchedulingThroughput's (interleaved:
// RESCLASS_BENCH_ROUNDS rounds, each churn run between two baseline runs,
// the same refusal of a disturbed run), so the ratio is the churn run's pods/s
// over the mean of the baselines right around it.
func BenchmarkSchedulingUnderChurn(b *testing.B) {
	const (
		class = "bench-churn-gpu"
		pool  = "bench-churn"
		large = 5000
	)
	nodes := 1000
	if v := os.Getenv("RESCLASS_BENCH_CHURN_NODES"); v != "" {
		var err error
		if nodes, err = strconv.Atoi(v); err != nil || nodes < 1 || nodes >= large {
			b.Fatalf("RESCLASS_BENCH_CHURN_NODES=%q: want a number of nodes, 1 to %d", v, large-1)
		}
	}
	period := 10 * time.Second
	if v := os.Getenv("RESCLASS_BENCH_CHURN_PERIOD"); v != "" {
		var err error
		if period, err = time.ParseDuration(v); err != nil || period <= 0 {
			b.Fatalf("RESCLASS_BENCH_CHURN_PERIOD=%q: want a duration above 0", v)
		}
	}
	waiting := 100
	if v := os.Getenv("RESCLASS_BENCH_CHURN_WAITING"); v != "" {
		var err error
		if waiting, err = strconv.Atoi(v); err != nil || waiting < 0 {
			b.Fatalf("RESCLASS_BENCH_CHURN_WAITING=%q: want a number of pods, 0 or more", v)
		}
	}
	rounds := 5
	if v := os.Getenv("RESCLASS_BENCH_ROUNDS"); v != "" {
		var err error
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			b.Fatalf("RESCLASS_BENCH_ROUNDS=%q: want a number of rounds, 1 or more", v)
		}
	}
	ctx := context.Background()
	ch := newChurn(b, period)
	addNodes := func(prefix string, count int) {
		names, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{
			Prefix: prefix, Count: count, Profile: "dgx-a100", Labels: map[string]string{"pool": pool},
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { deleteNodes(names) })
		ch.add(ctx, names)
	}
	addNodes("bench-churn", nodes)
	schedClass(b, ctx, class, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"))
	classResource := corev1.ResourceName(v1alpha1.ResourceNamePrefix + class)
	client := fastClient(b)
	warmUp(b, ctx, client, pool, classResource)
	createWaiting(b, ctx, client, pool, classResource, waiting)

	baseline := benchSide{name: "baseline-no-churn", scheduler: resclassScheduler, resource: classResource}
	churning := benchSide{name: "churn", scheduler: resclassScheduler, resource: classResource, during: ch.start}
	pods := min(1000, 4*nodes)
	scale := os.Getenv("RESCLASS_BENCH_NODES_5000")
	if scale != "only" {
		benchLog(b, "%d nodes, %d pods a run, %d waiting; churn: every node's NodeDevices once per %v, %.0f writes/s planned", nodes, pods, waiting, period, float64(nodes)/period.Seconds())
		interleaved(b, ctx, client, measureIdle(b, ctx, nodes), rounds, pods, pool, baseline, []benchSide{churning})
	}
	if scale == "0" {
		return
	}
	b.Run("5000-nodes", func(b *testing.B) {
		addNodes("bench-churn-more", large-nodes)
		benchLog(b, "%d nodes, 1000 pods a run, %d waiting; churn: every node's NodeDevices once per %v, %.0f writes/s planned", large, waiting, period, large/period.Seconds())
		interleaved(b, ctx, client, measureIdle(b, ctx, large), rounds, 1000, pool, baseline, []benchSide{churning})
	})
}

// createWaiting creates n pods that request 9 devices of resourceName, more
// than a node of pool has, and waits until the scheduler has found each
// unschedulable: they wait through the benchmark, in a namespace of their
// own, deleted at its end.
func createWaiting(b *testing.B, ctx context.Context, client kubernetes.Interface, pool string, resourceName corev1.ResourceName, n int) {
	b.Helper()
	if n == 0 {
		return
	}
	ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-waiting-"}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cluster.Client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	createPods(b, ctx, client, n, func(i int) *corev1.Pod {
		p := benchPod(ns.Name, i, resclassScheduler, resourceName, pool)
		p.Spec.Containers[0].Resources.Limits[resourceName] = resource.MustParse("9")
		return p
	})
	err = wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Pods(ns.Name).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, nil
		}
		turnedAway := 0
		for i := range list.Items {
			for _, c := range list.Items[i].Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					turnedAway++
				}
			}
		}
		return turnedAway == n, nil
	})
	if err != nil {
		b.Fatalf("%d waiting pods not all found unschedulable: %v", n, err)
	}
}

// churn rewrites the NodeDevices status of its nodes as their agents would
// when the free pages of the hugepage pools move: each node once per period,
// one node every period/len(nodes), in the nodes' order.
type churn struct {
	b      *testing.B
	period time.Duration
	rc     versioned.Interface
	base   v1alpha1.NodeDevicesStatus // the profile's, as the nodes published it
	nodes  []*churnNode
}

// churnNode is one node's publisher, as its agent's.
type churnNode struct {
	mu      sync.Mutex
	pub     *inventory.Publisher
	current *v1alpha1.NodeDevices // as listed; the publisher knows its own writes since
	writes  int64
}

// churnWriters publish at once: enough that the writes' latency does not
// bound their rate.
const churnWriters = 16

func newChurn(b *testing.B, period time.Duration) *churn {
	b.Helper()
	base, err := framework.LoadProfile("dgx-a100")
	if err != nil {
		b.Fatal(err)
	}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.QPS, cfg.Burst = 2000, 4000
	rc, err := versioned.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return &churn{b: b, period: period, rc: rc, base: base}
}

// add takes nodes into the churn, with their NodeDevices as published.
func (c *churn) add(ctx context.Context, names []string) {
	c.b.Helper()
	client := fastClient(c.b)
	for _, name := range names {
		node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{ResourceVersion: "0"})
		if err != nil {
			c.b.Fatal(err)
		}
		nd, err := c.rc.ResclassV1alpha1().NodeDevices().Get(ctx, name, metav1.GetOptions{ResourceVersion: "0"})
		if err != nil {
			c.b.Fatal(err)
		}
		c.nodes = append(c.nodes, &churnNode{pub: &inventory.Publisher{Resclass: c.rc, Kube: client, Node: node}, current: nd})
	}
}

// start starts the writes (benchSide.during). They run for a tenth of the
// period before it returns, so that the pods meet them going. stop ends
// them and returns the NodeDevices writes per second made
// (nodedevices-writes/s) and, when some failed, how many
// (nodedevices-failed-writes/s).
func (c *churn) start() func() map[string]float64 {
	ctx, cancel := context.WithCancel(context.Background())
	var wrote, failed atomic.Int64
	var firstErr atomic.Value
	next := make(chan *churnNode)
	var wg sync.WaitGroup
	for range churnWriters {
		wg.Go(func() {
			for n := range next {
				ok, err := n.publish(ctx, c.base)
				switch {
				case err != nil && ctx.Err() == nil:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				case ok:
					wrote.Add(1)
				}
			}
		})
	}
	began := time.Now()
	// A ticker drops the ticks a slow receiver misses: writes that fall
	// behind are not made up for, and nodedevices-writes/s says how many
	// were made.
	tick := time.NewTicker(c.period / time.Duration(len(c.nodes)))
	wg.Go(func() {
		defer close(next)
		defer tick.Stop()
		for i := 0; ; i = (i + 1) % len(c.nodes) {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			select {
			case <-ctx.Done():
				return
			case next <- c.nodes[i]:
			}
		}
	})
	time.Sleep(c.period / 10)
	return func() map[string]float64 {
		cancel()
		wg.Wait()
		seconds := time.Since(began).Seconds()
		out := map[string]float64{"nodedevices-writes/s": float64(wrote.Load()) / seconds}
		if n := failed.Load(); n > 0 {
			out["nodedevices-failed-writes/s"] = float64(n) / seconds
			benchLog(c.b, "churn: %d NodeDevices writes failed, the first: %v", n, firstErr.Load())
		}
		return out
	}
}

// publish writes the node's NodeDevices status with its hugepage pools'
// free pages moved (between 1 and 64, never what they were).
func (n *churnNode) publish(ctx context.Context, base v1alpha1.NodeDevicesStatus) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.writes++
	status := *base.DeepCopy()
	for i := range status.Devices {
		if d := &status.Devices[i]; d.Kind == v1alpha1.DeviceKindHugePages {
			d.Attributes[v1alpha1.AttributePagesFree] = v1alpha1.DeviceAttribute{IntValue: ptr.To(1 + (n.writes+int64(i))%64)}
		}
	}
	return n.pub.Publish(ctx, n.current, status)
}
