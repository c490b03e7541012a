package distribution

import (
	"context"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// DefaultConflictRetry is how soon a distribution with a conflicting
// namespace is looked at again the first time, and DefaultConflictRetryMax
// the longest it waits: the controller does not watch foreign objects (its
// cache holds only copies), so this is how a cleared conflict is noticed.
// The wait doubles with every look that finds a conflict still there and
// starts again from DefaultConflictRetry once a pass finds none
// (docs/distribution.md, "Conflicts").
const (
	DefaultConflictRetry    = time.Second
	DefaultConflictRetryMax = 5 * time.Minute
)

// conflictJitter spreads each wait over ±20%, so that distributions whose
// conflicts began together (a namespace label that added many) do not look
// again all at once.
const conflictJitter = 0.2

// conflictTracker remembers, per distribution, the namespaces where a pass
// found a same-named foreign object, and when to look at them again.
// Between looks a remembered namespace costs no request: it is a conflict
// until the look, which is one metadata list of the objects of that name
// (conflictLook), not a create and a read per namespace. Safe for
// concurrent use.
type conflictTracker struct {
	base, max time.Duration
	// random is in [0, 1); tests set it.
	random func() float64

	mu     sync.Mutex
	byName map[string]*conflictMemory
}

// conflictMemory is what is remembered of one distribution.
type conflictMemory struct {
	// uid and generation are the distribution and spec it is about: a new
	// spec may name another object, so it starts afresh.
	uid        types.UID
	generation int64
	// ours are the distribution's resourceVersions that this controller
	// read or wrote (its status). Any other is a write by someone else, which
	// starts afresh too: touching the distribution is how a user asks for a
	// look now (docs/distribution.md, "Conflicts").
	ours       []string
	namespaces map[string]bool
	// looks counts the looks in a row that found a conflict.
	looks   int
	retryAt time.Time
}

func newConflictTracker(base, maxWait time.Duration) *conflictTracker {
	return &conflictTracker{base: base, max: maxWait, random: rand.Float64, byName: map[string]*conflictMemory{}}
}

// recall returns the namespaces remembered as conflicting for rd (nil when
// none, or when the memory is of another spec or someone else wrote rd since)
// and whether it is time to look at them again.
func (t *conflictTracker) recall(rd *v1alpha1.ResourceDistribution, now time.Time) (known map[string]bool, due bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.byName[rd.Name]
	if m == nil {
		return nil, false
	}
	if m.uid != rd.UID || m.generation != rd.Generation || !slices.Contains(m.ours, rd.ResourceVersion) {
		delete(t.byName, rd.Name)
		return nil, false
	}
	// A copy: forgetNamespace may change the memory while the pass reads.
	return maps.Clone(m.namespaces), !now.Before(m.retryAt)
}

// record keeps what a pass found: conflicts are the namespaces found
// conflicting; looked says whether the pass looked at every one of them
// (rather than counting remembered ones without a request). It returns how
// soon to pass again for the conflicts (0 when there are none: the memory is
// cleared, and the next conflict waits DefaultConflictRetry again).
func (t *conflictTracker) record(rd *v1alpha1.ResourceDistribution, conflicts []string, looked bool, now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(conflicts) == 0 {
		delete(t.byName, rd.Name)
		return 0
	}
	m := t.byName[rd.Name]
	if m == nil || m.uid != rd.UID || m.generation != rd.Generation {
		m = &conflictMemory{uid: rd.UID, generation: rd.Generation}
		t.byName[rd.Name] = m
		looked = true
	}
	m.own(rd.ResourceVersion)
	m.namespaces = make(map[string]bool, len(conflicts))
	for _, ns := range conflicts {
		m.namespaces[ns] = true
	}
	if looked {
		m.looks++
		m.retryAt = now.Add(t.wait(m.looks))
	}
	return max(m.retryAt.Sub(now), time.Millisecond)
}

// wait is how long to wait after the n-th look in a row that found a
// conflict: base doubled n-1 times, at most max, jittered.
func (t *conflictTracker) wait(n int) time.Duration {
	d := t.base
	for i := 1; i < n && d < t.max; i++ {
		d *= 2
	}
	jittered := time.Duration(float64(d) * (1 - conflictJitter + 2*conflictJitter*t.random()))
	return min(jittered, t.max)
}

// wrote notes a status this controller wrote to the distribution: its
// resourceVersion is its own, not a user's touch.
func (t *conflictTracker) wrote(rd *v1alpha1.ResourceDistribution, resourceVersion string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := t.byName[rd.Name]; m != nil && m.uid == rd.UID {
		m.own(resourceVersion)
	}
}

// ownVersions is how many of the controller's own resourceVersions of a
// distribution are kept. A pass may read the distribution from a cache that
// has not yet seen the status the previous pass wrote, and write it again:
// every version either wrote may be the next one read.
const ownVersions = 8

// own adds rv to the versions that are the controller's own.
func (m *conflictMemory) own(rv string) {
	if slices.Contains(m.ours, rv) {
		return
	}
	m.ours = append(m.ours, rv)
	if len(m.ours) > ownVersions {
		m.ours = slices.Delete(m.ours, 0, len(m.ours)-ownVersions)
	}
}

// forgetNamespace drops ns from every memory: a namespace just created holds
// no foreign object from before, and the next pass tries to create the copy
// there.
func (t *conflictTracker) forgetNamespace(ns string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range t.byName {
		delete(m.namespaces, ns)
	}
}

// forget drops a distribution that is gone.
func (t *conflictTracker) forget(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.byName, name)
}

// conflictLook lists, as metadata, every object of the copy's kind and name
// in the cluster (one request, whatever the number of namespaces) and
// returns those of the remembered namespaces where it is still not this
// distribution's. Only they are read from the answer: any other namespace
// tries its create, as the first time.
func (r *Reconciler) conflictLook(ctx context.Context, rd *v1alpha1.ResourceDistribution, res *Resource, remembered map[string]bool) (map[string]bool, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(res.Kind + "List"))
	if err := r.APIReader.List(ctx, list, client.MatchingFields{"metadata.name": res.Name}); err != nil {
		return nil, err
	}
	foreign := map[string]bool{}
	for i := range list.Items {
		if obj := &list.Items[i]; obj.GetName() == res.Name && remembered[obj.GetNamespace()] && !res.Owned(obj, rd) {
			foreign[obj.GetNamespace()] = true
		}
	}
	return foreign, nil
}
