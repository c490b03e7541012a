package nvml

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	peerlinks "github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvlink"
)

// addNVLinks gives each of gpus, which describe devs in order, its active
// NVLink count (nvlinks), the GPUs it reaches over them (nvlinkPeers) and the
// links to each (nvlinkPeerLinks), each only when there are any.
//
// A link's far end is matched to one of this node's GPUs by PCI address. Any
// other far end is taken to be an NVSwitch: the NVLink endpoints of the systems
// NVIDIA ships are GPUs and NVSwitches (IBM POWER9's CPU links, long out of
// support, would be misread). A switch gives every GPU attached to it a path to
// every other, so the GPUs with a switch link are all peers of one another: a
// node is taken to have one NVSwitch fabric, as HGX and DGX boards do. Peers are
// this node's GPUs only; those a multi-node NVLink domain reaches on other nodes
// are not devices here. Over the switch a pair's link count is the smaller of
// the two GPUs' switch links: the switch gives each GPU its full NVLink
// bandwidth to any other, so the slower end bounds the pair.
func (d *Discoverer) addNVLinks(devs []lib.Device, gpus []v1alpha1.Device) {
	byAddress := map[string]string{}
	index := map[string]int{} // by NVML index, which a GPU left out makes differ from i
	for i, g := range gpus {
		index[g.ID] = i
		if n := g.Attributes[v1alpha1.AttributeIndex].IntValue; n != nil {
			index[g.ID] = int(*n)
		}
		if a, ok := g.Attributes[v1alpha1.AttributePCIAddress]; ok {
			byAddress[*a.StringValue] = g.ID
		}
	}
	links := make([]nvlinks, len(gpus))
	var switched []int // positions in gpus
	for i, dev := range devs {
		var p problems
		links[i] = readNVLinks(dev, byAddress, &p)
		p.report(&gpus[i])
		if links[i].toSwitch {
			switched = append(switched, i)
		}
	}
	for i, l := range links {
		if l.active == 0 {
			continue
		}
		if l.toSwitch {
			for _, j := range switched {
				l.peers[gpus[j].ID] += min(l.switchLinks, links[j].switchLinks)
			}
		}
		delete(l.peers, gpus[i].ID)
		gpus[i].Attributes[v1alpha1.AttributeNVLinks] = v1alpha1.IntAttribute(int64(l.active))
		if len(l.peers) > 0 {
			// Peers by NVML index, as nvidia-smi topo shows them: UUIDs
			// would outgrow an attribute's 256 characters at 7 peers.
			indices := make([]int, 0, len(l.peers))
			perPeer := peerlinks.PeerLinks{}
			for id, n := range l.peers {
				indices = append(indices, index[id])
				perPeer[index[id]] = min(n, peerlinks.MaxNVLinks)
			}
			slices.Sort(indices)
			peers := make([]string, len(indices))
			for j, n := range indices {
				peers[j] = strconv.Itoa(n)
			}
			gpus[i].Attributes[v1alpha1.AttributeNVLinkPeers] = v1alpha1.StringAttribute(strings.Join(peers, ","))
			gpus[i].Attributes[v1alpha1.AttributeNVLinkPeerLinks] = v1alpha1.StringAttribute(perPeer.String())
		}
	}
}

// nvlinks is what one GPU's links reach.
type nvlinks struct {
	active      int
	peers       map[string]int // UUIDs of GPUs at the far end of a link: the links to each
	toSwitch    bool           // a link ends at something that is not a GPU
	switchLinks int            // the links that do
}

// readNVLinks reads dev's links, byAddress naming this node's GPUs by PCI
// address. NOT_SUPPORTED or INVALID_ARGUMENT for a link index means the GPU has
// no such link: a GPU without NVLink answers so for every index, an A100 for
// those past its twelfth. Neither is a problem.
func readNVLinks(dev lib.Device, byAddress map[string]string, p *problems) nvlinks {
	l := nvlinks{peers: map[string]int{}}
	for link := range lib.NVLINK_MAX_LINKS {
		state, ret := dev.GetNvLinkState(link)
		if ret == lib.ERROR_NOT_SUPPORTED || ret == lib.ERROR_INVALID_ARGUMENT {
			continue
		}
		if !p.check(fmt.Sprintf("NVLink %d", link), ret) || state != lib.FEATURE_ENABLED {
			continue
		}
		l.active++
		// A link whose far end cannot be read still counts; it names no peer.
		remote, ret := dev.GetNvLinkRemotePciInfo(link)
		if !p.check(fmt.Sprintf("NVLink %d remote", link), ret) {
			continue
		}
		switch address := pciBusID(remote); {
		case address == "":
		case byAddress[address] != "":
			l.peers[byAddress[address]]++
		default:
			l.toSwitch = true
			l.switchLinks++
		}
	}
	return l
}
