package distribution

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/clock"
)

// The verbs a distribution's writes need of its author, per namespace: a copy
// is created, updated (or, for a Secret whose type changed or an immutable
// object, deleted and created again) and deleted.
const (
	VerbCreate = "create"
	VerbUpdate = "update"
	VerbDelete = "delete"
)

// DefaultAuthorizationTTL is how long the controller trusts a
// SubjectAccessReview answer: a revoked RoleBinding takes effect on the
// copies within this time, and a distribution over N namespaces asks at most
// about once per TTL, verb and namespace (once per TTL and verb when the
// author may write everywhere).
const DefaultAuthorizationTTL = 10 * time.Second

// defaultAuthorizationEntries bounds the cache: one entry per author, verb,
// resource and namespace.
const defaultAuthorizationEntries = 100_000

// Authorizer asks the apiserver whether an Author may create, update or
// delete Secrets or ConfigMaps in a namespace (SubjectAccessReview), and
// remembers the answers for TTL. A cluster-wide review is asked first: when
// it allows, every namespace is allowed without a review of its own.
// Safe for concurrent use.
type Authorizer struct {
	SAR authorizationclient.SubjectAccessReviewInterface
	// TTL is how long an answer is reused; 0 asks every time.
	TTL time.Duration
	// MaxEntries bounds the cache (default 100000); when it is full the
	// expired answers go, and if that is not enough, all of them.
	MaxEntries int
	// MaxReviews bounds how many namespaces Denied asks about one by one
	// (0: no bound). Past it, when the cluster-wide review says no, Denied
	// asks nothing more and returns a *TooManyReviewsError: the admission
	// webhook answers any caller that reaches it, and without a bound one
	// request would cost the apiserver a review per namespace of the cluster.
	MaxReviews int
	// Workers is how many reviews Denied asks at once (default 8).
	Workers int
	// Limiter, when set, paces every review this Authorizer asks, whoever
	// the caller: the admission webhook's bound on what all requests
	// together cost the apiserver. A review that would wait past the
	// context's deadline is not asked (ErrOutOfTime).
	Limiter flowcontrol.RateLimiter
	Clock   clock.PassiveClock

	mu    sync.Mutex
	cache map[authzKey]authzAnswer
	// inflight makes concurrent questions of one key share one review: the
	// controller's workers start together, and without it each asked the
	// same cluster-wide question before the first answer was cached.
	inflight singleflight.Group
	// beforeFlight, when set (tests), runs between a caller's look at the
	// cache and its turn in inflight: where another review can end unseen.
	beforeFlight func()
}

// authzKey identifies a question. The author is a digest of its canonical
// record, which may be 16 KiB: the cache's size then depends on the number
// of answers, not on what a caller put in an identity.
type authzKey struct {
	author                    [sha256.Size]byte
	verb, resource, namespace string
}

type authzAnswer struct {
	allowed bool
	expires time.Time
}

// ErrOutOfTime: a review was not asked, or not answered, before the
// context's deadline (or the Limiter would have made it wait past it).
var ErrOutOfTime = errors.New("out of time for SubjectAccessReviews")

// Allowed reports whether author may verb resource (secrets or configmaps)
// in namespace.
func (a *Authorizer) Allowed(ctx context.Context, author Author, verb, resource, namespace string) (bool, error) {
	encoded := sha256.Sum256([]byte(author.key()))
	if ok, err := a.review(ctx, author, encoded, verb, resource, metav1.NamespaceAll); err != nil || ok {
		return ok, err
	}
	return a.review(ctx, author, encoded, verb, resource, namespace)
}

// Denied returns the namespaces among namespaces where author may not verb
// resource, sorted; Workers reviews run at once. When ctx's deadline comes
// first (or the Limiter would pass it), it stops and returns an
// *OutOfTimeError; the answers it had are cached (TTL), so asking again
// goes on from there.
func (a *Authorizer) Denied(ctx context.Context, author Author, verb, resource string, namespaces []string) ([]string, error) {
	if len(namespaces) == 0 {
		return nil, nil
	}
	encoded := sha256.Sum256([]byte(author.key()))
	outOfTime := func(err error, checked int) error {
		if errors.Is(err, ErrOutOfTime) || errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return &OutOfTimeError{Verb: verb, Resource: resource, Namespaces: len(namespaces), Checked: checked, TTL: a.TTL}
		}
		return err
	}
	if ok, err := a.review(ctx, author, encoded, verb, resource, metav1.NamespaceAll); err != nil || ok {
		if err != nil {
			return nil, outOfTime(err, 0)
		}
		return nil, nil
	}
	if a.MaxReviews > 0 && len(namespaces) > a.MaxReviews {
		return nil, &TooManyReviewsError{Verb: verb, Resource: resource, Namespaces: len(namespaces), Max: a.MaxReviews}
	}
	workers := a.Workers
	if workers <= 0 {
		workers = 8
	}
	// The first error stops the others: past a deadline every review left
	// would fail the same way.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		mu       sync.Mutex
		denied   []string
		firstErr error
		checked  atomic.Int64
		wg       sync.WaitGroup
	)
	work := make(chan string)
	for range min(workers, len(namespaces)) {
		wg.Go(func() {
			for ns := range work {
				ok, err := a.review(ctx, author, encoded, verb, resource, ns)
				mu.Lock()
				switch {
				case err != nil:
					if firstErr == nil {
						firstErr = err
						cancel(err)
					}
				case !ok:
					denied = append(denied, ns)
					checked.Add(1)
				default:
					checked.Add(1)
				}
				mu.Unlock()
			}
		})
	}
feed:
	for _, ns := range namespaces {
		select {
		case work <- ns:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return nil, outOfTime(firstErr, int(checked.Load()))
	}
	slices.Sort(denied)
	return denied, nil
}

func (a *Authorizer) review(ctx context.Context, author Author, encoded [sha256.Size]byte, verb, resource, namespace string) (bool, error) {
	key := authzKey{author: encoded, verb: verb, resource: resource, namespace: namespace}
	now := a.now()
	if a.TTL > 0 {
		a.mu.Lock()
		ans, ok := a.cache[key]
		a.mu.Unlock()
		if ok && now.Before(ans.expires) {
			authorizationChecks.WithLabelValues(verdict(ans.allowed), "true").Inc()
			return ans.allowed, nil
		}
		if a.beforeFlight != nil {
			a.beforeFlight()
		}
		// Each question is counted once: by ask when this caller's review
		// answers it, as cached when the answer is another's (a review that
		// ended just now, or one in flight that this caller waited for).
		leader := false
		v, err, _ := a.inflight.Do(fmt.Sprintf("%x %q %q %q", encoded, verb, resource, namespace), func() (any, error) {
			leader = true
			// A review that ended between this caller's look at the cache
			// and here has answered already.
			a.mu.Lock()
			ans, ok := a.cache[key]
			a.mu.Unlock()
			if ok && now.Before(ans.expires) {
				authorizationChecks.WithLabelValues(verdict(ans.allowed), "true").Inc()
				return ans.allowed, nil
			}
			return a.ask(ctx, author, key, now)
		})
		if !leader {
			// Answered by another worker's review: no review of its own.
			result := "error"
			if err == nil {
				result = verdict(v.(bool))
			}
			authorizationChecks.WithLabelValues(result, "true").Inc()
		}
		if err != nil {
			return false, err
		}
		return v.(bool), nil
	}
	return a.ask(ctx, author, key, now)
}

// ask asks the apiserver, counts the review and caches its answer.
func (a *Authorizer) ask(ctx context.Context, author Author, key authzKey, now time.Time) (bool, error) {
	verb, resource, namespace := key.verb, key.resource, key.namespace
	if a.Limiter != nil {
		// Fails at once when the wait would pass ctx's deadline: the
		// request is answered in time rather than after its caller gave up.
		if err := a.Limiter.Wait(ctx); err != nil {
			return false, fmt.Errorf("%w: %w", ErrOutOfTime, err)
		}
	}
	extra := make(map[string]authorizationv1.ExtraValue, len(author.Extra))
	for k, v := range author.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	review, err := a.SAR.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: author.Username, UID: author.UID, Groups: author.Groups, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: verb, Version: "v1", Resource: resource},
	}}, metav1.CreateOptions{})
	if err != nil {
		authorizationChecks.WithLabelValues("error", "false").Inc()
		where := "cluster-wide"
		if namespace != "" {
			where = "in " + namespace
		}
		return false, fmt.Errorf("asking whether %s may %s %s %s: %w", author, verb, resource, where, err)
	}
	allowed := review.Status.Allowed
	authorizationChecks.WithLabelValues(verdict(allowed), "false").Inc()
	if a.TTL > 0 {
		a.store(key, authzAnswer{allowed: allowed, expires: now.Add(a.TTL)}, now)
	}
	return allowed, nil
}

func (a *Authorizer) store(key authzKey, ans authzAnswer, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	limit := a.MaxEntries
	if limit <= 0 {
		limit = defaultAuthorizationEntries
	}
	if a.cache == nil {
		a.cache = map[authzKey]authzAnswer{}
	}
	if len(a.cache) >= limit {
		for k, v := range a.cache {
			if !now.Before(v.expires) {
				delete(a.cache, k)
			}
		}
		if len(a.cache) >= limit {
			clear(a.cache)
		}
	}
	a.cache[key] = ans
}

// Len is the number of answers cached, expired ones included.
func (a *Authorizer) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.cache)
}

func (a *Authorizer) now() time.Time {
	if a.Clock == nil {
		return time.Now()
	}
	return a.Clock.Now()
}

func verdict(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

// TooManyReviewsError is Denied's answer when the author may not verb
// resource cluster-wide and more namespaces than Authorizer.MaxReviews would
// need a review each: none of them was asked.
type TooManyReviewsError struct {
	Verb, Resource  string
	Namespaces, Max int
}

func (e *TooManyReviewsError) Error() string {
	return fmt.Sprintf("%s %s cluster-wide, and the request needs it in %d namespaces, more than the %d checked one by one",
		e.Verb, e.Resource, e.Namespaces, e.Max)
}

// OutOfTimeError is Denied's answer when its context's deadline came (or the
// Limiter would have passed it) before every namespace was asked about.
type OutOfTimeError struct {
	Verb, Resource      string
	Namespaces, Checked int
	TTL                 time.Duration
}

func (e *OutOfTimeError) Error() string {
	msg := fmt.Sprintf("%s %s cluster-wide, and checking the %d namespaces the request needs it in one by one did not finish in the time an admission has (%d checked)",
		e.Verb, e.Resource, e.Namespaces, e.Checked)
	if e.TTL > 0 {
		msg += fmt.Sprintf("; the answers are remembered for %s, so the same request made again goes on from there", e.TTL)
	}
	return msg
}

func (e *OutOfTimeError) Unwrap() error { return ErrOutOfTime }
