package webhook

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"

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
// Each handler is served by a process of its own (this test binary run
// again, serveForBenchmark), as the webhook is deployed: its collector runs on
// its own heap, with the Deployment's GOGC and GOMEMLIMIT
// (deploy/webhook/deployment.yaml), and the load generator's garbage is not
// the server's.
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
// request of each server, and the p99 ratio (unit "ratio"); ns/op is
// suppressed, it would only be the length of the schedule. It refuses to
// report a disturbed run (maxOutsideCores, maxBaselineSpread) unless
// RESCLASS_BENCH_ALLOW_DISTURBED=1.
//
// pods is the worst case of the pod policies (a pod limited by every rule of
// the quota configuration, five quotas to match). resourceclasses compiles a
// class's selectors to CEL, milliseconds a request: at benchRate it would
// saturate the cores, so it runs at resourceClassRate (class writes are
// rare). The ResourceQuotas come from a client-go indexer, the store an
// informer fills, read as the webhook reads it (informerQuotas).
func BenchmarkAdmission(b *testing.B) {
	podReview := review(b, "admission.k8s.io/v1", ptr.To(podRequest(admissionv1.Create, "team-a", mustJSON(b, benchPod())).AdmissionRequest))
	classReview := review(b, "admission.k8s.io/v1", ptr.To(classRequest(admissionv1.Create, mustJSON(b, benchClass()), nil).AdmissionRequest))
	const resourceClassRate = 50
	gcEnv := deployedGC(b)

	for _, bc := range []struct {
		name           string
		path           string
		body           []byte
		rate, perRound int
	}{
		{"pods", PodsPath, podReview, benchRate, benchRoundRequests},
		{"resourceclasses", ResourceClassesPath, classReview, resourceClassRate, resourceClassRate * 2},
	} {
		b.Run(bc.name, func(b *testing.B) {
			baseline := startSide(b, "baseline", bc.path, bc.body, gcEnv)
			measured := startSide(b, bc.name, bc.path, bc.body, gcEnv)
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
				b.ReportMetric(float64(s.bytes)/float64(s.requests), prefix+"server-B/req")
				b.ReportMetric(float64(s.allocs)/float64(s.requests), prefix+"server-allocs/req")
				b.ReportMetric(float64(s.collections)/s.seconds, prefix+"server-gc/s")
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

// BenchmarkAdmissionHandler is the server side of one pod admission, without
// the network: the AdmissionReview's decoding, the policies and the answer's
// encoding, through the same controller-runtime handler as Run registers,
// against the baseline that allows without looking. Its ns/op, B/op and
// allocs/op, unlike BenchmarkAdmission's tail, hardly move with the machine's
// load: they say where a change went.
func BenchmarkAdmissionHandler(b *testing.B) {
	cfg := mustParseQuotaConfig(b, benchQuotaConfig)
	pods := &podPolicies{config: func() *quota.Config { return cfg }, quotas: quotaIndex(b, benchQuotas()...)}
	body := review(b, "admission.k8s.io/v1", ptr.To(podRequest(admissionv1.Create, "team-a", mustJSON(b, benchPod())).AdmissionRequest))
	for _, bc := range []struct {
		name    string
		handler admission.Handler
	}{
		{"baseline-allow-all", admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { return admission.Allowed("") })},
		{"pods", pods},
	} {
		b.Run(bc.name, func(b *testing.B) {
			wh := &webhook.Admission{Handler: bc.handler}
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, PodsPath, bytes.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				w := httptest.NewRecorder()
				wh.ServeHTTP(w, r)
				if w.Code != http.StatusOK || !bytes.Contains(w.Body.Bytes(), []byte(`"allowed":true`)) {
					b.Fatalf("HTTP %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}

// deployedGC is the environment that gives the benchmark's servers the
// collector settings the webhook's Deployment gives the webhook (GOGC and
// GOMEMLIMIT in deploy/webhook/deployment.yaml): the tail follows the
// collections, so the figures are the deployed configuration's. Where GOGC
// or GOMEMLIMIT is set in the benchmark's environment, the servers inherit
// that instead (GOGC=100 for Go's default), and the log says so.
func deployedGC(b *testing.B) []string {
	b.Helper()
	if gogc, limit := os.Getenv("GOGC"), os.Getenv("GOMEMLIMIT"); gogc != "" || limit != "" {
		b.Logf("the servers run with the environment's GC settings, not the Deployment's: GOGC=%q GOMEMLIMIT=%q", gogc, limit)
		return nil
	}
	c, err := deploymentContainer(webhookDeployment, "webhook")
	if err != nil {
		b.Fatal(err)
	}
	env := literalEnv(c)
	var out []string
	for _, name := range []string{"GOGC", "GOMEMLIMIT"} {
		if v, ok := env[name]; ok {
			out = append(out, name+"="+v)
		}
	}
	b.Logf("the servers run with the webhook Deployment's GC settings: %v", out)
	return out
}

// webhookDeployment is the webhook's manifest, from this package's directory.
const webhookDeployment = "../../deploy/webhook/deployment.yaml"

// deploymentContainer is a container of the Deployment in a multi-document
// manifest.
func deploymentContainer(path, name string) (*corev1.Container, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for _, doc := range bytes.Split(raw, []byte("\n---\n")) {
		var d appsv1.Deployment
		if err := yaml.Unmarshal(doc, &d); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if d.Kind != "Deployment" {
			continue
		}
		for i, c := range d.Spec.Template.Spec.Containers {
			if c.Name == name {
				return &d.Spec.Template.Spec.Containers[i], nil
			}
		}
	}
	return nil, fmt.Errorf("%s: no Deployment with a container %q", path, name)
}

// literalEnv is a container's environment given by value.
func literalEnv(c *corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return env
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
	url    string // the server's, without a path
	pid    int
	load   *openLoop
	rounds [][]time.Duration // each round's latencies
	// What the server allocated and how often it collected during the
	// side's rounds, over requests and seconds.
	bytes, allocs, collections uint64
	requests                   int
	seconds                    float64
}

// envServe names the handler a child process of the test binary serves for
// BenchmarkAdmission (serveForBenchmark).
const envServe = "RESCLASS_BENCH_ADMISSION_SERVE"

func TestMain(m *testing.M) {
	if name := os.Getenv(envServe); name != "" {
		os.Exit(serveForBenchmark(name))
	}
	os.Exit(m.Run())
}

// serveForBenchmark serves the named handler over TLS on loopback at every
// webhook path, and the process's allocation counters at /memstats, until
// its standard input closes. It prints the server's URL and its certificate
// (base64 DER) on the first two lines of its standard output.
func serveForBenchmark(name string) int {
	var handler admission.Handler
	switch name {
	case "baseline":
		handler = admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { return admission.Allowed("") })
	case "pods":
		cfg, err := quota.Parse([]byte(benchQuotaConfig))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		indexer := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc})
		for _, q := range benchQuotas() {
			if err := indexer.Add(q); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		handler = &podPolicies{config: func() *quota.Config { return cfg }, quotas: informerQuotas{indexer}}
	case "resourceclasses":
		handler = &resourceClasses{}
	default:
		fmt.Fprintf(os.Stderr, "no handler %q\n", name)
		return 1
	}
	mux := http.NewServeMux()
	for _, path := range []string{PodsPath, ResourceClassesPath} {
		mux.Handle(path, &webhook.Admission{Handler: handler})
	}
	mux.HandleFunc("/memstats", func(w http.ResponseWriter, _ *http.Request) {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		fmt.Fprintf(w, "%d %d %d", m.TotalAlloc, m.Mallocs, m.NumGC)
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = &tls.Config{NextProtos: []string{"http/1.1"}}
	srv.StartTLS()
	defer srv.Close()
	fmt.Printf("%s\n%s\n", srv.URL, base64.StdEncoding.EncodeToString(srv.Certificate().Raw))
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// startSide starts a process serving the named handler with env added to
// its environment, and opens benchWorkers connections to it at path.
func startSide(b *testing.B, name, path string, body []byte, env []string) *side {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envServe+"="+name), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(stdout)
	var url, cert string
	if lines.Scan() {
		url = lines.Text()
	}
	if lines.Scan() {
		cert = lines.Text()
	}
	der, err := base64.StdEncoding.DecodeString(cert)
	if err != nil || url == "" {
		b.Fatalf("%s: the server said %q, %q", name, url, cert)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(parsed)
	// Keep an idle connection per worker, as the apiserver's webhook client
	// does (client-go keeps up to 25 per host); net/http's default of 2 would
	// make requests pay for TLS handshakes.
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: roots, NextProtos: []string{"http/1.1"}},
		MaxIdleConnsPerHost: benchWorkers,
	}}
	s := &side{name: name, url: url, pid: cmd.Process.Pid, load: &openLoop{client: client, url: url + path, body: body}}
	// Open every connection before measuring: a burst, all due at once.
	if _, err := s.load.run(benchWorkers*4, 0); err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	return s
}

// memstats is what the side's server has allocated so far, in bytes and
// objects, and how many collections it has made.
func (s *side) memstats(b *testing.B) (bytes, allocs, collections uint64) {
	b.Helper()
	resp, err := s.load.client.Get(s.url + "/memstats")
	if err != nil {
		b.Fatalf("%s: %v", s.name, err)
	}
	defer resp.Body.Close()
	if _, err := fmt.Fscan(resp.Body, &bytes, &allocs, &collections); err != nil {
		b.Fatalf("%s: /memstats: %v", s.name, err)
	}
	return bytes, allocs, collections
}

// interleave runs rounds rounds of perRound requests, one every interval, on
// each side in turn (the first side first in even rounds, last in odd ones),
// and returns how many cores processes other than the benchmark's used
// meanwhile.
func interleave(b *testing.B, rounds, perRound int, interval time.Duration, sides ...*side) (outsideCores float64) {
	b.Helper()
	ours := func() time.Duration {
		self, err := cpustat.Process(os.Getpid())
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range sides {
			server, err := cpustat.Process(s.pid)
			if err != nil {
				b.Fatal(err)
			}
			self += server
		}
		return self
	}
	machine := func() time.Duration {
		m, err := cpustat.Machine()
		if err != nil {
			b.Fatal(err)
		}
		return m
	}
	machine0, ours0 := machine(), ours()
	start := time.Now()
	for r := range rounds {
		for k := range sides {
			s := sides[k]
			if r%2 == 1 {
				s = sides[len(sides)-1-k]
			}
			bytes0, allocs0, gc0 := s.memstats(b)
			roundStart := time.Now()
			l, err := s.load.run(perRound, interval)
			s.seconds += time.Since(roundStart).Seconds()
			if err != nil {
				b.Fatalf("%s: %v", s.name, err)
			}
			bytes1, allocs1, gc1 := s.memstats(b)
			s.rounds = append(s.rounds, l)
			s.bytes += bytes1 - bytes0
			s.allocs += allocs1 - allocs0
			s.collections += gc1 - gc0
			s.requests += perRound
		}
	}
	wall := time.Since(start)
	return float64((machine()-machine0)-(ours()-ours0)) / float64(wall)
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
