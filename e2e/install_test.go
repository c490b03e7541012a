package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	deploydistribution "github.com/resclass/resclass/deploy/distribution"
	"github.com/resclass/resclass/deploy/install"
	deployscheduler "github.com/resclass/resclass/deploy/scheduler"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
)

// TestInstallManifestsAreAccepted: everything `kubectl apply -k deploy/` and
// `helm install` would send — with the chart's defaults and with the values
// operators change most — is accepted by the real apiserver (server-side
// dry-run: full validation and admission, nothing stored).
func TestInstallManifestsAreAccepted(t *testing.T) {
	ctx := context.Background()
	kustomized, err := install.Kustomize()
	if err != nil {
		t.Fatal(err)
	}
	renders := map[string][]*unstructured.Unstructured{"kustomize deploy/": kustomized}
	for name, values := range map[string]map[string]any{
		"helm defaults": nil,
		// Every pod policy on: the apiserver compiles the rendered CEL of the
		// pods and workloads webhooks' matchConditions.
		"helm BinPack, PreBind, assignment writers, every pod policy, no node agent": {
			"scheduler": map[string]any{"strategy": "BinPack", "assignmentWrite": "PreBind",
				"assignmentWriters": map[string]any{"users": []string{"system:serviceaccount:ops:repair"}, "groups": []string{"ops-admins"}}},
			"webhook": map[string]any{"policies": map[string]any{
				"emptyNamespaceSelector": true, "crossNamespaceAffinityQuota": true,
				"priorityClassQuota": []string{"cluster-services", "high"}, "resourceQuota": []string{"class.resclass.io/", "nvidia.com/"},
			}},
			"nodeAgent": map[string]any{"enabled": false},
		},
		"helm, every priority class limited":            {"webhook": map[string]any{"policies": map[string]any{"priorityClassQuota": []string{"*"}}}},
		"helm with the ResourceDistribution controller": {"distribution": map[string]any{"enabled": true}},
		"helm with the stock profile resclass-dra":      {"scheduler": map[string]any{"dra": map[string]any{"enabled": true}}},
	} {
		objs, err := install.HelmTemplate(ctx, values)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		renders[name] = objs
	}
	// The Namespaces for real: a dry-run creates nothing to dry-run into.
	applyNamespaces(t, kustomized)
	apply := dryRunApplier(t)
	for name, objs := range renders {
		t.Run(name, func(t *testing.T) {
			if len(objs) < 20 {
				t.Fatalf("rendered %d objects, want the whole install", len(objs))
			}
			for _, obj := range objs {
				if err := apply(ctx, obj); err != nil {
					t.Errorf("%s %s/%s: %v", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
				}
			}
		})
	}
}

// dryRunApplier server-side applies an object with dryRun=All, as
// `kubectl apply --server-side --dry-run=server` does.
func dryRunApplier(t *testing.T) func(context.Context, *unstructured.Unstructured) error {
	t.Helper()
	return applier(t, []string{metav1.DryRunAll})
}

// applier server-side applies an object as the field manager
// resclass-install-e2e, for real when dryRun is empty.
func applier(t *testing.T, dryRun []string) func(context.Context, *unstructured.Unstructured) error {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	client, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	return func(ctx context.Context, obj *unstructured.Unstructured) error {
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s is not served: %w", gvk, err)
		}
		ri := client.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		_, err = ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "resclass-install-e2e", Force: true, DryRun: dryRun})
		return err
	}
}

// TestComponentsCannotDoMore: each component's ServiceAccount, with the RBAC
// deploy/ installs (the other e2e tests prove it suffices: every component runs
// under it), is refused what its job does not need.
func TestComponentsCannotDoMore(t *testing.T) {
	ctx := context.Background()
	// The RBAC of all five, as installed (the ResourceDistribution
	// controller's is the opt-in component deploy/distribution).
	kustomized, err := install.Kustomize()
	if err != nil {
		t.Fatal(err)
	}
	rbac := append(slices.Clone(deploydistribution.RBAC), "\n---\n"...)
	for _, obj := range kustomized {
		switch obj.GetKind() {
		case "Namespace":
			// Where the ServiceAccounts go; their Pod Security labels are
			// TestInstallPodSecurity's.
			data, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": obj.GetName()}})
			if err != nil {
				t.Fatal(err)
			}
			rbac = append(append(rbac, data...), "\n---\n"...)
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			data, err := obj.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			rbac = append(append(rbac, data...), "\n---\n"...)
		}
	}
	if _, err := cluster.ApplyManifestData(ctx, "deploy/ (RBAC)", rbac); err != nil {
		t.Fatal(err)
	}

	sa := func(name string) string {
		if name == "resclass-node-agent" {
			return "system:serviceaccount:" + install.NodeAgentNamespace + ":" + name
		}
		return "system:serviceaccount:" + install.Namespace + ":" + name
	}
	type check struct {
		verb, group, resource, subresource, namespace, name string
		allowed                                             bool
	}
	for _, c := range []struct {
		user   string
		checks []check
	}{{
		user: sa("resclass-node-agent"),
		checks: []check{
			{verb: "patch", group: "resclass.io", resource: "nodedevices", allowed: true},
			{verb: "delete", group: "resclass.io", resource: "nodedevices"},
			{verb: "update", group: "", resource: "pods"},
			{verb: "delete", group: "", resource: "nodes"},
			{verb: "get", group: "", resource: "secrets", namespace: "default"},
			{verb: "create", group: "resclass.io", resource: "resourceclasses"},
			{verb: "update", group: "resclass.io", resource: "resourceclasses", subresource: "status"},
			// Pods in its own namespace would run privileged on any node.
			{verb: "create", group: "", resource: "pods", namespace: install.NodeAgentNamespace},
			{verb: "create", group: "apps", resource: "daemonsets", namespace: install.NodeAgentNamespace},
			{verb: "get", group: "", resource: "secrets", namespace: install.NodeAgentNamespace},
			// DRA mode: its node's ResourceSlices (the admission policy
			// narrows them to its node and driver; TestDRANode), the
			// claims it prepares read-only, and no DeviceClass.
			{verb: "create", group: "resource.k8s.io", resource: "resourceslices", allowed: true},
			{verb: "get", group: "resource.k8s.io", resource: "resourceclaims", namespace: "default", allowed: true},
			{verb: "update", group: "resource.k8s.io", resource: "resourceclaims", subresource: "status", namespace: "default"},
			{verb: "list", group: "resource.k8s.io", resource: "resourceclaims", namespace: "default"},
			{verb: "create", group: "resource.k8s.io", resource: "deviceclasses"},
		},
	}, {
		user: sa("resclass-scheduler"),
		checks: []check{
			{verb: "create", group: "", resource: "pods", subresource: "binding", namespace: "default", allowed: true},
			{verb: "update", group: "resclass.io", resource: "resourceclasses", subresource: "status", allowed: true},
			{verb: "update", group: "resclass.io", resource: "resourceclasses"},
			{verb: "patch", group: "resclass.io", resource: "nodedevices"},
			{verb: "get", group: "", resource: "secrets", namespace: "default"},
			{verb: "create", group: "resclass.io", resource: "resourcedistributions"},
		},
	}, {
		user: sa("resclass-webhook"),
		checks: []check{
			{verb: "list", group: "", resource: "resourcequotas", allowed: true},
			{verb: "watch", group: "", resource: "namespaces", allowed: true},
			{verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews", allowed: true},
			// ... and no more: no Secret at all, its own TLS Secret included
			// (the kubelet mounts it), no ConfigMap, no Lease (nothing needs
			// a leader), no webhook configuration (the cert rotator's job).
			{verb: "get", group: "", resource: "secrets", namespace: "resclass-system", name: "resclass-webhook-tls"},
			{verb: "list", group: "", resource: "secrets", namespace: "resclass-system"},
			{verb: "watch", group: "", resource: "secrets", namespace: "resclass-system"},
			{verb: "update", group: "", resource: "secrets", namespace: "resclass-system", name: "resclass-webhook-tls"},
			{verb: "create", group: "", resource: "secrets", namespace: "team-a"},
			{verb: "get", group: "", resource: "secrets", namespace: "team-a"},
			{verb: "list", group: "", resource: "secrets"},
			{verb: "create", group: "", resource: "secrets", namespace: "resclass-system"},
			{verb: "get", group: "", resource: "configmaps", namespace: "team-a"},
			{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: "resclass-system"},
			{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "resclass-system", name: "resclass-webhook"},
			{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "resclass-system", name: "resclass-scheduler"},
			{verb: "update", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "resclass-webhook"},
			{verb: "update", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: "resclass-webhook"},
			{verb: "create", group: "", resource: "pods", namespace: "team-a"},
			{verb: "create", group: "", resource: "serviceaccounts", subresource: "token", namespace: "team-a"},
			{verb: "create", group: "rbac.authorization.k8s.io", resource: "rolebindings", namespace: "team-a"},
			{verb: "patch", group: "", resource: "namespaces"},
			{verb: "delete", group: "", resource: "namespaces"},
			{verb: "get", group: "resclass.io", resource: "resourcedistributions"},
			{verb: "update", group: "resclass.io", resource: "resourcedistributions", subresource: "status"},
			{verb: "update", group: "", resource: "resourcequotas", namespace: "team-a"},
			{verb: "patch", group: "", resource: "nodes"},
		},
	}, {
		user: sa("resclass-webhook-certs"),
		checks: []check{
			// Its Secret and the two configurations, by name; a list or
			// watch by name is what its cache does.
			{verb: "get", group: "", resource: "secrets", namespace: "resclass-system", name: "resclass-webhook-tls", allowed: true},
			{verb: "watch", group: "", resource: "secrets", namespace: "resclass-system", name: "resclass-webhook-tls", allowed: true},
			{verb: "update", group: "", resource: "secrets", namespace: "resclass-system", name: "resclass-webhook-tls", allowed: true},
			{verb: "update", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "resclass-webhook", allowed: true},
			{verb: "update", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: "resclass-webhook", allowed: true},
			// ... and no more: no other Secret, no Secret creation or
			// deletion, no Lease, no other configuration.
			{verb: "list", group: "", resource: "secrets", namespace: "resclass-system"},
			{verb: "get", group: "", resource: "secrets", namespace: "resclass-system", name: "another"},
			{verb: "update", group: "", resource: "secrets", namespace: "resclass-system", name: "another"},
			{verb: "create", group: "", resource: "secrets", namespace: "resclass-system"},
			{verb: "delete", group: "", resource: "secrets", namespace: "resclass-system", name: "resclass-webhook-tls"},
			{verb: "get", group: "", resource: "secrets", namespace: "team-a"},
			{verb: "get", group: "", resource: "configmaps", namespace: "resclass-system"},
			{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: "resclass-system"},
			{verb: "list", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations"},
			{verb: "update", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "someone-elses"},
			{verb: "delete", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "resclass-webhook"},
			{verb: "create", group: "", resource: "pods", namespace: "resclass-system"},
		},
	}, {
		user: sa("resclass-distribution"),
		checks: []check{
			// What the ResourceDistribution controller needs, in any
			// namespace (the admission policy narrows the writes to copies).
			{verb: "create", group: "", resource: "secrets", namespace: "team-a", allowed: true},
			{verb: "delete", group: "", resource: "configmaps", namespace: "team-a", allowed: true},
			{verb: "patch", group: "resclass.io", resource: "resourcedistributions", subresource: "status", allowed: true},
			{verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews", allowed: true},
			{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "resclass-system", name: "resclass-distribution", allowed: true},
			// ... and no more.
			{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "resclass-system", name: "resclass-webhook"},
			{verb: "update", group: "resclass.io", resource: "resourcedistributions"},
			{verb: "create", group: "", resource: "pods", namespace: "team-a"},
			{verb: "create", group: "", resource: "serviceaccounts", subresource: "token", namespace: "team-a"},
			{verb: "create", group: "rbac.authorization.k8s.io", resource: "rolebindings", namespace: "team-a"},
			{verb: "update", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "resclass-webhook"},
			{verb: "patch", group: "", resource: "namespaces"},
		},
	}} {
		for _, ch := range c.checks {
			review, err := cluster.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   c.user,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + strings.Split(c.user, ":")[2], "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: ch.verb, Group: ch.group, Resource: ch.resource,
					Subresource: ch.subresource, Namespace: ch.namespace, Name: ch.name},
			}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if review.Status.Allowed != ch.allowed {
				t.Errorf("%s: %s %s/%s %s ns=%q name=%q: allowed=%v, want %v", strings.TrimPrefix(c.user, "system:serviceaccount:"),
					ch.verb, ch.group, ch.resource, ch.subresource, ch.namespace, ch.name, review.Status.Allowed, ch.allowed)
			}
		}
	}

	// And for real, impersonating the cert rotator: its caBundle update
	// reaches resclass's configuration only.
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: sa("resclass-webhook-certs"),
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:resclass-system", "system:authenticated"}}
	webhookClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fail := admissionregistrationv1.Ignore
	none := admissionregistrationv1.SideEffectClassNone
	url := "https://127.0.0.1:1/never-called"
	other, err := cluster.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-someone-elses-"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "never.e2e.resclass.io", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{"e2e.resclass.io"}, APIVersions: []string{"v1"}, Resources: []string{"nothing"}}}},
			FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), other.Name, metav1.DeleteOptions{})
	})
	other.Webhooks[0].ClientConfig.CABundle = []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
	if _, err := webhookClient.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, other, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the cert rotator's ServiceAccount updating another webhook configuration: %v, want Forbidden", err)
	}
	if _, err := webhookClient.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "e2e-not-allowed"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the cert rotator's ServiceAccount creating a pod: %v, want Forbidden", err)
	}

	// Every ServiceAccount a workload runs as is one the install creates.
	var accounts, used []string
	for _, obj := range kustomized {
		switch obj.GetKind() {
		case "ServiceAccount":
			accounts = append(accounts, obj.GetName())
		case "Deployment", "DaemonSet":
			name, _, _ := unstructured.NestedString(obj.Object, "spec", "template", "spec", "serviceAccountName")
			used = append(used, name)
		}
	}
	for _, u := range used {
		if !slices.Contains(accounts, u) {
			t.Errorf("a workload runs as ServiceAccount %q, which the install does not create (it has %v)", u, accounts)
		}
	}
}

// TestInstallPodSecurity: with the install's Namespaces as rendered — Pod
// Security `restricted` enforced on resclass-system, `privileged` on the node
// agent's resclass-node — the apiserver admits the pods of every workload the
// install runs (kustomize, and Helm with the values that change pod specs),
// and refuses a privileged pod, and the node agent's own pod, in
// resclass-system. Pod Security is enforced on pods, not on their
// Deployments, so each workload's pod template is created as a pod
// (server-side dry-run: admission runs, nothing is stored).
func TestInstallPodSecurity(t *testing.T) {
	ctx := context.Background()
	kustomized, err := install.Kustomize()
	if err != nil {
		t.Fatal(err)
	}
	// The Namespaces and ServiceAccounts for real: Pod Security reads the
	// namespace's labels, and a pod's ServiceAccount must exist.
	namespaces := applyNamespaces(t, kustomized)
	apply := applier(t, nil)
	for _, obj := range kustomized {
		if obj.GetKind() == "ServiceAccount" {
			if err := apply(ctx, obj); err != nil {
				t.Fatal(err)
			}
		}
	}
	if namespaces[install.Namespace] != "restricted" || namespaces[install.NodeAgentNamespace] != "privileged" {
		t.Fatalf("the install's Pod Security levels: %v, want %s restricted and %s privileged", namespaces, install.Namespace, install.NodeAgentNamespace)
	}
	// The release namespace of a Helm install is labelled by hand, as the
	// chart's README and NOTES say: the same label as kustomize's.
	withDistribution, err := install.HelmTemplate(ctx, map[string]any{"distribution": map[string]any{"enabled": true}})
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range withDistribution {
		if obj.GetKind() == "ServiceAccount" {
			if err := apply(ctx, obj); err != nil {
				t.Fatal(err)
			}
		}
	}

	pods := map[string]corev1.Pod{}
	add := func(render string, objs []*unstructured.Unstructured) {
		for _, obj := range objs {
			var tmpl corev1.PodTemplateSpec
			switch obj.GetKind() {
			case "Deployment", "DaemonSet":
				m, _, err := unstructured.NestedMap(obj.Object, "spec", "template")
				if err != nil {
					t.Fatal(err)
				}
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &tmpl); err != nil {
					t.Fatalf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
				}
			default:
				continue
			}
			pods[fmt.Sprintf("%s: %s %s/%s", render, obj.GetKind(), obj.GetNamespace(), obj.GetName())] = corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{GenerateName: obj.GetName() + "-", Namespace: obj.GetNamespace(), Labels: tmpl.Labels},
				Spec:       tmpl.Spec,
			}
		}
	}
	add("kustomize deploy/", kustomized)
	add("helm distribution.enabled", withDistribution)
	for name, values := range map[string]map[string]any{
		"helm nodeAgent.privileged=false":   {"nodeAgent": map[string]any{"privileged": false}},
		"helm cdi-cri, GPU operator driver": {"nodeAgent": map[string]any{"deviceListStrategy": "envvar,cdi-cri", "nvml": map[string]any{"driverRoot": "/run/nvidia/driver"}}},
		"helm certManager":                  {"webhook": map[string]any{"certManagement": "certManager"}},
		"helm scheduler.dra.enabled":        {"scheduler": map[string]any{"dra": map[string]any{"enabled": true}}},
	} {
		objs, err := install.HelmTemplate(ctx, values)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// Their ServiceAccounts too (scheduler.dra.enabled has its own),
		// so that the test does not depend on another having made them.
		for _, obj := range objs {
			if obj.GetKind() == "ServiceAccount" {
				if err := apply(ctx, obj); err != nil {
					t.Fatal(err)
				}
			}
		}
		add(name, objs)
	}
	var workloads []string
	for name := range pods {
		workloads = append(workloads, name)
	}
	slices.Sort(workloads)
	if len(workloads) < 10 {
		t.Fatalf("found %d workloads, want every render's: %v", len(workloads), workloads)
	}
	create := func(ctx context.Context, pod corev1.Pod) error {
		_, err := cluster.Client.CoreV1().Pods(pod.Namespace).Create(ctx, &pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	var agent *corev1.Pod
	for _, name := range workloads {
		pod := pods[name]
		if err := create(ctx, pod); err != nil {
			t.Errorf("%s, in a namespace enforcing %s: %v", name, namespaces[pod.Namespace], err)
			continue
		}
		t.Logf("%s: admitted under Pod Security %s", name, namespaces[pod.Namespace])
		if pod.Namespace == install.NodeAgentNamespace && agent == nil {
			agent = &pod
		}
	}

	// What restricted refuses in resclass-system: a privileged pod, and the
	// node agent's pod (host paths, root), which is why it has a namespace of
	// its own. The same privileged pod is admitted there.
	privileged := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-privileged-", Namespace: install.Namespace},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
			SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}},
	}
	err = create(ctx, privileged)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `violates PodSecurity "restricted:latest"`) || !strings.Contains(err.Error(), "privileged") {
		t.Errorf("a privileged pod in %s: %v, want Forbidden by PodSecurity restricted:latest", install.Namespace, err)
	} else {
		t.Logf("a privileged pod in %s: %v", install.Namespace, err)
	}
	if agent == nil {
		t.Fatal("no node agent pod rendered")
	}
	moved := *agent.DeepCopy()
	moved.Namespace = install.Namespace
	moved.Spec.ServiceAccountName = "resclass-scheduler" // one that exists there
	err = create(ctx, moved)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `violates PodSecurity "restricted:latest"`) || !strings.Contains(err.Error(), `"hostPath"`) {
		t.Errorf("the node agent's pod in %s: %v, want Forbidden for its hostPath volumes", install.Namespace, err)
	}
	privileged.Namespace = install.NodeAgentNamespace
	privileged.Spec.ServiceAccountName = "resclass-node-agent"
	if err := create(ctx, privileged); err != nil {
		t.Errorf("a privileged pod in %s (Pod Security privileged): %v", install.NodeAgentNamespace, err)
	}
}

// applyNamespaces applies the Namespaces among objs for real, labels
// included, and returns each one's enforced Pod Security level. The labels are
// this test's field manager's and given back when the test ends: the other
// tests do not expect them.
func applyNamespaces(t *testing.T, objs []*unstructured.Unstructured) map[string]string {
	t.Helper()
	apply := applier(t, nil)
	levels := map[string]string{}
	for _, obj := range objs {
		if obj.GetKind() != "Namespace" {
			continue
		}
		levels[obj.GetName()] = obj.GetLabels()["pod-security.kubernetes.io/enforce"]
		if err := apply(context.Background(), obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			bare := &unstructured.Unstructured{}
			bare.SetAPIVersion("v1")
			bare.SetKind("Namespace")
			bare.SetName(obj.GetName())
			if err := apply(context.Background(), bare); err != nil {
				t.Errorf("giving back the labels of Namespace %s: %v", obj.GetName(), err)
			}
		})
	}
	return levels
}

// TestDRASchedulerCannotDoMore: the ServiceAccount resclass-dra-scheduler, with
// the RBAC the opt-in component deploy/scheduler/dra installs (Helm
// scheduler.dra.enabled), impersonated against the real apiserver, can do
// what the stock scheduler does for the form class.resclass.io/<class>: bind
// a pod, write a ResourceClaim and its status (the allocation, the
// reservation), create the claim of an extended-resource request, hold its own
// Lease. It cannot write resclass.io objects, NodeDevices, DeviceClasses,
// ResourceSlices, Secrets or the resclass scheduler's Leases, and the
// resclass scheduler's admission policy still refuses it the hand-off
// annotation, in a Binding and in a pod's status update alike. Writes are
// server-side dry-runs: authorization and admission run, nothing is stored.
// (TestDRAExtendedResourceForm runs that scheduler under this identity: the
// grants suffice.)
func TestDRASchedulerCannotDoMore(t *testing.T) {
	ctx := context.Background()
	if _, err := cluster.ApplyManifestData(ctx, "deploy/scheduler/dra/rbac.yaml", deployscheduler.DRARBAC); err != nil {
		t.Fatal(err)
	}
	// The policies as installed (the harness applies them with the resclass
	// scheduler; applying them again changes nothing).
	if _, err := cluster.ApplyManifestData(ctx, "deploy/scheduler/assignment-policy.yaml", deployscheduler.AssignmentPolicy); err != nil {
		t.Fatal(err)
	}
	cfg := impersonating("system:serviceaccount:"+install.Namespace+":resclass-dra-scheduler",
		"system:serviceaccounts", "system:serviceaccounts:"+install.Namespace, "system:authenticated")
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	dryUpdate := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	ns := newNamespace(t, ctx, nil)

	// RBAC and admission take a moment to see new bindings and policies:
	// wait until the first allowed call is. The pod names a scheduler that
	// does not run, so that none binds it first (the resclass-dra one may run,
	// started by the DRA tests).
	pod, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train"},
		Spec: corev1.PodSpec{SchedulerName: "e2e-nobody", Containers: []corev1.Container{{Name: "c", Image: "registry.example/train:1"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	binding := func(annotations map[string]string) *corev1.Binding {
		return &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Annotations: annotations},
			Target: corev1.ObjectReference{Kind: "Node", Name: "dra-node"}}
	}
	var bindErr error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		bindErr = client.CoreV1().Pods(ns).Bind(ctx, binding(nil), dryRun)
		return bindErr == nil, nil
	})
	if err != nil {
		t.Fatalf("the DRA scheduler binding a pod: %v", bindErr)
	}
	hand := forged("dra-node", "nvidia.high.mem", "gpu-0")
	wantPolicyDenial(t, "a Binding with the hand-off", client.CoreV1().Pods(ns).Bind(ctx, binding(map[string]string{assignment.AnnotationKey: hand}), dryRun), assignment.AnnotationKey)

	// Its pod status writes (Unschedulable conditions, nominations) are
	// allowed; the same write carrying the hand-off is the policy's to refuse.
	status := pod.DeepCopy()
	status.Status.Conditions = append(status.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable})
	if _, err := client.CoreV1().Pods(ns).UpdateStatus(ctx, status, dryUpdate); err != nil {
		t.Errorf("the DRA scheduler's pod status update: %v", err)
	}
	status.Annotations = map[string]string{assignment.AnnotationKey: hand}
	_, err = client.CoreV1().Pods(ns).UpdateStatus(ctx, status, dryUpdate)
	wantPolicyDenial(t, "a pod status update with the hand-off", err, assignment.AnnotationKey)
	if err := annotate(ctx, client, ns, pod.Name, map[string]any{assignment.AnnotationKey: hand}); !apierrors.IsForbidden(err) {
		t.Errorf("the DRA scheduler patching a pod's annotations: %v, want Forbidden", err)
	}

	// ResourceClaims: the claim of an extended-resource request created, a
	// claim's finalizer and its status (allocation and reservation) written.
	claim, err := cluster.Client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "train-extended-resources"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "container-0-request-0", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "nvidia.high.mem"},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fresh := claim.DeepCopy()
	fresh.ObjectMeta = metav1.ObjectMeta{GenerateName: "train-extended-resources-"}
	if _, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, fresh, dryRun); err != nil {
		t.Errorf("the DRA scheduler creating a ResourceClaim: %v", err)
	}
	claim.Finalizers = append(claim.Finalizers, "resource.kubernetes.io/delete-protection")
	if _, err := client.ResourceV1().ResourceClaims(ns).Update(ctx, claim, dryUpdate); err != nil {
		t.Errorf("the DRA scheduler adding a ResourceClaim's finalizer: %v", err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "container-0-request-0", Driver: "resclass.io", Pool: "dra-node", Device: "gpu-0",
	}}}}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if _, err := client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, claim, dryUpdate); err != nil {
		t.Errorf("the DRA scheduler writing a ResourceClaim's allocation: %v", err)
	}

	// Its own Lease: create, and get (NotFound, not Forbidden, when absent).
	own := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "resclass-dra-scheduler"}}
	if _, err := client.CoordinationV1().Leases(install.Namespace).Create(ctx, own, dryRun); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Errorf("the DRA scheduler creating its Lease: %v", err)
	}
	if _, err := client.CoordinationV1().Leases(install.Namespace).Get(ctx, own.Name, metav1.GetOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("the DRA scheduler reading its Lease: %v", err)
	}

	// ... and no more.
	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("the DRA scheduler %s: %v, want Forbidden", what, err)
		}
	}
	for _, lease := range []string{"resclass-scheduler", "resclass-class-status"} {
		_, err := client.CoordinationV1().Leases(install.Namespace).Get(ctx, lease, metav1.GetOptions{})
		forbidden("reading the Lease "+lease, err)
		_, err = client.CoordinationV1().Leases(install.Namespace).Update(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: lease}}, dryUpdate)
		forbidden("updating the Lease "+lease, err)
		forbidden("deleting the Lease "+lease, client.CoordinationV1().Leases(install.Namespace).Delete(ctx, lease, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}))
	}
	resclass := func(resource string) dynamic.NamespaceableResourceInterface {
		return dyn.Resource(v1alpha1.SchemeGroupVersion.WithResource(resource))
	}
	object := func(kind, name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": kind, "metadata": map[string]any{"name": name}}}
	}
	_, err = resclass("resourceclasses").Create(ctx, object("ResourceClass", "e2e-dra-identity"), dryRun)
	forbidden("creating a ResourceClass", err)
	_, err = resclass("resourceclasses").UpdateStatus(ctx, object("ResourceClass", "e2e-dra-identity"), dryUpdate)
	forbidden("updating a ResourceClass's status", err)
	_, err = resclass("resourceclasses").List(ctx, metav1.ListOptions{})
	forbidden("listing ResourceClasses", err)
	_, err = resclass("nodedevices").Create(ctx, object("NodeDevices", "dra-node"), dryRun)
	forbidden("creating NodeDevices", err)
	_, err = resclass("nodedevices").Patch(ctx, "dra-node", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
	forbidden("patching NodeDevices", err)
	_, err = resclass("resourcedistributions").Namespace(ns).Create(ctx, object("ResourceDistribution", "e2e-dra-identity"), dryRun)
	forbidden("creating a ResourceDistribution", err)
	_, err = client.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "e2e-dra-identity"}}, dryRun)
	forbidden("creating a DeviceClass", err)
	forbidden("deleting a DeviceClass", client.ResourceV1().DeviceClasses().Delete(ctx, "nvidia.high.mem", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}))
	_, err = client.ResourceV1().ResourceSlices().Create(ctx, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "e2e-dra-identity"},
		Spec: resourceapi.ResourceSliceSpec{Driver: "resclass.io", NodeName: ptr.To("dra-node"), Pool: resourceapi.ResourcePool{Name: "dra-node", ResourceSliceCount: 1}}}, dryRun)
	forbidden("creating a ResourceSlice", err)
	_, err = client.CoreV1().Secrets(install.Namespace).Get(ctx, "resclass-webhook-tls", metav1.GetOptions{})
	forbidden("reading the webhook's Secret", err)
	_, err = client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	forbidden("listing Secrets", err)
	_, err = client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "e2e-dra-identity"}}, dryRun)
	forbidden("creating a Secret", err)
	_, err = client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "e2e-dra-identity"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, dryRun)
	forbidden("creating a pod", err)
}
