package resourceclasses

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// isDRANode says whether node serves its devices through DRA
// (v1alpha1.LabelDeviceMode): the stock DynamicResources plugin allocates
// them from the node's ResourceSlices through the DeviceClass of each
// ResourceClass, so this plugin neither filters nor reserves there. Its agent
// serves no device-plugin endpoint and publishes no NodeDevices, so nothing
// this plugin holds can be handed out on it (docs/dra.md, "Nodes").
func isDRANode(node *corev1.Node) bool {
	return node != nil && v1alpha1.DeviceModeOf(node.Labels) == v1alpha1.DeviceModeDRA
}

// errDRANode is Filter's answer on a DRA-mode node when this process's
// DynamicResources does not serve class requests (DRAExtendedResource off,
// the resclass binary's default): a class request bound there would get no
// device (no claim, and no allocatable on the node), so it is refused there.
// The pod reaches those devices in the ResourceClaim form, or through a stock
// kube-scheduler profile with the gate on (docs/dra.md, "Which scheduler
// serves which pods").
const errDRANode = "node serves its devices through DRA: a class request there needs a ResourceClaim of the class's DeviceClass, or a scheduler with DRAExtendedResource on (docs/dra.md)"

// draNodes are the DRA-mode nodes among nodes.
func draNodes(nodes []fwk.NodeInfo) sets.Set[string] {
	var out sets.Set[string]
	for _, ni := range nodes {
		if n := ni.Node(); isDRANode(n) {
			if out == nil {
				out = sets.New[string]()
			}
			out.Insert(n.Name)
		}
	}
	return out
}
