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
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// BenchmarkSchedulingThroughput is scheduler_perf's question on the embedded
// apiserver: how many pods per second the resclass scheduler binds, on 1000
// simulated DGX nodes of 8 GPUs (kwok; no kubelet is needed to bind).
//
//   - baseline-extended-resource: the same binary schedules the pods
//     requesting a plain extended resource (example.com/gpu, 8 per node), which
//     the plugin skips: what kube-scheduler does without device selection.
//   - class: pods request 1 GPU as class.resclass.io/<class>; the
//     ResourceClasses plugin picks node and device and writes the assignment.
//   - class-prebind: the same, with the assignment patched onto the pod before
//     the binding instead of written in it (assignmentWrite: PreBind): one
//     more pod write.
//   - class-topology: the same, with strategy Topology (Reserve runs the
//     topology search once per pod).
//   - 5000-nodes/baseline-extended-resource and 5000-nodes/class: the
//     baseline and class runs once 4000 more nodes joined the pool
//     (scheduler_perf's 5000 nodes), unless RESCLASS_BENCH_NODES_5000=0;
//     RESCLASS_BENCH_NODES_5000=only runs these alone.
//
// RESCLASS_BENCH_SIDES (a comma-separated list of class, class-prebind,
// class-topology) runs only those sides against the baseline, for a quicker
// look at one of them; the 5000-node variant runs the first of them.
//
// The machine's speed moves by tens of percent within minutes, and by 15-30%
// from one run to the next (docs/scheduler.md, "Interleaved rounds"), so the
// runs interleave (interleaved): a baseline run, then each class side's run
// followed by a baseline run, RESCLASS_BENCH_ROUNDS rounds (default 5). A
// side's ratio in a round is its pods/s over the mean of the two baselines
// right before and after its run; the side reports the median of its rounds'
// ratios (unit "ratio"), its median pods/s and the breakdown of its median run
// (breakdown_test.go, docs/scheduler.md "Where the time goes").
//
// The pods stay Pending once bound (framework.SimulatedPendingLabel), as in
// scheduler_perf, and 500 pods of each kind are scheduled before the first
// run (warmUpPods). Each run creates the pods (16 writers) and measures from
// the first create to the last pod bound; ns/op means nothing here and is
// suppressed.
//
// The benchmark refuses to report a disturbed run (docs/scheduler.md): one
// during which processes other than the cluster's and the benchmark's used more
// than maxOutsideCores, or in which, for a side, fewer than minValidRounds of
// its runs had baselines within maxBaselineSpread of each other around them.
func BenchmarkSchedulingThroughput(b *testing.B) {
	const (
		nodes = 1000
		more  = 4000 // the 5000-node variant's
		pods  = 1000 // per run: 31 runs at 5 rounds fit in about 10 minutes
		class = "bench-gpu"
		plain = corev1.ResourceName("example.com/gpu")
		pool  = "bench-throughput"
	)
	ctx := context.Background()
	addNodes := func(prefix string, count int) {
		names, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{
			Prefix: prefix, Count: count, Profile: "dgx-a100",
			Labels:   map[string]string{"pool": pool},
			Capacity: corev1.ResourceList{plain: resource.MustParse("8")},
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { deleteNodes(names) })
	}
	addNodes("bench-dgx", nodes)
	schedClass(b, ctx, class, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"), req("memory", v1alpha1.ResourceSelectorOpGtEq, "30G"))
	classResource := corev1.ResourceName(v1alpha1.ResourceNamePrefix + class)
	rounds := 5
	if v := os.Getenv("RESCLASS_BENCH_ROUNDS"); v != "" {
		var err error
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			b.Fatalf("RESCLASS_BENCH_ROUNDS=%q: want a number of rounds, 1 or more", v)
		}
	}
	client := fastClient(b)
	// The first pods a fresh cluster schedules cost more than the later ones
	// (the processes' heaps and caches grow, the apiserver's watch cache
	// fills): scheduled unmeasured, of both kinds, so that neither the
	// baseline nor the class run pays for them (docs/scheduler.md, "Drift").
	warmUp(b, ctx, client, pool, plain)
	warmUp(b, ctx, client, pool, classResource)
	idle := measureIdle(b, ctx, nodes)

	sides := []benchSide{
		{name: "class", scheduler: resclassScheduler, resource: classResource},
		{name: "class-prebind", scheduler: framework.PreBindSchedulerName, resource: classResource},
		{name: "class-topology", scheduler: framework.TopologySchedulerName, resource: classResource},
	}
	if only := os.Getenv("RESCLASS_BENCH_SIDES"); only != "" {
		sides = slices.DeleteFunc(sides, func(s benchSide) bool { return !slices.Contains(strings.Split(only, ","), s.name) })
		if len(sides) == 0 {
			b.Fatalf("RESCLASS_BENCH_SIDES=%q: want some of class, class-prebind, class-topology", only)
		}
	}
	baseline := benchSide{name: "baseline-extended-resource", scheduler: resclassScheduler, resource: plain}
	scale := os.Getenv("RESCLASS_BENCH_NODES_5000")
	if scale != "only" {
		interleaved(b, ctx, client, idle, rounds, pods, pool, baseline, sides)
	}
	if scale == "0" {
		return
	}
	b.Run("5000-nodes", func(b *testing.B) {
		addNodes("bench-dgx-more", more)
		idle = measureIdle(b, ctx, nodes+more)
		interleaved(b, ctx, client, idle, rounds, pods, pool, baseline, sides[:1])
	})
}

// warmUp schedules warmUpPods pods of resourceName on the nodes of pool,
// unmeasured, and deletes them.
func warmUp(b *testing.B, ctx context.Context, client kubernetes.Interface, pool string, resourceName corev1.ResourceName) {
	b.Helper()
	ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-warmup-"}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	batch := make([]*corev1.Pod, warmUpPods)
	for i := range batch {
		batch[i] = benchPod(ns.Name, i, resclassScheduler, resourceName, pool)
	}
	scheduleAll(b, ctx, batch, "bench-run="+ns.Name, 5*time.Minute)
	deleteNamespaceAndWait(b, ctx, ns.Name)
}

// measureIdle is what the cluster of nodes uses with nothing to schedule
// (kwok's heartbeats for the nodes, the controllers), with a margin: each
// run starts once it is back there (settle).
func measureIdle(b *testing.B, ctx context.Context, nodes int) float64 {
	b.Helper()
	time.Sleep(5 * time.Second) // the nodes' first heartbeats and NodeDevices
	idle := 1.3*idleBreakdown(b, ctx, 10*time.Second) + 0.05
	benchLog(b, "%d nodes: the cluster idles at %.2f cores or less", nodes, idle)
	return idle
}

// benchSide is what one of SchedulingThroughput's runs schedules: pods
// requesting one of resource, by the scheduler named scheduler.
type benchSide struct {
	name      string
	scheduler string
	resource  corev1.ResourceName
	// during, if set, starts what runs alongside the side's pods
	// (SchedulingUnderChurn's NodeDevices writes) once the cluster has
	// settled, before the first pod is created; the stop it returns is called
	// once the last pod is bound and returns what it did: figures by unit,
	// reported as the side's medians.
	during func() (stop func() map[string]float64)
}

// benchRun is one run's figures.
type benchRun struct {
	podsPerSecond float64
	figures       runFigures
	probe         [2]time.Duration // framework.SpeedProbe right before and after the run
	// settled is how long the run waited for the cluster to idle before it,
	// cleanup how long deleting its pods took after it.
	settled, cleanup time.Duration
	// alongside is what the side's during did, by unit.
	alongside map[string]float64
}

// interleaved runs SchedulingThroughput's rounds on the cluster as it is
// (docs/scheduler.md, "Interleaved rounds"): a baseline run, then for each
// round one run of each of sides, each followed by a baseline run, so that
// every run of a side has a baseline right before and right after it. Then it
// reports, as sub-benchmarks of b, each side's median ratio to its brackets
// and the baseline's median pods/s, or refuses the run (disturbed).
func interleaved(b *testing.B, ctx context.Context, client kubernetes.Interface, idle float64, rounds, pods int, pool string, baseline benchSide, sides []benchSide) {
	b.Helper()
	runs := map[string][]benchRun{}
	measure := func(s benchSide, round int) benchRun {
		r := scheduleRun(b, ctx, client, idle, pods, pool, s, fmt.Sprintf("%s-%d", s.name, len(runs[s.name])))
		runs[s.name] = append(runs[s.name], r)
		benchLog(b, "round %d %s: %.1f pods/s; speed probe %v before, %v after; other work %.2f cores; settled in %v, cleaned up in %v; CPU ms per pod: %s; scheduler: %.0f KB allocated per pod, %.0f GCs, live heap %.0f MB",
			round, s.name, r.podsPerSecond, r.probe[0].Round(10*time.Microsecond), r.probe[1].Round(10*time.Microsecond),
			r.figures.outside, r.settled.Round(100*time.Millisecond), r.cleanup.Round(100*time.Millisecond), fmtMap(r.figures.cpuMS, "%.2f"),
			r.figures.schedAllocB/1024, r.figures.schedGCs, r.figures.schedLiveB/1e6)
		if r.alongside != nil {
			benchLog(b, "round %d %s: alongside the pods: %s", round, s.name, fmtMap(r.alongside, "%.1f"))
		}
		return r
	}
	// brackets[side][round]: the side's run of the round and its baselines.
	brackets := map[string][]framework.Bracketed{}
	before := measure(baseline, 0)
	for round := range rounds {
		for _, s := range sides {
			run := measure(s, round)
			after := measure(baseline, round)
			brackets[s.name] = append(brackets[s.name], framework.Bracketed{Before: before.podsPerSecond, Run: run.podsPerSecond, After: after.podsPerSecond})
			before = after
		}
	}

	var outside float64
	for _, rs := range runs {
		for _, r := range rs {
			outside = max(outside, r.figures.outside)
		}
	}
	// valid[side]: the rounds whose brackets are at most maxBaselineSpread
	// apart.
	valid := map[string][]int{}
	var reasons []string // every reason at once: a refused run is read for why
	if outside > maxOutsideCores {
		reasons = append(reasons, fmt.Sprintf("other work used up to %.2f cores of the machine during a run (at most %.2f for a figure worth reporting)", outside, maxOutsideCores))
	}
	for _, s := range sides {
		for r, br := range brackets[s.name] {
			benchLog(b, "round %d %s: %.3f of the baselines around it, %.1f and %.1f pods/s, %.0f%% apart", r, s.name, br.Ratio(), br.Before, br.After, 100*br.Spread())
			if br.Spread() <= maxBaselineSpread {
				valid[s.name] = append(valid[s.name], r)
			}
		}
		if n := len(valid[s.name]); n < minValidRounds(rounds) {
			reasons = append(reasons, fmt.Sprintf("%s: %d of %d runs had baselines within %.0f%% of each other around them, at least %d for a figure worth reporting: the machine's speed moved within a run's neighbourhood",
				s.name, n, rounds, 100*maxBaselineSpread, minValidRounds(rounds)))
		}
	}
	if len(reasons) > 0 {
		disturbed(b, "%s", strings.Join(reasons, "; "))
	}

	report := func(b *testing.B, name string, chosen []benchRun, ratios []float64, rounds []int) {
		pps := make([]float64, len(chosen))
		for i, r := range chosen {
			pps[i] = r.podsPerSecond
		}
		// The breakdown is the median run's: by ratio for a side, by pods/s
		// for the baseline.
		median := framework.MedianIndex(pps)
		if ratios != nil {
			median = framework.MedianIndex(ratios)
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() { // the runs are done; nothing to time
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(framework.Median(pps), "pods/s")
			for unit := range chosen[0].alongside {
				values := make([]float64, len(chosen))
				for i, r := range chosen {
					values[i] = r.alongside[unit]
				}
				b.ReportMetric(framework.Median(values), unit)
			}
			if ratios != nil {
				b.ReportMetric(framework.Median(ratios), "ratio")
				b.Logf("ratio by valid round %v: %s; pods/s %s; the breakdown below is the median run's, round %d's",
					rounds, fmtFloats(ratios, "%.3f"), fmtFloats(pps, "%.1f"), rounds[median])
			} else {
				b.Logf("pods/s by run: %s; the breakdown below is the median run's, the %d. baseline", fmtFloats(pps, "%.1f"), median+1)
			}
			chosen[median].figures.report(b)
		})
	}
	report(b, baseline.name, runs[baseline.name], nil, nil)
	for _, s := range sides {
		rs := valid[s.name]
		if len(rs) == 0 { // reported anyway (RESCLASS_BENCH_ALLOW_DISTURBED=1): every round
			for r := range rounds {
				rs = append(rs, r)
			}
		}
		var chosen []benchRun
		var ratios []float64
		for _, r := range rs {
			chosen = append(chosen, runs[s.name][r])
			ratios = append(ratios, brackets[s.name][r].Ratio())
		}
		report(b, s.name, chosen, ratios, rs)
	}
}

// scheduleRun is one measured run of SchedulingThroughput: once the cluster
// is back to idle, pods of side in a fresh namespace, from the first create
// to the last bound; then the namespace is deleted and waited for.
func scheduleRun(b *testing.B, ctx context.Context, client kubernetes.Interface, idle float64, pods int, pool string, side benchSide, label string) benchRun {
	b.Helper()
	var r benchRun
	start := time.Now()
	settle(b, idle)
	r.settled = time.Since(start)
	r.probe[0] = framework.SpeedProbe()
	ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	batch := make([]*corev1.Pod, pods)
	for i := range batch {
		batch[i] = benchPod(ns.Name, i, side.scheduler, side.resource, pool)
	}
	var stop func() map[string]float64
	if side.during != nil {
		stop = side.during()
	}
	elapsed, figures := scheduleAllMeasured(b, ctx, batch, "bench-run="+ns.Name, label, 10*time.Minute)
	if stop != nil {
		r.alongside = stop()
	}
	r.probe[1] = framework.SpeedProbe()
	r.podsPerSecond = float64(pods) / elapsed.Seconds()
	r.figures = figures
	stayedPending(b, ctx, ns.Name)
	start = time.Now()
	// The pods go at once (no grace period: they run nowhere), before the
	// namespace: else the namespace controller deletes them gracefully and
	// kwok finalises each, which took 11-18 s a run, a third of a round.
	if err := client.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)}, metav1.ListOptions{}); err != nil {
		b.Fatal(err)
	}
	deleteNamespaceAndWait(b, ctx, ns.Name)
	r.cleanup = time.Since(start)
	return r
}

// benchLog prints a line of a long benchmark's log to stdout, as "log: NAME:
// ...", which hack/bench.sh passes through. The testing package prints a
// benchmark's own log cut to 10 lines, and a parent benchmark's not at all
// unless it fails (or with -test.v).
func benchLog(b *testing.B, format string, args ...any) {
	fmt.Printf("log: %s: %s\n", strings.TrimPrefix(b.Name(), "Benchmark"), fmt.Sprintf(format, args...))
}

// fmtFloats prints values in order.
func fmtFloats(values []float64, format string) string {
	parts := make([]string, len(values))
	for i, v := range values {
		parts[i] = fmt.Sprintf(format, v)
	}
	return strings.Join(parts, " ")
}

// warmUpPods of each kind are scheduled before the first measured run.
const warmUpPods = 500

// benchPod is SchedulingThroughput's pod i in namespace ns: one of
// resourceName, on a node of pool.
func benchPod(ns string, i int, schedulerName string, resourceName corev1.ResourceName, pool string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i), Namespace: ns, Labels: map[string]string{"bench-run": ns, framework.SimulatedPendingLabel: "true"}},
		Spec: corev1.PodSpec{
			SchedulerName: schedulerName,
			NodeSelector:  map[string]string{"pool": pool},
			Containers: []corev1.Container{{Name: "main", Image: "registry.example/train:1", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{resourceName: resource.MustParse("1")},
			}}},
		},
	}
}

// stayedPending fails the benchmark if kwok moved a pod of ns to Running:
// the pods' status updates would have counted as scheduling work
// (framework.SimulatedPendingLabel).
func stayedPending(b *testing.B, ctx context.Context, ns string) {
	b.Helper()
	list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		b.Fatal(err)
	}
	for i := range list.Items {
		if p := &list.Items[i]; p.Status.Phase != corev1.PodPending {
			b.Fatalf("pod %s is %s: kwok did not leave the benchmark's pods Pending (is _output/bin/kwok-stages.yaml from `make e2e-binaries`?)", p.Name, p.Status.Phase)
		}
	}
}

// idleBreakdown logs what the cluster does with nothing to schedule, over
// window: each process's cores and the apiserver's requests per second by
// verb and resource. It returns the cluster's cores.
func idleBreakdown(b *testing.B, ctx context.Context, window time.Duration) float64 {
	b.Helper()
	before := takeBreakdown(b, ctx, true)
	time.Sleep(window)
	after := takeBreakdown(b, ctx, false)
	seconds := after.at.Sub(before.at).Seconds()
	cores := map[string]float64{}
	var total float64
	for name, d := range after.cpu {
		c := (d - before.cpu[name]).Seconds() / seconds
		cores[name] = c
		total += c
	}
	requests := map[string]float64{}
	for _, verb := range []string{"GET", "LIST", "WATCH", "POST", "PUT", "PATCH", "DELETE", "APPLY"} {
		m0 := before.api.By("apiserver_request_total", "resource", "verb="+verb)
		for res, v := range after.api.By("apiserver_request_total", "resource", "verb="+verb) {
			if d := (v - m0[res]) / seconds; d > 0 {
				requests[verb+" "+res] = d
			}
		}
	}
	benchLog(b, "idle: %.2f cores (%s); apiserver requests/s: %s", total, fmtMap(cores, "%.3f"), fmtMap(requests, "%.1f"))
	return total
}

// What makes a SchedulingThroughput run disturbed: other work on the machine
// beyond maxOutsideCores on average during a run (an editor, a shell: well
// under a tenth of a core; a build: one or more); a side with fewer than
// minValidRounds runs whose two baselines are at most maxBaselineSpread apart
// (the machine's speed moved too much around the run for the bracketing to
// remove it).
const (
	maxOutsideCores   = 0.25
	maxBaselineSpread = 0.15
)

// minValidRounds is how many of a side's rounds must be valid for a figure:
// more than half of them, and at least 2.
func minValidRounds(rounds int) int { return max(2, rounds/2+1) }

// disturbed fails the benchmark: its figures are not worth reporting.
// RESCLASS_BENCH_ALLOW_DISTURBED=1 only logs why, for looking at a breakdown
// on a busy machine (the CPU per pod moves less with load than pods/s do).
func disturbed(b *testing.B, format string, args ...any) {
	b.Helper()
	if os.Getenv("RESCLASS_BENCH_ALLOW_DISTURBED") == "1" {
		benchLog(b, "disturbed (RESCLASS_BENCH_ALLOW_DISTURBED=1: reported anyway): "+format, args...)
		return
	}
	b.Fatalf("disturbed: "+format, args...)
}

// scheduleAll creates pods (16 writers on an unthrottled client) once a watch on
// the pods labelled selector has synced, and returns the time from the first
// create until the watch saw the last of them bound, and each pod's node. A
// watch, not polling: listing thousands of pods several times a second would
// load the apiserver the benchmark measures.
func scheduleAll(b *testing.B, ctx context.Context, pods []*corev1.Pod, selector string, timeout time.Duration) (time.Duration, map[string]string) {
	b.Helper()
	return scheduleAllHooked(b, ctx, pods, selector, timeout, nil, nil)
}

// scheduleAllMeasured is scheduleAll with the run's breakdown: what each
// process spent from the first create to the last pod bound. label names the
// run in its profiles' files (profileRun).
func scheduleAllMeasured(b *testing.B, ctx context.Context, pods []*corev1.Pod, selector, label string, timeout time.Duration) (time.Duration, runFigures) {
	b.Helper()
	var (
		before, after *breakdown
		profiles      sync.WaitGroup
	)
	elapsed, _ := scheduleAllHooked(b, ctx, pods, selector, timeout,
		func() {
			before = takeBreakdown(b, ctx, true)
			if dir := os.Getenv("RESCLASS_BENCH_PROFILE_DIR"); dir != "" {
				profileRun(b, ctx, dir, label, &profiles)
			}
		},
		func() { after = &breakdown{}; after.readCPU(b) })
	after.readMetrics(b, ctx)
	profiles.Wait()
	return elapsed, before.figures(b, after, len(pods))
}

// profileRun saves CPU profiles of the scheduler and, when the cluster was
// started with RESCLASS_E2E_PROFILING=1, of kube-apiserver, and the
// scheduler's allocation and heap profiles, over the first five seconds of a
// run, into dir (docs/scheduler.md, "Where the time goes"),
// as <benchmark>_<label>-<component>.pprof: label tells a benchmark's runs
// apart (SchedulingThroughput's side and round).
func profileRun(b *testing.B, ctx context.Context, dir, label string, wg *sync.WaitGroup) {
	name := strings.NewReplacer("/", "_", " ", "_").Replace(b.Name() + "_" + label)
	for _, component := range []string{"scheduler", "kube-apiserver"} {
		wg.Go(func() {
			data, err := cluster.CPUProfile(ctx, component, 5*time.Second)
			if err == nil {
				err = os.WriteFile(fmt.Sprintf("%s/%s-%s.pprof", dir, name, component), data, 0o644)
			}
			if err != nil {
				benchLog(b, "%s profile: %v", component, err)
			}
		})
	}
	// What the scheduler allocates over the same seconds, the garbage its
	// collections cost, and what it holds (as of its last collection), which
	// each collection marks (docs/scheduler.md, "5000 nodes and the
	// scheduler's heap").
	for kind, fetch := range map[string]func() ([]byte, error){
		"allocs": func() ([]byte, error) { return cluster.AllocsProfile(ctx, "scheduler", 5*time.Second) },
		"heap":   func() ([]byte, error) { return cluster.HeapProfile(ctx, "scheduler") },
	} {
		wg.Go(func() {
			data, err := fetch()
			if err == nil {
				err = os.WriteFile(fmt.Sprintf("%s/%s-scheduler-%s.pprof", dir, name, kind), data, 0o644)
			}
			if err != nil {
				benchLog(b, "scheduler %s profile: %v", kind, err)
			}
		})
	}
}

// scheduleAllHooked is scheduleAll calling starting just before the first
// create and done once the watch saw the last pod bound (in the watch's
// goroutine), when not nil.
func scheduleAllHooked(b *testing.B, ctx context.Context, pods []*corev1.Pod, selector string, timeout time.Duration, starting, finished func()) (time.Duration, map[string]string) {
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
				if finished != nil {
					finished()
				}
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
	if starting != nil {
		starting()
	}
	start := time.Now()
	createPods(b, ctx, client, len(pods), func(i int) *corev1.Pod { return pods[i] })
	if err := <-watchErr; err != nil {
		b.Fatalf("%d of %d pods bound: %v", len(bound), len(pods), err)
	}
	return done.Sub(start), bound
}

// deleteNamespaceAndWait deletes ns and waits until it is gone: its pods, so
// the devices they held are free for the next run, and everything else the
// namespace controller deletes with it (the pods' Events, for one), so that
// this cleanup is not measured as part of the next run.
func deleteNamespaceAndWait(b *testing.B, ctx context.Context, ns string) {
	b.Helper()
	if err := cluster.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		b.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		b.Fatalf("namespace %s not gone: %v", ns, err)
	}
}

// settle waits until the cluster's processes use no more CPU than idle (at
// most idle cores over a second, twice in a row), so that a run does not
// pay for the work the previous one left behind; a minute at most.
func settle(b *testing.B, idle float64) {
	b.Helper()
	var busy float64
	quiet := 0
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && quiet < 2; {
		busy = clusterCores(b, time.Second)
		if busy <= idle {
			quiet++
		} else {
			quiet = 0
		}
	}
	if quiet < 2 {
		benchLog(b, "the cluster did not settle: %.2f cores busy, %.2f expected when idle", busy, idle)
	}
}

// clusterCores is how many cores the cluster's processes used over d.
func clusterCores(b *testing.B, d time.Duration) float64 {
	b.Helper()
	total := func() time.Duration {
		cpu, err := cluster.CPUTimes()
		if err != nil {
			b.Fatal(err)
		}
		var sum time.Duration
		for _, t := range cpu {
			sum += t
		}
		return sum
	}
	t0, start := total(), time.Now()
	time.Sleep(d)
	return float64(total()-t0) / float64(time.Since(start))
}
