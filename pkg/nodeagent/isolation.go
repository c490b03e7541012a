package nodeagent

import (
	"context"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/gpuisolation"
)

// The Events of GPU isolation, on the Node.
const (
	EventGPUsNotIsolated     = "GPUsNotIsolated"
	EventGPUIsolationUnknown = "GPUIsolationUnknown"
	EventGPUsIsolated        = "GPUsIsolated"
)

// addRuntimeConfigFlag is --nvidia-runtime-config, for the agent and discover
// alike.
func addRuntimeConfigFlag(cmd *cobra.Command, paths *[]string) {
	cmd.Flags().StringSliceVar(paths, "nvidia-runtime-config", gpuisolation.DefaultRuntimeConfigs,
		"host paths, read below --host-root, of the NVIDIA container runtime's config.toml (the package's, and the GPU operator's toolkit), "+
			"read at every poll: the condition "+gpuisolation.ConditionType+" of NodeDevices, an Event on the Node and resclass_node_agent_gpu_isolation "+
			"say whether the runtime refuses NVIDIA_VISIBLE_DEVICES from unprivileged containers (isolated), accepts it (any pod may take any GPU) "+
			"or cannot be checked; a file not found is skipped, none found is never taken as isolated (docs/node-agent.md, \"GPU isolation\")")
}

// isolation keeps the node's GPUIsolation condition (pkg/gpuisolation): the
// NVIDIA container runtime's configuration is read again at every publish
// pass, so that a node hardened (or un-hardened) shows within a poll. One
// pass costs a stat and at most gpuisolation.MaxRuntimeConfigSize bytes per
// file. Events are recorded when the verdict changes, not at every pass.
type isolation struct {
	hostRoot string
	// paths are the host paths of the runtime's configuration files.
	paths []string
	// envVar says the agent names GPUs through NVIDIA_VISIBLE_DEVICES.
	envVar bool
	// prev is the last verdict (nil before the first).
	prev *metav1.Condition
}

func newIsolation(c Config) *isolation {
	paths := c.NVIDIARuntimeConfigs
	if paths == nil {
		paths = gpuisolation.DefaultRuntimeConfigs
	}
	return &isolation{hostRoot: c.HostRoot, paths: paths, envVar: !c.DeviceListStrategies.Isolated()}
}

// check judges the node, which publishes gpus GPUs.
func (i *isolation) check(gpus int) metav1.Condition {
	return gpuisolation.Check(i.hostRoot, i.paths).Condition(gpuisolation.Input{GPUs: gpus, EnvVarStrategy: i.envVar})
}

// report sets the metric to c and, when c's status or reason differs from
// the last verdict, logs it and records an Event on the Node: a Warning when
// the node is not isolated or cannot be checked, a Normal one when it
// becomes isolated after a warning. A node with no GPUs records none.
func (i *isolation) report(ctx context.Context, recorder record.EventRecorder, node *corev1.Node, m *metrics, c metav1.Condition) {
	state := gpuisolation.StateOf(c)
	for _, s := range gpuisolation.States {
		v := 0.0
		if s == state {
			v = 1
		}
		m.isolation.WithLabelValues(string(s)).Set(v)
	}
	prev := i.prev
	if prev != nil && prev.Status == c.Status && prev.Reason == c.Reason {
		return
	}
	i.prev = &c
	logger := klog.FromContext(ctx)
	switch state {
	case gpuisolation.StateUnisolated:
		logger.Info("GPUs not isolated", "reason", c.Reason, "message", c.Message)
		recorder.Event(node, corev1.EventTypeWarning, EventGPUsNotIsolated, c.Message)
	case gpuisolation.StateUnknown:
		logger.Info("GPU isolation cannot be checked", "reason", c.Reason, "message", c.Message)
		recorder.Event(node, corev1.EventTypeWarning, EventGPUIsolationUnknown, c.Message)
	case gpuisolation.StateIsolated:
		logger.Info("GPUs isolated", "message", c.Message)
		if prev != nil && gpuisolation.StateOf(*prev) != gpuisolation.StateNoGPUs {
			recorder.Event(node, corev1.EventTypeNormal, EventGPUsIsolated, c.Message)
		}
	default:
		logger.V(2).Info("GPU isolation not applicable", "reason", c.Reason, "message", c.Message)
	}
}
