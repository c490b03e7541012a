package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/e2e/framework"
)

// BenchmarkPodCreateWebhooks: pod creations per second through the real
// apiserver with resclass's webhooks registered, against the same creations
// where no webhook applies (baseline-no-webhooks). Every pod is one the pod
// webhook must check — a priority class and a cross-namespace affinity term,
// in a namespace whose quota covers both — so the figure is the webhook's
// worst case. Both namespaces carry the same ResourceQuota, so the
// apiserver's own quota admission costs the same on both sides.
//
// Each run creates the pods with 16 writers on an unthrottled client; ns/op
// means nothing here and is suppressed. The ratio is pods/s with webhooks over
// pods/s without. Beside it, the CPU the kube-apiserver spends per pod on
// both sides, and the webhook's: on a machine where the apiserver, etcd, the
// webhook and the writers share the cores, pods/s follows the CPU per pod, and
// the apiserver's own cost of calling a webhook (matchConditions, encoding
// the review, TLS) shows apart from the webhook's. The handler's latency is
// pkg/webhook's BenchmarkAdmission.
func BenchmarkPodCreateWebhooks(b *testing.B) {
	const pods = 2000
	ctx := context.Background()
	label := map[string]string{"bench-webhook": "on"}
	wh := startWebhook(b, framework.WebhookOptions{Policies: coveringPolicies, QuotaConfig: []byte(quotaAffinityAndCriticalPods), Selector: label})
	priorityClass(b, ctx, "cluster-services")
	client := fastClient(b)
	apiserver, err := cluster.PID("kube-apiserver")
	if err != nil {
		b.Fatal(err)
	}

	// run creates the pods and reports pods/s and the apiserver's CPU per pod
	// while they are created; with webhook set, the webhook's too.
	run := func(b *testing.B, labels map[string]string, webhook int) {
		var podsPerSecond, apiserverCPU, webhookCPU float64
		for b.Loop() {
			ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-", Labels: labels}}, metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			coveringQuota(b, ctx, ns.Name)
			apiserverBefore, webhookBefore := cpuSeconds(b, apiserver), 0.0
			if webhook != 0 {
				webhookBefore = cpuSeconds(b, webhook)
			}
			start := time.Now()
			createPods(b, ctx, client, pods, func(i int) *corev1.Pod {
				return &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i), Namespace: ns.Name, Labels: labels},
					Spec: corev1.PodSpec{
						SchedulerName:     "bench-no-such-scheduler",
						PriorityClassName: "cluster-services",
						Affinity: &corev1.Affinity{PodAffinity: &corev1.PodAffinity{
							PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: 1, PodAffinityTerm: corev1.PodAffinityTerm{
								TopologyKey: "kubernetes.io/hostname", Namespaces: []string{"other"},
								LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
							}}},
						}},
						Containers: []corev1.Container{{Name: "main", Image: "registry.example/app:1"}},
					},
				}
			})
			podsPerSecond = pods / time.Since(start).Seconds()
			apiserverCPU = (cpuSeconds(b, apiserver) - apiserverBefore) / pods * 1e6
			if webhook != 0 {
				webhookCPU = (cpuSeconds(b, webhook) - webhookBefore) / pods * 1e6
			}
			if b.Failed() {
				b.FailNow()
			}
			deleteNamespaceAndWait(b, ctx, ns.Name)
		}
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(podsPerSecond, "pods/s")
		b.ReportMetric(apiserverCPU, "apiserver-cpu-us/pod")
		if webhook != 0 {
			// What the webhook process spends per admission, informers
			// included (every pod create also updates the namespace's quotas,
			// which its informer decodes); it shares this machine's cores
			// with the apiserver it slows down.
			b.ReportMetric(webhookCPU, "webhook-cpu-us/pod")
		}
	}
	b.Run("baseline-no-webhooks", func(b *testing.B) { run(b, map[string]string{"bench-webhook": "off"}, 0) })
	b.Run("webhooks", func(b *testing.B) {
		calls := func() float64 {
			v, err := wh.Metric(ctx, `controller_runtime_webhook_requests_total{code="200",webhook="/validate-pods"}`)
			if err != nil {
				b.Fatal(err)
			}
			return v
		}
		before := calls()
		run(b, label, wh.PID())
		// The figure means something only if every pod went through the webhook.
		if answered := calls() - before; answered < pods {
			b.Fatalf("the pod webhook answered %v requests, want at least %d", answered, pods)
		}
	})
}

// cpuSeconds is the user and system CPU time the process has used so far.
func cpuSeconds(b *testing.B, pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name (which may hold spaces) in parentheses;
	// utime and stime are the 14th and 15th fields, in clock ticks (100/s on Linux).
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	utime, err1 := strconv.ParseFloat(fields[11], 64)
	stime, err2 := strconv.ParseFloat(fields[12], 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, data)
	}
	return (utime + stime) / 100
}

// coveringQuota gives ns a quota that covers the benchmark's pods, large
// enough never to run out, and waits for its status.
func coveringQuota(b *testing.B, ctx context.Context, ns string) {
	b.Helper()
	quotas := cluster.Client.CoreV1().ResourceQuotas(ns)
	hard := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("100000")}
	for _, q := range []corev1.ScopedResourceSelectorRequirement{
		{ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpIn, Values: []string{"cluster-services"}},
		{ScopeName: corev1.ResourceQuotaScopeCrossNamespacePodAffinity, Operator: corev1.ScopeSelectorOpExists},
	} {
		_, err := quotas.Create(ctx, &corev1.ResourceQuota{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "cover-"},
			Spec:       corev1.ResourceQuotaSpec{Hard: hard, ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{q}}},
		}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		list, err := quotas.List(ctx, metav1.ListOptions{})
		synced := err == nil && len(list.Items) == 2
		for _, q := range list.Items {
			synced = synced && len(q.Status.Hard) == 1
		}
		if synced {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("the quotas of %s have no status after 30s", ns)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
