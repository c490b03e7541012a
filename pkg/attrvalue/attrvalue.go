// Package attrvalue is the codec of device attribute values: Kubernetes
// quantities (memory, hugepage sizes), bandwidths in bits per second and
// dot-separated versions, with the bounds that keep parsing and comparing them
// cheap whatever the input (docs/resource-classes.md, "Bounds").
//
// Discovery formats what it finds with it, the inventory reads published values
// back to label a node, and the selector parses a class's values and a device's
// attributes with it: one reading of "40Gbps" or "30GiB" everywhere, and no
// importer needs the class compiler to format a value.
package attrvalue

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/inf.v0"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Bounds on the values a selector or a device may carry (docs/resource-classes.md,
// "Bounds"). Every real device value fits with room to spare (a 1Ei memory, a
// 1.6Tbps link, driver 580.159.04), and within them any comparison costs a few
// word operations: Kubernetes quantities compare by scaling one side to the
// other's exponent, so an exponent of 1e999999999 would cost 10^999999999.
const (
	// MaxQuantityLength is the longest quantity text accepted.
	MaxQuantityLength = 64
	// MaxQuantityExponent bounds the exponent of the e-notation: 1e18 and
	// 5e-6 are read, 1e19 is not (write 10Ei-scale sizes with a suffix).
	MaxQuantityExponent = 18
	// MaxBandwidthLength is the longest bandwidth text accepted.
	MaxBandwidthLength = 32
	// MaxVersionLength is the longest version text accepted: 8 parts of 9
	// digits, their dots and a "v".
	MaxVersionLength = 80
)

// maxQuantity is the largest magnitude of a quantity or bandwidth: 2^62, that
// is 4Ei (or 4.6 Ebit/s). Every value converts to an int64 with room for a
// sum, and apimachinery's parser, which silently caps larger values at
// 2^63-1, cannot turn "16Ei" into something smaller that passes.
var maxQuantity = inf.NewDec(1<<62, 0)

// ErrOutOfRange is wrapped by every error about a value beyond the bounds.
var ErrOutOfRange = errors.New("out of range")

// quoted renders s for a message, cut short so that a hostile value never
// makes a long message.
func quoted(s string) string {
	const keep = 40
	if len(s) > keep {
		return strconv.Quote(s[:keep]) + fmt.Sprintf("... (%d bytes)", len(s))
	}
	return strconv.Quote(s)
}

// ParseQuantity parses an amount in Kubernetes quantity notation, so "30G" is
// 30*10^9 and "30Gi" is 30*2^30, exactly as in a pod's resources. A trailing "B"
// after a suffix is accepted and ignored ("30GB", "30GiB") because that is how
// vendors and operators write memory sizes. The text is checked against the
// bounds before it is parsed: apimachinery's parser itself rounds to 1n with
// big decimals, so "1e-999999999" would not return.
func ParseQuantity(s string) (resource.Quantity, error) {
	if len(s) > MaxQuantityLength {
		return resource.Quantity{}, fmt.Errorf("%s is not a quantity: longer than %d characters: %w", quoted(s), MaxQuantityLength, ErrOutOfRange)
	}
	t := s
	if n := len(t); n >= 2 && t[n-1] == 'B' {
		if c := t[n-2]; c == 'i' || strings.IndexByte("kMGTPE", c) >= 0 {
			t = t[:n-1]
		}
	}
	if err := checkExponent(t); err != nil {
		return resource.Quantity{}, fmt.Errorf("%s is not a quantity: %w", quoted(s), err)
	}
	q, err := resource.ParseQuantity(t)
	if err != nil {
		return resource.Quantity{}, fmt.Errorf("%s is not a quantity (write e.g. 30G, 30Gi or 512Mi)", quoted(s))
	}
	if err := CheckQuantity(q); err != nil {
		return resource.Quantity{}, fmt.Errorf("%s: %w", quoted(s), err)
	}
	return q, nil
}

// checkExponent refuses an e-notation exponent beyond MaxQuantityExponent.
func checkExponent(s string) error {
	return CheckExponent(s, MaxQuantityExponent)
}

// CheckExponent refuses quantity text whose e-notation exponent is beyond
// ±limit, before apimachinery's parser sees it: that parser rounds to 1n with
// big decimals, so its cost grows with 10^|exponent|. It reads the text as the
// parser splits it: sign, digits, fraction, then the suffix, which is an
// exponent when it is "e" or "E" followed by more. Anything else is left to the
// parser.
func CheckExponent(s string, limit int64) error {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	suffix := s[i:]
	if len(suffix) < 2 || (suffix[0] != 'e' && suffix[0] != 'E') {
		return nil
	}
	exp, err := strconv.ParseInt(suffix[1:], 10, 64)
	if err != nil {
		var numErr *strconv.NumError
		if errors.As(err, &numErr) && errors.Is(numErr.Err, strconv.ErrRange) {
			return fmt.Errorf("the exponent is %w (at most e%d and at least e-%d)", ErrOutOfRange, limit, limit)
		}
		return nil // not an exponent: the parser refuses it
	}
	if exp > limit || exp < -limit {
		return fmt.Errorf("the exponent %d is %w (at most e%d and at least e-%d; write large sizes with a suffix, e.g. 1Ei)",
			exp, ErrOutOfRange, limit, limit)
	}
	return nil
}

// CheckQuantity reports whether q is within the bounds: a magnitude of at most
// 2^62 (4Ei) and no precision finer than 1n. Its cost does not depend on q, so it is
// the check to make on a quantity decoded from an untrusted object (a
// NodeDevices status) before comparing it with anything.
func CheckQuantity(q resource.Quantity) error {
	d := q.AsDec() // q is the caller's copy: the decimal it caches stays here
	// d is unscaled * 10^-scale. The scale is bounded even for zero: comparing
	// two values scales one to the other's exponent, whatever their digits.
	switch scale := int64(d.Scale()); {
	case scale > 9:
		return fmt.Errorf("%w: finer than 1n", ErrOutOfRange)
	case -scale > MaxQuantityExponent:
		return fmt.Errorf("%w: its exponent is beyond e%d", ErrOutOfRange, MaxQuantityExponent)
	case d.UnscaledBig().BitLen() > 128:
		// At least 2^128*10^-9: known without multiplying anything out.
		return fmt.Errorf("%w: larger than 4Ei (2^62)", ErrOutOfRange)
	}
	var abs inf.Dec
	if abs.Abs(d).Cmp(maxQuantity) > 0 {
		return fmt.Errorf("%w: larger than 4Ei (2^62)", ErrOutOfRange)
	}
	return nil
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
		return resource.Quantity{}, fmt.Errorf("%s is not a bandwidth: %s (write e.g. 40Gbps, 100G or 25000Mbps)", quoted(s), why)
	}
	if len(s) > MaxBandwidthLength {
		return resource.Quantity{}, fmt.Errorf("%s is not a bandwidth: longer than %d characters: %w", quoted(s), MaxBandwidthLength, ErrOutOfRange)
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
	if err := CheckQuantity(q); err != nil {
		return resource.Quantity{}, fmt.Errorf("%s is not a bandwidth: %w", quoted(s), err)
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
	if len(s) > MaxVersionLength {
		return v, fmt.Errorf("%s is not a version: longer than %d characters: %w", quoted(s), MaxVersionLength, ErrOutOfRange)
	}
	t := strings.TrimPrefix(strings.TrimPrefix(s, "v"), "V")
	if t == "" {
		return v, fmt.Errorf("%q is not a version: %w", s, errVersion)
	}
	for part := range strings.SplitSeq(t, ".") {
		if v.n == maxVersionParts {
			return Version{}, fmt.Errorf("%q is not a version: more than %d parts: %w", s, maxVersionParts, ErrOutOfRange)
		}
		if part == "" || strings.Trim(part, "0123456789") != "" {
			return Version{}, fmt.Errorf("%q is not a version: %w", s, errVersion)
		}
		if len(part) > 9 {
			return Version{}, fmt.Errorf("%q is not a version: a part of more than 9 digits is %w", s, ErrOutOfRange)
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
