package distribution

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	authenticationv1 "k8s.io/api/authentication/v1"
	sigsjson "sigs.k8s.io/json"
)

// Bounds of an author annotation. The apiserver caps all of an object's
// annotations at 256 KiB; an identity is far smaller (a few groups, a
// ServiceAccount's pod name and credential id in extra), so anything near
// these is not one.
const (
	maxAuthorBytes  = 16 << 10
	maxAuthorGroups = 256
	maxAuthorExtra  = 64
	maxExtraValues  = 64
)

// Author is the identity responsible for a ResourceDistribution's current spec,
// as the apiserver authenticated the request that wrote it: what
// v1alpha1.AnnotationAuthor holds, and what the controller asks the apiserver
// about (SubjectAccessReview) before each write of a copy.
type Author struct {
	Username string              `json:"username"`
	UID      string              `json:"uid,omitempty"`
	Groups   []string            `json:"groups,omitempty"`
	Extra    map[string][]string `json:"extra,omitempty"`
}

// AuthorOf is the Author of an admission request's user.
func AuthorOf(u authenticationv1.UserInfo) Author {
	a := Author{Username: u.Username, UID: u.UID, Groups: slices.Clone(u.Groups)}
	if len(u.Extra) > 0 {
		a.Extra = make(map[string][]string, len(u.Extra))
		for k, v := range u.Extra {
			a.Extra[k] = slices.Clone([]string(v))
		}
	}
	return a
}

// Encode is the annotation value: JSON with the extra keys sorted, so that
// the same identity always encodes to the same string and the webhook can
// compare an annotation with the requester byte for byte.
func (a Author) Encode() string {
	data, err := json.Marshal(a) // maps are encoded in key order
	if err != nil {
		panic(err) // strings, slices and maps of strings always encode
	}
	return string(data)
}

// String is the user name, for messages; groups and extra stay out of them.
func (a Author) String() string { return fmt.Sprintf("%q", a.Username) }

// ParseAuthor reads an AnnotationAuthor value. The webhook writes it and
// refuses any other, but the controller reads an object anyone with write
// access to ResourceDistributions may have stored while the webhook was not
// in the path, so it parses it as hostile input: bounded in size, strictly
// decoded (unknown and duplicate fields are errors), and only in the form
// Encode writes (which keeps two spellings of one identity from meaning
// different things to the webhook and the controller).
func ParseAuthor(value string) (Author, error) {
	var a Author
	if value == "" {
		return a, errors.New("no author recorded")
	}
	if len(value) > maxAuthorBytes {
		return a, fmt.Errorf("the author is %d bytes, more than %d", len(value), maxAuthorBytes)
	}
	strict, err := sigsjson.UnmarshalStrict([]byte(value), &a)
	if err != nil {
		return Author{}, fmt.Errorf("the author is not valid JSON: %w", err)
	}
	if len(strict) > 0 {
		return Author{}, fmt.Errorf("the author has %w", strict[0])
	}
	switch {
	case a.Username == "":
		return Author{}, errors.New("the author has no user name")
	case len(a.Groups) > maxAuthorGroups:
		return Author{}, fmt.Errorf("the author has %d groups, more than %d", len(a.Groups), maxAuthorGroups)
	case len(a.Extra) > maxAuthorExtra:
		return Author{}, fmt.Errorf("the author has %d extra keys, more than %d", len(a.Extra), maxAuthorExtra)
	}
	for _, k := range slices.Sorted(maps.Keys(a.Extra)) {
		if len(a.Extra[k]) > maxExtraValues {
			return Author{}, fmt.Errorf("the author's extra %q has %d values, more than %d", k, len(a.Extra[k]), maxExtraValues)
		}
	}
	if a.Encode() != value {
		return Author{}, errors.New("the author is not in the form the webhook writes")
	}
	return a, nil
}
