package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// webhookLabel confines the webhooks the tests register to the tests'
// namespaces and objects, so that the other tests sharing the cluster never
// meet them.
var webhookLabel = map[string]string{"e2e-resclass-webhook": "on"}

// The covering-quota rules the tests load, in the apiserver's own formats.
const (
	// "Only allow cross-namespace affinity in some namespaces", with the
	// scope spelled as the policy's proposal spells it, and the critical-pods
	// quota rule (story 1, docs/webhook.md) beside it.
	quotaAffinityAndCriticalPods = `apiVersion: apiserver.config.k8s.io/v1
kind: ResourceQuotaConfiguration
limitedResources:
- resource: pods
  matchScopes:
  - scopeName: CrossNamespaceAffinity
- resource: pods
  matchScopes:
  - scopeName: PriorityClass
    operator: In
    values: ["cluster-services"]
- resource: pods
  matchContains: ["class.resclass.io/"]
`
	// Every priority class needs a covering quota, written as an operator
	// writes it for the apiserver: an AdmissionConfiguration.
	quotaEveryPriorityClass = `apiVersion: apiserver.k8s.io/v1alpha1
kind: AdmissionConfiguration
plugins:
- name: "ResourceQuota"
  configuration:
    apiVersion: resourcequota.admission.k8s.io/v1alpha1
    kind: Configuration
    limitedResources:
    - resource: pods
      matchScopes:
      - operator : Exists
        scopeName: PriorityClass
`
)

// The pod policies are off in a default install; the tests turn them on, as
// an operator does, through the chart's webhook.policies.
var (
	// componentPolicies are the three policies of the kustomize component
	// deploy/webhook/policies.
	componentPolicies = map[string]any{
		"emptyNamespaceSelector": true, "crossNamespaceAffinityQuota": true, "priorityClassQuota": []any{"cluster-services"},
	}
	// coveringPolicies render matchConditions that cover the rules above
	// (quotaAffinityAndCriticalPods and quotaEveryPriorityClass, which it is
	// changed to): every priority class and the class resources too.
	coveringPolicies = map[string]any{
		"emptyNamespaceSelector": true, "crossNamespaceAffinityQuota": true,
		"priorityClassQuota": []any{"*"}, "resourceQuota": []any{"class.resclass.io/"},
	}
)

// TestWebhookPolicies: the webhook binary, bootstrapping its own certificate
// and called by the real apiserver over TLS, enforces the policies of seeds
// 000 and 001 beside the apiserver's own ResourceQuota admission.
func TestWebhookPolicies(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	wh := startWebhook(t, framework.WebhookOptions{Policies: coveringPolicies, QuotaConfig: []byte(quotaAffinityAndCriticalPods), Selector: webhookLabel})
	for _, pc := range []string{"cluster-services", "high"} {
		priorityClass(t, ctx, pc)
	}
	pods := func(ns string) podClient { return podClient{t: t, ctx: ctx, ns: ns} }

	t.Run("affinity/empty namespaceSelector is rejected, with what to write instead", func(t *testing.T) {
		ns := newNamespace(t, ctx, webhookLabel)
		quotaFor(t, ctx, ns, "cross-ns", corev1.ResourceList{corev1.ResourcePods: resource.MustParse("10")},
			corev1.ScopedResourceSelectorRequirement{ScopeName: corev1.ResourceQuotaScopeCrossNamespacePodAffinity, Operator: corev1.ScopeSelectorOpExists})
		p := pods(ns)
		err := p.create("anti-all", withAffinity(&corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{TopologyKey: "kubernetes.io/hostname", NamespaceSelector: &metav1.LabelSelector{}}},
		}}))
		wantDenied(t, err, `admission webhook "pods.resclass.io" denied the request`,
			"spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaceSelector", "empty namespaceSelector selects every namespace")
		err = p.create("prefer-all", withAffinity(&corev1.Affinity{PodAffinity: &corev1.PodAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: 1, PodAffinityTerm: corev1.PodAffinityTerm{TopologyKey: "kubernetes.io/hostname", NamespaceSelector: &metav1.LabelSelector{}}}},
		}}))
		wantDenied(t, err, "spec.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.namespaceSelector")
		// The seed's allowed example: a selector that names what it selects.
		if err := p.create("anti-hpc", withAffinity(&corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{TopologyKey: "kubernetes.io/hostname",
				NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "workload", Operator: metav1.LabelSelectorOpIn, Values: []string{"HPC"}}}}}},
		}})); err != nil {
			t.Errorf("the seed's allowed namespaceSelector: %v", err)
		}
	})

	t.Run("workloads/the pod policies on templates, at apply time, naming the template's field", func(t *testing.T) {
		ns := newNamespace(t, ctx, webhookLabel)
		deployment := func(selector string) []byte {
			return []byte(fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: %s
  labels: {e2e-resclass-webhook: "on"}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - topologyKey: kubernetes.io/hostname
            labelSelector: {matchLabels: {app: web}}
            namespaceSelector: %s
      containers: [{name: c, image: registry.k8s.io/pause:3.10}]
`, ns, selector))
		}
		// kubectl apply --server-side of the Deployment: refused by the
		// webhook, before any ReplicaSet or pod exists.
		_, err := cluster.ApplyManifestData(ctx, "web.yaml", deployment("{}"))
		wantDenied(t, err, `admission webhook "workloads.resclass.io" denied the request`,
			"spec.template.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaceSelector",
			"empty namespaceSelector selects every namespace")
		// Selecting what it means, it reaches other namespaces: its pods need
		// a quota covering CrossNamespacePodAffinity, which the namespace
		// lacks until it is created.
		_, err = cluster.ApplyManifestData(ctx, "web.yaml", deployment("{matchLabels: {team: web}}"))
		wantDenied(t, err, "spec.template: every pod of this Deployment would be refused",
			"insufficient quota to match these scopes: [{CrossNamespacePodAffinity Exists []}]")
		quotaFor(t, ctx, ns, "cross-ns", corev1.ResourceList{corev1.ResourcePods: resource.MustParse("10")},
			corev1.ScopedResourceSelectorRequirement{ScopeName: corev1.ResourceQuotaScopeCrossNamespacePodAffinity, Operator: corev1.ScopeSelectorOpExists})
		// Then it applies; changing its template to {} is refused.
		if _, err := cluster.ApplyManifestData(ctx, "web.yaml", deployment("{matchLabels: {team: web}}")); err != nil {
			t.Fatalf("a Deployment with a namespaceSelector that names namespaces: %v", err)
		}
		_, err = cluster.ApplyManifestData(ctx, "web.yaml", deployment("{}"))
		wantDenied(t, err, "spec.template.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaceSelector")

		// A CronJob whose pods' priority class no quota of the namespace
		// covers: its template is under jobTemplate.
		_, err = cluster.ApplyManifestData(ctx, "nightly.yaml", []byte(fmt.Sprintf(`apiVersion: batch/v1
kind: CronJob
metadata:
  name: nightly
  namespace: %s
  labels: {e2e-resclass-webhook: "on"}
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        spec:
          priorityClassName: cluster-services
          restartPolicy: Never
          containers: [{name: c, image: registry.k8s.io/pause:3.10}]
`, ns)))
		wantDenied(t, err, `admission webhook "workloads.resclass.io" denied the request`,
			"spec.jobTemplate.spec.template: every pod of this CronJob would be refused",
			"insufficient quota to match these scopes: [{PriorityClass In [cluster-services]}]")
	})

	crossNS := withAffinity(&corev1.Affinity{PodAffinity: &corev1.PodAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{TopologyKey: "kubernetes.io/hostname", Namespaces: []string{"other"},
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}},
	}})

	t.Run("affinity/cross-namespace affinity only where a quota covers it", func(t *testing.T) {
		bare, covered := newNamespace(t, ctx, webhookLabel), newNamespace(t, ctx, webhookLabel)
		wantDenied(t, pods(bare).create("cross", crossNS),
			"insufficient quota to match these scopes: [{CrossNamespacePodAffinity Exists []}]")
		if err := pods(bare).create("same-ns", withAffinity(&corev1.Affinity{PodAffinity: &corev1.PodAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{TopologyKey: "kubernetes.io/hostname",
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}},
		}})); err != nil {
			t.Errorf("affinity within the pod's own namespace needs no quota: %v", err)
		}
		// "a hard limit equal to the number of pods that are allowed to": the
		// apiserver counts, the webhook only asks that the quota be there.
		quotaFor(t, ctx, covered, "cross-ns", corev1.ResourceList{corev1.ResourcePods: resource.MustParse("2")},
			corev1.ScopedResourceSelectorRequirement{ScopeName: corev1.ResourceQuotaScopeCrossNamespacePodAffinity, Operator: corev1.ScopeSelectorOpExists})
		for _, name := range []string{"cross-1", "cross-2"} {
			if err := pods(covered).create(name, crossNS); err != nil {
				t.Fatalf("%s in a covered namespace: %v", name, err)
			}
		}
		wantDenied(t, pods(covered).create("cross-3", crossNS), "exceeded quota: cross-ns")
	})

	t.Run("affinity/disable cross-namespace affinity in foo-ns", func(t *testing.T) {
		foo := newNamespace(t, ctx, webhookLabel)
		quotaFor(t, ctx, foo, "disable-cross-namespace-affinity", corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")},
			corev1.ScopedResourceSelectorRequirement{ScopeName: corev1.ResourceQuotaScopeCrossNamespacePodAffinity, Operator: corev1.ScopeSelectorOpExists})
		// Covered, so the webhook lets it through; the apiserver's quota of 0 stops it.
		wantDenied(t, pods(foo).create("cross", crossNS), "exceeded quota: disable-cross-namespace-affinity", "limited: pods=0")
		if err := pods(foo).create("plain", nil); err != nil {
			t.Errorf("a pod without cross-namespace affinity in foo-ns: %v", err)
		}
		// The seed spells the scope CrossNamespaceAffinity; the apiserver knows
		// only CrossNamespacePodAffinity in a ResourceQuota (the webhook's
		// configuration accepts both).
		_, err := cluster.Client.CoreV1().ResourceQuotas(foo).Create(ctx, &corev1.ResourceQuota{
			ObjectMeta: metav1.ObjectMeta{Name: "seed-spelling"},
			Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")},
				ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{ScopeName: "CrossNamespaceAffinity", Operator: corev1.ScopeSelectorOpExists}}}},
		}, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) {
			t.Errorf("a ResourceQuota with the seed's scope spelling: got %v, want Invalid (docs/webhook.md says so)", err)
		}
	})

	t.Run("priority/story1 cluster-services only where a quota covers it", func(t *testing.T) {
		user := newNamespace(t, ctx, webhookLabel)
		wantDenied(t, pods(user).create("critical", withPriority("cluster-services")),
			`admission webhook "pods.resclass.io" denied the request: insufficient quota to match these scopes: [{PriorityClass In [cluster-services]}]`)
		for name, mutate := range map[string]func(*corev1.Pod){"no-priority": nil, "other-priority": withPriority("high")} {
			if err := pods(user).create(name, mutate); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
		// The seed's kube-system: the webhook never checks kube-system, and
		// the apiserver's own quota admission counts pods: "10".
		quotaFor(t, ctx, "kube-system", "pods-cluster-services", corev1.ResourceList{corev1.ResourcePods: resource.MustParse("10")},
			corev1.ScopedResourceSelectorRequirement{ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpIn, Values: []string{"cluster-services"}})
		ks := pods("kube-system")
		ks.prefix = "e2e-story1-"
		for i := range 10 {
			if err := ks.create(string(rune('a'+i)), withPriority("cluster-services")); err != nil {
				t.Fatalf("cluster-services pod %d in kube-system: %v", i+1, err)
			}
		}
		wantDenied(t, ks.create("k", withPriority("cluster-services")), "exceeded quota: pods-cluster-services", "limited: pods=10")
		// The same quota in a user namespace covers it there too.
		quotaFor(t, ctx, user, "pods-cluster-services", corev1.ResourceList{corev1.ResourcePods: resource.MustParse("10")},
			corev1.ScopedResourceSelectorRequirement{ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpIn, Values: []string{"cluster-services"}})
		if err := pods(user).create("critical", withPriority("cluster-services")); err != nil {
			t.Errorf("cluster-services where a quota covers it: %v", err)
		}
	})

	t.Run("class requests need a quota on the class, counted by the apiserver", func(t *testing.T) {
		ns := newNamespace(t, ctx, webhookLabel)
		gpus := withClass("nvidia.high.mem", 2)
		wantDenied(t, pods(ns).create("gpu", gpus), "insufficient quota to consume: requests.class.resclass.io/nvidia.high.mem")
		quotaFor(t, ctx, ns, "high-mem", corev1.ResourceList{"requests.class.resclass.io/nvidia.high.mem": resource.MustParse("4")},
			corev1.ScopedResourceSelectorRequirement{ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpIn, Values: []string{"high"}})
		// The quota is scoped to priority high: it does not cover other pods.
		wantDenied(t, pods(ns).create("gpu", gpus), "insufficient quota to consume: requests.class.resclass.io/nvidia.high.mem")
		for _, name := range []string{"high-1", "high-2"} {
			if err := pods(ns).create(name, gpus, withPriority("high")); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		wantDenied(t, pods(ns).create("high-3", gpus, withPriority("high")),
			"exceeded quota: high-mem", "requested: requests.class.resclass.io/nvidia.high.mem=2", "limited: requests.class.resclass.io/nvidia.high.mem=4")
	})

	t.Run("matchConditions skip pods that need no check", func(t *testing.T) {
		ns := newNamespace(t, ctx, webhookLabel)
		const calls = `controller_runtime_webhook_requests_total{code="200",webhook="/validate-pods"}`
		before := metric(t, ctx, wh, calls)
		if err := pods(ns).create("plain", nil); err != nil {
			t.Fatal(err)
		}
		if got := metric(t, ctx, wh, calls); got != before {
			t.Errorf("a pod without priority class, cross-namespace affinity or extended resources reached the webhook (%v -> %v calls)", before, got)
		}
		if err := pods(ns).create("other-priority", withPriority("high")); err != nil {
			t.Fatal(err)
		}
		if got := metric(t, ctx, wh, calls); got != before+1 {
			t.Errorf("a pod with a priority class: %v -> %v calls, want one more", before, got)
		}
	})

	t.Run("priority/story2 reloads the config; a bad one keeps the last good", func(t *testing.T) {
		ns := newNamespace(t, ctx, webhookLabel)
		quotaFor(t, ctx, ns, "pods-cluster-services", corev1.ResourceList{corev1.ResourcePods: resource.MustParse("10")},
			corev1.ScopedResourceSelectorRequirement{ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpIn, Values: []string{"cluster-services"}})
		loads := metric(t, ctx, wh, `resclass_webhook_quota_config_loads_total{result="loaded"}`)
		writeFile(t, wh.QuotaConfigPath, quotaEveryPriorityClass)
		poll(t, ctx, 30*time.Second, "the webhook reloads the story-2 config", func(ctx context.Context) (bool, error) {
			return metric(t, ctx, wh, `resclass_webhook_quota_config_loads_total{result="loaded"}`) > loads, nil
		})
		if err := pods(ns).create("critical", withPriority("cluster-services")); err != nil {
			t.Errorf("cluster-services is covered by the PriorityClass quota: %v", err)
		}
		wantDenied(t, pods(ns).create("high", withPriority("high")), "insufficient quota to match these scopes: [{PriorityClass Exists []}]")
		if err := pods(ns).create("none", withAffinity(nil)); err != nil {
			t.Errorf("a pod without a priority class: %v", err)
		}
		// Story 1's rule is gone: cross-namespace affinity is free again.
		if err := pods(ns).create("cross", crossNS); err != nil {
			t.Errorf("after the reload, cross-namespace affinity is not limited: %v", err)
		}

		writeFile(t, wh.QuotaConfigPath, "apiVersion: apiserver.config.k8s.io/v1\nkind: ResourceQuotaConfiguration\n"+
			"limitedResources: [{resource: pods, matchScopes: [{scopeName: Nope, operator: Exists}]}]\n")
		poll(t, ctx, 30*time.Second, "the webhook reports the invalid config", func(ctx context.Context) (bool, error) {
			return metric(t, ctx, wh, `resclass_webhook_quota_config_last_load_valid`) == 0, nil
		})
		wantDenied(t, pods(ns).create("high", withPriority("high")), "insufficient quota to match these scopes: [{PriorityClass Exists []}]")
		if !strings.Contains(wh.Log(), "Nope") {
			t.Errorf("the webhook's log does not name the invalid scope")
		}
		if got := metric(t, ctx, wh, `resclass_webhook_denials_total{reason="uncovered-scopes",webhook="/validate-pods"}`); got < 3 {
			t.Errorf("resclass_webhook_denials_total for uncovered scopes = %v, want at least the 3 denials seen so far", got)
		}
	})

	t.Run("ResourceClass selectors validated, spec immutable", func(t *testing.T) {
		rc, err := cluster.Resclass()
		if err != nil {
			t.Fatal(err)
		}
		classes := rc.ResclassV1alpha1().ResourceClasses()
		bad := &v1alpha1.ResourceClass{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-webhook-bad", Labels: webhookLabel},
			Spec: v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
				{Key: "kind", Operator: "In", Values: []string{"GPU"}},
				{Key: "memory", Operator: "Gt", Values: []string{"lots"}},
			}}}},
		}
		_, err = classes.Create(ctx, bad, metav1.CreateOptions{})
		wantDenied(t, err, `admission webhook "resourceclasses.resclass.io" denied the request`,
			`ResourceClass.resclass.io "e2e-webhook-bad" is invalid`, "spec.resourceSelector[0].matchExpressions[1].values[0]")
		good := bad.DeepCopy()
		good.Name = "e2e-webhook-good"
		good.Spec.ResourceSelector[0].MatchExpressions[1].Values = []string{"30G"}
		created, err := classes.Create(ctx, good, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = classes.Delete(context.Background(), created.Name, metav1.DeleteOptions{}) })
		// The scheduler writes the class's status meanwhile: change the
		// latest version, so that a conflict does not stand in for the denial.
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			changed, err := classes.Get(ctx, created.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			changed.Spec.ResourceSelector[0].MatchExpressions[1].Values = []string{"40G"}
			_, err = classes.Update(ctx, changed, metav1.UpdateOptions{})
			return err
		})
		wantDenied(t, err, "spec is immutable")
		// Likewise relabel the latest version.
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			latest, err := classes.Get(ctx, created.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if latest.Labels == nil {
				latest.Labels = map[string]string{}
			}
			latest.Labels["team"] = "ml"
			_, err = classes.Update(ctx, latest, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Errorf("a metadata change is allowed: %v", err)
		}
	})

	t.Run("certificate rotation without a restart", func(t *testing.T) {
		pid := wh.PID()
		served, err := wh.ServedCertificate()
		if err != nil {
			t.Fatal(err)
		}
		secrets := cluster.Client.CoreV1().Secrets("resclass-system")
		secret, err := secrets.Get(ctx, "resclass-webhook-tls", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		oldCA := secret.Data["ca.crt"]
		// A CA that no longer parses is what an expired one looks like to
		// the cert rotator: it issues a new CA and certificate and injects the
		// CA; the webhook, which may not read the Secret, serves the new
		// certificate once the Secret volume brings it.
		secret.Data["ca.crt"] = []byte("not a certificate")
		if _, err := secrets.Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(t, ctx, 60*time.Second, "a new certificate is served", func(context.Context) (bool, error) {
			now, err := wh.ServedCertificate()
			return err == nil && !bytes.Equal(now, served), nil
		})
		vwc, err := cluster.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, wh.Config.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range vwc.Webhooks {
			if bytes.Equal(w.ClientConfig.CABundle, oldCA) || len(w.ClientConfig.CABundle) == 0 {
				t.Errorf("webhook %s still has the old (or no) caBundle", w.Name)
			}
		}
		// The apiserver trusts the new certificate: it gets answers again.
		ns := newNamespace(t, ctx, webhookLabel)
		poll(t, ctx, 30*time.Second, "the apiserver reaches the rotated webhook", func(ctx context.Context) (bool, error) {
			err := pods(ns).create("high", withPriority("high"))
			return err != nil && strings.Contains(err.Error(), "insufficient quota to match these scopes"), nil
		})
		if wh.PID() != pid {
			t.Errorf("the webhook restarted (pid %d -> %d)", pid, wh.PID())
		}
	})

	// Last: it leaves the webhook dead.
	t.Run("an outage fails closed, only for the pods it guards", func(t *testing.T) {
		ns := newNamespace(t, ctx, webhookLabel)
		wh.Kill()
		wantDenied(t, pods(ns).create("critical", withPriority("cluster-services")), `failed calling webhook "pods.resclass.io"`)
		if err := pods(ns).create("plain", nil); err != nil {
			t.Errorf("a pod the matchConditions skip must not depend on the webhook: %v", err)
		}
		ks := pods("kube-system")
		ks.prefix = "e2e-outage-"
		if err := ks.create("critical", withPriority("cluster-services")); err != nil {
			t.Errorf("kube-system must not depend on the webhook: %v", err)
		}
	})
}

// startWebhook starts the webhook binary for one test or benchmark and
// stops it, removing its webhook configuration, when that ends.
func startWebhook(tb testing.TB, opts framework.WebhookOptions) *framework.Webhook {
	tb.Helper()
	wh, err := cluster.StartWebhook(context.Background(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := wh.Stop(context.Background()); err != nil {
			tb.Errorf("stopping the webhook: %v", err)
		}
	})
	return wh
}

// startDistribution starts the ResourceDistribution controller for one test
// or benchmark and stops it when that ends.
func startDistribution(tb testing.TB, opts framework.DistributionOptions) *framework.Distribution {
	tb.Helper()
	d, err := cluster.StartDistribution(context.Background(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := d.Stop(); err != nil {
			tb.Errorf("stopping the ResourceDistribution controller: %v", err)
		}
	})
	return d
}

// podClient creates small pods that no scheduler takes (they stay Pending), so
// that only admission is exercised.
type podClient struct {
	t      *testing.T
	ctx    context.Context
	ns     string
	prefix string
}

func (p podClient) create(name string, mutate ...func(*corev1.Pod)) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.prefix + name, Namespace: p.ns, Labels: map[string]string{"e2e-resclass-webhook": "on"}},
		Spec: corev1.PodSpec{
			SchedulerName: "e2e-no-such-scheduler",
			Containers:    []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	for _, m := range mutate {
		if m != nil {
			m(pod)
		}
	}
	_, err := cluster.Client.CoreV1().Pods(p.ns).Create(p.ctx, pod, metav1.CreateOptions{})
	if err == nil && p.ns == "kube-system" {
		p.t.Cleanup(func() {
			_ = cluster.Client.CoreV1().Pods(p.ns).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		})
	}
	return err
}

func withAffinity(a *corev1.Affinity) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.Affinity = a }
}

func withPriority(class string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.PriorityClassName = class }
}

func withClass(class string, n int64) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(v1alpha1.ResourceNamePrefix + class): *resource.NewQuantity(n, resource.DecimalSI)}
	}
}

func priorityClass(t testing.TB, ctx context.Context, name string) {
	t.Helper()
	_, err := cluster.Client.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Value: 1000,
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// quotaFor creates a ResourceQuota and waits until the quota controller has
// written its status: until then the apiserver refuses every pod it covers.
func quotaFor(t *testing.T, ctx context.Context, ns, name string, hard corev1.ResourceList, scopes ...corev1.ScopedResourceSelectorRequirement) {
	t.Helper()
	quotas := cluster.Client.CoreV1().ResourceQuotas(ns)
	_, err := quotas.Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ResourceQuotaSpec{Hard: hard, ScopeSelector: &corev1.ScopeSelector{MatchExpressions: scopes}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = quotas.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	poll(t, ctx, 30*time.Second, "quota "+ns+"/"+name+" has a status", func(ctx context.Context) (bool, error) {
		q, err := quotas.Get(ctx, name, metav1.GetOptions{})
		return err == nil && len(q.Status.Hard) == len(hard) && len(q.Status.Used) == len(hard), nil
	})
}

func wantDenied(t *testing.T, err error, substrings ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("allowed, want a denial saying %q", substrings)
		return
	}
	for _, s := range substrings {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("denial %q does not say %q", err, s)
		}
	}
}

func metric(t *testing.T, ctx context.Context, wh *framework.Webhook, prefix string) float64 {
	t.Helper()
	v, err := wh.Metric(ctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}
