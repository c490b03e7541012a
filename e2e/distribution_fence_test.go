package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	distpkg "github.com/resclass/resclass/pkg/distribution"
)

// TestResourceDistributionOwners: adding an ownerReference to a
// ResourceDistribution is a deferred delete of it and of every copy (the
// garbage collector deletes them under its own identity when the owner is
// missing or deleted), so the admission policy resclass-distribution-owners
// admits it only from an identity that may delete the distribution and the
// copies' kind in every namespace; the garbage collector's own work (collect
// a distribution whose owner is deleted, orphan one) goes on.
func TestResourceDistributionOwners(t *testing.T) {
	d := startDistributionEnv(t)
	ctx, rc := d.ctx, d.rc
	rdRule := func(verbs ...string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{"resclass.io"}, Resources: []string{"resourcedistributions"}, Verbs: verbs}
	}
	user := func(t *testing.T, name string, rules map[string]rbacv1.PolicyRule) (string, versioned.Interface) {
		t.Helper()
		u := fmt.Sprintf("e2e-%s-%d", name, time.Now().UnixNano()%1e9)
		for ns, r := range rules {
			grant(t, ctx, u, strings.TrimPrefix(ns, "*"), r)
		}
		c, err := versioned.NewForConfig(impersonating(u, "system:authenticated"))
		if err != nil {
			t.Fatal(err)
		}
		return u, c
	}
	// owner is a cluster-scoped object to own a distribution (a cluster-scoped
	// dependent's owner must be cluster-scoped): an empty ClusterRole.
	owner := func(t *testing.T) *rbacv1.ClusterRole {
		t.Helper()
		cr, err := cluster.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-owner-"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cluster.Client.RbacV1().ClusterRoles().Delete(context.Background(), cr.Name, metav1.DeleteOptions{})
		})
		return cr
	}
	ownedBy := func(cr *rbacv1.ClusterRole) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: cr.Name, UID: cr.UID}
	}
	missing := metav1.OwnerReference{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: "e2e-missing-owner", UID: "00000000-0000-0000-0000-000000000001"}
	addOwner := func(c versioned.Interface, name string, ref metav1.OwnerReference, dryRun bool) error {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{ref}}})
		opts := metav1.PatchOptions{}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		_, err := c.ResclassV1alpha1().ResourceDistributions().Patch(ctx, name, types.MergePatchType, patch, opts)
		return err
	}
	// refused waits, with dry runs, until the apiserver enforces the policy
	// (once its informer has it: an attempt admitted before would have the
	// distribution collected), then makes the attempt for real and checks
	// the refusal's message.
	refused := func(t *testing.T, what string, attempt func(dryRun bool) error, message string) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			err := attempt(true)
			if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "resclass-distribution-owners") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s (dry run): %v, want refused by resclass-distribution-owners", what, err)
			}
		}
		err := attempt(false)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "resclass-distribution-owners") {
			t.Fatalf("%s: %v, want refused by resclass-distribution-owners", what, err)
		}
		wantDenied(t, err, message)
	}
	gone := func(t *testing.T, name string) {
		t.Helper()
		poll(t, ctx, 90*time.Second, name+" collected", func(ctx context.Context) (bool, error) {
			_, err := rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	}

	t.Run("a user who may only update distributions cannot give one an owner, missing or real", func(t *testing.T) {
		d := d.with(t)
		a, b := d.ns(nil), d.ns(nil)
		rd := d.create("owned", secret("owned", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{
			IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: a}, {Name: b}}})
		d.waitSynced(rd, 2)
		_, mallory := user(t, "mallory", map[string]rbacv1.PolicyRule{"": rdRule("get", "update", "patch")})
		refused(t, "a missing owner", func(dry bool) error { return addOwner(mallory, rd.Name, missing, dry) },
			"only an identity that may delete the ResourceDistribution "+rd.Name+" may add an ownerReference to it")
		real := ownedBy(owner(t))
		refused(t, "a real owner", func(dry bool) error { return addOwner(mallory, rd.Name, real, dry) },
			"only an identity that may delete the ResourceDistribution")
		// Delete on the distribution is not enough: the copies may be in
		// any namespace.
		_, trent := user(t, "trent", map[string]rbacv1.PolicyRule{"": rdRule("get", "update", "patch", "delete"), a: {APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"delete"}}})
		refused(t, "an owner, by a user who may delete the distribution and secrets in a only", func(dry bool) error { return addOwner(trent, rd.Name, missing, dry) },
			"only an identity that may delete secrets in every namespace may add an ownerReference to the ResourceDistribution "+rd.Name)
		// Nor at create: the owner decides when its copies go.
		_, carol := user(t, "carol", map[string]rbacv1.PolicyRule{"": rdRule("get", "create"), a: {APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}}})
		refused(t, "a create with an owner", func(dry bool) error {
			owned := distribution("born-owned", secret("born-owned", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{
				IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: a}}})
			owned.OwnerReferences = []metav1.OwnerReference{missing}
			opts := metav1.CreateOptions{}
			if dry {
				opts.DryRun = []string{metav1.DryRunAll}
			}
			created, err := carol.ResclassV1alpha1().ResourceDistributions().Create(ctx, owned, opts)
			if err == nil && !dry {
				_ = rc.ResclassV1alpha1().ResourceDistributions().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
			}
			return err
		}, "only an identity that may delete the ResourceDistribution")

		got, err := rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.OwnerReferences) != 0 {
			t.Errorf("the distribution has owners %v", got.OwnerReferences)
		}
		// No owner was stored, so the garbage collector has nothing to act
		// on: the copies are where they were.
		d.wantCopies("owned", []string{a, b}, nil)
	})

	t.Run("an owner added by one who may delete it all; deleting the owner collects the distribution and its copies", func(t *testing.T) {
		d := d.with(t)
		a, b := d.ns(nil), d.ns(nil)
		rd := d.create("collected", secret("collected", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{
			IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: a}, {Name: b}}})
		d.waitSynced(rd, 2)
		cr := owner(t)
		// Olivia may delete distributions, Secrets everywhere and the owner.
		name, olivia := user(t, "olivia", map[string]rbacv1.PolicyRule{
			"":  rdRule("get", "update", "patch", "delete"),
			"*": {APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"delete"}},
		})
		// ... and this one ClusterRole (grant asks about the collection,
		// which resourceNames does not allow).
		deleteOwner := rbacv1.PolicyRule{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"clusterroles"}, Verbs: []string{"delete"}, ResourceNames: []string{cr.Name}}
		roleName := "e2e-delete-" + cr.Name
		if _, err := cluster.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: roleName}, Rules: []rbacv1.PolicyRule{deleteOwner}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cluster.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: roleName},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: roleName},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: name, APIGroup: rbacv1.GroupName}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cluster.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), roleName, metav1.DeleteOptions{})
			_ = cluster.Client.RbacV1().ClusterRoles().Delete(context.Background(), roleName, metav1.DeleteOptions{})
		})
		if err := addOwner(olivia, rd.Name, ownedBy(cr), false); err != nil {
			t.Fatalf("olivia adding an owner: %v", err)
		}
		asOlivia, err := kubernetes.NewForConfig(impersonating(name, "system:authenticated"))
		if err != nil {
			t.Fatal(err)
		}
		poll(t, ctx, 30*time.Second, "olivia deletes the owner", func(ctx context.Context) (bool, error) {
			err := asOlivia.RbacV1().ClusterRoles().Delete(ctx, cr.Name, metav1.DeleteOptions{})
			return err == nil, nil
		})
		gone(t, rd.Name)
		d.waitCopies("collected", nil, []string{a, b}, "secret")
	})

	t.Run("a missing owner set by one who may delete it all: the garbage collector collects", func(t *testing.T) {
		d := d.with(t)
		a := d.ns(nil)
		rd := d.create("dangling", secret("dangling", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{
			IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: a}}})
		d.waitSynced(rd, 1)
		if err := addOwner(rc, rd.Name, missing, false); err != nil {
			t.Fatalf("the cluster admin adding an owner: %v", err)
		}
		gone(t, rd.Name)
		d.waitCopies("dangling", nil, []string{a}, "secret")
	})

	t.Run("orphaning: the garbage collector removes the owner, the distribution and its copies stay", func(t *testing.T) {
		d := d.with(t)
		a := d.ns(nil)
		rd := d.create("orphaned", secret("orphaned", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{
			IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: a}}})
		d.waitSynced(rd, 1)
		cr := owner(t)
		if err := addOwner(rc, rd.Name, ownedBy(cr), false); err != nil {
			t.Fatal(err)
		}
		// The garbage collector orphans the dependents its graph knows of
		// when it handles the owner's deletion. Deleted before its informer
		// delivered the ownerReference, the owner goes with no dependent
		// orphaned, and the distribution then names a missing owner and is
		// collected (seen in CI under load). A barrier: a second
		// distribution given a missing owner after it, which the collector
		// deletes only once its graph took in the events before it, ours
		// among them (one informer delivers them in order).
		barrier := d.create("orphaned-barrier", secret("orphaned-barrier", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{
			IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: a}}})
		if err := addOwner(rc, barrier.Name, missing, false); err != nil {
			t.Fatal(err)
		}
		gone(t, barrier.Name)
		if err := cluster.Client.RbacV1().ClusterRoles().Delete(ctx, cr.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationOrphan)}); err != nil {
			t.Fatal(err)
		}
		poll(t, ctx, 90*time.Second, "the garbage collector removed the owner", func(ctx context.Context) (bool, error) {
			got, err := rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
			return err == nil && len(got.OwnerReferences) == 0, err
		})
		d.wantCopies("orphaned", []string{a}, nil)
	})
}

// TestResourceDistributionCredentialFence: a copy is never a credential of
// the cluster nor a name the cluster reads as its own. The webhook refuses
// such a distribution when it is written; the admission policy
// resclass-distribution-writes refuses the controller's own token such a
// write in any namespace (kube-system included), even dressed as a copy of
// an existing distribution; and distributing into kube-system, a feature,
// still works.
func TestResourceDistributionCredentialFence(t *testing.T) {
	d := startDistributionEnv(t)
	ctx, rc := d.ctx, d.rc
	a := d.ns(nil)
	included := func(nss ...string) v1alpha1.ResourceDistributionTargets {
		var t v1alpha1.ResourceDistributionTargets
		for _, ns := range nss {
			t.IncludedNamespaces = append(t.IncludedNamespaces, v1alpha1.ResourceDistributionNamespace{Name: ns})
		}
		return t
	}
	typed := func(name, typ string, data map[string]string) []byte {
		raw, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": name}, "type": typ, "stringData": data})
		return raw
	}

	t.Run("the webhook refuses a credential type, a custom type and a reserved name", func(t *testing.T) {
		d := d.with(t)
		for what, c := range map[string]struct {
			resource []byte
			targets  v1alpha1.ResourceDistributionTargets
			want     []string
		}{
			"a bootstrap token into kube-system": {typed("bootstrap-token-abcdef", "bootstrap.kubernetes.io/token", map[string]string{"token-id": "abcdef", "token-secret": "0123456789abcdef"}),
				included("kube-system"), []string{"spec.resource.type", "bootstrap.kubernetes.io/token", "credential"}},
			"Helm's release record": {typed("sh.helm.release.v1.x.v1", "helm.sh/release.v1", map[string]string{"release": "x"}),
				included(a), []string{"spec.resource.type", "helm.sh/release.v1", "custom type"}},
			"aws-auth into kube-system": {configMap("aws-auth", map[string]string{"mapRoles": "x"}),
				included(a, "kube-system"), []string{"spec.targets.includedNamespaces[1]", "kube-system/aws-auth", "rename the ConfigMap"}},
			"kube-root-ca.crt anywhere": {configMap("kube-root-ca.crt", map[string]string{"ca.crt": "x"}),
				included(a), []string{"spec.resource.metadata.name", "kube-root-ca.crt"}},
		} {
			_, err := d.try("refused", c.resource, c.targets)
			if !apierrors.IsInvalid(err) {
				t.Errorf("%s: %v, want Invalid", what, err)
				continue
			}
			wantDenied(t, err, c.want...)
			if strings.Contains(err.Error(), "0123456789abcdef") {
				t.Errorf("%s: the denial shows the Secret's data: %v", what, err)
			}
		}
	})

	t.Run("the controller's token cannot write a credential or a reserved name, even dressed as a copy of a real distribution", func(t *testing.T) {
		d := d.with(t)
		rd := d.create("real", secret("real", map[string]string{"k": "v"}), included(a))
		d.waitSynced(rd, 1)
		real, err := rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The marks of a copy of rd, its owner's real UID included: all the
		// policy can see (it cannot read the distribution).
		asCopy := metav1.ObjectMeta{Labels: map[string]string{distpkg.LabelDistribution: distpkg.LabelValue(real.Name)},
			OwnerReferences: []metav1.OwnerReference{distpkg.OwnerReference(real)}}
		meta := func(ns, name string) metav1.ObjectMeta {
			m := *asCopy.DeepCopy()
			m.Namespace, m.Name = ns, name
			return m
		}
		ctl, err := kubernetes.NewForConfig(impersonating(framework.DistributionUser, serviceAccountGroups...))
		if err != nil {
			t.Fatal(err)
		}
		// Dry runs: if the fence failed, nothing would be stored.
		dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
		secretAs := func(ns, name string, typ corev1.SecretType, data map[string]string) func() error {
			return func() error {
				return ignoreResult(ctl.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: meta(ns, name), Type: typ, StringData: data}, dry))
			}
		}
		configMapAs := func(ns, name string) func() error {
			return func() error {
				return ignoreResult(ctl.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: meta(ns, name), Data: map[string]string{"k": "v"}}, dry))
			}
		}
		for what, c := range map[string]struct {
			attempt func() error
			message string
		}{
			"a bootstrap token in kube-system": {secretAs("kube-system", "bootstrap-token-abcdef", "bootstrap.kubernetes.io/token",
				map[string]string{"token-id": "abcdef", "token-secret": "0123456789abcdef", "usage-bootstrap-authentication": "true"}),
				"may not write a Secret of type bootstrap.kubernetes.io/token"},
			"a custom type": {secretAs(a, "sh.helm.release.v1.x.v1", "helm.sh/release.v1", map[string]string{"release": "x"}),
				"may not write a Secret of type helm.sh/release.v1"},
			"kube-root-ca.crt (it exists: the policy answers first)": {configMapAs(a, "kube-root-ca.crt"),
				"may not write the ConfigMap " + a + "/kube-root-ca.crt"},
			"aws-auth in kube-system":            {configMapAs("kube-system", "aws-auth"), "may not write the ConfigMap kube-system/aws-auth"},
			"cluster-info in kube-public":        {configMapAs("kube-public", "cluster-info"), "may not write the ConfigMap kube-public/cluster-info"},
			"extension-apiserver-authentication": {configMapAs("kube-system", "extension-apiserver-authentication"), "may not write the ConfigMap kube-system/extension-apiserver-authentication"},
		} {
			var err error
			poll(t, ctx, 15*time.Second, what+" refused by resclass-distribution-writes", func(context.Context) (bool, error) {
				err = c.attempt()
				return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "resclass-distribution-writes"), nil
			})
			wantDenied(t, err, c.message)
		}
		// The same marks on a plain Secret and a plain ConfigMap are a
		// copy the policy admits (dry run): the refusals above are the type
		// and the name, nothing else.
		for what, attempt := range map[string]func() error{
			"an Opaque Secret in kube-system":   secretAs("kube-system", "e2e-plain", corev1.SecretTypeOpaque, map[string]string{"k": "v"}),
			"a TLS Secret":                      secretAs(a, "e2e-tls", corev1.SecretTypeTLS, map[string]string{"tls.crt": "c", "tls.key": "k"}),
			"a ConfigMap of another name there": configMapAs("kube-system", "e2e-registry-mirrors"),
		} {
			if err := attempt(); err != nil {
				t.Errorf("%s, dressed as a copy: %v, want admitted", what, err)
			}
		}
	})

	t.Run("distributing into kube-system still works", func(t *testing.T) {
		d := d.with(t)
		pull := typed("e2e-pull", string(corev1.SecretTypeDockerConfigJson), map[string]string{corev1.DockerConfigJsonKey: `{"auths":{}}`})
		rd := d.create("pull", pull, included("kube-system", a))
		d.waitSynced(rd, 2)
		name := "e2e-mirrors-" + fmt.Sprint(time.Now().UnixNano()%1e6)
		cm := d.create("mirrors", configMap(name, map[string]string{"mirrors": "x"}), included("kube-system"))
		d.waitSynced(cm, 1)
		d.waitCopies(name, []string{"kube-system"}, nil, "configmap")
		s, err := cluster.Client.CoreV1().Secrets("kube-system").Get(ctx, "e2e-pull", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Type != corev1.SecretTypeDockerConfigJson {
			t.Errorf("the copy in kube-system has type %s", s.Type)
		}
	})
}

// TestResourceDistributionReviewBound: one admission asks at most
// --distribution-max-namespace-reviews namespaces one by one (here 3), so
// whoever reaches the webhook cannot make one request cost a review per
// namespace of the cluster; past the bound a user allowed only per
// namespace is refused with what to do, and within it nothing changes.
func TestResourceDistributionReviewBound(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	startWebhook(t, framework.WebhookOptions{Selector: webhookLabel, Args: []string{"--distribution-max-namespace-reviews=3"}})
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	d := &distEnv{t: t, ctx: ctx, rc: rc}
	label := d.uniqueLabel()
	var nss []string
	for range 4 {
		nss = append(nss, d.ns(label))
	}
	u := fmt.Sprintf("e2e-bounded-%d", time.Now().UnixNano()%1e9)
	grant(t, ctx, u, "", rbacv1.PolicyRule{APIGroups: []string{"resclass.io"}, Resources: []string{"resourcedistributions"}, Verbs: []string{"get", "create", "delete"}})
	for _, ns := range nss {
		grant(t, ctx, u, ns, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create", "delete"}})
	}
	c, err := versioned.NewForConfig(impersonating(u, "system:authenticated"))
	if err != nil {
		t.Fatal(err)
	}
	create := func(targets v1alpha1.ResourceDistributionTargets) error {
		created, err := c.ResclassV1alpha1().ResourceDistributions().Create(ctx, distribution("bounded", secret("bounded", map[string]string{"k": "v"}), targets), metav1.CreateOptions{})
		if err == nil {
			t.Cleanup(func() {
				_ = rc.ResclassV1alpha1().ResourceDistributions().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
			})
		}
		return err
	}
	err = create(v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: label}})
	wantDenied(t, err, fmt.Sprintf("user %q may not create secrets cluster-wide, and the request needs it in 4 namespaces, more than the 3 checked one by one", u),
		"ask for create secrets in every namespace, or change fewer namespaces at a time")
	var three []v1alpha1.ResourceDistributionNamespace
	for _, ns := range nss[:3] {
		three = append(three, v1alpha1.ResourceDistributionNamespace{Name: ns})
	}
	if err := create(v1alpha1.ResourceDistributionTargets{IncludedNamespaces: three}); err != nil {
		t.Errorf("three namespaces she may write, within the bound: %v", err)
	}
}
