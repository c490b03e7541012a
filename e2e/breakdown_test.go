package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/scheduler/resourceclasses"
)

// breakdown is where a scheduling benchmark's run went (docs/scheduler.md,
// "Where the time goes"): the CPU each process of the embedded cluster and
// the benchmark itself used, the machine's CPU (to tell other work apart),
// and the scheduler's, kube-apiserver's and etcd's own metrics. Two of them,
// before and after a run, give the run's figures per bound pod.
type breakdown struct {
	at      time.Time
	cpu     map[string]time.Duration
	self    time.Duration
	machine time.Duration
	stalls  int64 // the kernel's direct reclaim (framework.DirectReclaim)
	scanned int64
	sched   framework.Samples
	dra     framework.Samples // the stock scheduler profile's (StartDRAScheduler), when it runs
	api     framework.Samples
	etcd    framework.Samples
}

// takeBreakdown reads the figures; before says the run is about to start.
// Reading kube-apiserver's metrics costs it (and the benchmark) CPU, so the
// CPU times are read after the metrics before a run and before them after
// it: the reads stay outside the window they measure.
func takeBreakdown(b testing.TB, ctx context.Context, before bool) *breakdown {
	b.Helper()
	s := &breakdown{}
	if before {
		s.readMetrics(b, ctx)
		s.readCPU(b)
	} else {
		s.readCPU(b)
		s.readMetrics(b, ctx)
	}
	return s
}

func (s *breakdown) readCPU(b testing.TB) {
	b.Helper()
	var err error
	s.at = time.Now()
	if s.cpu, err = cluster.CPUTimes(); err != nil {
		b.Fatal(err)
	}
	if s.self, err = framework.ProcessCPU(os.Getpid()); err != nil {
		b.Fatal(err)
	}
	if s.machine, err = framework.MachineCPU(); err != nil {
		b.Fatal(err)
	}
	if s.stalls, s.scanned, err = framework.DirectReclaim(); err != nil {
		b.Fatal(err)
	}
}

func (s *breakdown) readMetrics(b testing.TB, ctx context.Context) {
	b.Helper()
	var err error
	for component, dst := range map[string]*framework.Samples{"scheduler": &s.sched, "kube-apiserver": &s.api, "etcd": &s.etcd} {
		if *dst, err = cluster.Metrics(ctx, component); err != nil {
			b.Fatalf("%s metrics: %v", component, err)
		}
	}
	if cluster.DRASchedulerStarted() {
		if s.dra, err = cluster.Metrics(ctx, "scheduler-dra"); err != nil {
			b.Fatalf("scheduler-dra metrics: %v", err)
		}
	}
}

// cpuGroups are the processes a breakdown reports, by the metric's prefix.
var cpuGroups = []struct{ metric, process string }{
	{"scheduler", "scheduler"},
	{"scheduler-dra", "scheduler-dra"},
	{"apiserver", "kube-apiserver"},
	{"etcd", "etcd"},
	{"kwok", "kwok"},
	{"kcm", "kube-controller-manager"},
}

// breakdownPlugins are the plugins whose time a breakdown reports: resclass's,
// and upstream's DynamicResources, which allocates on DRA-mode nodes.
var breakdownPlugins = []string{resourceclasses.Name, "DynamicResources"}

// extensionPoints are the plugin's, as the scheduler's metrics name them.
var extensionPoints = []string{"PreFilter", "Filter", "PreScore", "Score", "Reserve", "PreBind", "Bind"}

// runFigures is a breakdown's difference over one run of pods bound pods.
type runFigures struct {
	wall    time.Duration
	pods    float64
	cpuMS   map[string]float64            // per pod, by cpuGroups' metric, plus "client", "other-cluster" and "total"
	outside float64                       // cores used by processes outside the cluster and the benchmark
	plugin  map[string]map[string]float64 // µs per scheduling cycle, by breakdownPlugins and extension point
	fw      map[string]float64            // µs per pod, by extension point, all plugins of both schedulers
	writes  map[string]float64            // mutating requests per pod, by resource (and subresource)
	inBytes map[string]float64            // request body bytes per pod, by resource
	watchB  map[string]float64            // watch event bytes sent per pod, by resource
	walB    float64                       // etcd WAL bytes per pod
	// schedAllocB is the bytes the scheduler allocated per pod, schedGCs the
	// garbage collections it finished during the run: at 5000 nodes one
	// collection costs about a third of a run's scheduler CPU
	// (docs/scheduler.md, "5000 nodes and the scheduler's heap").
	schedAllocB, schedGCs float64
	schedLiveB            float64 // the scheduler's live heap after its last collection, at the run's end
	stalls                int64   // direct reclaim stalls during the run
	scanned               int64   // and pages they scanned
}

func (before *breakdown) figures(b testing.TB, after *breakdown, pods int) runFigures {
	n := float64(pods)
	f := runFigures{wall: after.at.Sub(before.at), pods: n, cpuMS: map[string]float64{}, plugin: map[string]map[string]float64{}, fw: map[string]float64{},
		writes: map[string]float64{}, inBytes: map[string]float64{}, watchB: map[string]float64{}}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / n }
	var cluster time.Duration
	grouped := map[string]bool{}
	for _, g := range cpuGroups {
		f.cpuMS[g.metric] = ms(after.cpu[g.process] - before.cpu[g.process])
		grouped[g.process] = true
	}
	for name, d := range after.cpu {
		cluster += d - before.cpu[name]
		if !grouped[name] {
			f.cpuMS["other-cluster"] += ms(d - before.cpu[name])
		}
	}
	self := after.self - before.self
	f.cpuMS["client"] = ms(self)
	f.cpuMS["total"] = ms(cluster + self)
	f.outside = float64(after.machine-before.machine-cluster-self) / float64(f.wall)
	f.stalls, f.scanned = after.stalls-before.stalls, after.scanned-before.scanned

	delta := func(s0, s1 framework.Samples, name string, match ...string) float64 {
		return s1.Sum(name, match...) - s0.Sum(name, match...)
	}
	// Plugin durations are sampled (kube-scheduler records them for 10% of
	// cycles): per cycle is their sum over the sampled cycles' count, which
	// PreFilter's count is (it runs once in every cycle). A plugin's figures
	// are the sum over both schedulers (a run uses one of them).
	const pluginMetric = "scheduler_plugin_execution_duration_seconds"
	for _, name := range breakdownPlugins {
		plugin := "plugin=" + name
		f.plugin[name] = map[string]float64{}
		cycles := delta(before.sched, after.sched, pluginMetric+"_count", plugin, "extension_point=PreFilter") +
			delta(before.dra, after.dra, pluginMetric+"_count", plugin, "extension_point=PreFilter")
		for _, ep := range extensionPoints {
			if cycles > 0 {
				f.plugin[name][ep] = (delta(before.sched, after.sched, pluginMetric+"_sum", plugin, "extension_point="+ep) +
					delta(before.dra, after.dra, pluginMetric+"_sum", plugin, "extension_point="+ep)) / cycles * 1e6
			}
		}
	}
	for _, ep := range extensionPoints {
		const fwMetric = "scheduler_framework_extension_point_duration_seconds_sum"
		f.fw[ep] = (delta(before.sched, after.sched, fwMetric, "extension_point="+ep) + delta(before.dra, after.dra, fwMetric, "extension_point="+ep)) / n * 1e6
	}
	byDelta := func(s0, s1 framework.Samples, name, key string, match ...string) map[string]float64 {
		out := map[string]float64{}
		m0 := s0.By(name, key, match...)
		for k, v := range s1.By(name, key, match...) {
			if d := (v - m0[k]) / n; d > 0 {
				out[k] = d
			}
		}
		return out
	}
	// Writes by resource and subresource: a pod's create, Binding
	// (pods/binding) and status patches (pods/status) are different work.
	for _, verb := range []string{"POST", "PUT", "PATCH", "DELETE"} {
		for _, sub := range subresources(after.api, "apiserver_request_total") {
			for res, v := range byDelta(before.api, after.api, "apiserver_request_total", "resource", "verb="+verb, "subresource="+sub) {
				if sub != "" {
					res += "/" + sub
				}
				f.writes[res] += v
			}
		}
	}
	f.inBytes = byDelta(before.api, after.api, "apiserver_request_body_size_bytes_sum", "resource")
	f.watchB = byDelta(before.api, after.api, "apiserver_watch_events_sizes_sum", "resource")
	f.walB = delta(before.etcd, after.etcd, "etcd_disk_wal_write_bytes_total") / n
	f.schedAllocB = delta(before.sched, after.sched, "go_gc_heap_allocs_bytes_total") / n
	f.schedGCs = delta(before.sched, after.sched, "go_gc_cycles_total_gc_cycles_total")
	f.schedLiveB = after.sched.Sum("go_gc_heap_live_bytes")
	return f
}

// report puts the figures into the benchmark's output: the headline ones as
// metrics (hack/bench.sh prints them, and their ratio to the baseline's), the
// rest in the log.
func (f runFigures) report(b *testing.B) {
	for _, g := range append(cpuGroups, struct{ metric, process string }{"client", ""}, struct{ metric, process string }{"total", ""}) {
		b.ReportMetric(f.cpuMS[g.metric], g.metric+"-cpu-ms/pod")
	}
	for _, ep := range extensionPoints {
		if v := f.plugin[resourceclasses.Name][ep]; v > 0 {
			b.ReportMetric(v, "plugin-"+strings.ToLower(ep)+"-us/pod")
		}
		if v := f.plugin["DynamicResources"][ep]; v > 0 {
			b.ReportMetric(v, "dra-plugin-"+strings.ToLower(ep)+"-us/pod")
		}
	}
	b.ReportMetric(sum(f.writes), "writes/pod")
	b.ReportMetric(sum(f.inBytes), "request-B/pod")
	b.ReportMetric(sum(f.watchB), "watch-B/pod")
	b.ReportMetric(f.walB, "etcd-wal-B/pod")
	b.ReportMetric(f.schedAllocB, "scheduler-alloc-B/pod")
	b.Logf("CPU ms per pod: %s; other work on the machine: %.2f cores over %v (%.1f pods/s)", fmtMap(f.cpuMS, "%.2f"), f.outside, f.wall.Round(time.Millisecond), f.pods/f.wall.Seconds())
	for _, name := range breakdownPlugins {
		if len(f.plugin[name]) > 0 {
			b.Logf("%s µs per cycle (sampled): %s", name, fmtMap(f.plugin[name], "%.1f"))
		}
	}
	b.Logf("all plugins µs per pod: %s", fmtMap(f.fw, "%.1f"))
	b.Logf("writes per pod: %s", fmtMap(f.writes, "%.3f"))
	b.Logf("request bytes per pod: %s", fmtMap(f.inBytes, "%.0f"))
	b.Logf("watch bytes sent per pod: %s", fmtMap(f.watchB, "%.0f"))
	b.Logf("etcd WAL bytes per pod: %.0f", f.walB)
	b.Logf("scheduler: %.0f bytes allocated per pod, %.0f garbage collections, live heap %.0f MB", f.schedAllocB, f.schedGCs, f.schedLiveB/1e6)
	// Not (yet) a reason to refuse a run: docs/scheduler.md, "An idle cluster".
	b.Logf("direct memory reclaim during the run: %d stalls, %d pages scanned", f.stalls, f.scanned)
}

// subresources are the values of the label subresource among the samples
// named name ("" for the resource itself).
func subresources(s framework.Samples, name string) []string {
	seen := map[string]bool{}
	for _, x := range s {
		if x.Name == name {
			seen[x.Labels["subresource"]] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

func sum(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}

// fmtMap prints m's ten largest entries that are not zero, largest first
// (the per-resource maps hold a line for every kind the apiserver serves).
func fmtMap(m map[string]float64, format string) string {
	keys := slices.Collect(maps.Keys(m))
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	parts := make([]string, 0, len(keys))
	for i, k := range keys {
		if i == 10 || m[k] <= 0 {
			break
		}
		parts = append(parts, fmt.Sprintf("%s="+format, k, m[k]))
	}
	return strings.Join(parts, " ")
}
