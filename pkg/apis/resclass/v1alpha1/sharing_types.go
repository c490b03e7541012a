package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
)

// Sharing a device between pods (docs/sharing.md).
//
// The operator chooses, per GPU, how it serves pods: whole, to one pod at a
// time (SharingExclusive, the default), or in shares to several
// (SharingTimeSlicing, SharingMPS). The node agent reads the choice from the
// Node's labels (LabelGPUSharing, LabelGPUSharingDevicePrefix) and publishes
// it, with the capacity shares may take, in Device.Sharing. A ResourceClass
// with a Share selects only devices that serve shares, one without selects
// only devices served whole: the same GPU is never given both ways at once.

// LabelGPUSharing is the Node label that sets the sharing mode of every GPU
// of the node: "exclusive" (also when absent or not one of the values),
// "time-slicing" or "mps". The operator sets it, as LabelDeviceMode, and for
// the same reason it is outside the resclass.io/ prefix: the node agent's
// admission policy lets it change resclass.io/ labels, and this one says what
// the agent may hand out, so the agent must not be able to change it.
const LabelGPUSharing = "node.resclass.io/gpu-sharing"

// LabelGPUSharingDevicePrefix, followed by a GPU's UUID, is the Node label
// that sets that GPU's mode, over LabelGPUSharing:
// gpu-sharing.node.resclass.io/GPU-4b8a…=mps.
const LabelGPUSharingDevicePrefix = "gpu-sharing.node.resclass.io/"

// The values of LabelGPUSharing and of the per-GPU labels.
const (
	SharingLabelExclusive   = "exclusive"
	SharingLabelTimeSlicing = "time-slicing"
	SharingLabelMPS         = "mps"
)

// SharingMode is how a device serves pods.
// +kubebuilder:validation:Enum=Exclusive;TimeSlicing;MPS
type SharingMode string

const (
	// SharingExclusive: the device goes whole to one pod at a time, through
	// classes without a share.
	SharingExclusive SharingMode = "Exclusive"
	// SharingTimeSlicing: pods of share classes run on the device together,
	// interleaved by the driver's time-slicing. Their shares are the
	// scheduler's accounting only: nothing on the device limits a pod's
	// memory or compute.
	SharingTimeSlicing SharingMode = "TimeSlicing"
	// SharingMPS: pods of share classes run on the device together as
	// clients of one CUDA MPS server, each given its share as MPS client
	// limits (docs/sharing.md says what those hold against).
	SharingMPS SharingMode = "MPS"
)

// Shares reports whether m serves shares rather than whole devices.
func (m SharingMode) Shares() bool { return m == SharingTimeSlicing || m == SharingMPS }

// SharingModeOfLabel is the mode a label value names; ok is false for a value
// that names none (then the device stays exclusive).
func SharingModeOfLabel(v string) (m SharingMode, ok bool) {
	switch v {
	case SharingLabelExclusive:
		return SharingExclusive, true
	case SharingLabelTimeSlicing:
		return SharingTimeSlicing, true
	case SharingLabelMPS:
		return SharingMPS, true
	}
	return SharingExclusive, false
}

// The capacities of a shared device, the names of DeviceSharing.Capacity,
// and what a ResourceShare unit takes of them.
const (
	// CapacityMemory is device memory, in bytes.
	CapacityMemory = "memory"
	// CapacityCompute is the device's compute (its streaming multiprocessors)
	// in percent: a shared GPU has 100.
	CapacityCompute = "compute"
)

// DeviceSharing is how a device serves pods, and what shares of it may take.
type DeviceSharing struct {
	// Mode is how the device serves pods now.
	// +required
	Mode SharingMode `json:"mode"`

	// RequestedMode is the mode the operator asked for when it differs from
	// Mode: the change waits for the pods that hold the device to end, and
	// meanwhile the device takes no new pod. Message names the pods.
	// +optional
	RequestedMode SharingMode `json:"requestedMode,omitempty"`

	// Capacity is what all shares of the device together may take, by
	// capacity name (CapacityMemory, CapacityCompute); set in a mode that
	// shares.
	// +optional
	// +kubebuilder:validation:MaxProperties=8
	Capacity map[string]resource.Quantity `json:"capacity,omitempty"`

	// Enforcement says, per capacity, what keeps a pod within its share.
	// +optional
	// +listType=map
	// +listMapKey=capacity
	// +kubebuilder:validation:MaxItems=8
	Enforcement []SharingEnforcement `json:"enforcement,omitempty"`

	// Message says what is in the way, if anything: a mode change waiting
	// for pods, an MPS control daemon that is not running.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// SharingEnforcement is what keeps pods within their shares of one capacity.
type SharingEnforcement struct {
	// Capacity is the capacity's name (CapacityMemory, CapacityCompute).
	// +required
	// +kubebuilder:validation:MaxLength=63
	Capacity string `json:"capacity"`

	// Mechanism names what enforces it, e.g. MPSClientLimit,
	// TimeSlicing, SchedulerAccounting.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Mechanism string `json:"mechanism"`

	// Strength is how far a tenant can be trusted to stay within it: Hard
	// (the device or driver refuses more, whatever the pod does), Soft (the
	// limit is set in the pod's own environment, which the pod can change),
	// or Accounting (the scheduler counts shares, nothing on the node stops
	// a pod taking more).
	// +required
	Strength EnforcementStrength `json:"strength"`
}

// EnforcementStrength is how far a share's limit holds against its pod.
// +kubebuilder:validation:Enum=Hard;Soft;Accounting
type EnforcementStrength string

// The values of EnforcementStrength.
const (
	EnforcementHard       EnforcementStrength = "Hard"
	EnforcementSoft       EnforcementStrength = "Soft"
	EnforcementAccounting EnforcementStrength = "Accounting"
)

// Mechanisms of SharingEnforcement.
const (
	MechanismMPSClientLimit      = "MPSClientLimit"
	MechanismTimeSlicing         = "TimeSlicing"
	MechanismSchedulerAccounting = "SchedulerAccounting"
)

// ResourceShare is the unit of a share class: what one unit of the class
// takes of one device. A container that requests N units of the class gets N
// times the unit, all on one device.
//
// +kubebuilder:validation:XValidation:rule="has(self.memory) || has(self.compute)",message="a share takes memory, compute or both"
// +kubebuilder:validation:XValidation:rule="!has(self.memory) || (quantity(string(self.memory)).isGreaterThan(quantity('0')) && quantity(string(self.memory)).compareTo(quantity('1Ei')) <= 0)",message="memory must be more than 0 and at most 1Ei"
type ResourceShare struct {
	// Memory is the device memory one unit takes, e.g. 10Gi: more than 0,
	// at most 1Ei.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`

	// Compute is the percentage of the device's compute one unit takes:
	// 1 to 100.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Compute *int32 `json:"compute,omitempty"`
}

// MaxShareMemoryBytes bounds ResourceShare.Memory (1Ei), far above any
// device's memory, so that a request's units of it never overflow.
const MaxShareMemoryBytes int64 = 1 << 60
