package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/resclass/resclass/e2e/framework"
)

// TestWebhookBlocksOnlyWhatItsRulesCover: the pod policies are opt-in, and
// with them on, the pods webhook is called only for the pods they concern,
// so that while every replica is down the apiserver refuses those (fail
// closed) and admits the rest without asking: a node-critical DaemonSet's
// pods outside kube-system among them (a CNI, a GPU operator, monitoring),
// which must come up on new nodes whatever the webhook's state.
func TestWebhookBlocksOnlyWhatItsRulesCover(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	priorityClass(t, ctx, "cluster-services")
	pods := func(ns string) podClient { return podClient{t: t, ctx: ctx, ns: ns} }
	emptySelector := withAffinity(&corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			TopologyKey:       corev1.LabelHostname,
			NamespaceSelector: &metav1.LabelSelector{},
			LabelSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
		}},
	}})
	hasPodWebhooks := func(cfg *admissionregistrationv1.ValidatingWebhookConfiguration) bool {
		return slices.ContainsFunc(cfg.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool {
			return w.Name == "pods.resclass.io" || w.Name == "workloads.resclass.io"
		})
	}

	t.Run("a default install enforces none of the three policies", func(t *testing.T) {
		wh := startWebhook(t, framework.WebhookOptions{Selector: webhookLabel})
		if hasPodWebhooks(wh.Config) {
			t.Errorf("the default configuration has the pods or workloads webhook")
		}
		ns := newNamespace(t, ctx, webhookLabel)
		for name, mutate := range map[string]func(*corev1.Pod){
			"empty-selector":   emptySelector,
			"cluster-services": withPriority("cluster-services"),
			"cross-namespace":  withAffinity(crossNamespaceAffinity()),
		} {
			if err := pods(ns).create(name, mutate); err != nil {
				t.Errorf("%s, no policy on: %v", name, err)
			}
		}
	})

	t.Run("webhook down: covered pods refused, a node-critical DaemonSet's pods admitted", func(t *testing.T) {
		wh := startWebhook(t, framework.WebhookOptions{Policies: componentPolicies, Selector: webhookLabel})
		if !hasPodWebhooks(wh.Config) {
			t.Fatalf("the policies rendered no pods or workloads webhook")
		}
		ns := newNamespace(t, ctx, webhookLabel)
		// Up: the policies are enforced.
		wantDenied(t, pods(ns).create("critical", withPriority("cluster-services")),
			`admission webhook "pods.resclass.io" denied the request`, "insufficient quota to match these scopes: [{PriorityClass In [cluster-services]}]")
		wantDenied(t, pods(ns).create("empty", emptySelector), "empty namespaceSelector selects every namespace")
		// A node-critical pod is not theirs: admitted without a call.
		const calls = `controller_runtime_webhook_requests_total{code="200",webhook="/validate-pods"}`
		before := metric(t, ctx, wh, calls)
		if err := pods(ns).create("node-critical-up", withPriority("system-node-critical")); err != nil {
			t.Errorf("a system-node-critical pod with the webhook up: %v", err)
		}
		if got := metric(t, ctx, wh, calls); got != before {
			t.Errorf("a system-node-critical pod reached the webhook (%v -> %v calls); the rules cover cluster-services only", before, got)
		}

		// A rule edited in at run time that the rendered matchConditions do
		// not cover (another priority class): its pods are never sent, and
		// the webhook says so in its metric, its log and an Event.
		const uncovered = `resclass_webhook_quota_config_uncovered_rules`
		if got := metric(t, ctx, wh, uncovered); got != 0 {
			t.Errorf("%s = %v with the rendered rule, want 0", uncovered, got)
		}
		priorityClass(t, ctx, "high")
		writeFile(t, wh.QuotaConfigPath, "apiVersion: apiserver.config.k8s.io/v1\nkind: ResourceQuotaConfiguration\n"+
			"limitedResources: [{resource: pods, matchScopes: [{scopeName: PriorityClass, operator: In, values: [cluster-services, high]}]}]\n")
		poll(t, ctx, 30*time.Second, "the webhook reports the uncovered rule", func(ctx context.Context) (bool, error) {
			return metric(t, ctx, wh, uncovered) == 1, nil
		})
		if !strings.Contains(wh.Log(), "re-render") {
			t.Errorf("the webhook's log does not say to re-render the configuration")
		}
		poll(t, ctx, 30*time.Second, "a RuleNotCovered Event on the rule's ConfigMap", func(ctx context.Context) (bool, error) {
			events, err := cluster.Client.EventsV1().Events("resclass-system").List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			return slices.ContainsFunc(events.Items, func(e eventsv1.Event) bool {
				return e.Reason == "RuleNotCovered" && e.Regarding.Kind == "ConfigMap" && e.Regarding.Name == "resclass-webhook-quota" &&
					strings.Contains(e.Note, "PriorityClass In [cluster-services high]")
			}), nil
		})
		// Not sent, so not enforced: what the report warns of.
		if err := pods(ns).create("high", withPriority("high")); err != nil {
			t.Errorf("a high pod, which the rendered conditions do not send: %v", err)
		}

		wh.Kill()
		wantDenied(t, pods(ns).create("critical", withPriority("cluster-services")), `failed calling webhook "pods.resclass.io"`)
		wantDenied(t, pods(ns).create("empty", emptySelector), `failed calling webhook "pods.resclass.io"`)
		wantDenied(t, pods(ns).create("cross", withAffinity(crossNamespaceAffinity())), `failed calling webhook "pods.resclass.io"`)

		// The DaemonSet: the workloads webhook fails open, so it is admitted.
		labels := map[string]string{"app": "node-critical", "e2e-resclass-webhook": "on"}
		ds, err := cluster.Client.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Name: "node-critical", Labels: labels},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "node-critical"}},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{
						PriorityClassName: "system-node-critical",
						Tolerations:       []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
						Containers:        []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
					},
				},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("a node-critical DaemonSet with the webhook down: %v", err)
		}
		// Its pod for node-1, created as the DaemonSet controller creates it
		// (the embedded cluster runs no DaemonSet controller): under its
		// identity, owned by the DaemonSet, bound to the node by affinity.
		dsController, err := kubernetes.NewForConfig(impersonating("system:serviceaccount:kube-system:daemon-set-controller", "system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"))
		if err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				GenerateName: "node-critical-", Labels: labels,
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))},
			},
			Spec: *ds.Spec.Template.Spec.DeepCopy(),
		}
		pod.Spec.SchedulerName = "e2e-no-such-scheduler" // admission is the point; nothing runs it
		pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-1"}}},
			}}},
		}}
		if _, err := dsController.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Errorf("the node-critical DaemonSet's pod outside kube-system, webhook down: %v", err)
		}
		if err := pods(ns).create("plain", nil); err != nil {
			t.Errorf("a pod no policy concerns, webhook down: %v", err)
		}
	})
}

// crossNamespaceAffinity is a required affinity term over a listed namespace.
func crossNamespaceAffinity() *corev1.Affinity {
	return &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
		TopologyKey:   corev1.LabelHostname,
		Namespaces:    []string{"other"},
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
	}}}}
}
