package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	distpkg "github.com/resclass/resclass/pkg/distribution"
)

// TestResourceDistributionAuthorMaxAge: with --distribution-author-max-age
// the controller replays an author record (and the groups it carries) for
// that long after it first saw the spec: then it says so (Authorized False,
// AuthorExpired, a Warning Event) and writes nothing, a deleted copy staying
// deleted, until the spec is written again, which records the author afresh
// and brings the copies back.
func TestResourceDistributionAuthorMaxAge(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	const maxAge = 6 * time.Second
	startWebhook(t, framework.WebhookOptions{Selector: webhookLabel})
	ctl := startDistribution(t, framework.DistributionOptions{Args: []string{"--distribution-author-max-age=" + maxAge.String()}})
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	d := &distEnv{t: t, ctx: ctx, rc: rc}
	a := d.ns(nil)
	rd := d.create("aged", secret("aged", map[string]string{"k": "v1"}), v1alpha1.ResourceDistributionTargets{
		IncludedNamespaces: []v1alpha1.ResourceDistributionNamespace{{Name: a}}})
	d.waitSynced(rd, 1)
	got, err := rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.AuthorSince == nil || got.Status.AuthorGeneration != got.Generation {
		t.Fatalf("status.authorSince %v of generation %d, want the current generation %d", got.Status.AuthorSince, got.Status.AuthorGeneration, got.Generation)
	}

	poll(t, ctx, maxAge+30*time.Second, "Authorized False, AuthorExpired", func(ctx context.Context) (bool, error) {
		got, err := rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, rd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, distpkg.ConditionAuthorized)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == distpkg.ReasonAuthorExpired &&
			strings.Contains(c.Message, "writes its spec again"), nil
	})
	waitEventOn(t, ctx, "default", "ResourceDistribution", rd.Name, distpkg.ReasonAuthorExpired, "--distribution-author-max-age=6s")

	// Expired, the controller writes nothing: a deleted copy is not made
	// again once the controller has reconciled the deletion (a reconcile
	// more than before it, and nothing left in its queue; a distribution
	// that is not expired gets its copy back in that reconcile).
	before := metricSum(scrape(t, ctl.MetricsURL), "controller_runtime_reconcile_total", "")
	if err := cluster.Client.CoreV1().Secrets(a).Delete(ctx, "aged", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, 30*time.Second, "the controller reconciles the deleted copy", func(context.Context) (bool, error) {
		text := scrape(t, ctl.MetricsURL)
		return metricSum(text, "controller_runtime_reconcile_total", "") > before && metricSum(text, "workqueue_depth", "") == 0, nil
	})
	d.wantCopies("aged", nil, []string{a})

	// The spec written again: a fresh record, the copy back with the new
	// content.
	d.update(rd.Name, func(rd *v1alpha1.ResourceDistribution) {
		rd.Spec.Resource = runtime.RawExtension{Raw: secret("aged", map[string]string{"k": "v2"})}
	})
	poll(t, ctx, maxAge, "the copy back with v2 before the new record expires", func(ctx context.Context) (bool, error) {
		s, err := cluster.Client.CoreV1().Secrets(a).Get(ctx, "aged", metav1.GetOptions{})
		return err == nil && string(s.Data["k"]) == "v2", nil
	})
}

// scrape returns the text of a plain-HTTP /metrics on loopback.
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url) //nolint:gosec,noctx // the test's own loopback endpoint
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
