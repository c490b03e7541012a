package distribution

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// Bounds of an author record. The apiserver caps all of an object's
// annotations at 256 KiB; an identity is far smaller (a few groups, a
// ServiceAccount's pod name and credential id in extra), so anything near
// these is not one. They are checked before anything is split, so reading a
// hostile record costs at most a few passes over maxAuthorBytes.
const (
	maxAuthorBytes  = 16 << 10
	maxAuthorGroups = 256
	maxAuthorExtra  = 64
	maxExtraValues  = 64
)

// Author is the identity responsible for a ResourceDistribution's current spec,
// as the apiserver authenticated the request that wrote it: what the
// v1alpha1.AnnotationAuthorPrefix annotations hold, and what the controller
// asks the apiserver about (SubjectAccessReview) before each write of a copy.
//
// All four fields are kept. RBAC reads only the user and the groups, but an
// authorizer webhook may read the UID and extra, and extra can narrow a user
// (OpenShift's scoped tokens carry their scopes there): a review without it
// could allow what the author's own request would not. Extra holds per-token
// values too (authentication.kubernetes.io/credential-id): the record is of
// the request that wrote the spec, and the admission policy compares it with
// that request only.
type Author struct {
	Username string
	UID      string
	Groups   []string
	Extra    map[string][]string
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

// The canonical form, which the admission policy builds in CEL from
// request.userInfo with the same steps (deploy/webhook/author-policy.yaml);
// the two must stay equal, and the e2e tests compare them on the apiserver:
//
//   - user and uid: verbatim;
//   - a string inside groups or extra is escaped: "%" "," ";" "=" become
//     "%25" "%2C" "%3B" "%3D", and the empty string is "%" (so that [] and
//     [""] differ);
//   - groups: the escaped groups, deduplicated, sorted bytewise, joined by ",";
//   - extra: for each key, escape(key) "=" the escaped values in their order
//     joined by ","; those entries sorted bytewise and joined by ";".
//
// The groups are a set (authorization does not depend on their order or
// repetition); an extra key's values keep their order, as the request had it.
var escaper = strings.NewReplacer("%", "%25", ",", "%2C", ";", "%3B", "=", "%3D")

func escape(s string) string {
	if s == "" {
		return "%"
	}
	return escaper.Replace(s)
}

// unescape is escape's inverse; it refuses any other use of "%".
func unescape(s string) (string, error) {
	if s == "%" {
		return "", nil
	}
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("%.64q ends in an incomplete escape", s)
		}
		switch s[i+1 : i+3] {
		case "25":
			b.WriteByte('%')
		case "2C":
			b.WriteByte(',')
		case "3B":
			b.WriteByte(';')
		case "3D":
			b.WriteByte('=')
		default:
			return "", fmt.Errorf("%.64q has the escape %q, not one of %%25 %%2C %%3B %%3D", s, s[i:i+3])
		}
		i += 2
	}
	return b.String(), nil
}

func encodeGroups(groups []string) string {
	escaped := make([]string, len(groups))
	for i, g := range groups {
		escaped[i] = escape(g)
	}
	slices.Sort(escaped)
	return strings.Join(slices.Compact(escaped), ",")
}

func encodeExtra(extra map[string][]string) string {
	entries := make([]string, 0, len(extra))
	for k, values := range extra {
		escaped := make([]string, len(values))
		for i, v := range values {
			escaped[i] = escape(v)
		}
		entries = append(entries, escape(k)+"="+strings.Join(escaped, ","))
	}
	slices.Sort(entries)
	return strings.Join(entries, ";")
}

// Annotations is the record of a: the four annotations, in the canonical form.
func (a Author) Annotations() map[string]string {
	return map[string]string{
		v1alpha1.AnnotationAuthorUser:   a.Username,
		v1alpha1.AnnotationAuthorUID:    a.UID,
		v1alpha1.AnnotationAuthorGroups: encodeGroups(a.Groups),
		v1alpha1.AnnotationAuthorExtra:  encodeExtra(a.Extra),
	}
}

// key identifies the author in the Authorizer's cache: the canonical record,
// quoted field by field (user and uid are verbatim and may hold anything).
func (a Author) key() string {
	return fmt.Sprintf("%q %q %q %q", a.Username, a.UID, encodeGroups(a.Groups), encodeExtra(a.Extra))
}

// String is the user name, for messages; groups and extra stay out of them.
func (a Author) String() string { return fmt.Sprintf("%q", a.Username) }

// AuthorRecord is the part of annotations that belongs to the author record:
// every key that begins with v1alpha1.AnnotationAuthorPrefix (the old JSON
// annotation included). Nil when there is none.
func AuthorRecord(annotations map[string]string) map[string]string {
	var record map[string]string
	for k, v := range annotations {
		if strings.HasPrefix(k, v1alpha1.AnnotationAuthorPrefix) {
			if record == nil {
				record = map[string]string{}
			}
			record[k] = v
		}
	}
	return record
}

// ErrNoAuthor: a distribution carries no author record at all.
var ErrNoAuthor = errors.New("no author recorded")

// ErrOldAuthorFormat: a distribution carries only the author annotation of
// resclass before the record (v1alpha1.AnnotationAuthorJSON). Nothing bound
// that one to the requester when the webhook was not in the path, so it is
// not trusted: its spec must be written again (docs/distribution.md,
// "Upgrading").
var ErrOldAuthorFormat = fmt.Errorf("the author is recorded only in the old format (the JSON annotation %s), which no admission policy could check", v1alpha1.AnnotationAuthorJSON)

// ParseAuthor reads the author record of a distribution's annotations. The
// admission policy binds the record to the requester, but the controller
// reads objects that may have been stored before the policy existed or while
// it was removed, so it parses the record as hostile input: bounded in size
// before anything is split, exactly the four annotations, and only in the
// canonical form Annotations writes (so that two spellings of one identity
// cannot mean different things to the policy and the controller).
func ParseAuthor(annotations map[string]string) (Author, error) {
	record := AuthorRecord(annotations)
	if len(record) == 0 {
		return Author{}, ErrNoAuthor
	}
	if _, old := record[v1alpha1.AnnotationAuthorJSON]; old && len(record) == 1 {
		return Author{}, ErrOldAuthorFormat
	}
	size := 0
	for _, k := range slices.Sorted(maps.Keys(record)) {
		switch k {
		case v1alpha1.AnnotationAuthorUser, v1alpha1.AnnotationAuthorUID, v1alpha1.AnnotationAuthorGroups, v1alpha1.AnnotationAuthorExtra:
		default:
			return Author{}, fmt.Errorf("the author record has the annotation %q, which is not one of its fields", k)
		}
		size += len(record[k])
	}
	for _, k := range []string{v1alpha1.AnnotationAuthorUser, v1alpha1.AnnotationAuthorUID, v1alpha1.AnnotationAuthorGroups, v1alpha1.AnnotationAuthorExtra} {
		if _, ok := record[k]; !ok {
			return Author{}, fmt.Errorf("the author record lacks the annotation %s", k)
		}
	}
	if size > maxAuthorBytes {
		return Author{}, fmt.Errorf("the author record is %d bytes, more than %d", size, maxAuthorBytes)
	}
	a := Author{Username: record[v1alpha1.AnnotationAuthorUser], UID: record[v1alpha1.AnnotationAuthorUID]}
	if a.Username == "" {
		return Author{}, errors.New("the author has no user name")
	}
	if v := record[v1alpha1.AnnotationAuthorGroups]; v != "" {
		if n := strings.Count(v, ",") + 1; n > maxAuthorGroups {
			return Author{}, fmt.Errorf("the author has %d groups, more than %d", n, maxAuthorGroups)
		}
		for _, g := range strings.Split(v, ",") {
			group, err := unescape(g)
			if err != nil {
				return Author{}, fmt.Errorf("the author's groups: %w", err)
			}
			a.Groups = append(a.Groups, group)
		}
	}
	if v := record[v1alpha1.AnnotationAuthorExtra]; v != "" {
		if n := strings.Count(v, ";") + 1; n > maxAuthorExtra {
			return Author{}, fmt.Errorf("the author has %d extra keys, more than %d", n, maxAuthorExtra)
		}
		a.Extra = map[string][]string{}
		for _, entry := range strings.Split(v, ";") {
			k, values, ok := strings.Cut(entry, "=")
			if !ok {
				return Author{}, fmt.Errorf("the author's extra entry %.64q has no \"=\"", entry)
			}
			key, err := unescape(k)
			if err != nil {
				return Author{}, fmt.Errorf("the author's extra: %w", err)
			}
			if _, dup := a.Extra[key]; dup {
				return Author{}, fmt.Errorf("the author's extra has the key %.64q twice", key)
			}
			list := []string{}
			if values != "" {
				if n := strings.Count(values, ",") + 1; n > maxExtraValues {
					return Author{}, fmt.Errorf("the author's extra %.64q has %d values, more than %d", key, n, maxExtraValues)
				}
				for _, ev := range strings.Split(values, ",") {
					value, err := unescape(ev)
					if err != nil {
						return Author{}, fmt.Errorf("the author's extra %.64q: %w", key, err)
					}
					list = append(list, value)
				}
			}
			a.Extra[key] = list
		}
	}
	if !maps.Equal(a.Annotations(), record) {
		return Author{}, errors.New("the author record is not in the canonical form the webhook writes (sorted, deduplicated, escaped)")
	}
	return a, nil
}
