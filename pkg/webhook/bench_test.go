package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/quota"
)

// The load BenchmarkAdmission offers: benchRate requests per second,
// benchRequests of them (2 s) per iteration, sent through benchWorkers
// keep-alive connections. The rate is well within what one replica answers
// on two cores, so the figures are service time plus the queueing of an
// unsaturated server, not the collapse of a saturated one.
const (
	benchRate     = 2000
	benchRequests = 4000
	benchWorkers  = 16
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
// It reports p50 and p99 over every request of every iteration; ns/op is
// suppressed, it would only be the length of the schedule. The
// baseline-allow-all handler answers Allowed without looking, the same
// TLS, HTTP and AdmissionReview decoding and encoding with no policy, so
// the siblings' ratios are the cost of the policies themselves. The
// ResourceQuotas come from a client-go indexer, the store an informer fills,
// read the way controller-runtime's cache reader reads it with
// UnsafeDisableDeepCopy (by namespace index, objects as stored).
func BenchmarkAdmission(b *testing.B) {
	cfg := mustParseQuotaConfig(b, benchQuotaConfig)
	pods := &podPolicies{
		config: func() *quota.Config { return cfg },
		quotas: indexerReader(b, benchQuotas()...),
	}
	podReview := review(b, "admission.k8s.io/v1", ptr.To(podRequest(admissionv1.Create, "team-a", mustJSON(b, benchPod())).AdmissionRequest))
	classReview := review(b, "admission.k8s.io/v1", ptr.To(classRequest(admissionv1.Create, mustJSON(b, benchClass()), nil).AdmissionRequest))

	for _, bc := range []struct {
		name    string
		path    string
		handler admission.Handler
		body    []byte
	}{
		{"baseline-allow-all", PodsPath, admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
			return admission.Allowed("")
		}), podReview},
		{"pods", PodsPath, pods, podReview},
		{"resourceclasses", ResourceClassesPath, &resourceClasses{}, classReview},
	} {
		b.Run(bc.name, func(b *testing.B) {
			srv := httptest.NewUnstartedServer(&webhook.Admission{Handler: bc.handler})
			srv.TLS = &tls.Config{NextProtos: []string{"http/1.1"}}
			srv.StartTLS()
			defer srv.Close()
			client := srv.Client()
			// Keep an idle connection per worker, as the apiserver's webhook
			// client does (client-go keeps up to 25 per host); net/http's
			// default of 2 would make requests pay for TLS handshakes.
			client.Transport.(*http.Transport).MaxIdleConnsPerHost = benchWorkers
			load := &openLoop{client: client, url: srv.URL + bc.path, body: bc.body}

			// Open every connection before measuring: a burst, all due at once.
			if _, err := load.run(benchWorkers*4, 0); err != nil {
				b.Fatal(err)
			}
			var latencies []time.Duration
			for b.Loop() {
				l, err := load.run(benchRequests, time.Second/benchRate)
				if err != nil {
					b.Fatal(err)
				}
				latencies = append(latencies, l...)
			}
			slices.Sort(latencies)
			quantile := func(q float64) float64 {
				i := int(q*float64(len(latencies))+0.5) - 1
				return float64(latencies[min(max(i, 0), len(latencies)-1)]) / float64(time.Millisecond)
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(quantile(0.50), "p50-ms")
			b.ReportMetric(quantile(0.99), "p99-ms")
		})
	}
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

// indexerReader lists ResourceQuotas from a client-go indexer by namespace,
// as controller-runtime's cache reader does for a List with
// UnsafeDisableDeepCopy.
func indexerReader(tb testing.TB, quotas ...*corev1.ResourceQuota) client.Reader {
	tb.Helper()
	indexer := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc})
	for _, q := range quotas {
		if err := indexer.Add(q.DeepCopy()); err != nil {
			tb.Fatal(err)
		}
	}
	return indexReader{indexer}
}

type indexReader struct{ indexer toolscache.Indexer }

func (r indexReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("not used by the pod webhook")
}

func (r indexReader) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	o := (&client.ListOptions{}).ApplyOptions(opts)
	objs, err := r.indexer.ByIndex(toolscache.NamespaceIndex, o.Namespace)
	if err != nil {
		return err
	}
	quotas := list.(*corev1.ResourceQuotaList)
	quotas.Items = make([]corev1.ResourceQuota, len(objs))
	for i, obj := range objs {
		quotas.Items[i] = *obj.(*corev1.ResourceQuota)
	}
	return nil
}
