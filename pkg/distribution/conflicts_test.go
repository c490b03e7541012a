package distribution

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// TestConflictBackoff: while a distribution's conflicts stay, each look that
// finds them doubles the wait (1s, 2s, 4s, ... at most 5m); a pass between
// looks neither looks (the remembered namespaces are returned, not due) nor
// moves the schedule; a clean pass, a new spec, or a write to the
// distribution by someone else starts again from 1s; the controller's own
// status write does not.
func TestConflictBackoff(t *testing.T) {
	tr := newConflictTracker(DefaultConflictRetry, DefaultConflictRetryMax)
	tr.random = func() float64 { return 0.5 } // no jitter
	rd := &v1alpha1.ResourceDistribution{ObjectMeta: metav1.ObjectMeta{Name: "d", UID: "u1", Generation: 1, ResourceVersion: "10"}}
	now := time.Unix(1_000_000, 0)

	if known, due := tr.recall(rd, now); known != nil || due {
		t.Fatalf("nothing remembered yet: got %v due=%v", known, due)
	}
	var waits []time.Duration
	for range 12 {
		known, due := tr.recall(rd, now)
		looked := len(known) == 0 || due
		if !looked {
			t.Fatalf("at %v: a pass at the scheduled time is due", now)
		}
		wait := tr.record(rd, []string{"a", "b"}, looked, now)
		waits = append(waits, wait)
		tr.wrote(rd, fmt.Sprint(len(waits)+10)) // the status write between
		rd.ResourceVersion = fmt.Sprint(len(waits) + 10)
		// A pass in between (a copy's event): remembered, not due, no
		// change to the schedule.
		between := now.Add(wait / 2)
		if known, due := tr.recall(rd, between); !known["a"] || !known["b"] || due {
			t.Fatalf("half way through wait %d: got %v due=%v, want a and b not due", len(waits), known, due)
		}
		if again := tr.record(rd, []string{"a", "b"}, false, between); again != wait-wait/2 {
			t.Fatalf("a pass between looks moved the schedule: %v left, want %v", again, wait-wait/2)
		}
		now = now.Add(wait)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300}
	for i := range want {
		if waits[i] != want[i]*time.Second {
			t.Fatalf("waits %v, want %v seconds", waits, want)
		}
	}

	// A pass that reads the distribution from a cache behind the status the
	// last pass wrote, and writes it again: every version either wrote is
	// the controller's own, whichever the cache shows next.
	stale := rd.ResourceVersion
	tr.wrote(rd, "500")
	rd.ResourceVersion = stale
	tr.record(rd, []string{"a", "b"}, false, now)
	tr.wrote(rd, "501")
	for _, rv := range []string{"500", stale, "501"} {
		rd.ResourceVersion = rv
		if known, _ := tr.recall(rd, now); !known["a"] {
			t.Errorf("resourceVersion %s, the controller's own: forgot the conflicts", rv)
		}
	}

	// Someone else's write (kubectl annotate) forgets: the next pass looks
	// at once, and the wait starts again from 1s.
	rd.ResourceVersion = "999"
	if known, _ := tr.recall(rd, now); known != nil {
		t.Errorf("after a foreign write: remembered %v", known)
	}
	if wait := tr.record(rd, []string{"a"}, true, now); wait != time.Second {
		t.Errorf("after a foreign write: wait %v, want 1s", wait)
	}
	// A new spec forgets too.
	tr.record(rd, []string{"a"}, true, now) // 2s
	rd.Generation = 2
	if known, _ := tr.recall(rd, now); known != nil {
		t.Errorf("after a new generation: remembered %v", known)
	}
	if wait := tr.record(rd, []string{"a"}, true, now); wait != time.Second {
		t.Errorf("after a new generation: wait %v, want 1s", wait)
	}
	// A clean pass clears; no requeue for conflicts.
	if wait := tr.record(rd, nil, true, now); wait != 0 {
		t.Errorf("clean pass: wait %v, want 0", wait)
	}
	if known, _ := tr.recall(rd, now); known != nil {
		t.Errorf("after a clean pass: remembered %v", known)
	}
	// A namespace created afresh is tried again at the next pass.
	tr.record(rd, []string{"a", "b"}, true, now)
	tr.forgetNamespace("a")
	if known, _ := tr.recall(rd, now); known["a"] || !known["b"] {
		t.Errorf("after namespace a was created: remembered %v, want only b", known)
	}
	tr.forget("d")
	if known, _ := tr.recall(rd, now); known != nil {
		t.Errorf("after the distribution went: remembered %v", known)
	}
}

// TestConflictBackoffJitter: each wait is within ±20% of its step, never
// above the maximum.
func TestConflictBackoffJitter(t *testing.T) {
	for _, r := range []float64{0, 0.25, 0.999999} {
		tr := newConflictTracker(DefaultConflictRetry, DefaultConflictRetryMax)
		tr.random = func() float64 { return r }
		for n, step := range map[int]time.Duration{1: time.Second, 4: 8 * time.Second, 9: 256 * time.Second, 30: 300 * time.Second} {
			got := tr.wait(n)
			lo, hi := time.Duration(float64(step)*0.8), min(time.Duration(float64(step)*1.2), DefaultConflictRetryMax)
			if got < lo || got > hi {
				t.Errorf("random %v, look %d: wait %v, want %v to %v", r, n, got, lo, hi)
			}
		}
	}
}

// TestFailureMessageBounded: 10 000 failed writes make a message of a few
// KiB that counts them all, names the first by namespace (sorted) and says
// how many more; an error text of any length is cut.
func TestFailureMessageBounded(t *testing.T) {
	var failures []writeFailure
	for i := 9999; i >= 0; i-- {
		failures = append(failures, writeFailure{namespace: fmt.Sprintf("team-%05d", i),
			err: fmt.Errorf("secrets %q is forbidden: %s", "s", strings.Repeat("an apiserver's long refusal ", 100))})
	}
	msg := failureMessage(failures)
	if len(msg) > maxMessageBytes {
		t.Errorf("%d bytes, want at most %d", len(msg), maxMessageBytes)
	}
	for _, want := range []string{"writes failed in 10000 namespace(s): team-00000: secrets", "; team-00009: ", "; and 9990 more"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q: %.600s", want, msg)
		}
	}
	if strings.Contains(msg, "team-00010") {
		t.Errorf("names more than %d namespaces", failuresNamed)
	}
	// The condition and the description hold it whole; an Event's note is
	// cut to what events.k8s.io accepts.
	status := &v1alpha1.ResourceDistributionStatus{}
	setCondition(status, ConditionSynced, 1, metav1.ConditionFalse, ReasonWriteFailed, msg)
	if got := status.Conditions[0].Message; got != msg {
		t.Errorf("the condition changed a bounded message")
	}
	if few := failureMessage([]writeFailure{{namespace: "b", err: errors.New("boom")}, {namespace: "a", err: errors.New("bang")}}); few != "writes failed in 2 namespace(s): a: bang; b: boom" {
		t.Errorf("two failures: %q", few)
	}
}

// TestMessagesBounded: every message the controller writes stays within its
// sink's bound whatever grows in it: a user name of 16 KiB (the largest
// author record the controller reads), 10 000 namespaces.
func TestMessagesBounded(t *testing.T) {
	res := mustParse(t, `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"}}`)
	author := Author{Username: strings.Repeat("é", 8<<10)}
	var many []string
	for i := range 10000 {
		many = append(many, fmt.Sprintf("team-%05d", i))
	}
	msg := forbiddenMessage(author, res, map[string][]string{VerbCreate: many, VerbDelete: many})
	if len(msg) > maxMessageBytes || !utf8.ValidString(msg) || !strings.HasSuffix(msg, "...(cut)") {
		t.Errorf("forbidden message: %d bytes, valid UTF-8 %v, ends %q", len(msg), utf8.ValidString(msg), msg[max(0, len(msg)-20):])
	}
	status := &v1alpha1.ResourceDistributionStatus{}
	setCondition(status, ConditionAuthorized, 1, metav1.ConditionFalse, ReasonForbidden, strings.Repeat("x", 100_000))
	if n := len(status.Conditions[0].Message); n > maxMessageBytes {
		t.Errorf("condition message of %d bytes", n)
	}
	if got := boundMessage(strings.Repeat("é", 1000), maxEventBytes); len(got) > maxEventBytes || !utf8.ValidString(got) {
		t.Errorf("event note of %d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
	}
	if got := boundMessage("short", maxEventBytes); got != "short" {
		t.Errorf("a short message changed: %q", got)
	}
}
