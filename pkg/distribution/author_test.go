package distribution

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
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

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func TestAuthorRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		user authenticationv1.UserInfo
		want map[string]string
	}{{
		user: authenticationv1.UserInfo{Username: "alice"},
		want: map[string]string{v1alpha1.AnnotationAuthorUser: "alice", v1alpha1.AnnotationAuthorUID: "", v1alpha1.AnnotationAuthorGroups: "", v1alpha1.AnnotationAuthorExtra: ""},
	}, {
		user: authenticationv1.UserInfo{Username: "system:serviceaccount:ci:deployer", UID: "u-1",
			Groups: []string{"system:serviceaccounts", "system:authenticated", "system:serviceaccounts"},
			Extra:  map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"p"}, "a": {}, "authentication.kubernetes.io/credential-id": {"JTI=x"}}},
		want: map[string]string{
			v1alpha1.AnnotationAuthorUser:   "system:serviceaccount:ci:deployer",
			v1alpha1.AnnotationAuthorUID:    "u-1",
			v1alpha1.AnnotationAuthorGroups: "system:authenticated,system:serviceaccounts",
			v1alpha1.AnnotationAuthorExtra:  "a=;authentication.kubernetes.io/credential-id=JTI%3Dx;authentication.kubernetes.io/pod-name=p",
		},
	}, {
		// Every separator and the escape itself, in a group, a key and a
		// value; the empty group and the empty value are "%".
		user: authenticationv1.UserInfo{Username: "a,b;c=d%", UID: "=",
			Groups: []string{"", "x,y", "100%", "a;b=c"},
			Extra:  map[string]authenticationv1.ExtraValue{"k=1;": {"", "v,w", "v,w"}, "": {""}}},
		want: map[string]string{
			v1alpha1.AnnotationAuthorUser:   "a,b;c=d%",
			v1alpha1.AnnotationAuthorUID:    "=",
			v1alpha1.AnnotationAuthorGroups: "%,100%25,a%3Bb%3Dc,x%2Cy",
			v1alpha1.AnnotationAuthorExtra:  "%=%;k%3D1%3B=%,v%2Cw,v%2Cw",
		},
	}} {
		a := AuthorOf(tc.user)
		record := a.Annotations()
		if !maps.Equal(record, tc.want) {
			t.Errorf("%s: record %q, want %q", tc.user.Username, record, tc.want)
		}
		got, err := ParseAuthor(record)
		if err != nil {
			t.Fatalf("%q: %v", record, err)
		}
		if !maps.Equal(got.Annotations(), record) || got.Username != a.Username || got.UID != a.UID {
			t.Errorf("round trip: %+v, want %+v", got, a)
		}
		// The groups are a set: sorted and deduplicated; extra values keep
		// their order and repetition.
		wantGroups := slices.Clone(a.Groups)
		slices.SortFunc(wantGroups, func(x, y string) int { return strings.Compare(escape(x), escape(y)) })
		if wantGroups = slices.Compact(wantGroups); !slices.Equal(got.Groups, wantGroups) {
			t.Errorf("groups %q, want %q", got.Groups, wantGroups)
		}
		for k, v := range a.Extra {
			if !slices.Equal(got.Extra[k], v) || got.Extra[k] == nil {
				t.Errorf("extra %q: %q, want %q", k, got.Extra[k], v)
			}
		}
	}
}

func TestParseAuthorRefuses(t *testing.T) {
	record := func(user, uid, groups, extra string) map[string]string {
		return map[string]string{v1alpha1.AnnotationAuthorUser: user, v1alpha1.AnnotationAuthorUID: uid,
			v1alpha1.AnnotationAuthorGroups: groups, v1alpha1.AnnotationAuthorExtra: extra, "other": "kept out"}
	}
	with := func(m map[string]string, k, v string) map[string]string {
		m = maps.Clone(m)
		m[k] = v
		return m
	}
	without := func(m map[string]string, k string) map[string]string {
		m = maps.Clone(m)
		delete(m, k)
		return m
	}
	ok := record("alice", "", "g", "")
	if _, err := ParseAuthor(ok); err != nil {
		t.Fatalf("the valid record: %v", err)
	}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		want        string
	}{
		{"nothing", nil, "no author recorded"},
		{"only other annotations", map[string]string{"other": "x"}, "no author recorded"},
		{"the old JSON annotation", map[string]string{v1alpha1.AnnotationAuthorJSON: `{"username":"admin","groups":["system:masters"]}`}, "old format"},
		{"the old annotation beside the record", with(ok, v1alpha1.AnnotationAuthorJSON, `{"username":"alice"}`), `"resclass.io/spec-author", which is not one of its fields`},
		{"a field it does not know", with(ok, v1alpha1.AnnotationAuthorPrefix+".scopes", "all"), "not one of its fields"},
		{"no uid annotation", without(ok, v1alpha1.AnnotationAuthorUID), "lacks the annotation resclass.io/spec-author.uid"},
		{"no user name", with(ok, v1alpha1.AnnotationAuthorUser, ""), "no user name"},
		{"unsorted groups", with(ok, v1alpha1.AnnotationAuthorGroups, "b,a"), "canonical"},
		{"repeated groups", with(ok, v1alpha1.AnnotationAuthorGroups, "a,a"), "canonical"},
		{"an empty group not escaped", with(ok, v1alpha1.AnnotationAuthorGroups, ",a"), "canonical"},
		{"a lowercase escape", with(ok, v1alpha1.AnnotationAuthorGroups, "a%2cb"), "escape"},
		{"an escape of another character", with(ok, v1alpha1.AnnotationAuthorGroups, "a%41"), "escape"},
		{"an incomplete escape", with(ok, v1alpha1.AnnotationAuthorGroups, "a%2"), "incomplete"},
		{"an unescaped separator in extra", with(ok, v1alpha1.AnnotationAuthorExtra, "k=a=b"), "canonical"},
		{"an extra entry without =", with(ok, v1alpha1.AnnotationAuthorExtra, "k"), `has no "="`},
		{"an extra key twice", with(ok, v1alpha1.AnnotationAuthorExtra, "k=a;k=b"), "twice"},
		{"unsorted extra", with(ok, v1alpha1.AnnotationAuthorExtra, "l=a;k=b"), "canonical"},
		{"too many groups", with(ok, v1alpha1.AnnotationAuthorGroups, strings.Repeat("g,", maxAuthorGroups)+"g"), "groups, more than"},
		{"too many extra keys", with(ok, v1alpha1.AnnotationAuthorExtra, strings.Repeat("k=;", maxAuthorExtra)+"k="), "extra keys, more than"},
		{"too many extra values", with(ok, v1alpha1.AnnotationAuthorExtra, "k="+strings.Repeat("v,", maxExtraValues)+"v"), "values, more than"},
		{"too large", with(ok, v1alpha1.AnnotationAuthorUser, strings.Repeat("a", maxAuthorBytes)), "bytes, more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseAuthor(tc.annotations)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseAuthor = %v, want an error saying %q", err, tc.want)
			}
			if err != nil && len(err.Error()) > 400 {
				t.Errorf("the error is %d bytes long: it goes into the status and an Event", len(err.Error()))
			}
		})
	}
	if _, err := ParseAuthor(map[string]string{v1alpha1.AnnotationAuthorJSON: "{}"}); !errors.Is(err, ErrOldAuthorFormat) {
		t.Errorf("the old annotation alone: %v, want ErrOldAuthorFormat", err)
	}
}

// FuzzParseAuthor: ParseAuthor never panics, accepts only the canonical
// record of the identity it returns, and its errors stay short.
func FuzzParseAuthor(f *testing.F) {
	for _, s := range [][4]string{
		{"alice", "", "", ""},
		{"a", "u", "g", "k=v;l="},
		{"a,b;c=d%", "=", "%,100%25,a%3Bb%3Dc,x%2Cy", "%=%;k%3D1%3B=%,v%2Cw,v%2Cw"},
		{"a", "", "b,a", ""},
		{"a", "", "a%2", "k"},
		{"", "", "", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, user, uid, groups, extra string) {
		watchdog.Run(t, func() {
			record := map[string]string{v1alpha1.AnnotationAuthorUser: user, v1alpha1.AnnotationAuthorUID: uid,
				v1alpha1.AnnotationAuthorGroups: groups, v1alpha1.AnnotationAuthorExtra: extra}
			a, err := ParseAuthor(record)
			if err != nil {
				if len(err.Error()) > 600 {
					t.Fatalf("a %d-byte error", len(err.Error()))
				}
				return
			}
			if a.Username == "" || !maps.Equal(a.Annotations(), record) {
				t.Fatalf("accepted %q as %+v, whose record is %q", record, a, a.Annotations())
			}
			// The record of what was parsed parses to the same identity.
			again, err := ParseAuthor(a.Annotations())
			if err != nil || again.key() != a.key() {
				t.Fatalf("the record of %+v does not parse back: %v", a, err)
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
