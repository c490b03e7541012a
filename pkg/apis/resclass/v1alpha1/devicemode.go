package v1alpha1

// LabelDeviceMode is the Node label that says how the node's devices are handed
// out (docs/dra.md, "Nodes"): DeviceModeDevicePlugin (the default, also when
// the label is absent) or DeviceModeDRA. The operator sets it; the node agent
// reads it and serves one mode only, and the resclass scheduler leaves DRA-mode
// nodes to the stock DynamicResources plugin, so a device is never handed out
// by both paths. It is outside the resclass.io/ prefix on purpose: the node
// agent's admission policy lets it change resclass.io/ labels, not this one.
const LabelDeviceMode = "node.resclass.io/device-mode"

// The values of LabelDeviceMode.
const (
	DeviceModeDevicePlugin = "device-plugin"
	DeviceModeDRA          = "dra"
)

// DeviceModeOf is the mode a Node's labels select: DeviceModeDRA only for the
// exact value "dra", DeviceModeDevicePlugin for anything else (absent, empty,
// a typo), the mode that needs nothing of the cluster beyond resclass.
func DeviceModeOf(labels map[string]string) string {
	if labels[LabelDeviceMode] == DeviceModeDRA {
		return DeviceModeDRA
	}
	return DeviceModeDevicePlugin
}
