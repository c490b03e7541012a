package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	distpkg "github.com/resclass/resclass/pkg/distribution"
)

// serviceAccountGroups are the groups the apiserver gives a ServiceAccount of
// resclass-system.
var serviceAccountGroups = []string{"system:serviceaccounts", "system:serviceaccounts:resclass-system", "system:authenticated"}

// wantUnauthorized checks that status.unauthorizedNamespaces names ns, alone,
// with verb and a reason saying reason.
func wantUnauthorized(t *testing.T, rd *v1alpha1.ResourceDistribution, ns, verb, reason string) {
	t.Helper()
	got := rd.Status.UnauthorizedNamespaces
	if rd.Status.Unauthorized != 1 || len(got) != 1 || got[0].Name != ns || got[0].Verb != verb || !strings.Contains(got[0].Reason, reason) {
		t.Errorf("status.unauthorized %d, unauthorizedNamespaces %+v; want 1: %s, %s, %q", rd.Status.Unauthorized, got, ns, verb, reason)
	}
}

// TestResourceDistributionTrust: a distribution writes only where its author
// could, for the whole life of a copy, and the two resclass identities
// involved can do no more than their part — proved with impersonated users
// on the real apiserver's RBAC and admission.
func TestResourceDistributionTrust(t *testing.T) {
	d := startDistributionEnv(t)
	ctx, rc := d.ctx, d.rc
	secretsRW := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "create", "update", "delete"}}
	rds := rbacv1.PolicyRule{APIGroups: []string{"resclass.io"}, Resources: []string{"resourcedistributions"}, Verbs: []string{"get", "create", "update", "delete"}}

	// author is a user who may write ResourceDistributions and the Secrets
	// of the namespaces given, and nothing else.
	author := func(t *testing.T, name string, secretsIn ...string) (string, versioned.Interface) {
		t.Helper()
		user := fmt.Sprintf("e2e-%s-%d", name, time.Now().UnixNano()%1e9)
		grant(t, ctx, user, "", rds)
		for _, ns := range secretsIn {
			grant(t, ctx, user, ns, secretsRW)
		}
		c, err := versioned.NewForConfig(impersonating(user, "system:authenticated"))
		if err != nil {
			t.Fatal(err)
		}
		return user, c
	}
	createAs := func(t *testing.T, c versioned.Interface, rd *v1alpha1.ResourceDistribution) (*v1alpha1.ResourceDistribution, error) {
		created, err := c.ResclassV1alpha1().ResourceDistributions().Create(ctx, rd, metav1.CreateOptions{})
		if err == nil {
			t.Cleanup(func() {
				_ = rc.ResclassV1alpha1().ResourceDistributions().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
			})
		}
		return created, err
	}
	// waitAuthorized waits for the Authorized condition to be False naming
	// every part.
	waitForbidden := func(t *testing.T, name string, parts ...string) *v1alpha1.ResourceDistribution {
		t.Helper()
		var got *v1alpha1.ResourceDistribution
		poll(t, ctx, 30*time.Second, fmt.Sprintf("%s: Authorized False naming %q", name, parts), func(ctx context.Context) (bool, error) {
			var err error
			if got, err = rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, name, metav1.GetOptions{}); err != nil {
				return false, err
			}
			c := meta.FindStatusCondition(got.Status.Conditions, distpkg.ConditionAuthorized)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != distpkg.ReasonForbidden || c.ObservedGeneration != got.Generation {
				return false, nil
			}
			for _, p := range parts {
				if !strings.Contains(c.Message, p) || !strings.Contains(got.Status.Description, p) {
					return false, nil
				}
			}
			return true, nil
		})
		return got
	}

	t.Run("a namespace labelled later where the author may not write gets no copy; the status and an Event name it", func(t *testing.T) {
		d := d.with(t)
		team := d.uniqueLabel()
		a, b, c := d.ns(team), d.ns(team), d.ns(nil)
		user, alice := author(t, "alice", a, b)
		rd, err := createAs(t, alice, distribution("later", secret("later", map[string]string{"k": "v"}),
			v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: team}}))
		if err != nil {
			t.Fatalf("a distribution into namespaces alice may write: %v", err)
		}
		if got := rd.Annotations[v1alpha1.AnnotationAuthorUser]; got != user {
			t.Errorf("the recorded author is %q, want %s", got, user)
		}
		d.waitSynced(rd, 2)
		d.label(c, team)
		got := waitForbidden(t, rd.Name, "create secrets in 1 namespace(s): "+c, user)
		if got.Status.Succeeded != 2 || got.Status.Desired != 3 {
			t.Errorf("succeeded %d of %d, want 2 of 3", got.Status.Succeeded, got.Status.Desired)
		}
		wantUnauthorized(t, got, c, "create", "may not create secrets in this namespace, so no copy is made there")
		waitEventOn(t, ctx, "default", "ResourceDistribution", rd.Name, distpkg.ReasonForbidden, c)
		d.wantCopies("later", []string{a, b}, []string{c})
	})

	t.Run("an author who lost rights in b edits the data: b's copy keeps its content, the status says so", func(t *testing.T) {
		d := d.with(t)
		team := d.uniqueLabel()
		a, b := d.ns(team), d.ns(team)
		user, alice := author(t, "alice", a, b)
		rd, err := createAs(t, alice, distribution("rotated", secret("rotated", map[string]string{"token": "v1"}),
			v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: team}}))
		if err != nil {
			t.Fatal(err)
		}
		d.waitSynced(rd, 2)
		revoke(t, ctx, user, b, secretsRW)

		current, err := alice.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		current.Spec.Resource = runtime.RawExtension{Raw: secret("rotated", map[string]string{"token": "v2"})}
		if _, err := alice.ResclassV1alpha1().ResourceDistributions().Update(ctx, current, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("the edit (admitted with a warning): %v", err)
		}
		got := waitForbidden(t, rd.Name, "update secrets in 1 namespace(s): "+b)
		wantUnauthorized(t, got, b, "update", "may not update secrets in this namespace, so the copy there keeps its old content")
		poll(t, ctx, 30*time.Second, "a's copy carries v2", func(ctx context.Context) (bool, error) {
			s, err := cluster.Client.CoreV1().Secrets(a).Get(ctx, "rotated", metav1.GetOptions{})
			return err == nil && string(s.Data["token"]) == "v2", nil
		})
		s, err := cluster.Client.CoreV1().Secrets(b).Get(ctx, "rotated", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if string(s.Data["token"]) != "v1" {
			t.Errorf("b's copy was rewritten to %q, though its author may not update Secrets there", s.Data["token"])
		}
	})

	t.Run("a user without delete in b can neither shrink b out of the targets nor delete the distribution", func(t *testing.T) {
		d := d.with(t)
		a, b := d.ns(nil), d.ns(nil)
		rd := d.create("kept", secret("kept", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{
			IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: a}, {Name: b}}})
		d.waitSynced(rd, 2)
		user, bob := author(t, "bob", a)
		current, err := bob.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		current.Spec.Targets.IncludedNamespaces = []v1alpha1.ResourceDistributionNamespace{{Name: a}}
		_, err = bob.ResclassV1alpha1().ResourceDistributions().Update(ctx, current, metav1.UpdateOptions{})
		wantDenied(t, err, fmt.Sprintf("user %q may not delete secrets in 1 namespace(s) holding a copy: %s", user, b))
		err = bob.ResclassV1alpha1().ResourceDistributions().Delete(ctx, rd.Name, metav1.DeleteOptions{})
		wantDenied(t, err, fmt.Sprintf("user %q may not delete secrets in 1 namespace(s) holding a copy: %s", user, b))
		d.wantCopies("kept", []string{a, b}, nil)
	})

	t.Run("a user with ResourceDistribution create but no Secret rights learns nothing about existing Secrets", func(t *testing.T) {
		d := d.with(t)
		holds, empty := d.ns(nil), d.ns(nil)
		d.foreignSecret(holds, "probe")
		_, carol := author(t, "carol")
		denial := func(ns string) string {
			_, err := createAs(t, carol, distribution("probe", secret("probe", map[string]string{"k": "v"}),
				v1alpha1.ResourceDistributionTargets{IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: ns}}}))
			if !apierrors.IsForbidden(err) {
				t.Fatalf("targeting %s: %v, want Forbidden", ns, err)
			}
			return err.Error()
		}
		withSecret, without := denial(holds), denial(empty)
		if strings.ReplaceAll(withSecret, holds, "NS") != strings.ReplaceAll(without, empty, "NS") {
			t.Errorf("the denials differ where a Secret exists:\n  %s\n  %s", withSecret, without)
		}
		for _, leak := range []string{"exists", "conflict"} {
			if strings.Contains(strings.ToLower(withSecret), leak) {
				t.Errorf("the denial says %q: %s", leak, withSecret)
			}
		}
		wantDenied(t, fmt.Errorf("%s", withSecret), "may not create secrets in 1 target namespace(s): "+holds)
	})

	t.Run("the webhook's ServiceAccount cannot read or write any Secret, its TLS Secret included", func(t *testing.T) {
		d := d.with(t)
		ns := d.ns(nil)
		target := d.foreignSecret(ns, "not-the-webhooks")
		tls, err := cluster.Client.CoreV1().Secrets("resclass-system").Get(ctx, "resclass-webhook-tls", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wh, err := kubernetes.NewForConfig(impersonating(framework.WebhookUser, serviceAccountGroups...))
		if err != nil {
			t.Fatal(err)
		}
		byName := metav1.ListOptions{FieldSelector: "metadata.name=resclass-webhook-tls"}
		for what, err := range map[string]error{
			"get":                               ignoreResult(wh.CoreV1().Secrets(ns).Get(ctx, target.Name, metav1.GetOptions{})),
			"list cluster-wide":                 ignoreResult(wh.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})),
			"list in the namespace":             ignoreResult(wh.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})),
			"create":                            ignoreResult(wh.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "planted"}}, metav1.CreateOptions{})),
			"update":                            ignoreResult(wh.CoreV1().Secrets(ns).Update(ctx, target, metav1.UpdateOptions{})),
			"delete":                            wh.CoreV1().Secrets(ns).Delete(ctx, target.Name, metav1.DeleteOptions{}),
			"create in resclass-system":         ignoreResult(wh.CoreV1().Secrets("resclass-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "planted"}}, metav1.CreateOptions{})),
			"get its TLS Secret":                ignoreResult(wh.CoreV1().Secrets("resclass-system").Get(ctx, tls.Name, metav1.GetOptions{})),
			"list its TLS Secret by name":       ignoreResult(wh.CoreV1().Secrets("resclass-system").List(ctx, byName)),
			"watch its TLS Secret by name":      ignoreResult(wh.CoreV1().Secrets("resclass-system").Watch(ctx, byName)),
			"list resclass-system":              ignoreResult(wh.CoreV1().Secrets("resclass-system").List(ctx, metav1.ListOptions{})),
			"update its TLS Secret":             ignoreResult(wh.CoreV1().Secrets("resclass-system").Update(ctx, tls, metav1.UpdateOptions{})),
			"get a ConfigMap":                   ignoreResult(wh.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})),
			"get its webhook configuration":     ignoreResult(wh.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "resclass-webhook", metav1.GetOptions{})),
			"create a Lease in resclass-system": ignoreResult(wh.CoordinationV1().Leases("resclass-system").Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "planted"}}, metav1.CreateOptions{})),
		} {
			if !apierrors.IsForbidden(err) {
				t.Errorf("the webhook's ServiceAccount, %s: %v, want Forbidden", what, err)
			}
		}
	})

	t.Run("the cert rotator's ServiceAccount reaches its TLS Secret and no other", func(t *testing.T) {
		d := d.with(t)
		ns := d.ns(nil)
		foreign := d.foreignSecret(ns, "not-the-rotators")
		neighbour, err := cluster.Client.CoreV1().Secrets("resclass-system").Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-neighbour-"}, StringData: map[string]string{"k": "v"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cluster.Client.CoreV1().Secrets("resclass-system").Delete(context.Background(), neighbour.Name, metav1.DeleteOptions{})
		})
		rot, err := kubernetes.NewForConfig(impersonating(framework.CertRotatorUser, serviceAccountGroups...))
		if err != nil {
			t.Fatal(err)
		}
		// What it needs works (its cache lists and watches by name).
		if _, err := rot.CoreV1().Secrets("resclass-system").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=resclass-webhook-tls"}); err != nil {
			t.Errorf("the rotator listing its TLS Secret by name: %v", err)
		}
		for what, err := range map[string]error{
			"get a Secret in its namespace":    ignoreResult(rot.CoreV1().Secrets("resclass-system").Get(ctx, neighbour.Name, metav1.GetOptions{})),
			"update a Secret in its namespace": ignoreResult(rot.CoreV1().Secrets("resclass-system").Update(ctx, neighbour, metav1.UpdateOptions{})),
			"delete a Secret in its namespace": rot.CoreV1().Secrets("resclass-system").Delete(ctx, neighbour.Name, metav1.DeleteOptions{}),
			"list its namespace":               ignoreResult(rot.CoreV1().Secrets("resclass-system").List(ctx, metav1.ListOptions{})),
			"create in its namespace":          ignoreResult(rot.CoreV1().Secrets("resclass-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "planted"}}, metav1.CreateOptions{})),
			"delete its TLS Secret":            rot.CoreV1().Secrets("resclass-system").Delete(ctx, "resclass-webhook-tls", metav1.DeleteOptions{}),
			"get elsewhere":                    ignoreResult(rot.CoreV1().Secrets(ns).Get(ctx, foreign.Name, metav1.GetOptions{})),
			"update elsewhere":                 ignoreResult(rot.CoreV1().Secrets(ns).Update(ctx, foreign, metav1.UpdateOptions{})),
			"list cluster-wide":                ignoreResult(rot.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})),
			"list another by name":             ignoreResult(rot.CoreV1().Secrets("resclass-system").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + neighbour.Name})),
			"get a ConfigMap":                  ignoreResult(rot.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})),
		} {
			if !apierrors.IsForbidden(err) {
				t.Errorf("the cert rotator's ServiceAccount, %s: %v, want Forbidden", what, err)
			}
		}
	})

	t.Run("the controller's ServiceAccount cannot overwrite or delete a foreign Secret, even by direct API call", func(t *testing.T) {
		d := d.with(t)
		ns := d.ns(nil)
		foreign := d.foreignSecret(ns, "someone-elses")
		foreignCM, err := cluster.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "someone-elses"}, Data: map[string]string{"owner": "someone else"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ctl, err := kubernetes.NewForConfig(impersonating(framework.DistributionUser, serviceAccountGroups...))
		if err != nil {
			t.Fatal(err)
		}
		// RBAC lets it read (the residual risk): the policy is what stops the
		// writes.
		if _, err := ctl.CoreV1().Secrets(ns).Get(ctx, foreign.Name, metav1.GetOptions{}); err != nil {
			t.Fatalf("RBAC should let the controller read Secrets: %v", err)
		}
		disguised := foreign.DeepCopy()
		disguised.Labels = map[string]string{distpkg.LabelDistribution: "fake"}
		disguised.OwnerReferences = []metav1.OwnerReference{{APIVersion: "resclass.io/v1alpha1", Kind: "ResourceDistribution", Name: "fake", UID: "fake", Controller: ptr.To(true)}}
		overwritten := foreign.DeepCopy()
		overwritten.StringData = map[string]string{"owner": "the controller"}
		attempts := map[string]func() error{
			"update": func() error {
				return ignoreResult(ctl.CoreV1().Secrets(ns).Update(ctx, overwritten, metav1.UpdateOptions{}))
			},
			"update dressed as a copy": func() error {
				return ignoreResult(ctl.CoreV1().Secrets(ns).Update(ctx, disguised, metav1.UpdateOptions{}))
			},
			"delete": func() error { return ctl.CoreV1().Secrets(ns).Delete(ctx, foreign.Name, metav1.DeleteOptions{}) },
			"create a plain Secret": func() error {
				return ignoreResult(ctl.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "planted"}}, metav1.CreateOptions{}))
			},
			// Half a copy is not one: the policy's verdict (its
			// matchConditions) needs both marks.
			"create a Secret with the label and no owner": func() error {
				return ignoreResult(ctl.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "label-only", Labels: disguised.Labels}}, metav1.CreateOptions{}))
			},
			"create a Secret with the owner and no label": func() error {
				return ignoreResult(ctl.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "owner-only", OwnerReferences: disguised.OwnerReferences}}, metav1.CreateOptions{}))
			},
			"create a Secret owned by a distribution, not as its controller": func() error {
				refs := []metav1.OwnerReference{disguised.OwnerReferences[0]}
				refs[0].Controller = nil
				return ignoreResult(ctl.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "not-controller", Labels: disguised.Labels, OwnerReferences: refs}}, metav1.CreateOptions{}))
			},
			"update a foreign ConfigMap": func() error {
				cm := foreignCM.DeepCopy()
				cm.Data = map[string]string{"owner": "the controller"}
				return ignoreResult(ctl.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}))
			},
			"delete a foreign ConfigMap": func() error {
				return ctl.CoreV1().ConfigMaps(ns).Delete(ctx, foreignCM.Name, metav1.DeleteOptions{})
			},
			"create a token Secret dressed as a copy": func() error {
				token := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "token", Labels: disguised.Labels, OwnerReferences: disguised.OwnerReferences,
					Annotations: map[string]string{corev1.ServiceAccountNameKey: "default"}}, Type: corev1.SecretTypeServiceAccountToken}
				return ignoreResult(ctl.CoreV1().Secrets(ns).Create(ctx, token, metav1.CreateOptions{}))
			},
		}
		// A real copy: the policy lets the controller keep it, not hand it to
		// another owner nor make it a plain Secret.
		rd := d.create("fenced", secret("fenced", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{
			IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: ns}}})
		d.waitSynced(rd, 1)
		realCopy, err := cluster.Client.CoreV1().Secrets(ns).Get(ctx, "fenced", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		reowned := realCopy.DeepCopy()
		reowned.OwnerReferences[0].UID, reowned.OwnerReferences[0].Name = "another-distribution", "another"
		unmarked := realCopy.DeepCopy()
		unmarked.OwnerReferences, unmarked.Labels = nil, nil
		attempts["give a copy another owner"] = func() error {
			return ignoreResult(ctl.CoreV1().Secrets(ns).Update(ctx, reowned, metav1.UpdateOptions{}))
		}
		attempts["make a copy a plain Secret"] = func() error {
			return ignoreResult(ctl.CoreV1().Secrets(ns).Update(ctx, unmarked, metav1.UpdateOptions{}))
		}
		for what, attempt := range attempts {
			// The policy was applied when the controller started; the
			// apiserver enforces it once its policy informer has it.
			var err error
			poll(t, ctx, 15*time.Second, what+" refused by the policy", func(context.Context) (bool, error) {
				err = attempt()
				return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "resclass-distribution-writes"), nil
			})
			if !strings.Contains(err.Error(), "the ResourceDistribution controller may") {
				t.Errorf("%s: %v, want the policy's message", what, err)
			}
		}
		now, err := cluster.Client.CoreV1().Secrets(ns).Get(ctx, foreign.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if now.ResourceVersion != foreign.ResourceVersion {
			t.Errorf("the foreign Secret changed: resourceVersion %s -> %s", foreign.ResourceVersion, now.ResourceVersion)
		}
		if now, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(ctx, foreignCM.Name, metav1.GetOptions{}); err != nil {
			t.Error(err)
		} else if now.ResourceVersion != foreignCM.ResourceVersion {
			t.Errorf("the foreign ConfigMap changed: resourceVersion %s -> %s", foreignCM.ResourceVersion, now.ResourceVersion)
		}
		if now, err := cluster.Client.CoreV1().Secrets(ns).Get(ctx, "fenced", metav1.GetOptions{}); err != nil {
			t.Error(err)
		} else if now.ResourceVersion != realCopy.ResourceVersion || !metav1.IsControlledBy(now, rd) {
			t.Errorf("the copy changed: resourceVersion %s -> %s, owners %v", realCopy.ResourceVersion, now.ResourceVersion, now.OwnerReferences)
		}
	})
}

func ignoreResult[T any](_ T, err error) error { return err }

// TestResourceDistributionStatusBounded: status.distributedResources names
// at most --distribution-status-max-copies namespaces (here 50 of 200
// copies) and status.distributed counts them all, so the status stays small
// however many namespaces a distribution reaches; and the delete
// authorization still covers the copies the status leaves out: a user
// without delete in b, a namespace beyond the bound, can neither delete the
// distribution nor shrink b out of its targets.
func TestResourceDistributionStatusBounded(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	const copies, bound = 200, 50
	// More reviews per request than the default bound (200): the delete
	// checks beyond the status's bound are what this test is about, asked
	// about each of the cluster's namespaces.
	startWebhook(t, framework.WebhookOptions{Selector: webhookLabel, Args: []string{"--distribution-max-namespace-reviews=5000"}})
	startDistribution(t, framework.DistributionOptions{Args: []string{fmt.Sprintf("--distribution-status-max-copies=%d", bound)}})
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	d := &distEnv{t: t, ctx: ctx, rc: rc}
	label := d.uniqueLabel()
	var targets []string
	for range copies {
		targets = append(targets, d.ns(label))
	}
	slices.Sort(targets)
	rd := d.create("bounded", secret("bounded", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{
		NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: label}})
	st := d.waitSynced(rd, copies)
	var named []string
	poll(t, ctx, 30*time.Second, fmt.Sprintf("status.distributed %d, %d named", copies, bound), func(ctx context.Context) (bool, error) {
		got, err := rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		st = got.Status
		named = slices.Sorted(maps.Keys(st.DistributedResources))
		return st.Distributed == copies, nil
	})
	if !slices.Equal(named, targets[:bound]) {
		t.Fatalf("status.distributedResources names %d namespaces (%v...), want the first %d of the %d targets by name", len(named), named[:min(3, len(named))], bound, copies)
	}
	if raw, err := json.Marshal(st); err != nil {
		t.Fatal(err)
	} else if size := len(raw); size > 8000 {
		t.Errorf("the status of %d copies is %d bytes, want a bounded few kB", copies, size)
	}

	// b holds a copy the status does not name.
	b := targets[copies-1]
	bob := fmt.Sprintf("e2e-bob-%d", time.Now().UnixNano()%1e9)
	grant(t, ctx, bob, "", rbacv1.PolicyRule{APIGroups: []string{"resclass.io"}, Resources: []string{"resourcedistributions"}, Verbs: []string{"get", "update", "delete"}})
	asBob, err := versioned.NewForConfig(impersonating(bob, "system:authenticated"))
	if err != nil {
		t.Fatal(err)
	}
	current, err := asBob.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	current.Spec.Targets = v1alpha1.ResourceDistributionTargets{IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: targets[0]}}}
	_, err = asBob.ResclassV1alpha1().ResourceDistributions().Update(ctx, current, metav1.UpdateOptions{})
	// The denial names only the first namespaces of hundreds (b is the last
	// by name); that b's copy is still there below is the proof.
	wantDenied(t, err, fmt.Sprintf("user %q may not delete secrets in", bob), "that may hold a copy", "more;")
	err = asBob.ResclassV1alpha1().ResourceDistributions().Delete(ctx, rd.Name, metav1.DeleteOptions{})
	wantDenied(t, err, fmt.Sprintf("user %q may not delete secrets in", bob), "that may hold a copy", "more;")
	d.wantCopies("bounded", []string{targets[0], b}, nil)

	// An author allowed everywhere shrinks it below the bound: the status
	// names every copy again.
	d.update(rd.Name, func(rd *v1alpha1.ResourceDistribution) {
		rd.Spec.Targets = v1alpha1.ResourceDistributionTargets{IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: targets[0]}, {Name: b}}}
	})
	poll(t, ctx, time.Minute, "2 copies, both named", func(ctx context.Context) (bool, error) {
		got, err := rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return got.Status.Distributed == 2 && len(got.Status.DistributedResources) == 2 && got.Status.DistributedResources[b] != "", nil
	})
	d.waitCopies("bounded", []string{targets[0], b}, targets[1:bound], "secret")
}
