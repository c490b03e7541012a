package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
)

// MIG partitioning of a GPU (docs/mig.md).
//
// A GPU in MIG mode has MIGSlices memory slices. A GPU instance of a profile
// occupies Slices consecutive memory slices from one of the profile's
// placements; instances may not overlap. The node agent publishes, for each
// GPU in MIG mode, the profiles NVML lists for it and the instances that
// exist, so that what can still be created is known without asking the node.

// MIGSlices is the number of memory slices of a MIG-capable GPU.
const MIGSlices = 8

// MIGMode is how resclass partitions a GPU in MIG mode.
// +kubebuilder:validation:Enum=Static;Dynamic
type MIGMode string

const (
	// MIGStatic: the GPU's MIG devices are those an operator made; resclass
	// serves them as they are.
	MIGStatic MIGMode = "Static"
	// MIGDynamic: resclass creates slices on the GPU for the pods that need
	// them and destroys them once no pod holds them (docs/mig.md).
	MIGDynamic MIGMode = "Dynamic"
)

// DeviceMIG is a GPU's MIG geometry and the GPU instances on it.
type DeviceMIG struct {
	// Mode is how resclass partitions the GPU, as the operator marked it
	// (node.resclass.io/gpu-mig, gpu-mig.node.resclass.io/<GPU UUID>).
	// Absent means Static.
	// +optional
	Mode MIGMode `json:"mode,omitempty"`

	// Message says why a marking was not followed (a value that names no
	// mode, say).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Message string `json:"message,omitempty"`

	// Profiles are the GPU instance profiles the GPU offers.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	Profiles []MIGProfile `json:"profiles,omitempty"`

	// Instances are the GPU instances on the GPU now.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Instances []MIGInstance `json:"instances,omitempty"`
}

// MIGProfile is one GPU instance profile of a GPU.
type MIGProfile struct {
	// Name is the profile's name as nvidia-smi prints it ("1g.10gb",
	// "1g.10gb+me"), also a MIG device's migProfile attribute.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`

	// Slices is the memory slices an instance of it occupies.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8
	Slices int32 `json:"slices"`

	// Compute is its compute slices, of the GPU's seven.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8
	Compute int32 `json:"compute"`

	// Memory is the profile's memory as NVML states it for the profile.
	// +required
	Memory resource.Quantity `json:"memory"`

	// Multiprocessors is its streaming multiprocessors.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1024
	Multiprocessors int32 `json:"multiprocessors,omitempty"`

	// Decoders, JPEGs and OFAs are its media engines (video decoders, JPEG
	// decoders, optical flow accelerators).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	Decoders int32 `json:"decoders,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	JPEGs int32 `json:"jpegs,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	OFAs int32 `json:"ofas,omitempty"`

	// Placements are the memory slices an instance of it may start at.
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:Minimum=0
	// +kubebuilder:validation:items:Maximum=7
	Placements []int32 `json:"placements"`

	// Max is the most instances of it the GPU holds at once.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8
	Max int32 `json:"max"`
}

// MIGInstance is a GPU instance on a GPU.
type MIGInstance struct {
	// Profile names its profile, one of the GPU's Profiles.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Profile string `json:"profile"`

	// Start is the first memory slice it occupies.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=7
	Start int32 `json:"start"`

	// Created says resclass created it for a pod (its ownership record
	// names it). Such an instance's MIG device is not published as a
	// device of its own: it belongs to the pod it was made for.
	// +optional
	Created bool `json:"created,omitempty"`
}

// LabelGPUMIG is the Node label that sets how resclass partitions every GPU
// of the node that is in MIG mode (docs/mig.md): "dynamic" (slices created
// for pods, MIGDynamic) or "static" (the layout an operator made,
// MIGStatic, also when absent). Like the sharing labels, it is outside
// resclass.io/, so the node agent cannot set it.
const LabelGPUMIG = "node.resclass.io/gpu-mig"

// LabelGPUMIGDevicePrefix, followed by a GPU's UUID, is the Node label that
// sets that GPU's MIG mode, over LabelGPUMIG.
const LabelGPUMIGDevicePrefix = "gpu-mig.node.resclass.io/"

// The values of LabelGPUMIG and of the per-GPU labels.
const (
	MIGLabelDynamic = "dynamic"
	MIGLabelStatic  = "static"
)
