package distribution

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// TestNamespaceEventsQueueOnlyConcernedDistributions: a namespace event
// queues the distributions whose targets match the namespace before or
// after, or whose status names it, and no other.
func TestNamespaceEventsQueueOnlyConcernedDistributions(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	rd := func(name string, targets v1alpha1.ResourceDistributionTargets, copies ...string) *v1alpha1.ResourceDistribution {
		d := &v1alpha1.ResourceDistribution{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)}, Spec: v1alpha1.ResourceDistributionSpec{Targets: targets}}
		if len(copies) > 0 {
			d.Status.DistributedResources = map[string]string{}
			for _, ns := range copies {
				d.Status.DistributedResources[ns] = "1"
			}
		}
		return d
	}
	team := func(v string) v1alpha1.ResourceDistributionTargets {
		return v1alpha1.ResourceDistributionTargets{NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": v}}}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		rd("ml", team("ml")),
		rd("web", team("web")),
		rd("web-with-copy-in-x", team("web"), "x"),
		rd("only-a", v1alpha1.ResourceDistributionTargets{IncludedNamespaces: names("a")}),
		rd("everywhere", v1alpha1.ResourceDistributionTargets{}),
	).Build()
	r := &Reconciler{Client: c, Protected: testOwnNamespaces, conflicts: newConflictTracker(DefaultConflictRetry, DefaultConflictRetryMax)}

	queued := func(oldNS, newNS *corev1.Namespace) []string {
		q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
		defer q.ShutDown()
		r.enqueueFor(context.Background(), q, clientObject(oldNS), clientObject(newNS))
		var got []string
		for q.Len() > 0 {
			item, _ := q.Get()
			got = append(got, item.Name)
			q.Done(item)
		}
		slices.Sort(got)
		return got
	}
	x := func(labels map[string]string) *corev1.Namespace { return namespace("x", labels) }
	for _, tc := range []struct {
		name     string
		old, new *corev1.Namespace
		want     []string
	}{
		{"a new namespace labelled team=ml (and one whose status still names an x)", nil, x(map[string]string{"team": "ml"}), []string{"everywhere", "ml", "web-with-copy-in-x"}},
		{"relabelled from ml to web: both sides, and the copy's", x(map[string]string{"team": "ml"}), x(map[string]string{"team": "web"}), []string{"everywhere", "ml", "web", "web-with-copy-in-x"}},
		{"an update that changes no label concerns none", x(map[string]string{"team": "ml"}), x(map[string]string{"team": "ml"}), nil},
		{"deleted: those that targeted it or hold a copy there", x(nil), nil, []string{"everywhere", "web-with-copy-in-x"}},
		{"resclass's own namespace matches no selector nor the default", nil, namespace(testOwnNamespaces[0], map[string]string{"team": "ml"}), nil},
		{"nor does the node agent's", nil, namespace(testOwnNamespaces[1], map[string]string{"team": "ml"}), nil},
		{"a listed namespace", nil, namespace("a", nil), []string{"everywhere", "only-a"}},
	} {
		if got := queued(tc.old, tc.new); !slices.Equal(got, tc.want) {
			t.Errorf("%s: queued %v, want %v", tc.name, got, tc.want)
		}
	}
}

// clientObject keeps a nil *Namespace a nil interface, as the event handler
// receives it.
func clientObject(ns *corev1.Namespace) client.Object {
	if ns == nil {
		return nil
	}
	return ns
}

// TestUnauthorizedNamespacesBounded: the status names the namespaces the
// author may not write in, sorted, each with its verb and consequence, at
// most v1alpha1.MaxUnauthorizedNamespaces of them, and counts them all; the
// messages name a bounded few.
func TestUnauthorizedNamespacesBounded(t *testing.T) {
	res := mustParse(t, `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"}}`)
	author := Author{Username: "alice"}

	total, listed := unauthorizedNamespaces(author, res, map[string][]string{VerbUpdate: {"b"}, VerbCreate: {"c", "a"}})
	want := []v1alpha1.ResourceDistributionUnauthorizedNamespace{
		{Name: "a", Verb: "create", Reason: `the author "alice" may not create secrets in this namespace, so no copy is made there`},
		{Name: "b", Verb: "update", Reason: `the author "alice" may not update secrets in this namespace, so the copy there keeps its old content`},
		{Name: "c", Verb: "create", Reason: `the author "alice" may not create secrets in this namespace, so no copy is made there`},
	}
	if total != 3 || !slices.Equal(listed, want) {
		t.Errorf("got %d %+v, want 3 %+v", total, listed, want)
	}
	if total, listed := unauthorizedNamespaces(author, res, nil); total != 0 || listed != nil {
		t.Errorf("none forbidden: got %d %v", total, listed)
	}

	var many []string
	for i := range 5000 {
		many = append(many, fmt.Sprintf("team-%04d", i))
	}
	total, listed = unauthorizedNamespaces(author, res, map[string][]string{VerbCreate: slices.Clone(many)})
	if total != 5000 || len(listed) != v1alpha1.MaxUnauthorizedNamespaces || listed[0].Name != "team-0000" || listed[len(listed)-1].Name != "team-0099" {
		t.Errorf("5000 forbidden: total %d, %d listed from %s to %s; want 5000, the first %d by name",
			total, len(listed), listed[0].Name, listed[len(listed)-1].Name, v1alpha1.MaxUnauthorizedNamespaces)
	}
	msg := forbiddenMessage(author, res, map[string][]string{VerbCreate: many})
	if !strings.Contains(msg, "create secrets in 5000 namespace(s): team-0000, team-0001") || !strings.Contains(msg, "team-0019 and 4980 more") || len(msg) > 2000 {
		t.Errorf("message of %d bytes: %.300s", len(msg), msg)
	}
}

// TestConflictingNamespacesBounded: the status counts every conflicting
// namespace and names the first v1alpha1.MaxConflictingNamespaces.
func TestConflictingNamespacesBounded(t *testing.T) {
	if total, listed := conflictingNamespaces(nil); total != 0 || listed != nil {
		t.Errorf("no conflict: got %d %v", total, listed)
	}
	total, listed := conflictingNamespaces([]string{"a", "b"})
	if want := []v1alpha1.ResourceDistributionNamespace{{Name: "a"}, {Name: "b"}}; total != 2 || !slices.Equal(listed, want) {
		t.Errorf("got %d %+v, want 2 %+v", total, listed, want)
	}
	var many []string
	for i := range 5000 {
		many = append(many, fmt.Sprintf("team-%04d", i))
	}
	total, listed = conflictingNamespaces(many)
	if total != 5000 || len(listed) != v1alpha1.MaxConflictingNamespaces || listed[0].Name != "team-0000" || listed[len(listed)-1].Name != "team-0099" {
		t.Errorf("5000 conflicts: total %d, %d listed from %s to %s; want 5000, the first %d",
			total, len(listed), listed[0].Name, listed[len(listed)-1].Name, v1alpha1.MaxConflictingNamespaces)
	}
}

// TestStatusCopiesBounded: status.distributedResources names at most the
// bound's first namespaces by name, status.distributed counts them all, and
// a status that leaves some out says so (CopyNamespaces), so that admission
// does not take it for the whole list.
func TestStatusCopiesBounded(t *testing.T) {
	all := map[string]string{}
	for i := range 5000 {
		all[fmt.Sprintf("team-%04d", i)] = "1"
	}
	for _, limit := range []int{0, 1, 100, 5000, 6000} {
		first := firstCopies(all, limit)
		want := limit
		if limit <= 0 {
			want = DefaultMaxStatusCopies
		}
		want = min(want, len(all))
		status := v1alpha1.ResourceDistributionStatus{Distributed: int32(len(all)), DistributedResources: first}
		names, complete := CopyNamespaces(&status)
		if len(names) != want || names[0] != "team-0000" || names[len(names)-1] != fmt.Sprintf("team-%04d", want-1) || complete != (want == len(all)) {
			t.Errorf("limit %d: %d named (%s..%s), complete=%v; want the first %d", limit, len(names), names[0], names[len(names)-1], complete, want)
		}
	}
	// A status written before status.distributed existed names every copy.
	if _, complete := CopyNamespaces(&v1alpha1.ResourceDistributionStatus{DistributedResources: map[string]string{"a": "1"}}); !complete {
		t.Error("a status without distributed is complete")
	}
}
