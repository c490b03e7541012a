package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
)

// startWebhook runs the webhook binary with deploy/webhook's configuration and
// the pod policies turned on as the kustomize component deploy/webhook/policies
// turns them on (a default install enforces none), its covering-quota rule
// included (deploy/webhook/policies/quota-config.yaml).
func startWebhook(ctx context.Context, p *printer, c *framework.Cluster, root string) (*framework.Webhook, error) {
	const file = "deploy/webhook/policies/quota-config.yaml"
	data, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		return nil, err
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(data, &cm); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	rule := cm.Data["quota-config.yaml"]
	if rule == "" {
		return nil, errors.New(file + " has no quota-config.yaml key")
	}
	// The component's webhooks, flags and rule, read from its files.
	wh, err := c.StartWebhook(ctx, framework.WebhookOptions{Component: true, QuotaConfig: []byte(rule)})
	if err != nil {
		return nil, err
	}
	p.line("  The cert rotator (its own ServiceAccount) issued the webhook's certificate into the Secret")
	p.line("  resclass-webhook-tls and its CA into the webhook configurations; the webhook, which may read")
	p.line("  no Secret, serves it from its volume, and the apiserver calls it over TLS.")
	p.line("  The pod policies are opt-in; turned on here as deploy/webhook/policies turns them on.")
	p.line("  Its covering-quota rule (%s):", file)
	for _, l := range strings.Split(strings.TrimSpace(rule), "\n") {
		p.line("    %s", l)
	}
	return wh, nil
}

// badClass tries to create a class with mistakes through the apiserver.
func badClass(ctx context.Context, p *printer, c *framework.Cluster) error {
	rc, err := c.Resclass()
	if err != nil {
		return err
	}
	bad := &v1alpha1.ResourceClass{ObjectMeta: metav1.ObjectMeta{Name: "sloppy"}, Spec: v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{
		MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
			{Key: "memory", Operator: v1alpha1.ResourceSelectorOpGtEq, Values: []string{"30 gigs"}},
			{Key: "speed", Operator: v1alpha1.ResourceSelectorOpGt, Values: []string{"40000"}},
			{Key: "product", Operator: v1alpha1.ResourceSelectorOpLt, Values: []string{"A100"}},
		},
	}}}}
	p.line("  kubectl create resourceclass sloppy: memory GtEq \"30 gigs\"; speed Gt \"40000\"; product Lt \"A100\"")
	_, err = rc.ResclassV1alpha1().ResourceClasses().Create(ctx, bad, metav1.CreateOptions{})
	if err == nil {
		return errors.New("the webhook admitted a ResourceClass with three mistakes")
	}
	printDenial(p, err)
	return nil
}

// policyPods walks through the affinity policy and the critical-pods quota rule
// with the example rule (docs/webhook.md).
func policyPods(ctx context.Context, p *printer, c *framework.Cluster) error {
	pods := c.Client.CoreV1().Pods("demo")
	if _, err := c.Client.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{
		ObjectMeta: metav1.ObjectMeta{Name: "cluster-services"}, Value: 1000000,
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	pod := func(name string, mutate func(*corev1.Pod)) *corev1.Pod {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "demo"},
			Spec: corev1.PodSpec{
				// Admission is the point here: no scheduler takes these.
				SchedulerName: "demo-admission-only",
				Containers:    []corev1.Container{{Name: "main", Image: "registry.example/app:1"}},
			},
		}
		mutate(pod)
		return pod
	}
	try := func(what string, pod *corev1.Pod, wantAllowed bool) error {
		p.line("  %s", what)
		_, err := pods.Create(ctx, pod, metav1.CreateOptions{})
		switch {
		case err == nil && wantAllowed:
			p.line("    admitted")
		case err != nil && !wantAllowed:
			printDenial(p, err)
		case err == nil:
			return fmt.Errorf("%s: admitted, want a denial", what)
		default:
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}

	antiAll := pod("anti-everyone", func(p *corev1.Pod) {
		p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			TopologyKey: "topology.kubernetes.io/zone", NamespaceSelector: &metav1.LabelSelector{},
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "batch"}},
		}}}}
	})
	if err := try("affinity policy: anti-affinity with namespaceSelector: {} (every namespace)", antiAll, false); err != nil {
		return err
	}
	crossNS := pod("near-the-db", func(p *corev1.Pod) {
		p.Spec.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			TopologyKey: "kubernetes.io/hostname", Namespaces: []string{"databases"},
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
		}}}}
	})
	if err := try("affinity policy: affinity to pods in namespace databases, no quota in demo", crossNS, false); err != nil {
		return err
	}
	critical := pod("critical", func(p *corev1.Pod) { p.Spec.PriorityClassName = "cluster-services" })
	if err := try("critical-pods quota: priorityClassName cluster-services, no quota in demo", critical, false); err != nil {
		return err
	}
	p.line("  kubectl -n demo create quota: pods: \"2\", scoped PriorityClass In [cluster-services]")
	quotas := c.Client.CoreV1().ResourceQuotas("demo")
	if _, err := quotas.Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "cluster-services"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("2")},
			ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{
				ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpIn, Values: []string{"cluster-services"}}}}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := waitQuotaStatus(ctx, c, "demo", "cluster-services"); err != nil {
		return err
	}
	for i, want := range []bool{true, true, false} {
		name := fmt.Sprintf("critical-%d", i+1)
		what := fmt.Sprintf("critical-pods quota: %s with priorityClassName cluster-services", name)
		if !want {
			what += " (the quota's third)"
			// The quota controller recounts from its own pod informer and
			// may write a usage that misses a pod just admitted, which
			// would admit a third: wait until it has counted both.
			if err := waitQuotaUsed(ctx, c, "demo", "cluster-services", 2); err != nil {
				return err
			}
		}
		if err := try(what, pod(name, func(p *corev1.Pod) { p.Spec.PriorityClassName = "cluster-services" }), want); err != nil {
			return err
		}
	}
	p.line("  (the webhook asks for a covering quota; the apiserver's own ResourceQuota admission counts)")
	return nil
}

func waitQuotaStatus(ctx context.Context, c *framework.Cluster, ns, name string) error {
	// Until the quota controller writes the status, the apiserver refuses the
	// pods the quota covers.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		q, err := c.Client.CoreV1().ResourceQuotas(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && len(q.Status.Hard) > 0, nil
	})
	if err != nil {
		return fmt.Errorf("quota %s/%s has no status: %w", ns, name, err)
	}
	return nil
}

// waitQuotaUsed waits until quota ns/name's status counts pods pods.
func waitQuotaUsed(ctx context.Context, c *framework.Cluster, ns, name string, pods int64) error {
	var used resource.Quantity
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		q, err := c.Client.CoreV1().ResourceQuotas(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		used = q.Status.Used[corev1.ResourcePods]
		return used.Value() == pods, nil
	})
	if err != nil {
		return fmt.Errorf("quota %s/%s counts %s pods, want %d: %w", ns, name, used.String(), pods, err)
	}
	return nil
}

// printDenial prints an admission error, one cause a line where it has them.
func printDenial(p *printer, err error) {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Details != nil && len(status.Status().Details.Causes) > 0 {
		p.line("    refused: %s", strings.SplitN(status.Status().Message, ": ", 2)[0])
		for _, cause := range status.Status().Details.Causes {
			p.line("      %s: %s", cause.Field, cause.Message)
		}
		return
	}
	p.line("    refused: %s", err)
}

// startDistribution runs the ResourceDistribution controller apart, as its
// own ServiceAccount (deploy/distribution, which an install opts into).
func startDistribution(ctx context.Context, p *printer, c *framework.Cluster) (*framework.Distribution, error) {
	ctl, err := c.StartDistribution(ctx, framework.DistributionOptions{})
	if err != nil {
		return nil, err
	}
	p.line("  The controller (deploy/distribution, opt-in) runs as its own ServiceAccount resclass-distribution;")
	p.line("  the admission policy resclass-distribution-writes lets it write distribution copies and nothing else.")
	return ctl, nil
}

// distribute walks through ResourceDistribution: a ConfigMap copied into the namespaces a
// label selects, one that joins later, a Secret that meets a foreign
// same-named Secret (left alone, reported), and an author who may not write
// every target (refused).
func distribute(ctx context.Context, p *printer, c *framework.Cluster) error {
	rc, err := c.Resclass()
	if err != nil {
		return err
	}
	nss := c.Client.CoreV1().Namespaces()
	for _, ns := range []string{"ml-train", "ml-serve", "web"} {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if strings.HasPrefix(ns, "ml-") {
			n.Labels = map[string]string{"team": "ml"}
		}
		if _, err := nss.Create(ctx, n, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	rd := &v1alpha1.ResourceDistribution{
		ObjectMeta: metav1.ObjectMeta{Name: "ml-settings"},
		Spec: v1alpha1.ResourceDistributionSpec{
			Resource: runtime.RawExtension{Raw: []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"ml-settings"},"data":{"NCCL_IB_HCA":"mlx5"}}`)},
			Targets:  v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ml"}}},
		},
	}
	p.line("  ResourceDistribution ml-settings: ConfigMap ml-settings into namespaces labelled team=ml")
	created, err := rc.ResclassV1alpha1().ResourceDistributions().Create(ctx, rd, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	p.line("    its author, recorded by the webhook and bound to the requester by the policy resclass-spec-author (%s): %s",
		v1alpha1.AnnotationAuthorUser, created.Annotations[v1alpha1.AnnotationAuthorUser])
	if err := waitDistributed(ctx, c, rd.Name, 2); err != nil {
		return err
	}
	if err := printTable(ctx, p, c, "/apis/resclass.io/v1alpha1/resourcedistributions"); err != nil {
		return err
	}
	p.line("  kubectl label namespace web team=ml: the new target gets its copy (the author may write there)")
	if _, err := nss.Patch(ctx, "web", types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"ml"}}}`), metav1.PatchOptions{}); err != nil {
		return err
	}
	if err := waitDistributed(ctx, c, rd.Name, 3); err != nil {
		return err
	}
	cm, err := c.Client.CoreV1().ConfigMaps("web").Get(ctx, "ml-settings", metav1.GetOptions{})
	if err != nil {
		return err
	}
	p.line("    web/ml-settings: data %v, owned by ResourceDistribution %s, %s=%s", cm.Data, cm.OwnerReferences[0].Name,
		v1alpha1.AnnotationDistributedBy, cm.Annotations[v1alpha1.AnnotationDistributedBy])

	if _, err := c.Client.CoreV1().Secrets("ml-serve").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "registry"}, StringData: map[string]string{"owner": "the serving team"},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	p.line("  ResourceDistribution registry: Secret registry into team=ml, where ml-serve has its own Secret registry")
	secret := rd.DeepCopy()
	secret.Name = "registry"
	secret.Spec.Resource = runtime.RawExtension{Raw: []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"registry"},"stringData":{"token":"not-printed"}}`)}
	if _, err := rc.ResclassV1alpha1().ResourceDistributions().Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		return err
	}
	var synced *metav1.Condition
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, secret.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		synced = meta.FindStatusCondition(got.Status.Conditions, "Synced")
		return got.Status.Succeeded == 2 && synced != nil && synced.Reason == "Conflict", nil
	})
	if err != nil {
		return fmt.Errorf("ResourceDistribution registry did not report the conflict: %w", err)
	}
	p.line("    Synced=%s (%s): %s", synced.Status, synced.Reason, synced.Message)
	p.line("    ml-train and web got the copy; ml-serve's Secret is never touched (delete it, and the copy follows)")

	// dana may write Secrets in ml-train only: she cannot use a distribution
	// to reach the other namespaces.
	if err := grantDemo(ctx, c, "dana", "", rbacv1.PolicyRule{APIGroups: []string{"resclass.io"}, Resources: []string{"resourcedistributions"}, Verbs: []string{"create"}}); err != nil {
		return err
	}
	if err := grantDemo(ctx, c, "dana", "ml-train", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}}); err != nil {
		return err
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "dana", Groups: []string{"system:authenticated"}}
	dana, err := versioned.NewForConfig(cfg)
	if err != nil {
		return err
	}
	p.line("  dana, who may create Secrets in ml-train only, distributes a Secret to team=ml")
	danas := secret.DeepCopy()
	danas.Name = "danas-token"
	_, err = dana.ResclassV1alpha1().ResourceDistributions().Create(ctx, danas, metav1.CreateOptions{})
	if err == nil {
		return errors.New("a distribution into namespaces its author may not write was admitted")
	}
	printDenial(p, err)
	return nil
}

// grantDemo gives user rule, cluster-wide when ns is "".
func grantDemo(ctx context.Context, c *framework.Cluster, user, ns string, rule rbacv1.PolicyRule) error {
	name := "demo-" + user + "-" + rule.Resources[0]
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: user, APIGroup: rbacv1.GroupName}}
	if ns == "" {
		if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{rule}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		_, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}, Subjects: subjects}, metav1.CreateOptions{})
		return err
	}
	if _, err := c.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{rule}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err := c.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: subjects}, metav1.CreateOptions{})
	return err
}

func waitDistributed(ctx context.Context, c *framework.Cluster, name string, n int32) error {
	rc, err := c.Resclass()
	if err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		rd, err := rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, name, metav1.GetOptions{})
		return err == nil && rd.Status.Succeeded == n && rd.Status.Desired == n, nil
	})
	if err != nil {
		return fmt.Errorf("ResourceDistribution %s did not reach %d copies: %w", name, n, err)
	}
	return nil
}
