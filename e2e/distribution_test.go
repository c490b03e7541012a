package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
)

// secretValue is distinctive, so that the test can prove it never leaks into
// logs, Events or status.
const secretValue = "s3cr3t-e2e-d1str1but10n-value"

// TestResourceDistribution: the ResourceDistribution controller and webhook
// (docs/distribution.md) on the real apiserver, with the real garbage collector, each
// under its own identity.
func TestResourceDistribution(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	wh := startWebhook(t, framework.WebhookOptions{Selector: webhookLabel})
	ctl := startDistribution(t, framework.DistributionOptions{})
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	d := &distEnv{t: t, ctx: ctx, rc: rc}

	t.Run("intersection of targets, copies with owner and annotations", func(t *testing.T) {
		d := d.with(t)
		team := d.uniqueLabel()
		a, b, c := d.ns(team), d.ns(team), d.ns(nil)
		other := d.ns(team)
		rd := d.create("pull-secret", secret("pull-secret", map[string]string{"token": secretValue}), v1alpha1.ResourceDistributionTargets{
			IncludedNamespaces:     []v1alpha1.ResourceDistributionNamespace{{Name: a}, {Name: b}, {Name: c}},
			NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: team},
			ExcludedNamespaces:     []v1alpha1.ResourceDistributionNamespace{{Name: b}},
		})
		// included ∩ selector ∩ (all but excluded) = {a}
		st := d.waitSynced(rd, 1)
		d.wantCopies("pull-secret", []string{a}, []string{b, c, other})
		if st.DistributedResources[a] == "" {
			t.Errorf("status.distributedResources = %v, want %s's resourceVersion", st.DistributedResources, a)
		}
		copy, err := cluster.Client.CoreV1().Secrets(a).Get(ctx, "pull-secret", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if string(copy.Data["token"]) != secretValue {
			t.Errorf("copy data = %q", copy.Data)
		}
		if !metav1.IsControlledBy(copy, rd) {
			t.Errorf("the copy is not controlled by the distribution: %v", copy.OwnerReferences)
		}
		for _, k := range []string{v1alpha1.AnnotationDistributedBy, v1alpha1.AnnotationDistributedTime, v1alpha1.AnnotationContentHash} {
			if copy.Annotations[k] == "" {
				t.Errorf("the copy lacks annotation %s: %v", k, copy.Annotations)
			}
		}
	})

	t.Run("default targets: every namespace but kube-system, kube-public, resclass's own and the excluded", func(t *testing.T) {
		d := d.with(t)
		// The node agent's namespace (--node-agent-namespace, default
		// resclass-node) is protected too; the cluster here runs no agent
		// pod, so the namespace may not exist yet.
		if _, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "resclass-node"}}, metav1.CreateOptions{}); err == nil {
			t.Cleanup(func() {
				_ = cluster.Client.CoreV1().Namespaces().Delete(context.Background(), "resclass-node", metav1.DeleteOptions{})
			})
		} else if !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		kept, excluded := d.ns(nil), d.ns(nil)
		name := "e2e-default-" + strings.ToLower(kept[len(kept)-5:])
		d.create(name, configMap(name, map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{
			ExcludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: excluded}},
		})
		d.waitCopies(name, []string{kept, "default"}, []string{excluded, "kube-system", "kube-public", "resclass-system", "resclass-node"}, "configmap")
	})

	t.Run("a foreign same-named object is left alone and reported; the copy follows within seconds of it going", func(t *testing.T) {
		d := d.with(t)
		team := d.uniqueLabel()
		a, b, c := d.ns(team), d.ns(team), d.ns(team)
		for _, ns := range []string{a, c} {
			d.foreignSecret(ns, "shared")
		}
		// The webhook reads no Secret, so it cannot refuse this: the
		// controller reports both conflicts and copies to b.
		rd := d.create("shared", secret("shared", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: team}})
		poll(t, ctx, 30*time.Second, "both conflicts listed, Synced False/Conflict", func(ctx context.Context) (bool, error) {
			got, err := d.rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			cond := meta.FindStatusCondition(got.Status.Conditions, "Synced")
			return slices.Equal(sortedNamespaceNames(got.Status.ConflictingNamespaces), sortedStrings(a, c)) &&
				cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == "Conflict" && got.Status.Succeeded == 1, nil
		})
		d.wantCopies("shared", []string{b}, nil)
		_, err := d.try("a-pod", []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x"}}`), v1alpha1.ResourceDistributionTargets{})
		// The CRD's own schema refuses it before the webhook is asked.
		wantDenied(t, err, "spec.resource", "must be a v1 Secret or ConfigMap")

		// The foreign objects go: the copies follow within seconds, with no
		// other event to prompt the controller.
		for _, ns := range []string{a, c} {
			if err := cluster.Client.CoreV1().Secrets(ns).Delete(ctx, "shared", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		began := time.Now()
		d.waitSynced(rd, 3)
		t.Logf("the copies appeared %.1fs after the conflicts cleared", time.Since(began).Seconds())
	})

	t.Run("a conflict that arrives later is reported, the foreign object untouched, the rest in sync", func(t *testing.T) {
		d := d.with(t)
		team := d.uniqueLabel()
		a := d.ns(team)
		rd := d.create("later", secret("later", map[string]string{"k": secretValue}), v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: team}})
		d.waitSynced(rd, 1)
		late := d.ns(nil)
		foreign := d.foreignSecret(late, "later")
		d.label(late, team)
		poll(t, ctx, 30*time.Second, "the late namespace is listed as conflicting", func(ctx context.Context) (bool, error) {
			got, err := d.rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			c := meta.FindStatusCondition(got.Status.Conditions, "Synced")
			return len(got.Status.ConflictingNamespaces) == 1 && got.Status.ConflictingNamespaces[0].Name == late &&
				c != nil && c.Status == metav1.ConditionFalse && c.Reason == "Conflict" && got.Status.Succeeded == 1, nil
		})
		waitEventOn(t, ctx, "default", "ResourceDistribution", rd.Name, "Conflict", late)
		now, err := cluster.Client.CoreV1().Secrets(late).Get(ctx, "later", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if now.ResourceVersion != foreign.ResourceVersion || len(now.OwnerReferences) != 0 {
			t.Errorf("the foreign object was modified: resourceVersion %s -> %s, owners %v", foreign.ResourceVersion, now.ResourceVersion, now.OwnerReferences)
		}
		d.wantCopies("later", []string{a}, nil)
	})

	t.Run("more conflicts than the status lists: counted, the first 100 named by name", func(t *testing.T) {
		d := d.with(t)
		team := d.uniqueLabel()
		const n = v1alpha1.MaxConflictingNamespaces + 5
		conflicting := make([]string, n)
		for i := range conflicting {
			conflicting[i] = d.ns(team)
			d.foreignSecret(conflicting[i], "crowded")
		}
		clean := d.ns(team)
		rd := d.create("crowded", secret("crowded", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: team}})
		slices.Sort(conflicting)
		var st v1alpha1.ResourceDistributionStatus
		poll(t, ctx, 60*time.Second, fmt.Sprintf("%d conflicts counted", n), func(ctx context.Context) (bool, error) {
			got, err := d.rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			st = got.Status
			return st.ObservedGeneration == got.Generation && st.Conflicting == n, nil
		})
		if got := namespaceNamesOf(st.ConflictingNamespaces); !slices.Equal(got, conflicting[:v1alpha1.MaxConflictingNamespaces]) {
			t.Errorf("status.conflictingNamespaces = %d names (%s ... %s), want the first %d by name (%s ... %s)", len(got), got[0], got[len(got)-1],
				v1alpha1.MaxConflictingNamespaces, conflicting[0], conflicting[v1alpha1.MaxConflictingNamespaces-1])
		}
		if st.Desired != n+1 || st.Succeeded != 1 {
			t.Errorf("desired %d, succeeded %d; want %d, 1", st.Desired, st.Succeeded, n+1)
		}
		c := meta.FindStatusCondition(st.Conditions, "Synced")
		if c == nil || c.Reason != "Conflict" || !strings.Contains(c.Message, fmt.Sprintf("in %d target namespace(s)", n)) || !strings.Contains(c.Message, "and 85 more") {
			t.Errorf("Synced = %+v, want Conflict naming %d namespaces, 20 by name", c, n)
		}
		d.wantCopies("crowded", []string{clean}, nil)
	})

	t.Run("spec changes: content updates every copy, targets move them", func(t *testing.T) {
		d := d.with(t)
		blue, green := d.uniqueLabel(), d.uniqueLabel()
		b1, b2, g1 := d.ns(blue), d.ns(blue), d.ns(green)
		rd := d.create("moving", configMap("moving", map[string]string{"v": "1"}), v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: blue}})
		d.waitSynced(rd, 2)
		d.update(rd.Name, func(rd *v1alpha1.ResourceDistribution) {
			rd.Spec.Resource = runtime.RawExtension{Raw: configMap("moving", map[string]string{"v": "2"})}
		})
		poll(t, ctx, 30*time.Second, "both copies carry v=2", func(ctx context.Context) (bool, error) {
			for _, ns := range []string{b1, b2} {
				cm, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(ctx, "moving", metav1.GetOptions{})
				if err != nil || cm.Data["v"] != "2" {
					return false, nil
				}
			}
			return true, nil
		})
		d.update(rd.Name, func(rd *v1alpha1.ResourceDistribution) {
			rd.Spec.Targets.NamespaceLabelSelector = &metav1.LabelSelector{MatchLabels: green}
		})
		d.waitCopies("moving", []string{g1}, []string{b1, b2}, "configmap")
		// Relabel: a namespace joining the selector gets a copy, one leaving loses it.
		d.label(b1, green)
		d.waitCopies("moving", []string{g1, b1}, []string{b2}, "configmap")
		// The name is immutable.
		err := d.tryUpdate(rd.Name, func(rd *v1alpha1.ResourceDistribution) {
			rd.Spec.Resource = runtime.RawExtension{Raw: configMap("renamed", map[string]string{"v": "2"})}
		})
		// The CRD says so too (CEL); the webhook repeats it behind.
		wantDenied(t, err, "spec.resource", "immutable")
	})

	t.Run("a deleted namespace leaves the status; a deleted distribution takes its copies (garbage collector)", func(t *testing.T) {
		d := d.with(t)
		team := d.uniqueLabel()
		a, b := d.ns(team), d.ns(team)
		rd := d.create("doomed", secret("doomed", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: team}})
		d.waitSynced(rd, 2)
		if err := cluster.Client.CoreV1().Namespaces().Delete(ctx, b, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		d.waitSynced(rd, 1)
		if err := d.rc.ResclassV1alpha1().ResourceDistributions().Delete(ctx, rd.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		d.waitCopies("doomed", nil, []string{a}, "secret")
	})

	t.Run("the author must be allowed to create the kind in every target namespace", func(t *testing.T) {
		d := d.with(t)
		team := d.uniqueLabel()
		mine, theirs := d.ns(team), d.ns(team)
		user := "e2e-alice-" + mine[len(mine)-5:]
		grant(t, ctx, user, "", rbacv1.PolicyRule{APIGroups: []string{"resclass.io"}, Resources: []string{"resourcedistributions"}, Verbs: []string{"create", "get"}})
		grant(t, ctx, user, mine, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}})
		alice, err := versioned.NewForConfig(impersonating(user))
		if err != nil {
			t.Fatal(err)
		}
		rd := distribution("alices", secret("alices", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: team}})
		_, err = alice.ResclassV1alpha1().ResourceDistributions().Create(ctx, rd, metav1.CreateOptions{})
		wantDenied(t, err, fmt.Sprintf("user %q may not create secrets in 1 target namespace(s): %s", user, theirs))
		if err != nil && strings.Contains(err.Error(), mine+",") {
			t.Errorf("the denial names %s, where %s may create secrets", mine, user)
		}
		rd.Spec.Targets.IncludedNamespaces = []v1alpha1.ResourceDistributionNamespace{{Name: mine}}
		created, err := alice.ResclassV1alpha1().ResourceDistributions().Create(ctx, rd, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("a distribution into the namespace alice may write to: %v", err)
		}
		t.Cleanup(func() {
			_ = d.rc.ResclassV1alpha1().ResourceDistributions().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
		})
	})

	t.Run("secret data never in logs, events or status", func(t *testing.T) {
		if strings.Contains(wh.Log(), secretValue) {
			t.Errorf("the webhook's log contains secret data")
		}
		if strings.Contains(ctl.Log(), secretValue) {
			t.Errorf("the controller's log contains secret data")
		}
		events, err := cluster.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range events.Items {
			if strings.Contains(e.Message, secretValue) {
				t.Errorf("event %s carries secret data", e.Name)
			}
		}
		list, err := d.rc.ResclassV1alpha1().ResourceDistributions().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, rd := range list.Items {
			st, _ := json.Marshal(rd.Status)
			if strings.Contains(string(st), secretValue) {
				t.Errorf("the status of %s carries secret data", rd.Name)
			}
		}
	})
}

// distEnv creates namespaces and distributions that a test removes when done.
type distEnv struct {
	t   *testing.T
	ctx context.Context
	rc  versioned.Interface
	n   int
}

// startDistributionEnv starts the webhook and the distribution controller
// for t (both stopped when it ends) and returns its distEnv; a failure
// prints the components' logs.
func startDistributionEnv(t *testing.T) *distEnv {
	t.Helper()
	diagnoseOnFailure(t, cluster)
	startWebhook(t, framework.WebhookOptions{Selector: webhookLabel})
	startDistribution(t, framework.DistributionOptions{})
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	return &distEnv{t: t, ctx: context.Background(), rc: rc}
}

func (d *distEnv) with(t *testing.T) *distEnv {
	return &distEnv{t: t, ctx: d.ctx, rc: d.rc}
}

func (d *distEnv) uniqueLabel() map[string]string {
	d.n++
	return map[string]string{"e2e-dist": fmt.Sprintf("t%d-%d", time.Now().UnixNano(), d.n)}
}

func (d *distEnv) ns(labels map[string]string) string {
	return newNamespace(d.t, d.ctx, labels)
}

func (d *distEnv) label(ns string, labels map[string]string) {
	d.t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if _, err := cluster.Client.CoreV1().Namespaces().Patch(d.ctx, ns, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		d.t.Fatal(err)
	}
}

// namespaceNamesOf is the names in the status's order.
func namespaceNamesOf(nss []v1alpha1.ResourceDistributionNamespace) []string {
	names := make([]string, len(nss))
	for i, ns := range nss {
		names[i] = ns.Name
	}
	return names
}

func (d *distEnv) foreignSecret(ns, name string) *corev1.Secret {
	d.t.Helper()
	s, err := cluster.Client.CoreV1().Secrets(ns).Create(d.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"owner": "someone else"}}, metav1.CreateOptions{})
	if err != nil {
		d.t.Fatal(err)
	}
	return s
}

func distribution(name string, resource []byte, targets v1alpha1.ResourceDistributionTargets) *v1alpha1.ResourceDistribution {
	return &v1alpha1.ResourceDistribution{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-" + name + "-" + fmt.Sprint(time.Now().UnixNano()%1e6), Labels: webhookLabel},
		Spec:       v1alpha1.ResourceDistributionSpec{Resource: runtime.RawExtension{Raw: resource}, Targets: targets},
	}
}

func (d *distEnv) try(name string, resource []byte, targets v1alpha1.ResourceDistributionTargets) (*v1alpha1.ResourceDistribution, error) {
	created, err := d.rc.ResclassV1alpha1().ResourceDistributions().Create(d.ctx, distribution(name, resource, targets), metav1.CreateOptions{})
	if err == nil {
		d.t.Cleanup(func() {
			_ = d.rc.ResclassV1alpha1().ResourceDistributions().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
		})
	}
	return created, err
}

func (d *distEnv) create(name string, resource []byte, targets v1alpha1.ResourceDistributionTargets) *v1alpha1.ResourceDistribution {
	d.t.Helper()
	rd, err := d.try(name, resource, targets)
	if err != nil {
		d.t.Fatal(err)
	}
	return rd
}

// tryUpdate changes what mutate changes, sent as a JSON merge patch without a
// resourceVersion: what kubectl apply, edit or patch send. An Update would
// carry the resourceVersion it read, and under churn
// (TestResourceDistributionChaos: a namespace event every 20 ms, each a status
// write, which moves the resourceVersion too) even seconds of retries on
// conflict were not enough once in CI.
func (d *distEnv) tryUpdate(name string, mutate func(*v1alpha1.ResourceDistribution)) error {
	rds := d.rc.ResclassV1alpha1().ResourceDistributions()
	rd, err := rds.Get(d.ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	before, err := json.Marshal(rd)
	if err != nil {
		return err
	}
	mutate(rd)
	after, err := json.Marshal(rd)
	if err != nil {
		return err
	}
	patch, err := jsonpatch.CreateMergePatch(before, after)
	if err != nil {
		return err
	}
	_, err = rds.Patch(d.ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

func (d *distEnv) update(name string, mutate func(*v1alpha1.ResourceDistribution)) {
	d.t.Helper()
	if err := d.tryUpdate(name, mutate); err != nil {
		d.t.Fatal(err)
	}
}

// waitSynced waits until the distribution reports succeeded copies, in sync
// with its current generation.
func (d *distEnv) waitSynced(rd *v1alpha1.ResourceDistribution, succeeded int32) v1alpha1.ResourceDistributionStatus {
	d.t.Helper()
	var st v1alpha1.ResourceDistributionStatus
	poll(d.t, d.ctx, 30*time.Second, fmt.Sprintf("%s synced with %d copies", rd.Name, succeeded), func(ctx context.Context) (bool, error) {
		got, err := d.rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		st = got.Status
		return st.ObservedGeneration == got.Generation && st.Succeeded == succeeded && st.Desired == succeeded &&
			meta.IsStatusConditionTrue(st.Conditions, "Synced"), nil
	})
	return st
}

// waitCopies waits until the named object is in every namespace of want and
// in none of without.
func (d *distEnv) waitCopies(name string, want, without []string, kind string) {
	d.t.Helper()
	poll(d.t, d.ctx, 30*time.Second, fmt.Sprintf("%s %s in %v and not in %v", kind, name, want, without), func(ctx context.Context) (bool, error) {
		return d.copiesAre(ctx, name, want, without, kind) == "", nil
	})
}

func (d *distEnv) wantCopies(name string, want, without []string) {
	d.t.Helper()
	if msg := d.copiesAre(d.ctx, name, want, without, "secret"); msg != "" {
		d.t.Error(msg)
	}
}

func (d *distEnv) copiesAre(ctx context.Context, name string, want, without []string, kind string) string {
	get := func(ns string) error {
		var err error
		if kind == "configmap" {
			_, err = cluster.Client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		} else {
			_, err = cluster.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		}
		return err
	}
	for _, ns := range want {
		if err := get(ns); err != nil {
			return fmt.Sprintf("no copy in %s: %v", ns, err)
		}
	}
	for _, ns := range without {
		if err := get(ns); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("%s: want no copy, got %v", ns, err)
		}
	}
	return ""
}

func sortedStrings(s ...string) []string {
	return slices.Sorted(slices.Values(s))
}

func secret(name string, data map[string]string) []byte {
	raw, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": name}, "stringData": data})
	return raw
}

func configMap(name string, data map[string]string) []byte {
	raw, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name}, "data": data})
	return raw
}

// grantName names the (Cluster)Role and binding grant creates.
func grantName(user string, rule rbacv1.PolicyRule) string {
	return fmt.Sprintf("%s-%d", user, len(rule.Resources[0]))
}

// revoke takes back what grant(user, ns, rule) gave in the namespace ns.
func revoke(t *testing.T, ctx context.Context, user, ns string, rule rbacv1.PolicyRule) {
	t.Helper()
	if err := cluster.Client.RbacV1().RoleBindings(ns).Delete(ctx, grantName(user, rule), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAuthorized(t, ctx, user, ns, rule, false)
}

// waitAuthorized waits until the apiserver's authorizer answers want for user
// and the first verb and resource of rule in ns: RBAC reaches the authorizer
// through its informers, a moment after the write, longer under load.
func waitAuthorized(t *testing.T, ctx context.Context, user, ns string, rule rbacv1.PolicyRule, want bool) {
	t.Helper()
	group := ""
	if len(rule.APIGroups) > 0 {
		group = rule.APIGroups[0]
	}
	attrs := &authorizationv1.ResourceAttributes{Namespace: ns, Verb: rule.Verbs[0], Group: group, Resource: rule.Resources[0]}
	poll(t, ctx, time.Minute, fmt.Sprintf("%s allowed %v to %s %s in %q", user, want, attrs.Verb, attrs.Resource, ns), func(ctx context.Context) (bool, error) {
		r, err := cluster.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:authenticated"}, ResourceAttributes: attrs,
		}}, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed == want, err
	})
}

// grant gives user rule, cluster-wide when ns is "".
func grant(t *testing.T, ctx context.Context, user, ns string, rule rbacv1.PolicyRule) {
	t.Helper()
	c := cluster.Client
	name := grantName(user, rule)
	subject := []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: user, APIGroup: rbacv1.GroupName}}
	if ns == "" {
		if _, err := c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{rule}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}, Subjects: subject}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
			_ = c.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		waitAuthorized(t, ctx, user, ns, rule, true)
		return
	}
	if _, err := c.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{rule}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: subject}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAuthorized(t, ctx, user, ns, rule, true)
}
