package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// secretRequests counts the apiserver's requests on Secrets so far, from its
// /metrics (apiserver_request_total): creates refused because the object
// exists (409: a conflicting namespace tried again), reads of one Secret,
// and lists across namespaces (the controller's look at its conflicts).
func secretRequests(t testing.TB, ctx context.Context) (conflictingPosts, gets, clusterLists float64) {
	t.Helper()
	data, err := cluster.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="secrets"`) || !strings.Contains(line, `subresource=""`) {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v); err != nil {
			continue
		}
		switch {
		case strings.Contains(line, `verb="POST"`) && strings.Contains(line, `code="409"`):
			conflictingPosts += v
		case strings.Contains(line, `verb="GET"`) && strings.Contains(line, `scope="resource"`):
			gets += v
		case strings.Contains(line, `verb="LIST"`) && strings.Contains(line, `scope="cluster"`):
			clusterLists += v
		}
	}
	return conflictingPosts, gets, clusterLists
}

// TestResourceDistributionConflictBackoff: a distribution with conflicts
// looks at them again less and less often (1 s doubling to 5 m), and
// between looks a conflicting namespace costs no request at all: over 20 s
// after the conflicts are reported, not one create is refused for an
// existing object and not one Secret is read (the fixed 3 s retry made a
// POST and a GET per conflicting namespace every 3 s: about 33 of each
// here), and each look is one list. A conflict that clears is seen at the
// next look, or at once when the distribution is touched.
func TestResourceDistributionConflictBackoff(t *testing.T) {
	d := startDistributionEnv(t)
	ctx := d.ctx
	team := d.uniqueLabel()
	var conflicting, clean []string
	for i := range 10 {
		ns := d.ns(team)
		if i%2 == 0 {
			d.foreignSecret(ns, "backoff")
			conflicting = append(conflicting, ns)
		} else {
			clean = append(clean, ns)
		}
	}
	rd := d.create("backoff", secret("backoff", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: team}})
	status := func(ctx context.Context) (v1alpha1.ResourceDistributionStatus, error) {
		got, err := d.rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
		if err != nil {
			return v1alpha1.ResourceDistributionStatus{}, err
		}
		return got.Status, nil
	}
	conflictsAre := func(n int32, within time.Duration, what string) {
		t.Helper()
		poll(t, ctx, within, what, func(ctx context.Context) (bool, error) {
			st, err := status(ctx)
			c := meta.FindStatusCondition(st.Conditions, "Synced")
			return err == nil && st.Conflicting == n && st.Succeeded == 10-n && c != nil && (n == 0) == (c.Status == metav1.ConditionTrue), err
		})
	}
	conflictsAre(5, 30*time.Second, "5 conflicts and 5 copies")

	posts0, gets0, lists0 := secretRequests(t, ctx)
	time.Sleep(20 * time.Second)
	posts, gets, lists := secretRequests(t, ctx)
	posts, gets, lists = posts-posts0, gets-gets0, lists-lists0
	t.Logf("over 20 s with 5 conflicting namespaces: %.0f creates refused as existing, %.0f Secret reads, %.0f cluster-wide lists", posts, gets, lists)
	if posts != 0 || gets != 0 {
		t.Errorf("conflicting namespaces cost requests between looks: %.0f creates refused, %.0f reads; want none", posts, gets)
	}
	// Looks at about 1, 2, 4, 8 and 16 s after the first pass (±20%):
	// 3 to 5 fall in the window. At a fixed 3 s there would be 7.
	if lists < 1 || lists > 5 {
		t.Errorf("%.0f looks in 20 s, want 1 to 5 (backing off)", lists)
	}

	// A conflict that clears, with the distribution touched (any write by
	// someone other than the controller): looked at at once.
	if err := cluster.Client.CoreV1().Secrets(conflicting[0]).Delete(ctx, "backoff", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	touch := fmt.Sprintf(`{"metadata":{"annotations":{"e2e.resclass.io/touched":"%d"}}}`, time.Now().UnixNano())
	if _, err := d.rc.ResclassV1alpha1().ResourceDistributions().Patch(ctx, rd.Name, types.MergePatchType, []byte(touch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	conflictsAre(4, 5*time.Second, "the cleared conflict seen at once after a touch")
	t.Logf("after a touch, the copy appeared %.1fs after the conflict cleared", time.Since(began).Seconds())

	// Untouched, it is seen at the next look: the wait started again from
	// 1 s after the touch, so within a few seconds here.
	if err := cluster.Client.CoreV1().Secrets(conflicting[1]).Delete(ctx, "backoff", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	conflictsAre(3, 60*time.Second, "the cleared conflict seen at the next look")
	t.Logf("untouched, the copy appeared %.1fs after the conflict cleared", time.Since(began).Seconds())
	d.wantCopies("backoff", append(clean, conflicting[:2]...), nil)
}

// TestResourceDistributionManyFailures: 300 namespaces refuse the copy (a
// ResourceQuota of no Secrets), and the status is still written, its
// messages bounded: the Synced condition counts all 300 failures and names
// the first 10. Joined whole, the 300 refusals made a message past the
// 32 KiB a condition may hold, the status patch was refused, and the status
// stayed what it was.
func TestResourceDistributionManyFailures(t *testing.T) {
	d := startDistributionEnv(t)
	ctx := d.ctx
	team := d.uniqueLabel()
	const n = 300
	names := make([]string, n)
	forEachParallel(n, 16, func(i int) {
		ns, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-failing-", Labels: team}}, metav1.CreateOptions{})
		if err != nil {
			t.Errorf("creating a namespace: %v", err)
			return
		}
		names[i] = ns.Name
		quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "no-secrets"},
			Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourceSecrets: resource.MustParse("0")}}}
		if _, err := cluster.Client.CoreV1().ResourceQuotas(ns.Name).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
			t.Errorf("creating the quota in %s: %v", ns.Name, err)
		}
	})
	t.Cleanup(func() {
		forEachParallel(n, 16, func(i int) {
			_ = cluster.Client.CoreV1().Namespaces().Delete(context.Background(), names[i], metav1.DeleteOptions{})
		})
	})
	if t.Failed() {
		t.FailNow()
	}
	// Until the quota controller has counted a namespace's Secrets, the
	// apiserver's quota admission may let a create through there.
	poll(t, ctx, 2*time.Minute, "every quota counted", func(ctx context.Context) (bool, error) {
		quotas, err := cluster.Client.CoreV1().ResourceQuotas("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=no-secrets"})
		if err != nil {
			return false, err
		}
		counted := 0
		for _, q := range quotas.Items {
			if _, ok := q.Status.Hard[corev1.ResourceSecrets]; ok && strings.HasPrefix(q.Namespace, "e2e-failing-") {
				counted++
			}
		}
		return counted >= n, nil
	})
	rd := d.create("failing", secret("failing", map[string]string{"k": "v"}), v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: team}})
	var st v1alpha1.ResourceDistributionStatus
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := d.rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		st = got.Status
		c := meta.FindStatusCondition(st.Conditions, "Synced")
		return st.ObservedGeneration == got.Generation && c != nil && c.Reason == "WriteFailed" &&
			strings.Contains(c.Message, fmt.Sprintf("writes failed in %d namespace(s)", n)), nil
	})
	if err != nil {
		t.Fatalf("the status does not report the %d failed writes: %v; it is %+v", n, err, st)
	}
	c := meta.FindStatusCondition(st.Conditions, "Synced")
	t.Logf("Synced: %d bytes; description: %d bytes; %.300s", len(c.Message), len(st.Description), c.Message)
	if !strings.Contains(c.Message, fmt.Sprintf("; and %d more", n-10)) || !strings.Contains(c.Message, "exceeded quota") || len(c.Message) > 4096 || len(st.Description) > 4096 {
		t.Errorf("Synced message of %d bytes, description of %d: want at most 4096 each, naming 10 failures and counting %d more", len(c.Message), len(st.Description), n-10)
	}
	if st.Desired != n || st.Succeeded != 0 {
		t.Errorf("desired %d, succeeded %d; want %d, 0", st.Desired, st.Succeeded, n)
	}
}
