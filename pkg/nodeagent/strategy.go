package nodeagent

import (
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/handoff"
)

// reportStrategies logs at start how the agent names GPUs to the runtime,
// and says so when the strategies are not isolated
// (handoff.Strategies.Isolated): envvar needs a runtime that takes
// NVIDIA_VISIBLE_DEVICES from unprivileged containers, and such a runtime
// takes it from a tenant's pod too, so the scheduler's assignment no longer
// bounds the GPUs a container can reach on this node. An explicit choice,
// kept for runtimes without CDI; the GPUIsolation condition, its Warning
// Event and metric report it too (reason EnvVarStrategy, isolation.go), so
// that it is never silent (docs/node-agent.md, "GPU isolation").
func reportStrategies(logger klog.Logger, strategies handoff.Strategies) {
	if strategies.Isolated() {
		logger.Info("naming GPUs to the container runtime", "deviceListStrategy", strategies.String())
		return
	}
	logger.Info("naming GPUs to the container runtime by NVIDIA_VISIBLE_DEVICES: not isolated, any pod that sets the variable reaches every GPU of this node where the runtime accepts it; use cdi-cri", "deviceListStrategy", strategies.String())
}
