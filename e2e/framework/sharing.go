package framework

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/selector"
)

// ShareGPUs sets Sharing on every nvidia-gpu device of devices as the node
// agent publishes a GPU that nobody holds on a node labelled
// node.resclass.io/gpu-sharing for mode (docs/sharing.md): mode in force, the
// capacity shares may take (compute 100, memory the GPU's memory attribute)
// and the mode's enforcement; a GPU in MIG mode is exclusive, with the
// agent's message. A mode that does not share leaves devices as they are.
//
// It mirrors pkg/nodeagent's sharingModes.apply and shareCapacity, which are
// unexported (the agent decides per pass from labels and holders; a simulated
// node has neither): keep the two alike.
func ShareGPUs(devices []v1alpha1.Device, mode v1alpha1.SharingMode) {
	if !mode.Shares() {
		return
	}
	for i := range devices {
		d := &devices[i]
		if d.Kind != v1alpha1.DeviceKindNvidiaGPU {
			continue
		}
		if b := d.Attributes[v1alpha1.AttributeMIGEnabled].BoolValue; b != nil && *b {
			d.Sharing = &v1alpha1.DeviceSharing{Mode: v1alpha1.SharingExclusive, Message: "the GPU is in MIG mode: its MIG devices are served whole, never shared"}
			continue
		}
		capacity := map[string]resource.Quantity{v1alpha1.CapacityCompute: *resource.NewQuantity(100, resource.DecimalSI)}
		if m := d.Attributes[v1alpha1.AttributeMemory].QuantityValue; m != nil {
			capacity[v1alpha1.CapacityMemory] = m.DeepCopy()
		}
		enforcement := []v1alpha1.SharingEnforcement{
			{Capacity: v1alpha1.CapacityMemory, Mechanism: v1alpha1.MechanismSchedulerAccounting, Strength: v1alpha1.EnforcementAccounting},
			{Capacity: v1alpha1.CapacityCompute, Mechanism: v1alpha1.MechanismTimeSlicing, Strength: v1alpha1.EnforcementAccounting},
		}
		if mode == v1alpha1.SharingMPS {
			enforcement = []v1alpha1.SharingEnforcement{
				{Capacity: v1alpha1.CapacityMemory, Mechanism: v1alpha1.MechanismMPSClientLimit, Strength: v1alpha1.EnforcementSoft},
				{Capacity: v1alpha1.CapacityCompute, Mechanism: v1alpha1.MechanismMPSClientLimit, Strength: v1alpha1.EnforcementSoft},
			}
		}
		d.Sharing = &v1alpha1.DeviceSharing{Mode: mode, Capacity: capacity, Enforcement: enforcement}
	}
}

// sharingLabel is the value of node.resclass.io/gpu-sharing that asks for mode.
func sharingLabel(mode v1alpha1.SharingMode) string {
	switch mode {
	case v1alpha1.SharingTimeSlicing:
		return v1alpha1.SharingLabelTimeSlicing
	case v1alpha1.SharingMPS:
		return v1alpha1.SharingLabelMPS
	}
	return v1alpha1.SharingLabelExclusive
}

// simulatedPoolSlots is what a hugepage pool is to the kubelet in
// ClassCapacity: the node agent's default --hugepage-pool-slots.
const simulatedPoolSlots = 110

// ClassCapacity is how many of class.resclass.io/<class> the node agent's
// device plugin advertises to the kubelet for devices, and so the node's
// capacity of it (pkg/nodeagent's classMatcher): per device the class
// selects, its own id, a hugepage pool's slots (the agent's default 110), or,
// for a share class, one slot per unit that fits a device serving shares
// (handoff.ShareSlots).
func ClassCapacity(class *v1alpha1.ResourceClass, devices []v1alpha1.Device) (int64, error) {
	c, errs := selector.Compile(&class.Spec, field.NewPath("spec"))
	if len(errs) > 0 {
		return 0, fmt.Errorf("class %s: %w", class.Name, errs.ToAggregate())
	}
	var n int64
	for i := range devices {
		d := selector.NewDevice(&devices[i])
		if !c.Matches(d) {
			continue
		}
		shareSlots := 0
		if unit, ok := c.Share(); ok {
			_, capacity, _ := d.Sharing()
			shareSlots = handoff.ShareSlots(unit, capacity)
		}
		n += int64(len(handoff.KubeletIDs(kinds.Builtin, &devices[i], simulatedPoolSlots, shareSlots)))
	}
	return n, nil
}
