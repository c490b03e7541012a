package webhook

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/flowcontrol"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/distribution"
)

// labelledNamespaces is a fake cache of n namespaces labelled team=ml, and
// the answers that let alice create Secrets in each (not cluster-wide).
func labelledNamespaces(tb testing.TB, n int) (client.Reader, map[string]bool) {
	tb.Helper()
	var objs []client.Object
	allowed := map[string]bool{}
	for i := range n {
		name := fmt.Sprintf("ns-%05d", i)
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": "ml"}}})
		allowed["create "+name] = true
	}
	return fake.NewClientBuilder().WithScheme(newTestScheme(tb)).WithObjects(objs...).Build(), allowed
}

// TestDistributionAdmissionOutOfTime: a create whose reviews cannot all be
// paced within the admission's time is refused before its deadline, with a
// message that says how far it got and what to do; the answers it got are
// remembered, so the same request made again asks only the rest and is
// admitted. No review is asked twice.
func TestDistributionAdmissionOutOfTime(t *testing.T) {
	const namespaces = 2000
	nsCache, allowed := labelledNamespaces(t, namespaces)
	sar := &sarRecorder{allowed: allowed}
	h := &resourceDistributions{
		namespaces: nsCache,
		authorizer: &distribution.Authorizer{
			SAR: sar.client().AuthorizationV1().SubjectAccessReviews(), Workers: reviewWorkers, TTL: DefaultDistributionReviewTTL,
			// 1000 a second: 2000 reviews take 2 s, the deadline is 300 ms.
			Limiter: flowcontrol.NewTokenBucketRateLimiter(1000, 1),
		},
		protected: []string{"resclass-system", "resclass-node"},
	}
	req := distributionRequest(t, admissionv1.Create, newDistribution(pullSecret, v1alpha1.ResourceDistributionTargets{
		NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ml"}}}), nil)

	const budget = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	start := time.Now()
	resp := h.Handle(ctx, req)
	took := time.Since(start)
	cancel()
	if resp.Allowed {
		t.Fatal("admitted with 2000 reviews to pace in 300 ms")
	}
	msg := resp.Result.Message
	for _, want := range []string{
		`user "alice" may not create secrets cluster-wide, and checking the 2000 namespaces the request needs it in one by one did not finish in the time an admission has (`,
		"the answers are remembered for 30s, so the same request made again goes on from there",
		"or ask for create secrets in every namespace",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("denial lacks %q:\n%s", want, msg)
		}
	}
	if took > budget+100*time.Millisecond {
		t.Errorf("answered after %v, past the %v budget", took, budget)
	}
	first := len(sar.asked)
	if first < 2 || first >= namespaces {
		t.Fatalf("%d reviews asked in the first try, want some and not all", first)
	}

	// Again, with time enough: only the rest is asked.
	h.authorizer.Limiter = nil
	if resp := h.Handle(context.Background(), req); !resp.Allowed {
		t.Fatalf("the second try was refused: %s", resp.Result.Message)
	}
	if got := len(sar.asked); got != namespaces+1 {
		t.Errorf("%d reviews over both tries, want %d (one cluster-wide and one per namespace, none twice)", got, namespaces+1)
	}
	// And a third time from the cache alone.
	if resp := h.Handle(context.Background(), req); !resp.Allowed || len(sar.asked) != namespaces+1 {
		t.Errorf("a repeated request: allowed %v, %d reviews in all; want allowed and none more", resp.Allowed, len(sar.asked))
	}
}

// TestReviewBudget: the admission's reviews stop before the apiserver's
// timeout for the call (its ?timeout=, rounded up to a second), 10 s (the
// deployed timeoutSeconds) when the call does not say.
func TestReviewBudget(t *testing.T) {
	for timeout, want := range map[time.Duration]time.Duration{10 * time.Second: 8 * time.Second, 3 * time.Second: 1700 * time.Millisecond, time.Second: 500 * time.Millisecond, 30 * time.Second: 26 * time.Second} {
		if got := admissionBudget(timeout); got != want {
			t.Errorf("admissionBudget(%v) = %v, want %v", timeout, got, want)
		}
	}
	for query, want := range map[string]time.Duration{"?timeout=3s": 1700 * time.Millisecond, "": 8 * time.Second, "?timeout=nonsense": 8 * time.Second} {
		var left time.Duration
		h := reviewBudget(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			deadline, ok := r.Context().Deadline()
			if !ok {
				t.Errorf("%q: no deadline", query)
			}
			left = time.Until(deadline)
		}))
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, ResourceDistributionsPath+query, nil))
		if left > want || left < want-time.Second {
			t.Errorf("%q: %v left, want about %v", query, left, want)
		}
	}
}

// FuzzReviewBudget: whatever a caller writes in ?timeout=, the admission's
// reviews get a deadline, never past the longest timeout the apiserver
// uses (30 s, less the margin).
func FuzzReviewBudget(f *testing.F) {
	for _, seed := range []string{"10s", "3s", "", "1000000h", "-5s", "0", "1ns", "nonsense", "9223372036854775807ns"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, timeout string) {
		var left time.Duration
		var ok bool
		h := reviewBudget(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			var deadline time.Time
			deadline, ok = r.Context().Deadline()
			left = time.Until(deadline)
		}))
		req := httptest.NewRequest(http.MethodPost, ResourceDistributionsPath, nil)
		req.URL.RawQuery = url.Values{"timeout": {timeout}}.Encode()
		h.ServeHTTP(httptest.NewRecorder(), req)
		if !ok || left > admissionBudget(maxAdmissionTimeout) {
			t.Fatalf("timeout %q: deadline set %v, %v left", timeout, ok, left)
		}
	})
}
