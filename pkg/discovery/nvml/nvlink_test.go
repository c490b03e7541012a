package nvml

import (
	"strconv"
	"strings"
	"testing"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// nvlink is one link of a test topology: its state, or the error NVML answers
// for it, and the PCI address at its far end ("" where NVML cannot read it).
type nvlink struct {
	state  lib.EnableState
	ret    lib.Return
	remote string
}

// to is an active link to the device at this PCI address.
func to(address string) nvlink { return nvlink{state: lib.FEATURE_ENABLED, remote: address} }

var down = nvlink{state: lib.FEATURE_DISABLED}

// wire gives dev these links; a higher index answers INVALID_ARGUMENT, as past
// an A100's twelfth link. Far ends are reported in NVML's form of a bus id.
func wire(dev *dgxa100.Device, links ...nvlink) {
	dev.GetNvLinkStateFunc = func(i int) (lib.EnableState, lib.Return) {
		if i >= len(links) {
			return 0, lib.ERROR_INVALID_ARGUMENT
		}
		return links[i].state, links[i].ret
	}
	dev.GetNvLinkRemotePciInfoFunc = func(i int) (lib.PciInfo, lib.Return) {
		if i >= len(links) || links[i].remote == "" {
			return lib.PciInfo{}, lib.ERROR_NOT_SUPPORTED
		}
		return busID("0000" + strings.ToUpper(links[i].remote)), lib.SUCCESS
	}
}

// links repeats l n times.
func links(n int, l nvlink) []nvlink {
	out := make([]nvlink, n)
	for i := range out {
		out[i] = l
	}
	return out
}

func TestNVLinkTopology(t *testing.T) {
	server, root := dgx(t)
	gpu := func(i int) *dgxa100.Device { return server.Devices[i].(*dgxa100.Device) }
	const nvswitch = "0000:c1:00.0"
	// GPUs 0 and 1 are linked directly by two links, the rest of their twelve
	// down.
	wire(gpu(0), append([]nvlink{to(gpu(1).PciBusID), to(gpu(1).PciBusID)}, links(10, down)...)...)
	wire(gpu(1), append([]nvlink{to(gpu(0).PciBusID), to(gpu(0).PciBusID)}, links(10, down)...)...)
	// GPUs 2, 4 and 5 reach an NVSwitch, and so each other.
	wire(gpu(2), links(6, to(nvswitch))...)
	wire(gpu(4), links(6, to(nvswitch))...)
	wire(gpu(5), to(nvswitch), down)
	// GPU 3 has no NVLink (dgx's default), GPU 6 has links that are all down.
	wire(gpu(6), links(12, down)...)
	// GPU 7: link 0 cannot be read, link 1 is up to a far end NVML cannot name.
	wire(gpu(7), nvlink{ret: lib.ERROR_UNKNOWN}, nvlink{state: lib.FEATURE_ENABLED})
	gpus := discover(t, server, root)

	uuids := func(indices ...int) string {
		var ids []string
		for _, i := range indices {
			ids = append(ids, strconv.Itoa(i))
		}
		return strings.Join(ids, ",")
	}
	for _, tc := range []struct {
		name         string
		gpu          int
		links, peers string // "" for no attribute
		peerLinks    string
		problem      string // "" for a healthy GPU
	}{
		{name: "direct", gpu: 0, links: "2", peers: uuids(1), peerLinks: "1:2"},
		{name: "direct, other end", gpu: 1, links: "2", peers: uuids(0), peerLinks: "0:2"},
		{name: "switch", gpu: 2, links: "6", peers: uuids(4, 5), peerLinks: "4:6,5:1"},
		{name: "no NVLink", gpu: 3},
		{name: "switch, other GPU", gpu: 4, links: "6", peers: uuids(2, 5), peerLinks: "2:6,5:1"},
		{name: "switch, one link", gpu: 5, links: "1", peers: uuids(2, 4), peerLinks: "2:1,4:1"},
		{name: "links down", gpu: 6},
		{name: "unreadable", gpu: 7, links: "1", problem: "NVLink 0: ERROR_UNKNOWN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := gpus[tc.gpu]
			for name, want := range map[string]string{v1alpha1.AttributeNVLinks: tc.links, v1alpha1.AttributeNVLinkPeers: tc.peers, v1alpha1.AttributeNVLinkPeerLinks: tc.peerLinks} {
				a, ok := g.Attributes[name]
				switch {
				case want == "" && ok:
					t.Errorf("%s = %s, want none", name, a.String())
				case want != "" && a.String() != want:
					t.Errorf("%s = %s, want %s", name, a.String(), want)
				case ok && a.Type() != wellKnown[name]:
					t.Errorf("%s published as %s", name, a.Type())
				}
			}
			if g.Healthy != (tc.problem == "") || !strings.Contains(g.Reason, tc.problem) {
				t.Errorf("healthy=%v reason=%q, want problem %q", g.Healthy, g.Reason, tc.problem)
			}
		})
	}
}
