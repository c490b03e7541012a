package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/cdispec"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// The soak's size. make test runs the defaults; set these for a longer or
// wider run, and RESCLASS_SOAK_SEED to replay one (every run prints its seed).
const (
	soakDurationEnv = "RESCLASS_SOAK_DURATION" // faults for this long (Go duration); default 40s
	soakNodesEnv    = "RESCLASS_SOAK_NODES"    // kubelet nodes with an agent on a mock DGX A100 (8 GPUs); default 2
	soakSeedEnv     = "RESCLASS_SOAK_SEED"     // the random seed; default the clock
)

// soakWindow is how long before its node's agent stopped (or after: the
// kubelet's next status sync, 2 s on this harness, and the scheduler's
// informer) a pod may have been bound and still fail the kubelet's admission.
// Such a pod's Allocate comes when the agent is gone or going: the endpoint
// drains what is in flight, not what has not arrived. Any other failed
// admission fails the soak.
const soakWindow = 5 * time.Second

// TestSoakFleetFaults creates and deletes GPU pods without pause on real
// kubelet nodes while, at random, their node agents stop and start again,
// NVML fails for a while, the scheduler is killed (SIGKILL) and restarted, and
// the webhook, with the pod policies on, is killed and restarted. It checks,
// all along and at the end:
//
//   - no device is ever in the assignments of two live pods, and each running
//     container got from the kubelet exactly the GPUs its assignment names;
//   - once the faults stop, every pod that fits is placed and runs: none is
//     left Pending with room for it on some node;
//   - no pod fails admission, except those bound within soakWindow of their
//     node's agent stopping (counted, and printed);
//   - a pod the policies do not cover is never refused, webhook down or not;
//     one they cover is never admitted.
func TestSoakFleetFaults(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	duration, nodeCount, seed := soakSize(t)
	t.Logf("soak: seed %d (replay with %s=%d), %d nodes, %v of faults", seed, soakSeedEnv, seed, nodeCount, duration)
	ctx, cancel := context.WithTimeout(context.Background(), duration+5*time.Minute)
	defer cancel()

	const class = "e2e-soak-gpu"
	nodeLabel := map[string]string{"e2e-soak": "on"}
	if _, err := cluster.ApplyManifest(ctx, "../deploy/node-agent/rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	schedClass(t, ctx, class, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"))
	priorityClass(t, ctx, "cluster-services")
	wh := startWebhook(t, framework.WebhookOptions{Policies: componentPolicies, Selector: webhookLabel})
	ns := newNamespace(t, ctx, webhookLabel)

	nodes := make([]*soakNode, nodeCount)
	for i := range nodes {
		nodes[i] = startSoakNode(t, ctx, fmt.Sprintf("soak-%d", i), class, nodeLabel)
	}
	w := &soakWorld{
		t: t, ns: ns, class: class, nodeLabel: nodeLabel, nodes: nodes, wh: wh,
		rng:    rand.New(rand.NewPCG(uint64(seed), 0x50a4)), //nolint:gosec // a replayable schedule, not a secret
		byName: map[string]*soakNode{}, pods: map[string]*soakPod{}, faults: map[string]int{},
	}
	for _, n := range nodes {
		w.byName[n.name] = n
	}

	checkCtx, stopChecks := context.WithCancel(ctx)
	var checks sync.WaitGroup
	checks.Go(func() { w.sample(checkCtx) })
	checks.Go(func() { w.watch(checkCtx) })
	churnCtx, stopChurn := context.WithCancel(ctx)
	var churn sync.WaitGroup
	churn.Go(func() { w.create(churnCtx) })
	churn.Go(func() { w.reap(churnCtx, true) })

	start := time.Now()
	w.inject(ctx, time.Now().Add(duration))
	faultsEnded := time.Now()
	stopChurn()
	churn.Wait()
	t.Logf("soak: faults for %v: %s", faultsEnded.Sub(start).Round(time.Millisecond), w.faultSummary())

	// Every pod that can run runs: deletions and creations have stopped
	// (failed pods are still taken away), and no fault is pending.
	reapCtx, stopReap := context.WithCancel(ctx)
	var reap sync.WaitGroup
	reap.Go(func() { w.reap(reapCtx, false) })
	settled := w.settle(ctx, 2*time.Minute)
	stopReap()
	reap.Wait()
	stopChecks()
	checks.Wait()
	t.Logf("soak: settled %v after the faults stopped", settled.Round(time.Millisecond))

	w.checkKubelets(ctx)
	w.report(faultsEnded.Sub(start))
}

// soakSize reads the soak's duration, node count and seed.
func soakSize(t *testing.T) (time.Duration, int, int64) {
	duration, nodes, seed := 40*time.Second, 2, time.Now().UnixNano()
	if v := os.Getenv(soakDurationEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration such as 10m", soakDurationEnv, v)
		}
		duration = d
	}
	if v := os.Getenv(soakNodesEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 50 {
			t.Fatalf("%s=%q: want 1 to 50 nodes", soakNodesEnv, v)
		}
		nodes = n
	}
	if v := os.Getenv(soakSeedEnv); v != "" {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want the integer seed a run printed", soakSeedEnv, v)
		}
		seed = s
	}
	return duration, nodes, seed
}

// soakNode is a kubelet node whose agent the soak stops and starts.
type soakNode struct {
	name     string
	kn       *framework.KubeletNode
	dgx      *nvmlmock.Server
	root     string
	dir      string
	rc       versioned.Interface
	kc       kubernetes.Interface
	starts   int
	stop     func() error // nil while the agent is stopped
	stopped  []time.Time  // when the agent was stopped
	started  []time.Time  // when it was started
	nvmlDown bool
}

const soakGPUs = 8 // a mock DGX A100's

func startSoakNode(t *testing.T, ctx context.Context, name, class string, labels map[string]string) *soakNode {
	t.Helper()
	kn, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: name, Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNodes([]string{name}) })
	n := &soakNode{name: name, kn: kn, dir: t.TempDir()}
	n.dgx, n.root = mockDGX(t)
	n.rc, n.kc = agentClients(t, name)
	n.startAgent(t, ctx)
	waitClassAllocatable(t, ctx, name+"'s agent endpoint in the node's allocatable", name, class, soakGPUs)
	return n
}

// startAgent starts the node's agent as the DaemonSet would after a crash:
// a new process, with nothing of the old one's memory.
func (n *soakNode) startAgent(t *testing.T, ctx context.Context) {
	n.starts++
	n.started = append(n.started, time.Now())
	cfg := mockGPUAgent(n.kn, n.dgx, n.root, n.dir)
	// A socket of its own each time: the stopped agent may not have removed its own yet.
	cfg.IntrospectionSocket = filepath.Join(n.dir, fmt.Sprintf("agent-%d.sock", n.starts))
	// NVML is asked every second, so a fault is seen within the soak.
	cfg.ResyncInterval, cfg.OpenRetryMax = time.Second, time.Second
	cfg.DeviceGracePeriod = 3 * time.Minute
	n.stop, _ = runAgent(t, ctx, nodeagent.New(cfg, n.rc, n.kc))
}

// soakPod is what the soak knows of a pod it created.
type soakPod struct {
	name    string
	gpus    int
	created time.Time
	life    time.Duration // how long it runs before the soak deletes it
	running time.Time     // when the soak first saw it Running
	bound   time.Time
	node    string
	deleted bool
}

// soakFailure is a pod that failed the kubelet's admission.
type soakFailure struct {
	pod, node, reason string
	bound             time.Time
	excused           bool
	// after is how long after the agent's nearest stop it was bound
	// (negative: before).
	after time.Duration
}

type soakWorld struct {
	t         *testing.T
	ns, class string
	nodeLabel map[string]string
	nodes     []*soakNode
	byName    map[string]*soakNode
	wh        *framework.Webhook

	mu       sync.Mutex
	rng      *rand.Rand
	pods     map[string]*soakPod
	created  int
	faults   map[string]int
	failures []soakFailure
	// refused: creations of pods the policies do not cover that the
	// apiserver refused; admitted: of pods they cover that it admitted.
	refused, admitted []string
	coveredRefused    int
	doubles           []string
	samples           int
	webhookDown       bool
}

func (w *soakWorld) intn(n int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rng.IntN(n)
}

func (w *soakWorld) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(w.intn(int(hi-lo)/int(time.Millisecond)))*time.Millisecond
}

// inject plays faults until end, one every 1.5 to 4 s, and returns once
// every one of them has been undone.
func (w *soakWorld) inject(ctx context.Context, end time.Time) {
	var undo sync.WaitGroup
	defer undo.Wait()
	for time.Now().Before(end) && ctx.Err() == nil {
		time.Sleep(w.between(1500*time.Millisecond, 4*time.Second))
		switch pick := w.intn(7); {
		case pick < 3: // an agent stops (its pod is evicted, OOM-killed, upgraded)
			n := w.nodes[w.intn(len(w.nodes))]
			w.mu.Lock()
			running := n.stop != nil
			w.mu.Unlock()
			if !running {
				continue
			}
			w.count("agent")
			w.mu.Lock()
			n.stopped = append(n.stopped, time.Now())
			stop := n.stop
			n.stop = nil
			w.mu.Unlock()
			if err := stop(); err != nil {
				w.t.Errorf("agent of %s: %v", n.name, err)
			}
			down := w.between(2*time.Second, 6*time.Second)
			undo.Go(func() {
				time.Sleep(down)
				w.mu.Lock()
				defer w.mu.Unlock()
				n.startAgent(w.t, ctx)
			})
		case pick < 5: // NVML fails for a while, the driver staying loaded
			n := w.nodes[w.intn(len(w.nodes))]
			w.mu.Lock()
			failing := n.nvmlDown
			n.nvmlDown = true
			w.mu.Unlock()
			if failing {
				continue
			}
			w.count("nvml")
			n.dgx.FailCount(lib.ERROR_UNKNOWN)
			down := w.between(time.Second, 5*time.Second)
			undo.Go(func() {
				time.Sleep(down)
				n.dgx.FailCount(lib.SUCCESS)
				w.mu.Lock()
				n.nvmlDown = false
				w.mu.Unlock()
			})
		case pick < 6: // the scheduler's node dies
			w.count("scheduler")
			if err := cluster.RestartScheduler(ctx); err != nil {
				w.t.Errorf("restarting the scheduler: %v", err)
			}
		default: // every webhook replica is down for a while
			w.mu.Lock()
			down := w.webhookDown
			w.webhookDown = true
			w.mu.Unlock()
			if down {
				continue
			}
			w.count("webhook")
			w.wh.Kill()
			after := w.between(time.Second, 4*time.Second)
			undo.Go(func() {
				time.Sleep(after)
				if err := w.wh.Restart(ctx); err != nil {
					w.t.Errorf("restarting the webhook: %v", err)
				}
				w.mu.Lock()
				w.webhookDown = false
				w.mu.Unlock()
			})
		}
	}
}

func (w *soakWorld) count(fault string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.faults[fault]++
}

func (w *soakWorld) faultSummary() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Sprintf("agents stopped %d, NVML failing %d, scheduler killed %d, webhook killed %d",
		w.faults["agent"], w.faults["nvml"], w.faults["scheduler"], w.faults["webhook"])
}

// create keeps about one and a half times what the nodes hold asked for:
// pods of 1 or 2 GPUs that run 2 to 10 s, so that some always wait. One
// creation in ten is a pod the policies cover (a cluster-services pod without
// a covering quota), which must never be admitted.
func (w *soakWorld) create(ctx context.Context) {
	capacity := len(w.nodes) * soakGPUs
	for ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		w.mu.Lock()
		asked := 0
		for _, p := range w.pods {
			if !p.deleted {
				asked += p.gpus
			}
		}
		if asked >= capacity*3/2 {
			w.mu.Unlock()
			continue
		}
		w.created++
		p := &soakPod{name: fmt.Sprintf("p-%05d", w.created), gpus: 1 + w.rng.IntN(2), life: 2*time.Second + time.Duration(w.rng.IntN(8000))*time.Millisecond}
		covered := w.rng.IntN(10) == 0
		w.mu.Unlock()

		pod := gpuPodOn(w.ns, p.name, resclassScheduler, "", w.class, int64(p.gpus))
		pod.Labels = webhookLabel
		pod.Spec.NodeSelector = w.nodeLabel
		if covered {
			pod.Name = "covered-" + p.name
			pod.Spec.PriorityClassName = "cluster-services"
		}
		_, err := cluster.Client.CoreV1().Pods(w.ns).Create(ctx, pod, metav1.CreateOptions{})
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		switch {
		case covered && err == nil:
			w.admitted = append(w.admitted, pod.Name)
			p.name = pod.Name
			w.pods[p.name] = p
		case covered:
			w.coveredRefused++
		case err != nil:
			w.refused = append(w.refused, fmt.Sprintf("%s: %v", p.name, err))
		default:
			p.created = time.Now()
			w.pods[p.name] = p
		}
		w.mu.Unlock()
	}
}

// reap deletes the pods that failed (after noting why) and, with expire,
// those that ran their life, and the Pending ones a user gives up on after
// 20 s.
func (w *soakWorld) reap(ctx context.Context, expire bool) {
	for ctx.Err() == nil {
		time.Sleep(200 * time.Millisecond)
		list, err := cluster.Client.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		for i := range list.Items {
			pod := &list.Items[i]
			w.mu.Lock()
			p := w.pods[pod.Name]
			del := false
			switch {
			case p == nil || p.deleted:
			case pod.Status.Phase == corev1.PodFailed:
				w.failed(p, pod)
				del = true
			case !expire:
			case pod.Status.Phase == corev1.PodRunning && !p.running.IsZero() && time.Since(p.running) > p.life:
				del = true
			case pod.Spec.NodeName == "" && time.Since(p.created) > 20*time.Second:
				del = true
			}
			if del {
				p.deleted = true
			}
			w.mu.Unlock()
			if del {
				_ = cluster.Client.CoreV1().Pods(w.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))})
			}
		}
	}
}

// failed notes a pod that failed admission, excused if it was bound within
// soakWindow of its node's agent stopping. Called with w.mu held.
func (w *soakWorld) failed(p *soakPod, pod *corev1.Pod) {
	f := soakFailure{pod: pod.Name, node: pod.Spec.NodeName, reason: pod.Status.Reason + ": " + pod.Status.Message, bound: boundAt(pod)}
	if f.bound.IsZero() { // the kubelet's status of a refused pod has no conditions
		f.bound = p.bound
	}
	if n := w.byName[f.node]; n != nil {
		for i, s := range n.stopped {
			f.reason += fmt.Sprintf(" [stop %d at %+.1fs", i, s.Sub(f.bound).Seconds())
			if i < len(n.started)-1 {
				f.reason += fmt.Sprintf(", started %+.1fs", n.started[i+1].Sub(f.bound).Seconds())
			}
			f.reason += "]"
		}
		// The condition's time has a resolution of a second.
		for _, s := range n.stopped {
			if !f.bound.Before(s.Add(-soakWindow-time.Second)) && !f.bound.After(s.Add(soakWindow)) {
				if d := f.bound.Sub(s); !f.excused || d.Abs() < f.after.Abs() {
					f.after = d
				}
				f.excused = true
			}
		}
	}
	w.failures = append(w.failures, f)
}

func boundAt(pod *corev1.Pod) time.Time {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// sample checks, every 300 ms, that no device is in the assignments of two
// live pods, and notes when pods are bound and running.
func (w *soakWorld) sample(ctx context.Context) {
	for ctx.Err() == nil {
		time.Sleep(300 * time.Millisecond)
		list, err := cluster.Client.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		holder := map[string]string{}
		var doubles []string
		w.mu.Lock()
		w.samples++
		for i := range list.Items {
			pod := &list.Items[i]
			if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
				continue
			}
			a, found, err := assignment.FromPod(pod)
			if !found || err != nil {
				continue
			}
			for _, id := range a.DeviceIDs() {
				key := a.Node + "/" + id
				if other, ok := holder[key]; ok {
					doubles = append(doubles, fmt.Sprintf("%s given to %s and %s", key, other, pod.Name))
				}
				holder[key] = pod.Name
			}
		}
		w.doubles = append(w.doubles, doubles...)
		w.mu.Unlock()
	}
}

// watch notes when each pod is bound and when it first runs, as the
// apiserver tells them: a pod the kubelet refuses fails within a sample's
// interval, and its status then has no PodScheduled condition.
func (w *soakWorld) watch(ctx context.Context) {
	for ctx.Err() == nil {
		watcher, err := cluster.Client.CoreV1().Pods(w.ns).Watch(ctx, metav1.ListOptions{})
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for ev := range watcher.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			w.mu.Lock()
			if p := w.pods[pod.Name]; p != nil {
				if pod.Spec.NodeName != "" && p.node == "" {
					p.node, p.bound = pod.Spec.NodeName, time.Now()
				}
				if pod.Status.Phase == corev1.PodRunning && p.running.IsZero() {
					p.running = time.Now()
				}
			}
			w.mu.Unlock()
		}
	}
}

// settle waits until every pod the soak left is Running, or Pending with no
// node that has room for it, and returns how long that took.
func (w *soakWorld) settle(ctx context.Context, timeout time.Duration) time.Duration {
	start := time.Now()
	var why string
	poll(w.t, ctx, timeout, "every pod that fits placed and running", func(ctx context.Context) (bool, error) {
		list, err := cluster.Client.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		used := map[string]int{}
		var pending []*corev1.Pod
		why = ""
		for i := range list.Items {
			pod := &list.Items[i]
			if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed {
				why = pod.Name + " not yet gone"
				continue
			}
			if pod.Spec.NodeName == "" {
				pending = append(pending, pod)
				continue
			}
			used[pod.Spec.NodeName] += podGPUs(pod, w.class)
			if pod.Status.Phase != corev1.PodRunning {
				why = fmt.Sprintf("%s bound to %s, %s", pod.Name, pod.Spec.NodeName, pod.Status.Phase)
			}
		}
		for _, pod := range pending {
			for _, n := range w.nodes {
				if soakGPUs-used[n.name] >= podGPUs(pod, w.class) {
					why = fmt.Sprintf("%s (%d GPUs) Pending while %s has %d free", pod.Name, podGPUs(pod, w.class), n.name, soakGPUs-used[n.name])
				}
			}
		}
		return why == "", nil
	})
	return time.Since(start)
}

func podGPUs(pod *corev1.Pod, class string) int {
	q := pod.Spec.Containers[0].Resources.Limits[corev1.ResourceName(v1alpha1.ResourceNamePrefix+class)]
	return int(q.Value())
}

// checkKubelets: every running pod's container was created by its kubelet
// with exactly the GPUs its assignment names (CDI names), and no two running
// pods on a node got the same one.
func (w *soakWorld) checkKubelets(ctx context.Context) {
	list, err := cluster.Client.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	given := map[string]string{}
	for i := range list.Items {
		pod := &list.Items[i]
		if pod.Status.Phase != corev1.PodRunning {
			continue
		}
		a, _, err := assignment.FromPod(pod)
		if err != nil || a == nil {
			w.t.Errorf("%s runs without a valid assignment: %v", pod.Name, err)
			continue
		}
		var want []string
		for _, id := range a.DeviceIDs() {
			want = append(want, cdispec.Kind+"="+id)
		}
		rec, err := w.byName[pod.Spec.NodeName].kn.WaitForRecord(ctx, w.ns, pod.Name, "c")
		if err != nil {
			w.t.Errorf("%s: %v", pod.Name, err)
			continue
		}
		var got []string
		for _, d := range rec.CDIDevices {
			got = append(got, d.GetName())
		}
		sort.Strings(want)
		sort.Strings(got)
		if !slices.Equal(got, want) {
			w.t.Errorf("%s on %s: the kubelet gave %v, its assignment names %v", pod.Name, pod.Spec.NodeName, got, want)
		}
		for _, name := range got {
			key := pod.Spec.NodeName + "/" + name
			if other, ok := given[key]; ok {
				w.t.Errorf("the kubelet of %s gave %s to both %s and %s", pod.Spec.NodeName, name, other, pod.Name)
			}
			given[key] = pod.Name
		}
	}
}

// report fails the soak on what must never happen and prints its figures.
func (w *soakWorld) report(faulted time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var bound, ran, excused int
	for _, p := range w.pods {
		if p.node != "" {
			bound++
		}
		if !p.running.IsZero() {
			ran++
		}
	}
	var unexcused []string
	var lag []time.Duration
	for _, f := range w.failures {
		if f.excused {
			excused++
			lag = append(lag, f.after)
			continue
		}
		unexcused = append(unexcused, fmt.Sprintf("%s on %s, bound %s: %s", f.pod, f.node, f.bound.Format(time.RFC3339), f.reason))
	}
	w.t.Logf("soak: %d pods created in %v (%d bound, %d ran), %d samples: %d devices given twice; "+
		"%d failed admission (%d bound within %v of their node's agent stopping); "+
		"%d uncovered pods refused, %d covered pods refused, %d admitted",
		w.created, faulted.Round(time.Second), bound, ran, w.samples, len(w.doubles),
		len(w.failures), excused, soakWindow, len(w.refused), w.coveredRefused, len(w.admitted))
	if len(lag) > 0 {
		slices.Sort(lag)
		w.t.Logf("soak: those were bound from %v to %v after their node's agent stopped (median %v): the time the kubelet and the scheduler take to see it",
			lag[0].Round(time.Millisecond), lag[len(lag)-1].Round(time.Millisecond), lag[len(lag)/2].Round(time.Millisecond))
	}
	if len(w.doubles) > 0 {
		w.t.Errorf("devices given twice:\n%s", strings.Join(w.doubles, "\n"))
	}
	if len(unexcused) > 0 {
		w.t.Errorf("pods that failed admission away from any agent stop:\n%s", strings.Join(unexcused, "\n"))
	}
	if len(w.refused) > 0 {
		w.t.Errorf("pods no policy covers, refused:\n%s", strings.Join(w.refused, "\n"))
	}
	if len(w.admitted) > 0 {
		w.t.Errorf("pods the policies cover, admitted without a covering quota: %v", w.admitted)
	}
	if ran == 0 || w.coveredRefused == 0 {
		w.t.Errorf("the soak proved nothing: %d pods ran, %d covered pods were tried", ran, w.coveredRefused)
	}
}
