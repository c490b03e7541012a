package assignment

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// CompatKeyPrefix starts every key CompatKey returns: the per-device annotation of
// the original Kubernetes resource-class proposal.
const CompatKeyPrefix = compatDomain + compatNamePrefix

const (
	compatDomain     = "scheduler.alpha.kubernetes.io/"
	compatNamePrefix = "resClass_"
	// maxKeyNameLength is the limit on the name part of an annotation key.
	maxKeyNameLength = 63
)

// CompatKey returns the seed-compat annotation key for one device of a class:
// scheduler.alpha.kubernetes.io/resClass_<class>_<device> when that is a valid
// annotation key. Otherwise, as for PCI addresses (':') or GPU UUIDs under a long
// class name, invalid characters become '-', the name is cut to fit 63 characters,
// and "-" plus 8 hex digits of sha256("<class>/<device>") is appended. The hash is
// added whenever the name was changed, not only when it was cut: sanitizing alone
// would give "0000:3b:00.0" and "0000-3b-00.0" the same key.
//
// The key is always valid, for any input, and cannot be turned back into the class
// and device; only AnnotationKey is ever read.
func CompatKey(class, device string) string {
	name := compatNamePrefix + class + "_" + device
	if validKeyName(name) {
		return compatDomain + name
	}
	var b strings.Builder
	for _, r := range name {
		if r < 0x80 && keyNameChar(byte(r)) {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	sum := sha256.Sum256([]byte(class + "/" + device))
	suffix := "-" + hex.EncodeToString(sum[:4])
	// Only ASCII is left, so cutting bytes cuts characters. The name still starts
	// with compatNamePrefix and ends with a hex digit, as a key name must.
	sanitized := b.String()
	return compatDomain + sanitized[:min(len(sanitized), maxKeyNameLength-len(suffix))] + suffix
}

// validKeyName reports whether name is a valid name part of an annotation key.
func validKeyName(name string) bool {
	if name == "" || len(name) > maxKeyNameLength || !alphanumeric(name[0]) || !alphanumeric(name[len(name)-1]) {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !keyNameChar(name[i]) {
			return false
		}
	}
	return true
}

func keyNameChar(c byte) bool {
	return alphanumeric(c) || c == '-' || c == '_' || c == '.'
}

func alphanumeric(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}
