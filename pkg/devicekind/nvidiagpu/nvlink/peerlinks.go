// Package nvlink is the codec of the nvidia-gpu kind's nvlinkPeerLinks
// attribute: NVML discovery (pkg/discovery/nvml) writes it, the scheduler
// reads it (through pkg/devicekind/nvidiagpu). It imports nothing of either,
// so that the kind can import the discovery.
package nvlink

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// PeerLinks is one GPU's NVLink reach, the value of the nvlinkPeerLinks
// attribute: for each GPU of the node it reaches over NVLink (by NVML index),
// the number of links between them, which is what their bandwidth scales with
// ("1:2,2:1,3:1,4:2", ascending indices). Over an NVSwitch fabric a pair's
// count is the smaller of the two GPUs' switch links: the switch gives each
// GPU its full NVLink bandwidth to any other.
type PeerLinks map[int]int

// Bounds of a PeerLinks value: it crosses a trust boundary (any node agent, or
// anyone allowed to write NodeDevices, publishes it), so the scheduler parses
// it with bounded cost and refuses what no machine has.
const (
	maxPeerLinksLen = 256 // the API's limit on a string attribute
	MaxNVLinkIndex  = 1023
	MaxNVLinks      = 64 // per pair; an H100 has 18 in all
)

// ParsePeerLinks reads a nvlinkPeerLinks value.
func ParsePeerLinks(s string) (PeerLinks, error) {
	if len(s) > maxPeerLinksLen {
		return nil, fmt.Errorf("nvlinkPeerLinks is %d bytes, more than %d", len(s), maxPeerLinksLen)
	}
	out := PeerLinks{}
	if s == "" {
		return out, nil
	}
	last := -1
	for _, entry := range strings.Split(s, ",") {
		peer, count, ok := strings.Cut(entry, ":")
		if !ok {
			return nil, fmt.Errorf("nvlinkPeerLinks entry %q is not <peer index>:<links>", entry)
		}
		p, err := smallInt(peer, MaxNVLinkIndex)
		if err != nil {
			return nil, fmt.Errorf("nvlinkPeerLinks entry %q: peer index %w", entry, err)
		}
		n, err := smallInt(count, MaxNVLinks)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("nvlinkPeerLinks entry %q: link count must be 1..%d", entry, MaxNVLinks)
		}
		if p <= last {
			return nil, fmt.Errorf("nvlinkPeerLinks: peer indices must ascend, %d follows %d", p, last)
		}
		last = p
		out[p] = n
	}
	return out, nil
}

// smallInt parses a decimal of at most 4 digits, no sign, no leading zero.
func smallInt(s string, limit int) (int, error) {
	if s == "" || len(s) > 4 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("%q must be a decimal 0..%d", s, limit)
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q must be a decimal 0..%d", s, limit)
		}
	}
	n, _ := strconv.Atoi(s)
	if n > limit {
		return 0, fmt.Errorf("%d is more than %d", n, limit)
	}
	return n, nil
}

// String formats p as ParsePeerLinks reads it.
func (p PeerLinks) String() string {
	peers := make([]int, 0, len(p))
	for i := range p {
		peers = append(peers, i)
	}
	slices.Sort(peers)
	var b strings.Builder
	for j, i := range peers {
		if j > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d:%d", i, p[i])
	}
	return b.String()
}
