// Package sysfs reads the small files of /sys the way discovery sources need them:
// a missing, truncated or garbage file is "no value", never an error storm.
package sysfs

import (
	"os"
	"strconv"
	"strings"
)

// ParseInt reads an integer as sysfs writes one: decimal, or hex with 0x,
// surrounded by whitespace. Anything else, including an empty file, is not a
// number.
func ParseInt(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, false
	}
	base := 10
	if t, ok := strings.CutPrefix(s, "0x"); ok {
		s, base = t, 16
	}
	n, err := strconv.ParseInt(s, base, 64)
	return n, err == nil
}

// ReadString returns the trimmed content of path, or "" if it cannot be read.
func ReadString(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// ReadInt reads an integer file (see ParseInt).
func ReadInt(path string) (int64, bool) {
	return ParseInt(ReadString(path))
}
