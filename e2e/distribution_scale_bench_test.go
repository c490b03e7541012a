package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	"github.com/resclass/resclass/pkg/webhook"
)

// BenchmarkDistributionAtScale: a ResourceDistribution over 10 000
// namespaces (RESCLASS_BENCH_DIST_NAMESPACES sets another number), on the
// embedded apiserver, with the webhook and the controller at their
// defaults but the controller's client rate (--kube-api-qps=5000, as in
// BenchmarkDistributionConvergence):
//
//   - admission-cluster-wide-rights: seconds from sending the create of a
//     distribution selecting every namespace to its answer, for a user
//     allowed to create Secrets cluster-wide: one review answers.
//   - admission-per-namespace-rights: the same for a user allowed only in
//     each namespace (a RoleBinding in each): a review per namespace,
//     paced by --distribution-review-qps, within the admission's 8 s (the
//     webhook's timeout, 10 s, less its margin). Each create is sent with
//     nothing cached (past --distribution-review-ttl), and sent
//     again while it is refused for running out of time, as the refusal
//     says to: s is the time from the first send to the admission, tries
//     the sends it took. cached-s is the same request sent again at once.
//     reviews counts the SubjectAccessReviews the apiserver answered per
//     admission, reviews/s their rate.
//   - convergence-with-conflicts: a tenth of the namespaces hold a foreign
//     Secret of the copy's name; seconds from the create to the status
//     reporting every other copy made and every conflict counted; then, over
//     the next 30 s, the requests the conflicts cost (conflict-posts: creates
//     refused as existing; conflict-gets: Secret reads; looks: lists of the
//     name across namespaces). A fixed 3 s retry made a POST and a GET per
//     conflicting namespace every 3 s: 10 000 of each in 30 s here.
//
// Every sub-benchmark sends one create per repeat (3 for admissions, 1 for
// the convergence) and reports the median; ns/op is suppressed.
func BenchmarkDistributionAtScale(b *testing.B) {
	n := 10_000
	if v := os.Getenv("RESCLASS_BENCH_DIST_NAMESPACES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	client := unthrottledClient(b)
	startWebhook(b, framework.WebhookOptions{Selector: webhookLabel})
	rc, err := cluster.Resclass()
	if err != nil {
		b.Fatal(err)
	}

	label := map[string]string{"bench-distribution-scale": fmt.Sprintf("d%d", time.Now().UnixNano())}
	names := make([]string, n)
	began := time.Now()
	forEachParallel(n, 32, func(i int) {
		ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-scale-", Labels: label}}, metav1.CreateOptions{})
		if err != nil {
			b.Errorf("creating a namespace: %v", err)
			return
		}
		names[i] = ns.Name
	})
	b.Cleanup(func() {
		forEachParallel(n, 32, func(i int) {
			_ = client.CoreV1().Namespaces().Delete(context.Background(), names[i], metav1.DeleteOptions{})
		})
	})
	if b.Failed() {
		b.FailNow()
	}
	benchLog(b, "%d namespaces created in %.1fs", n, time.Since(began).Seconds())

	// The two authors: one allowed everywhere, one in each namespace only.
	stamp := time.Now().UnixNano() % 1e9
	wide, narrow := fmt.Sprintf("bench-wide-%d", stamp), fmt.Sprintf("bench-narrow-%d", stamp)
	role := fmt.Sprintf("bench-secret-creator-%d", stamp)
	rules := map[string][]rbacv1.PolicyRule{
		role:                    {{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}}},
		role + "-distributions": {{APIGroups: []string{"resclass.io"}, Resources: []string{"resourcedistributions"}, Verbs: []string{"get", "create", "delete"}}},
	}
	for name, r := range rules {
		if _, err := client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: r}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	bindCluster := func(name, roleName string, users ...string) {
		var subjects []rbacv1.Subject
		for _, u := range users {
			subjects = append(subjects, rbacv1.Subject{Kind: rbacv1.UserKind, Name: u, APIGroup: rbacv1.GroupName})
		}
		if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: roleName}, Subjects: subjects}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	bindCluster(role+"-distributions", role+"-distributions", wide, narrow)
	bindCluster(role, role, wide)
	began = time.Now()
	forEachParallel(n, 32, func(i int) {
		if _, err := client.RbacV1().RoleBindings(names[i]).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: narrow, APIGroup: rbacv1.GroupName}}}, metav1.CreateOptions{}); err != nil {
			b.Errorf("binding %s in %s: %v", narrow, names[i], err)
		}
	})
	b.Cleanup(func() {
		for name := range rules {
			_ = client.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
			_ = client.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
		}
	})
	if b.Failed() {
		b.FailNow()
	}
	// The apiserver's authorizer sees a binding through its informer: wait
	// until the last one answers.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, ns := range []string{names[0], names[n-1]} {
			sar, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: narrow, ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Version: "v1", Resource: "secrets"}}}, metav1.CreateOptions{})
			if err != nil || !sar.Status.Allowed {
				return false, err
			}
		}
		return true, nil
	})
	if err != nil {
		b.Fatal(err)
	}
	benchLog(b, "%d RoleBindings in %.1fs", n, time.Since(began).Seconds())

	raw := secret("bench-scale", map[string]string{"token": strings.Repeat("0123456789abcdef", 64)})
	targets := v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: label}}
	admission := func(b *testing.B, user string) {
		cfg := impersonating(user, "system:authenticated")
		cfg.QPS, cfg.Burst = 5000, 10000
		uc, err := versioned.NewForConfig(cfg)
		if err != nil {
			b.Fatal(err)
		}
		// create sends the create until it is admitted, again whenever it
		// is refused for running out of time (the refusal says that the
		// same request made again goes on from the cached answers), and
		// returns the time from the first send to the admission and the
		// number of sends.
		create := func() (time.Duration, int) {
			start := time.Now()
			for tries := 1; ; tries++ {
				created, err := uc.ResclassV1alpha1().ResourceDistributions().Create(ctx, distribution("scale", raw, targets), metav1.CreateOptions{})
				if err != nil && strings.Contains(err.Error(), "did not finish in the time an admission has") && tries < 10 {
					benchLog(b, "try %d refused for time after %.2fs: %v", tries, time.Since(start).Seconds(), err)
					continue
				}
				took := time.Since(start)
				if err != nil {
					b.Fatalf("the create by %s was refused after %.2fs, try %d: %v", user, took.Seconds(), tries, err)
				}
				// No controller runs here: the status names no copy, so
				// the delete needs no review.
				if err := rc.ResclassV1alpha1().ResourceDistributions().Delete(ctx, created.Name, metav1.DeleteOptions{}); err != nil {
					b.Fatal(err)
				}
				return took, tries
			}
		}
		var cold, cached []time.Duration
		var reviews, apiCPU, tries float64
		apiserver, err := cluster.PID("kube-apiserver")
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			for range 3 {
				// Past the webhook's answer cache (--distribution-review-ttl).
				time.Sleep(webhook.DefaultDistributionReviewTTL + 2*time.Second)
				sars0, cpu0 := apiserverReviews(b, ctx), cpuSeconds(b, apiserver)
				took, n := create()
				cold = append(cold, took)
				tries += float64(n)
				reviews += apiserverReviews(b, ctx) - sars0
				apiCPU += cpuSeconds(b, apiserver) - cpu0
				took, _ = create()
				cached = append(cached, took)
			}
		}
		median := func(d []time.Duration) float64 { return slices.Sorted(slices.Values(d))[len(d)/2].Seconds() }
		var total time.Duration
		for _, d := range cold {
			total += d
		}
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(median(cold), "s")
		b.ReportMetric(tries/float64(len(cold)), "tries")
		b.ReportMetric(median(cached), "cached-s")
		b.ReportMetric(reviews/float64(len(cold)), "reviews")
		b.ReportMetric(reviews/total.Seconds(), "reviews/s")
		b.ReportMetric(apiCPU/float64(len(cold)), "apiserver-cpu-s")
		benchLog(b, "cold %v, cached %v", cold, cached)
	}
	b.Run("admission-cluster-wide-rights", func(b *testing.B) { admission(b, wide) })
	b.Run("admission-per-namespace-rights", func(b *testing.B) { admission(b, narrow) })

	b.Run("convergence-with-conflicts", func(b *testing.B) {
		startDistribution(b, framework.DistributionOptions{Args: []string{"--kube-api-qps=5000", "--kube-api-burst=10000"}})
		conflicting := n / 10
		forEachParallel(conflicting, 32, func(i int) {
			if _, err := client.CoreV1().Secrets(names[i*10]).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bench-scale"}, StringData: map[string]string{"owner": "someone else"}}, metav1.CreateOptions{}); err != nil {
				b.Errorf("the foreign Secret in %s: %v", names[i*10], err)
			}
		})
		if b.Failed() {
			b.FailNow()
		}
		var took time.Duration
		var posts, gets, looks float64
		for b.Loop() {
			start := time.Now()
			created, err := rc.ResclassV1alpha1().ResourceDistributions().Create(ctx, distribution("scale", raw, targets), metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
				got, err := rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, created.Name, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				st := got.Status
				c := meta.FindStatusCondition(st.Conditions, "Synced")
				return st.ObservedGeneration == got.Generation && int(st.Desired) == n && int(st.Succeeded) == n-conflicting &&
					int(st.Conflicting) == conflicting && c != nil && c.Reason == "Conflict", nil
			})
			if err != nil {
				b.Fatalf("%s did not converge: %v", created.Name, err)
			}
			took = time.Since(start)
			p0, g0, l0 := secretRequests(b, ctx)
			time.Sleep(30 * time.Second)
			p1, g1, l1 := secretRequests(b, ctx)
			posts, gets, looks = p1-p0, g1-g0, l1-l0
			if err := rc.ResclassV1alpha1().ResourceDistributions().Delete(ctx, created.Name, metav1.DeleteOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(took.Seconds(), "s")
		b.ReportMetric(posts, "conflict-posts-30s")
		b.ReportMetric(gets, "conflict-gets-30s")
		b.ReportMetric(looks, "looks-30s")
	})
}

// apiserverReviews is how many SubjectAccessReviews the apiserver has
// answered so far (apiserver_request_total).
func apiserverReviews(b *testing.B, ctx context.Context) float64 {
	data, err := cluster.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return metricSum(string(data), "apiserver_request_total{", `resource="subjectaccessreviews"`)
}
