package selector

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// ParseQuantity parses an amount in Kubernetes quantity notation, so "30G" is
// 30*10^9 and "30Gi" is 30*2^30, exactly as in a pod's resources. A trailing "B"
// after a suffix is accepted and ignored ("30GB", "30GiB") because that is how
// vendors and operators write memory sizes.
func ParseQuantity(s string) (resource.Quantity, error) {
	t := s
	if n := len(t); n >= 2 && t[n-1] == 'B' {
		if c := t[n-2]; c == 'i' || strings.IndexByte("kMGTPE", c) >= 0 {
			t = t[:n-1]
		}
	}
	q, err := resource.ParseQuantity(t)
	if err != nil {
		return resource.Quantity{}, fmt.Errorf("%q is not a quantity (write e.g. 30G, 30Gi or 512Mi)", s)
	}
	return q, nil
}

// bandwidthPrefixes maps a decimal prefix, in either case, to its quantity suffix.
// Binary prefixes are not used for rates.
var bandwidthPrefixes = map[byte]string{
	'k': "k", 'K': "k",
	'm': "M", 'M': "M",
	'g': "G", 'G': "G",
	't': "T", 'T': "T",
	'p': "P", 'P': "P",
}

// ParseBandwidth parses a rate in bits per second: a decimal number, an optional
// decimal prefix (k, M, G, T, P; either case, so "m" is mega, never milli) and the
// unit "bps" in any case. "40Gbps", "40GBPS" and "40G" are all 40*10^9 bit/s;
// "25000Mbps" is 25*10^9. A bare number is refused rather than guessed at: Linux
// reports link speed in Mbit/s, so "40000" would be ambiguous.
func ParseBandwidth(s string) (resource.Quantity, error) {
	fail := func(why string) (resource.Quantity, error) {
		return resource.Quantity{}, fmt.Errorf("%q is not a bandwidth: %s (write e.g. 40Gbps, 100G or 25000Mbps)", s, why)
	}
	t := s
	hasUnit := false
	if n := len(t); n >= 3 && strings.EqualFold(t[n-3:], "bps") {
		t, hasUnit = t[:n-3], true
	}
	suffix := ""
	if n := len(t); n > 0 {
		if p, ok := bandwidthPrefixes[t[n-1]]; ok {
			t, suffix = t[:n-1], p
		}
	}
	if !hasUnit && suffix == "" {
		return fail("it needs a unit")
	}
	if t == "" || !isDecimal(t) {
		return fail("the number must be decimal digits with an optional fraction")
	}
	q, err := resource.ParseQuantity(t + suffix)
	if err != nil {
		return fail(err.Error())
	}
	return q, nil
}

// FormatBandwidth writes bits per second in the form ParseBandwidth reads, with the
// largest prefix that keeps the number whole: 100000000000 -> "100Gbps".
func FormatBandwidth(bitsPerSecond int64) string {
	units := []string{"bps", "kbps", "Mbps", "Gbps", "Tbps", "Pbps"}
	u := 0
	for u < len(units)-1 && bitsPerSecond != 0 && bitsPerSecond%1000 == 0 {
		bitsPerSecond /= 1000
		u++
	}
	return strconv.FormatInt(bitsPerSecond, 10) + units[u]
}

func isDecimal(s string) bool {
	dot := false
	digits := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c == '.' && !dot && digits > 0:
			dot = true
		default:
			return false
		}
	}
	return digits > 0 && s[len(s)-1] != '.'
}

// maxVersionParts bounds a version so that it fits a fixed array and comparing two
// versions never allocates.
const maxVersionParts = 8

// Version is a dot-separated list of numbers, compared part by part as numbers;
// missing parts count as zero, so "8" == "8.0" and "535.104.05" > "535.86.10".
type Version struct {
	parts [maxVersionParts]uint32
	n     int
}

var errVersion = errors.New("must be dot-separated numbers, e.g. 8.0 or 535.104.05")

// ParseVersion parses a version, with an optional leading "v".
func ParseVersion(s string) (Version, error) {
	var v Version
	t := strings.TrimPrefix(strings.TrimPrefix(s, "v"), "V")
	if t == "" {
		return v, fmt.Errorf("%q is not a version: %w", s, errVersion)
	}
	for part := range strings.SplitSeq(t, ".") {
		if v.n == maxVersionParts {
			return Version{}, fmt.Errorf("%q is not a version: more than %d parts", s, maxVersionParts)
		}
		if part == "" || len(part) > 9 || strings.Trim(part, "0123456789") != "" {
			return Version{}, fmt.Errorf("%q is not a version: %w", s, errVersion)
		}
		n, _ := strconv.ParseUint(part, 10, 32) // at most 9 digits: cannot fail
		v.parts[v.n] = uint32(n)
		v.n++
	}
	return v, nil
}

// Compare returns -1, 0 or +1 as v is less than, equal to or greater than w.
func (v Version) Compare(w Version) int {
	for i := range maxVersionParts {
		switch {
		case v.parts[i] < w.parts[i]:
			return -1
		case v.parts[i] > w.parts[i]:
			return 1
		}
	}
	return 0
}

// String writes the version in canonical form (no "v", no leading zeros).
func (v Version) String() string {
	var b strings.Builder
	for i := 0; i < v.n; i++ {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(strconv.FormatUint(uint64(v.parts[i]), 10))
	}
	return b.String()
}

// parseBool accepts only "true" and "false", in any case: "1" or "yes" would be a
// guess.
func parseBool(s string) (bool, error) {
	switch {
	case strings.EqualFold(s, "true"):
		return true, nil
	case strings.EqualFold(s, "false"):
		return false, nil
	}
	return false, fmt.Errorf("%q is not a boolean (write true or false)", s)
}

func parseInt(s string) (int64, error) {
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not an integer", s)
	}
	return i, nil
}
