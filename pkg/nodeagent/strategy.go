package nodeagent

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/handoff"
)

// ReasonDeviceListUnisolated is the Warning Event on the Node of an agent
// that names GPUs by NVIDIA_VISIBLE_DEVICES (--device-list-strategy with
// envvar).
const ReasonDeviceListUnisolated = "DeviceListUnisolated"

// reportStrategies says at start how the agent names GPUs to the runtime,
// and warns, in its log and with an Event on its Node, when the strategies
// are not isolated (handoff.Strategies.Isolated): envvar needs a runtime
// that takes NVIDIA_VISIBLE_DEVICES from unprivileged containers, and such a
// runtime takes it from a tenant's pod too, so the scheduler's assignment no
// longer bounds the GPUs a container can reach on this node
// (docs/node-agent.md, "GPU isolation"). An explicit choice, kept for
// runtimes without CDI; reported so that it is never silent.
func reportStrategies(logger klog.Logger, recorder record.EventRecorder, node *corev1.Node, strategies handoff.Strategies) {
	if strategies.Isolated() {
		logger.Info("naming GPUs to the container runtime", "deviceListStrategy", strategies.String())
		return
	}
	msg := "--device-list-strategy=" + strategies.String() + " names GPUs by NVIDIA_VISIBLE_DEVICES, which works only where NVIDIA's container runtime accepts the variable from unprivileged containers; there any pod that sets it reaches every GPU of this node, whatever the scheduler assigned: use cdi-cri and harden the runtime (docs/node-agent.md, \"GPU isolation\")"
	logger.Info("WARNING: GPU isolation depends on the container runtime", "deviceListStrategy", strategies.String(), "detail", msg)
	recorder.Event(node, corev1.EventTypeWarning, ReasonDeviceListUnisolated, msg)
}
