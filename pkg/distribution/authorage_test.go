package distribution

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// TestAuthorAge: status.authorSince is the first time the controller saw the
// spec's generation, kept while the generation stays and started again by a
// new one (a spec written again, a new author record); the record expires
// maxAge after it, never with maxAge 0.
func TestAuthorAge(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 500_000_000, time.UTC)
	const maxAge = time.Hour
	st := &v1alpha1.ResourceDistributionStatus{}

	if expired, left := authorAge(st, 3, t0, maxAge); expired || st.AuthorGeneration != 3 || !st.AuthorSince.Equal(&metav1.Time{Time: t0.Truncate(time.Second)}) || left != maxAge-500*time.Millisecond {
		t.Fatalf("first sight: expired %v, left %s, since %v generation %d", expired, left, st.AuthorSince, st.AuthorGeneration)
	}
	since := st.AuthorSince.DeepCopy()
	if expired, left := authorAge(st, 3, t0.Add(59*time.Minute), maxAge); expired || left <= 0 || !st.AuthorSince.Equal(since) {
		t.Errorf("59 minutes on: expired %v, left %s, since %v (want kept %v)", expired, left, st.AuthorSince, since)
	}
	if expired, _ := authorAge(st, 3, t0.Add(maxAge), maxAge); !expired {
		t.Error("an hour on, the same generation: not expired")
	}
	if expired, _ := authorAge(st, 3, t0.Add(1000*time.Hour), 0); expired {
		t.Error("no max age: expired")
	}
	// The spec written again: a new record, a new clock.
	later := t0.Add(2 * maxAge)
	if expired, left := authorAge(st, 4, later, maxAge); expired || left != maxAge-500*time.Millisecond || st.AuthorGeneration != 4 || st.AuthorSince.Equal(since) {
		t.Errorf("new generation: expired %v, left %s, since %v generation %d", expired, left, st.AuthorSince, st.AuthorGeneration)
	}

	// A status that differs only in authorSince is written.
	a, b := &v1alpha1.ResourceDistributionStatus{}, &v1alpha1.ResourceDistributionStatus{}
	authorAge(a, 1, t0, 0)
	if statusEqual(a, b) {
		t.Error("statusEqual ignores authorSince")
	}
	authorAge(b, 1, t0, 0)
	if !statusEqual(a, b) {
		t.Error("statusEqual: equal authorSince differ")
	}
}
