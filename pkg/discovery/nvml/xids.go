package nvml

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Bounds of an XID list given by an operator (--ignored-xids): NVIDIA's XIDs
// are small numbers (below 200 today); the bounds leave room for new ones and
// keep a typo from becoming a list of a million entries.
const (
	MaxXID      = 65535
	maxXIDCount = 256
	maxXIDsText = 4096
)

// ParseXIDs reads a comma-separated list of XIDs, e.g. "94,95" (spaces
// around the numbers are allowed, duplicates are dropped). Every entry must be
// a decimal number from 1 to MaxXID; the error names the first one that is
// not.
func ParseXIDs(s string) ([]uint64, error) {
	if len(s) > maxXIDsText {
		return nil, fmt.Errorf("an XID list of %d characters is too long (at most %d)", len(s), maxXIDsText)
	}
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []uint64
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		x, err := strconv.ParseUint(part, 10, 64)
		if err != nil || x < 1 || x > MaxXID || part[0] == '+' {
			return nil, fmt.Errorf("entry %d, %.20q, is not an XID: write decimal numbers from 1 to %d, e.g. 94,95", i+1, part, MaxXID)
		}
		if !slices.Contains(out, x) {
			if len(out) == maxXIDCount {
				return nil, fmt.Errorf("more than %d XIDs", maxXIDCount)
			}
			out = append(out, x)
		}
	}
	return out, nil
}
