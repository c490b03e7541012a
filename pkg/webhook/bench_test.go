package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/resclass/resclass/internal/cpustat"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/quota"
)

// The load BenchmarkAdmission offers: benchRate requests per second through
// benchWorkers keep-alive connections, in rounds of benchRoundRequests (1 s),
// benchRounds per handler, the handler and its baseline taking turns. The rate
// is well within what one replica answers on two cores, so the figures are
// service time plus the queueing of an unsaturated server, not the collapse
// of a saturated one. 16000 requests a side put 160 of them above the p99,
// enough for the p99 not to hang on a handful.
const (
	benchRate          = 2000
	benchRoundRequests = 2000
	benchRounds        = 8
	benchWorkers       = 16
)

// What makes a BenchmarkAdmission run disturbed, and its figures not worth
// reporting (docs/webhook.md, "Performance"): other processes used more than
// maxOutsideCores of the machine on average while it ran (an editor or a
// shell use well under a tenth of a core; a build or a cluster, one or more),
// or the baseline's p99 over the even rounds and over the odd rounds differ by
// more than maxBaselineSpread (the two halves interleave in time, so on a quiet
// machine they agree; a burst of other work in some rounds pulls them apart).
const (
	maxOutsideCores   = 0.25
	maxBaselineSpread = 0.30
)

// benchQuotaConfig limits three scopes and the class resources: a pod of
// benchPod matches every one of them, so nothing short-circuits.
const benchQuotaConfig = `apiVersion: apiserver.config.k8s.io/v1
kind: ResourceQuotaConfiguration
limitedResources:
- resource: pods
  matchContains: ["class.resclass.io/"]
  matchScopes:
  - scopeName: PriorityClass
    operator: In
    values: ["cluster-services", "system-high"]
  - scopeName: CrossNamespacePodAffinity
    operator: Exists
  - scopeName: NotBestEffort
    operator: Exists
`

// benchQuotas are the five ResourceQuotas of benchPod's namespace: a plain
// compute quota and one covering each limited scope and resource, so the
// pod is allowed only after all of them have been matched.
func benchQuotas() []*corev1.ResourceQuota {
	hard := func(kv ...string) corev1.ResourceList {
		l := corev1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return l
	}
	meta := func(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name, Namespace: "team-a"} }
	return []*corev1.ResourceQuota{
		{ObjectMeta: meta("compute"), Spec: corev1.ResourceQuotaSpec{Hard: hard("requests.cpu", "200", "requests.memory", "800Gi", "pods", "500")}},
		{ObjectMeta: meta("cluster-services"), Spec: corev1.ResourceQuotaSpec{Hard: hard("pods", "50"),
			ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{
				ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpIn, Values: []string{"cluster-services", "system-high"}}}}}},
		{ObjectMeta: meta("cross-namespace"), Spec: corev1.ResourceQuotaSpec{Hard: hard("pods", "50"),
			Scopes: []corev1.ResourceQuotaScope{corev1.ResourceQuotaScopeCrossNamespacePodAffinity}}},
		{ObjectMeta: meta("not-best-effort"), Spec: corev1.ResourceQuotaSpec{Hard: hard("pods", "400", "requests.cpu", "150"),
			Scopes: []corev1.ResourceQuotaScope{corev1.ResourceQuotaScopeNotBestEffort}}},
		{ObjectMeta: meta("gpus"), Spec: corev1.ResourceQuotaSpec{Hard: hard("requests.class.resclass.io/nvidia-big", "16", "pods", "100")}},
	}
}

// benchPod is a pod as it reaches a validating webhook, defaulted by the
// apiserver, and limited by every rule of benchQuotaConfig: a priority
// class, a cross-namespace affinity term and a class.resclass.io limit.
func benchPod() *corev1.Pod {
	p := newPod(
		priority("cluster-services"),
		extendedResource("class.resclass.io/nvidia-big", "1"),
		affinity(&corev1.Affinity{
			PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{affinityTerm(teamSelector)}},
			PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{
				weighted(affinityTerm(nil))}},
		}),
	)
	p.GenerateName = "trainer-"
	p.Labels["app.kubernetes.io/name"] = "trainer"
	c := &p.Spec.Containers[0]
	c.Resources.Limits[corev1.ResourceMemory] = resource.MustParse("64Mi")
	c.Env = []corev1.EnvVar{{Name: "NCCL_DEBUG", Value: "INFO"}, {Name: "EPOCHS", Value: "90"}}
	c.VolumeMounts = []corev1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
	c.TerminationMessagePath = corev1.TerminationMessagePathDefault
	c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	c.ImagePullPolicy = corev1.PullIfNotPresent
	p.Spec.Volumes = []corev1.Volume{{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}}},
	}}}}
	p.Spec.RestartPolicy = corev1.RestartPolicyAlways
	p.Spec.DNSPolicy = corev1.DNSClusterFirst
	p.Spec.SchedulerName = "resclass-scheduler"
	p.Spec.ServiceAccountName = "default"
	p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](30)
	p.Spec.Priority = ptr.To[int32](2000000000)
	p.Spec.Tolerations = []corev1.Toleration{
		{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)},
		{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)},
	}
	return p
}

// benchClass has two selectors of four expressions each, every value typed.
func benchClass() *v1alpha1.ResourceClass {
	return newResourceClass("nvidia-big",
		[]v1alpha1.ResourceSelectorRequirement{
			expr("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"),
			expr("memory", v1alpha1.ResourceSelectorOpGtEq, "40Gi"),
			expr("computeCapability", v1alpha1.ResourceSelectorOpGtEq, "8.0"),
			expr("migEnabled", v1alpha1.ResourceSelectorOpEq, "false"),
		},
		[]v1alpha1.ResourceSelectorRequirement{
			expr("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"),
			expr("product", v1alpha1.ResourceSelectorOpIn, "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"),
			expr("driverVersion", v1alpha1.ResourceSelectorOpGtEq, "535.104.05"),
			expr("numaNode", v1alpha1.ResourceSelectorOpLtEq, "1"),
		})
}

// BenchmarkAdmission measures the admission latency the apiserver would
// see from each webhook under a steady load: AdmissionReviews posted over
// TLS (HTTP/1.1, keep-alive, as the apiserver calls webhooks) on loopback
// to the http.Handler Run registers, benchRate requests per second.
//
// The load is open-loop: a pacer schedules request i at start + i/benchRate
// whatever the answers do, and a pool of benchWorkers goroutines sends them.
// Each latency is taken from the request's scheduled send time, not from
// when a worker got to it: the apiserver does not wait for the webhook to
// answer one pod before admitting the next, so when the handler falls
// behind, the requests queue, and that wait is part of what a user's
// kubectl sees. A closed loop (or timing from the actual send) would slow
// down with the server and hide exactly that (coordinated omission).
//
// Each sub-benchmark measures its handler and the baseline, a server whose
// handler answers Allowed without looking (the same TLS, HTTP and
// AdmissionReview decoding and encoding, no policy), in alternating rounds,
// so that both see the same machine: a ratio of figures taken minutes apart
// on a shared machine measures the machine. It reports p50 and p99 of each
// side over all its rounds (baseline-*), the bytes and allocations per
// request of the whole process (client and server) during each side's
// rounds, and the p99 ratio (unit "ratio"); ns/op is suppressed, it would
// only be the length of the schedule. It refuses to report a disturbed run
// (maxOutsideCores, maxBaselineSpread) unless RESCLASS_BENCH_ALLOW_DISTURBED=1.
//
// pods is the worst case of the pod policies (a pod limited by every rule of
// the quota configuration, five quotas to match). resourceclasses compiles a
// class's selectors to CEL, milliseconds a request: at benchRate it would
// saturate the cores, so it runs at resourceClassRate (class writes are
// rare). The ResourceQuotas come from a client-go indexer, the store an
// informer fills, read the way the webhook reads it (quotaIndex).
func BenchmarkAdmission(b *testing.B) {
	cfg := mustParseQuotaConfig(b, benchQuotaConfig)
	pods := &podPolicies{
		config: func() *quota.Config { return cfg },
		quotas: quotaIndex(b, benchQuotas()...),
	}
	podReview := review(b, "admission.k8s.io/v1", ptr.To(podRequest(admissionv1.Create, "team-a", mustJSON(b, benchPod())).AdmissionRequest))
	classReview := review(b, "admission.k8s.io/v1", ptr.To(classRequest(admissionv1.Create, mustJSON(b, benchClass()), nil).AdmissionRequest))
	allowAll := admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		return admission.Allowed("")
	})
	const resourceClassRate = 50

	for _, bc := range []struct {
		name           string
		path           string
		handler        admission.Handler
		body           []byte
		rate, perRound int
	}{
		{"pods", PodsPath, pods, podReview, benchRate, benchRoundRequests},
		{"resourceclasses", ResourceClassesPath, &resourceClasses{}, classReview, resourceClassRate, resourceClassRate * 2},
	} {
		b.Run(bc.name, func(b *testing.B) {
			baseline := startSide(b, "baseline", bc.path, allowAll, bc.body)
			measured := startSide(b, bc.name, bc.path, bc.handler, bc.body)
			var outside float64
			for b.Loop() {
				outside = interleave(b, benchRounds, bc.perRound, time.Second/time.Duration(bc.rate), baseline, measured)
			}
			b.ReportMetric(0, "ns/op")
			for _, s := range []*side{measured, baseline} {
				prefix := ""
				if s == baseline {
					prefix = "baseline-"
				}
				b.ReportMetric(s.quantile(0.50), prefix+"p50-ms")
				b.ReportMetric(s.quantile(0.99), prefix+"p99-ms")
				b.ReportMetric(float64(s.bytes)/float64(s.requests), prefix+"B/req")
				b.ReportMetric(float64(s.allocs)/float64(s.requests), prefix+"allocs/req")
			}
			b.ReportMetric(measured.quantile(0.99)/baseline.quantile(0.99), "ratio")
			even, odd := baseline.halves(0.99)
			b.Logf("baseline p99 over even rounds %.2f ms, odd rounds %.2f ms; other work on the machine: %.2f cores", even, odd, outside)
			if outside > maxOutsideCores {
				disturbed(b, "other work used %.2f cores of the machine during the run (at most %.2f for a figure worth reporting)", outside, maxOutsideCores)
			}
			if spread := max(even, odd)/min(even, odd) - 1; spread > maxBaselineSpread {
				disturbed(b, "the baseline's p99 was %.2f ms over the even rounds and %.2f ms over the odd ones (%.0f%% apart, at most %.0f%% for a figure worth reporting)",
					even, odd, 100*spread, 100*maxBaselineSpread)
			}
		})
	}
}

// disturbed fails the benchmark: its figures are not worth reporting.
// RESCLASS_BENCH_ALLOW_DISTURBED=1 only logs why (for profiling on a busy
// machine), as e2e's benchmarks do.
func disturbed(b *testing.B, format string, args ...any) {
	b.Helper()
	if os.Getenv("RESCLASS_BENCH_ALLOW_DISTURBED") == "1" {
		b.Logf("disturbed (RESCLASS_BENCH_ALLOW_DISTURBED=1: reported anyway): "+format, args...)
		return
	}
	b.Fatalf("disturbed: "+format, args...)
}

// side is one handler of an interleaved measurement: its server, and what
// its rounds measured.
type side struct {
	name   string
	load   *openLoop
	rounds [][]time.Duration // each round's latencies
	// bytes and allocs allocated by the whole process during the side's
	// rounds, over requests.
	bytes, allocs uint64
	requests      int
}

// startSide serves handler over TLS at path and opens benchWorkers
// connections to it.
func startSide(b *testing.B, name, path string, handler admission.Handler, body []byte) *side {
	b.Helper()
	srv := httptest.NewUnstartedServer(&webhook.Admission{Handler: handler})
	srv.TLS = &tls.Config{NextProtos: []string{"http/1.1"}}
	srv.StartTLS()
	b.Cleanup(srv.Close)
	client := srv.Client()
	// Keep an idle connection per worker, as the apiserver's webhook client
	// does (client-go keeps up to 25 per host); net/http's default of 2 would
	// make requests pay for TLS handshakes.
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = benchWorkers
	s := &side{name: name, load: &openLoop{client: client, url: srv.URL + path, body: body}}
	// Open every connection before measuring: a burst, all due at once.
	if _, err := s.load.run(benchWorkers*4, 0); err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	return s
}

// interleave runs rounds rounds of perRound requests, one every interval, on
// each side in turn (the first side first in even rounds, last in odd ones),
// and returns how many cores other processes used meanwhile. Each round starts
// after a collection, so that no side pays for the garbage another left.
func interleave(b *testing.B, rounds, perRound int, interval time.Duration, sides ...*side) (outsideCores float64) {
	b.Helper()
	cpu := func() (machine, self time.Duration) {
		machine, err := cpustat.Machine()
		if err != nil {
			b.Fatal(err)
		}
		if self, err = cpustat.Process(os.Getpid()); err != nil {
			b.Fatal(err)
		}
		return machine, self
	}
	machine0, self0 := cpu()
	start := time.Now()
	for r := range rounds {
		for k := range sides {
			s := sides[k]
			if r%2 == 1 {
				s = sides[len(sides)-1-k]
			}
			runtime.GC()
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			l, err := s.load.run(perRound, interval)
			runtime.ReadMemStats(&m1)
			if err != nil {
				b.Fatalf("%s: %v", s.name, err)
			}
			s.rounds = append(s.rounds, l)
			s.bytes += m1.TotalAlloc - m0.TotalAlloc
			s.allocs += m1.Mallocs - m0.Mallocs
			s.requests += perRound
		}
	}
	wall := time.Since(start)
	machine1, self1 := cpu()
	return float64((machine1-machine0)-(self1-self0)) / float64(wall)
}

// quantile is the q-quantile of the side's latencies over all rounds, in ms.
func (s *side) quantile(q float64) float64 {
	return quantileMS(slices.Concat(s.rounds...), q)
}

// halves is the q-quantile over the even rounds and over the odd ones.
func (s *side) halves(q float64) (even, odd float64) {
	var e, o []time.Duration
	for i, r := range s.rounds {
		if i%2 == 0 {
			e = append(e, r...)
		} else {
			o = append(o, r...)
		}
	}
	return quantileMS(e, q), quantileMS(o, q)
}

func quantileMS(latencies []time.Duration, q float64) float64 {
	if len(latencies) == 0 {
		return 0
	}
	latencies = slices.Clone(latencies)
	slices.Sort(latencies)
	i := int(q*float64(len(latencies))+0.5) - 1
	return float64(latencies[min(max(i, 0), len(latencies)-1)]) / float64(time.Millisecond)
}

// openLoop posts one prebuilt AdmissionReview on a schedule and expects
// every answer to allow it.
type openLoop struct {
	client *http.Client
	url    string
	body   []byte
}

// run sends n requests, request i due at start + i*interval, and returns
// each one's latency from its due time, or the first failure.
func (l *openLoop) run(n int, interval time.Duration) ([]time.Duration, error) {
	type job struct {
		i   int
		due time.Time
	}
	// Buffered for all n, so that the pacer never waits for a worker: a
	// request that cannot be sent on time waits here, and its latency
	// counts that wait.
	jobs := make(chan job, n)
	latencies := make([]time.Duration, n)
	errs := make([]error, benchWorkers)
	var wg sync.WaitGroup
	for w := range benchWorkers {
		wg.Go(func() {
			for j := range jobs {
				err := l.post()
				latencies[j.i] = time.Since(j.due)
				if err != nil && errs[w] == nil {
					errs[w] = err
				}
			}
		})
	}
	start := time.Now()
	timer := time.NewTimer(time.Hour)
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			<-timer.C
		}
		jobs <- job{i, due}
	}
	timer.Stop()
	close(jobs)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return latencies, nil
}

func (l *openLoop) post() error {
	resp, err := l.client.Post(l.url, "application/json", bytes.NewReader(l.body))
	if err != nil {
		return err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, data)
	}
	var ar admissionv1.AdmissionReview
	if err := json.Unmarshal(data, &ar); err != nil {
		return fmt.Errorf("decoding the AdmissionReview: %w", err)
	}
	if ar.Response == nil || !ar.Response.Allowed {
		return fmt.Errorf("not allowed: %s", data)
	}
	return nil
}
