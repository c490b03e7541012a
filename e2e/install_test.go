package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	deploydistribution "github.com/resclass/resclass/deploy/distribution"
	"github.com/resclass/resclass/deploy/install"
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
		"helm BinPack, PreBind, assignment writers, {} allowed, no node agent": {
			"scheduler": map[string]any{"strategy": "BinPack", "assignmentWrite": "PreBind",
				"assignmentWriters": map[string]any{"users": []string{"system:serviceaccount:ops:repair"}, "groups": []string{"ops-admins"}}},
			"webhook":   map[string]any{"allowEmptyNamespaceSelector": true},
			"nodeAgent": map[string]any{"enabled": false},
		},
		"helm with the ResourceDistribution controller": {"distribution": map[string]any{"enabled": true}},
	} {
		objs, err := install.HelmTemplate(ctx, values)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		renders[name] = objs
	}
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
		_, err = ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "resclass-install-e2e", Force: true, DryRun: []string{metav1.DryRunAll}})
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

	sa := func(name string) string { return "system:serviceaccount:resclass-system:" + name }
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
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:resclass-system", "system:authenticated"},
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
