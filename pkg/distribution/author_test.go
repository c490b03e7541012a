package distribution

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func TestAuthorRoundTrip(t *testing.T) {
	for _, u := range []authenticationv1.UserInfo{
		{Username: "alice"},
		{Username: "system:serviceaccount:ci:deployer", UID: "u-1", Groups: []string{"system:serviceaccounts", "system:authenticated"},
			Extra: map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"p"}, "a": {}}},
	} {
		a := AuthorOf(u)
		got, err := ParseAuthor(a.Encode())
		if err != nil {
			t.Fatalf("%s: %v", a.Encode(), err)
		}
		if !reflect.DeepEqual(got, a) {
			t.Errorf("round trip: %+v, want %+v", got, a)
		}
		if a.Encode() != AuthorOf(u).Encode() {
			t.Errorf("Encode is not deterministic")
		}
	}
}

func TestParseAuthorRefuses(t *testing.T) {
	for _, tc := range []struct{ value, want string }{
		{"", "no author"},
		{`{"username":""}`, "no user name"},
		{`{"username":"a","admin":true}`, "unknown field"},
		{`{"username":"a","username":"b"}`, "duplicate field"},
		{`{"Username":"a"}`, "unknown field"},
		{`{ "username":"a"}`, "not in the form"},
		{`{"username":"a"} `, "not in the form"},
		{`{"username":"a","groups":[]}`, "not in the form"},
		{`["a"]`, "not valid JSON"},
		{`{"username":"a","groups":[` + strings.Repeat(`"g",`, maxAuthorGroups) + `"g"]}`, "groups"},
		{`{"username":"` + strings.Repeat("a", maxAuthorBytes) + `"}`, "bytes"},
	} {
		if _, err := ParseAuthor(tc.value); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseAuthor(%.60q) = %v, want an error saying %q", tc.value, err, tc.want)
		}
	}
}

// FuzzParseAuthor: ParseAuthor never panics, and what it accepts is exactly
// what Encode writes for it.
func FuzzParseAuthor(f *testing.F) {
	for _, s := range []string{
		`{"username":"alice"}`,
		`{"username":"a","uid":"u","groups":["g"],"extra":{"k":["v"],"l":null}}`,
		`{"username":"a","extra":{"k":[]}}`,
		`{"username":"a","groups":null}`,
		`{"username":"\u0000"}`,
		``, `null`, `{}`, `[`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		watchdog.Run(t, func() {
			a, err := ParseAuthor(value)
			if err != nil {
				return
			}
			if a.Username == "" || a.Encode() != value {
				t.Fatalf("accepted %q as %+v, which encodes as %q", value, a, a.Encode())
			}
		})
	})
}

// sarCounter allows alice to verb in the namespaces of allowed ("verb ns";
// ns "" is cluster-wide) and counts the reviews.
func sarCounter(allowed map[string]bool) (*Authorizer, *atomic.Int32) {
	var n atomic.Int32
	c := k8sfake.NewClientset()
	c.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		n.Add(1)
		attrs := sar.Spec.ResourceAttributes
		sar.Status.Allowed = sar.Spec.User == "alice" && attrs.Resource == "secrets" && allowed[attrs.Verb+" "+attrs.Namespace]
		return true, sar, nil
	})
	return &Authorizer{SAR: c.AuthorizationV1().SubjectAccessReviews()}, &n
}

func TestAuthorizerCache(t *testing.T) {
	ctx := context.Background()
	alice := Author{Username: "alice", Groups: []string{"g"}}
	authz, asked := sarCounter(map[string]bool{"create a": true})
	clock := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	authz.TTL, authz.Clock = 10*time.Second, clock

	check := func(verb, ns string, want bool, wantAsked int32) {
		t.Helper()
		got, err := authz.Allowed(ctx, alice, verb, "secrets", ns)
		if err != nil || got != want {
			t.Fatalf("Allowed(%s, %s) = %v, %v; want %v", verb, ns, got, err, want)
		}
		if n := asked.Load(); n != wantAsked {
			t.Fatalf("after Allowed(%s, %s): %d reviews, want %d", verb, ns, n, wantAsked)
		}
	}
	check(VerbCreate, "a", true, 2)  // cluster-wide, then a
	check(VerbCreate, "a", true, 2)  // both cached
	check(VerbCreate, "b", false, 3) // cluster-wide cached, b asked
	check(VerbUpdate, "a", false, 5) // another verb
	clock.SetTime(clock.Now().Add(10 * time.Second))
	check(VerbCreate, "a", true, 7) // expired

	denied, err := authz.Denied(ctx, alice, VerbCreate, "secrets", []string{"a", "b", "c"})
	if err != nil || fmt.Sprint(denied) != "[b c]" {
		t.Errorf("Denied = %v, %v; want [b c]", denied, err)
	}

	// Bounded: a full cache drops what expired, then everything.
	authz.MaxEntries = 3
	for i := range 10 {
		if _, err := authz.Allowed(ctx, alice, VerbDelete, "secrets", fmt.Sprint("ns", i)); err != nil {
			t.Fatal(err)
		}
		if authz.Len() > 3 {
			t.Fatalf("%d answers cached, more than MaxEntries 3", authz.Len())
		}
	}

	// TTL 0: nothing is kept.
	uncached, asked := sarCounter(map[string]bool{"create ": true})
	for range 3 {
		if ok, err := uncached.Allowed(ctx, alice, VerbCreate, "secrets", "x"); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	if asked.Load() != 3 || uncached.Len() != 0 {
		t.Errorf("TTL 0: %d reviews and %d cached, want 3 and 0", asked.Load(), uncached.Len())
	}
}

// TestAuthorizerSharesAReviewInFlight: workers that ask the same question at
// once share one SubjectAccessReview (the controller's 16 workers start
// together on a new distribution).
func TestAuthorizerSharesAReviewInFlight(t *testing.T) {
	ctx := context.Background()
	alice := Author{Username: "alice"}
	var n atomic.Int32
	release := make(chan struct{})
	c := k8sfake.NewClientset()
	c.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		<-release // the first review is still in flight while the others ask
		n.Add(1)
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		sar.Status.Allowed = true
		return true, sar, nil
	})
	authz := &Authorizer{SAR: c.AuthorizationV1().SubjectAccessReviews(), TTL: 10 * time.Second}
	before := checksCounted()
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if ok, err := authz.Allowed(ctx, alice, VerbCreate, "secrets", "a"); err != nil || !ok {
				t.Errorf("Allowed = %v, %v", ok, err)
			}
		})
	}
	time.Sleep(50 * time.Millisecond) // let them all ask; the count holds however many got here
	close(release)
	wg.Wait()
	if got := n.Load(); got != 1 {
		t.Errorf("%d reviews for 16 concurrent identical questions, want 1", got)
	}
	// Each question counted once: one review, fifteen answered by it.
	got := checksCounted()
	got.reviews -= before.reviews
	got.cached -= before.cached
	if got != (checks{reviews: 1, cached: 15}) {
		t.Errorf("metric: %+v for 16 questions and one review, want 1 review and 15 cached", got)
	}
}

// TestAuthorizerCountsEveryQuestion: the metric counts every question once,
// including the one whose caller found no answer in the cache, but then,
// leading the flight, found the answer of a review that ended meanwhile (it
// was counted nowhere).
func TestAuthorizerCountsEveryQuestion(t *testing.T) {
	ctx := context.Background()
	alice := Author{Username: "alice"}
	authz, asked := sarCounter(map[string]bool{"create ": true})
	authz.TTL = 10 * time.Second
	before := checksCounted()
	var fired atomic.Bool
	// The outer question misses the cache; before it leads its flight, an
	// inner one asks the same, is reviewed and caches the answer.
	authz.beforeFlight = func() {
		if fired.CompareAndSwap(false, true) {
			if ok, err := authz.Allowed(ctx, alice, VerbCreate, "secrets", "a"); err != nil || !ok {
				t.Errorf("inner Allowed = %v, %v", ok, err)
			}
		}
	}
	if ok, err := authz.Allowed(ctx, alice, VerbCreate, "secrets", "a"); err != nil || !ok {
		t.Fatalf("Allowed = %v, %v", ok, err)
	}
	if !fired.Load() || asked.Load() != 1 {
		t.Fatalf("inner question asked: %v, reviews %d; want true, 1", fired.Load(), asked.Load())
	}
	got := checksCounted()
	got.reviews -= before.reviews
	got.cached -= before.cached
	if got != (checks{reviews: 1, cached: 1}) {
		t.Errorf("metric: %+v for two questions and one review, want 1 review and 1 cached", got)
	}
}

type checks struct{ reviews, cached float64 }

// checksCounted reads resclass_distribution_authorization_checks_total's
// allowed answers.
func checksCounted() checks {
	return checks{
		reviews: testutil.ToFloat64(authorizationChecks.WithLabelValues("allowed", "false")),
		cached:  testutil.ToFloat64(authorizationChecks.WithLabelValues("allowed", "true")),
	}
}
