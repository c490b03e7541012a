package e2e

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	deploywebhook "github.com/resclass/resclass/deploy/webhook"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	distpkg "github.com/resclass/resclass/pkg/distribution"
)

// authorPolicyDenial is what the admission policy resclass-spec-author
// answers a spec write whose record is not the requester's.
const authorPolicyDenial = "must record the identity that writes the spec"

// TestDistributionAuthorBound: the author the controller acts for is bound to
// the requester in the apiserver, by the admission policy
// resclass-spec-author, whether or not the webhook is called. Distributions
// without the test's label are out of the webhooks' path (their
// objectSelector), as they are for everyone when the webhook is configured
// Ignore and down, removed, or repointed: only the policy stands.
func TestDistributionAuthorBound(t *testing.T) {
	d := startDistributionEnv(t)
	ctx, rc := d.ctx, d.rc
	rds := rbacv1.PolicyRule{APIGroups: []string{"resclass.io"}, Resources: []string{"resourcedistributions"}, Verbs: []string{"get", "create", "update", "delete"}}
	secretsRW := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "create", "update", "delete"}}
	rdsClient := rc.ResclassV1alpha1().ResourceDistributions()
	admin := distpkg.Author{Username: "system:admin", Groups: []string{"system:masters", "system:authenticated"}}

	// The policy is enforced once the apiserver's policy informer has it.
	probe := func(ctx context.Context) error {
		rd := distribution("probe", secret("probe", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{})
		rd.Labels, rd.Annotations = nil, distpkg.Author{Username: "someone-else"}.Annotations()
		_, err := rdsClient.Create(ctx, rd, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	poll(t, ctx, time.Minute, "the policy resclass-spec-author enforced", func(ctx context.Context) (bool, error) {
		err := probe(ctx)
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), authorPolicyDenial), nil
	})

	// as is a user who may write ResourceDistributions and the Secrets of
	// the namespaces given, impersonated with groups, a UID and extra that
	// hold every character the record escapes; who is the identity the
	// apiserver sees for it (SelfSubjectReview), to compare records with.
	as := func(t *testing.T, name string, secretsIn ...string) (string, versioned.Interface, distpkg.Author) {
		t.Helper()
		user := fmt.Sprintf("e2e-%s-%d", name, time.Now().UnixNano()%1e9)
		grant(t, ctx, user, "", rds)
		for _, ns := range secretsIn {
			grant(t, ctx, user, ns, secretsRW)
		}
		cfg := rest.CopyConfig(cluster.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, UID: "uid=" + name,
			Groups: []string{"system:authenticated", "team,ml", "100%;a=b", "team,ml", "a-team"},
			Extra:  map[string][]string{"example.com/scopes": {"read,write", "x=y"}, "example.com/idp": {"corp"}}}
		c, err := versioned.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		review, err := kc.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if review.Status.UserInfo.Username != user || len(review.Status.UserInfo.Extra) != 2 {
			t.Fatalf("the apiserver sees %+v", review.Status.UserInfo)
		}
		return user, c, distpkg.AuthorOf(review.Status.UserInfo)
	}
	unlabelled := func(name string, targets ...string) *v1alpha1.ResourceDistribution {
		var included []v1alpha1.ResourceDistributionNamespace
		for _, ns := range targets {
			included = append(included, v1alpha1.ResourceDistributionNamespace{Name: ns})
		}
		rd := distribution(name, secret(name, map[string]string{"k": "v1"}), v1alpha1.ResourceDistributionTargets{IncludedNamespaces: included})
		rd.Labels = nil
		return rd
	}
	cleanup := func(t *testing.T, name string) {
		t.Cleanup(func() { _ = rdsClient.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}

	t.Run("without the webhook, a record of system:masters, of nobody or with a planted field is refused; the requester's own is admitted and the controller distributes", func(t *testing.T) {
		d := d.with(t)
		a := d.ns(nil)
		user, mallory, self := as(t, "mallory", a)
		for _, tc := range []struct {
			name   string
			record map[string]string
		}{
			{"system:masters", admin.Annotations()},
			{"none", nil},
			{"the old JSON format", map[string]string{v1alpha1.AnnotationAuthorJSON: `{"username":"system:admin","groups":["system:masters"]}`}},
			{"the requester's groups in another order", func() map[string]string {
				r := self.Annotations()
				r[v1alpha1.AnnotationAuthorGroups] = "a-team,system:authenticated,100%25%3Ba%3Db,team%2Cml"
				return r
			}()},
			{"the requester's and a planted field", func() map[string]string {
				r := self.Annotations()
				r[v1alpha1.AnnotationAuthorPrefix+".scopes"] = "*"
				return r
			}()},
			{"the requester's beside the old JSON one", func() map[string]string {
				r := self.Annotations()
				r[v1alpha1.AnnotationAuthorJSON] = `{"username":"system:admin","groups":["system:masters"]}`
				return r
			}()},
		} {
			rd := unlabelled("forged", a)
			rd.Annotations = tc.record
			_, err := mallory.ResclassV1alpha1().ResourceDistributions().Create(ctx, rd, metav1.CreateOptions{})
			if !apierrors.IsForbidden(err) {
				t.Errorf("record %s: %v, want Forbidden", tc.name, err)
				continue
			}
			wantDenied(t, err, "ValidatingAdmissionPolicy 'resclass-spec-author'", authorPolicyDenial+`, user "`+user+`"`)
		}

		// The record pkg/distribution writes for the identity the apiserver
		// sees is the one the policy builds in CEL: escapes, order and
		// duplicates included.
		rd := unlabelled("self", a)
		rd.Annotations = self.Annotations()
		created, err := mallory.ResclassV1alpha1().ResourceDistributions().Create(ctx, rd, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("the requester's own record %q: %v", self.Annotations(), err)
		}
		cleanup(t, created.Name)
		if got := self.Annotations()[v1alpha1.AnnotationAuthorGroups]; got != "100%25%3Ba%3Db,a-team,system:authenticated,team%2Cml" {
			t.Errorf("groups recorded as %q", got)
		}
		d.waitSynced(created, 1)
		d.wantCopies("self", []string{a}, nil)
	})

	t.Run("without the webhook, an update keeps the record or, changing the spec, records the requester", func(t *testing.T) {
		d := d.with(t)
		a := d.ns(nil)
		_, alice, aliceID := as(t, "alice", a)
		bobUser, bob, bobID := as(t, "bob", a)
		rd := unlabelled("kept", a)
		rd.Annotations = aliceID.Annotations()
		created, err := alice.ResclassV1alpha1().ResourceDistributions().Create(ctx, rd, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cleanup(t, created.Name)
		// The controller writes the distribution too (its finalizer), so an
		// update that lost that race is made again on the latest version; a
		// refusal is returned as it came.
		update := func(mutate func(*v1alpha1.ResourceDistribution)) error {
			return retry.RetryOnConflict(retry.DefaultRetry, func() error {
				current, err := bob.ResclassV1alpha1().ResourceDistributions().Get(ctx, created.Name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				mutate(current)
				_, err = bob.ResclassV1alpha1().ResourceDistributions().Update(ctx, current, metav1.UpdateOptions{})
				return err
			})
		}
		newSpec := func(rd *v1alpha1.ResourceDistribution) {
			rd.Spec.Resource = runtime.RawExtension{Raw: secret("kept", map[string]string{"k": "v2"})}
		}
		if err := update(func(rd *v1alpha1.ResourceDistribution) { rd.Labels = map[string]string{"seen-by": "bob"} }); err != nil {
			t.Errorf("a label, the record unchanged: %v", err)
		}
		err = update(func(rd *v1alpha1.ResourceDistribution) { maps.Copy(rd.Annotations, bobID.Annotations()) })
		wantDenied(t, err, "ValidatingAdmissionPolicy 'resclass-spec-author'", "they change only with the spec")
		err = update(func(rd *v1alpha1.ResourceDistribution) { delete(rd.Annotations, v1alpha1.AnnotationAuthorExtra) })
		wantDenied(t, err, "they change only with the spec")
		err = update(newSpec)
		wantDenied(t, err, authorPolicyDenial+`, user "`+bobUser+`"`)
		if err := update(func(rd *v1alpha1.ResourceDistribution) { newSpec(rd); maps.Copy(rd.Annotations, bobID.Annotations()) }); err != nil {
			t.Fatalf("a spec change recording its requester: %v", err)
		}
		got, err := rdsClient.Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if author, err := distpkg.ParseAuthor(got.Annotations); err != nil || author.Username != bobUser {
			t.Errorf("the author after bob's spec change: %+v, %v", author, err)
		}
		poll(t, ctx, 30*time.Second, "a's copy carries bob's v2", func(ctx context.Context) (bool, error) {
			s, err := cluster.Client.CoreV1().Secrets(a).Get(ctx, "kept", metav1.GetOptions{})
			return err == nil && string(s.Data["k"]) == "v2", nil
		})
	})

	t.Run("through the webhook, a forged record is replaced by the requester's and the controller distributes", func(t *testing.T) {
		d := d.with(t)
		a := d.ns(nil)
		_, carol, carolID := as(t, "carol", a)
		rd := distribution("webhook", secret("webhook", map[string]string{"k": "v"}),
			v1alpha1.ResourceDistributionTargets{IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: a}}})
		rd.Annotations = admin.Annotations()
		created, err := carol.ResclassV1alpha1().ResourceDistributions().Create(ctx, rd, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cleanup(t, created.Name)
		if got := distpkg.AuthorRecord(created.Annotations); !maps.Equal(got, carolID.Annotations()) {
			t.Errorf("recorded %q, want carol's %q", got, carolID.Annotations())
		}
		d.waitSynced(created, 1)
		d.wantCopies("webhook", []string{a}, nil)
	})

	t.Run("a distribution stored in the old format, or with no record, gets no writes until its spec is written again", func(t *testing.T) {
		d := d.with(t)
		a := d.ns(nil)
		// As before the upgrade: stored without the policy.
		withoutAuthorPolicy(t, ctx, probe)
		old := unlabelled("old-format", a)
		old.Annotations = map[string]string{v1alpha1.AnnotationAuthorJSON: `{"username":"system:admin","groups":["system:masters"]}`}
		none := unlabelled("no-record", a)
		var stored []*v1alpha1.ResourceDistribution
		for _, rd := range []*v1alpha1.ResourceDistribution{old, none} {
			created, err := rdsClient.Create(ctx, rd, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cleanup(t, created.Name)
			stored = append(stored, created)
		}
		restoreAuthorPolicy(t, ctx, probe)

		for i, why := range []string{"the author is recorded only in the old format", "no author recorded"} {
			name := stored[i].Name
			poll(t, ctx, 30*time.Second, name+": Authorized False, NoAuthor, saying why and what to do", func(ctx context.Context) (bool, error) {
				got, err := rdsClient.Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				c := meta.FindStatusCondition(got.Status.Conditions, distpkg.ConditionAuthorized)
				return c != nil && c.Status == metav1.ConditionFalse && c.Reason == distpkg.ReasonNoAuthor && strings.Contains(c.Message, why) &&
					strings.Contains(c.Message, "No copy is created, updated or deleted for it until someone allowed to write its copies changes its spec"), nil
			})
			waitEventOn(t, ctx, "default", "ResourceDistribution", name, distpkg.ReasonNoAuthor, why)
		}
		d.wantCopies("old-format", nil, []string{a})
		d.wantCopies("no-record", nil, []string{a})

		// A label is no spec change: the old record stays, untrusted. (The
		// controller writes the distribution too: a lost race is retried.)
		var current *v1alpha1.ResourceDistribution
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			got, err := rdsClient.Get(ctx, stored[0].Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			got.Labels = map[string]string{"touched": "yes"}
			current, err = rdsClient.Update(ctx, got, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatalf("a label on an old-format distribution: %v", err)
		}
		if current.Annotations[v1alpha1.AnnotationAuthorJSON] == "" || current.Annotations[v1alpha1.AnnotationAuthorUser] != "" {
			t.Errorf("a label changed the record: %v", current.Annotations)
		}

		// The migration: its spec written again through the webhook.
		var updated *v1alpha1.ResourceDistribution
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			got, err := rdsClient.Get(ctx, stored[0].Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			got.Labels = webhookLabel
			got.Spec.Resource = runtime.RawExtension{Raw: secret("old-format", map[string]string{"k": "v2"})}
			updated, err = rdsClient.Update(ctx, got, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		record := distpkg.AuthorRecord(updated.Annotations)
		if _, has := record[v1alpha1.AnnotationAuthorJSON]; has || record[v1alpha1.AnnotationAuthorUser] == "" {
			t.Fatalf("the spec change through the webhook recorded %q", record)
		}
		d.waitSynced(updated, 1)
		d.wantCopies("old-format", []string{a}, nil)
	})
}

// withoutAuthorPolicy removes the binding of resclass-spec-author until
// restoreAuthorPolicy (or the test's end) applies it again; probe is a write
// the policy refuses.
func withoutAuthorPolicy(t *testing.T, ctx context.Context, probe func(context.Context) error) {
	t.Helper()
	if err := cluster.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, "resclass-spec-author", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restoreAuthorPolicy(t, context.Background(), probe) })
	poll(t, ctx, time.Minute, "the policy resclass-spec-author no longer enforced", func(ctx context.Context) (bool, error) {
		return probe(ctx) == nil, nil
	})
}

func restoreAuthorPolicy(t *testing.T, ctx context.Context, probe func(context.Context) error) {
	t.Helper()
	if _, err := cluster.ApplyManifestData(ctx, "deploy/webhook/author-policy.yaml", deploywebhook.AuthorPolicy); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, time.Minute, "the policy resclass-spec-author enforced again", func(ctx context.Context) (bool, error) {
		return apierrors.IsForbidden(probe(ctx)), nil
	})
}
