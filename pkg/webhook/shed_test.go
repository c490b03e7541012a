package webhook

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// With max requests being worked on, one more is answered at once with 429
// and a Status that says the webhook is overloaded and to retry, and is
// counted; once a slot frees, requests are served again.
func TestInFlightLimitSheds(t *testing.T) {
	const max = 3
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(max)
	blocking := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("block") != "" {
			started.Done()
			<-release
		}
		_, _ = io.WriteString(w, "served")
	})
	const path = "/test-shed"
	srv := httptest.NewServer(newInFlightLimit(max).wrap(path, blocking))
	defer srv.Close()
	before := testutil.ToFloat64(shedRequests.WithLabelValues(path))

	var done sync.WaitGroup
	for range max {
		done.Add(1)
		go func() {
			defer done.Done()
			resp, err := http.Post(srv.URL+"?block=1", "application/json", strings.NewReader("{}"))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("a request within the limit: HTTP %d", resp.StatusCode)
			}
		}()
	}
	started.Wait()
	if got := testutil.ToFloat64(inFlight); got < max {
		t.Errorf("in_flight_requests %v with %d requests held", got, max)
	}

	resp, err := http.Post(srv.URL, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the request over the limit: HTTP %d %q, want 429", resp.StatusCode, body)
	}
	if resp.Header.Get("Retry-After") != "" {
		t.Errorf("Retry-After %q: the apiserver's client would retry within the same timeout", resp.Header.Get("Retry-After"))
	}
	// The apiserver's client decodes a Status body and shows its message.
	var status metav1.Status
	if err := json.Unmarshal(body, &status); err != nil {
		t.Fatalf("the 429 body is not a Status: %v: %s", err, body)
	}
	if status.Kind != "Status" || status.Code != http.StatusTooManyRequests || status.Reason != metav1.StatusReasonTooManyRequests ||
		!strings.Contains(status.Message, "overloaded") || !strings.Contains(status.Message, "retry") || !strings.Contains(status.Message, "--max-in-flight") {
		t.Errorf("the 429 Status %+v: want reason TooManyRequests and a message saying the webhook is overloaded, the flag, and to retry", status)
	}
	// What the apiserver's webhook client (client-go's REST client) makes of
	// it: a TooManyRequests error carrying the message, which the apiserver
	// puts after `failed calling webhook "<name>": failed to call webhook:`.
	// No retry: there is no Retry-After.
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	callErr := cs.AdmissionregistrationV1().RESTClient().Post().AbsPath("/").Body([]byte("{}")).Do(context.Background()).Error()
	if !apierrors.IsTooManyRequests(callErr) || !strings.Contains(callErr.Error(), "the resclass webhook is overloaded") {
		t.Errorf("client-go's error for the shed request: %v, want TooManyRequests saying the webhook is overloaded", callErr)
	}
	if got := testutil.ToFloat64(shedRequests.WithLabelValues(path)) - before; got != 2 {
		t.Errorf("shed_requests_total{webhook=%q} rose by %v, want 2", path, got)
	}

	close(release)
	done.Wait()
	resp, err = http.Post(srv.URL, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("after the held requests finished: HTTP %d, want 200", resp.StatusCode)
	}
}
