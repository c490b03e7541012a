package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeDevices is the device inventory of one node, published by the resclass node
// agent running there. Its name is the node's name and it is owned by the Node, so
// it goes away with it. The agent writes it only when the inventory changes.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=nodedev,categories=resclass
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="GPUs",type=integer,JSONPath=`.status.summary.gpus`
// +kubebuilder:printcolumn:name="NICs",type=integer,JSONPath=`.status.summary.nics`
// +kubebuilder:printcolumn:name="HugePagePools",type=integer,JSONPath=`.status.summary.hugePagePools`
// +kubebuilder:printcolumn:name="Unhealthy",type=integer,JSONPath=`.status.summary.unhealthy`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeDevices struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Status is the inventory as the node agent last observed it.
	// +optional
	Status NodeDevicesStatus `json:"status,omitempty"`
}

// NodeDevicesStatus is what the node agent observed.
type NodeDevicesStatus struct {
	// Devices on the node, each under a stable id.
	// +optional
	// +listType=map
	// +listMapKey=id
	// +kubebuilder:validation:MaxItems=1024
	Devices []Device `json:"devices,omitempty"`

	// Summary counts Devices by kind, for `kubectl get nodedevices`.
	// +optional
	Summary DeviceSummary `json:"summary,omitempty"`

	// Conditions report the state of each discovery source, e.g. that NVML is not
	// installed on the node.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ConditionAgentServing is the NodeDevices condition by which the node agent
// says whether it serves the node's devices: True while it runs, False
// (reason ReasonAgentShuttingDown) from the moment it starts to stop. The
// scheduler places no class pod on a node where it is False. The kubelet says
// as much once the agent's endpoints are gone, but only at its next node
// status sync (10 s by default); this says it before the endpoints go, so
// that a stopping agent has no pod bound to it that it cannot admit. An
// object without it (an older agent) is judged by the kubelet's word alone.
const ConditionAgentServing = "AgentServing"

// Reasons of ConditionAgentServing.
const (
	ReasonAgentServing      = "Serving"
	ReasonAgentShuttingDown = "ShuttingDown"
)

// DeviceSummary counts a node's devices.
type DeviceSummary struct {
	// GPUs is the number of devices of kind nvidia-gpu.
	GPUs int32 `json:"gpus"`
	// NICs is the number of devices of kind nic.
	NICs int32 `json:"nics"`
	// HugePagePools is the number of devices of kind huge-pages.
	HugePagePools int32 `json:"hugePagePools"`
	// Unhealthy is the number of devices of any kind that are not healthy.
	Unhealthy int32 `json:"unhealthy"`
}

// Device is one device of a node, described richly enough for a ResourceClass to
// select it.
type Device struct {
	// ID is stable across agent restarts and unique on the node: the GPU UUID, the
	// NIC's PCI address, the hugepage pool id. It is what the kubelet and the pod
	// assignment refer to.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	ID string `json:"id"`

	// Kind of device: nvidia-gpu, nic, huge-pages, or another lower-case name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Kind string `json:"kind"`

	// Healthy is false while the device must not be given to new pods.
	Healthy bool `json:"healthy"`

	// Reason says why the device is unhealthy.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason,omitempty"`

	// Attributes describe the device; ResourceClass selectors compare them by type.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Attributes map[string]DeviceAttribute `json:"attributes,omitempty"`

	// Sharing is how the device serves pods, for a device that can be
	// shared (a GPU): whole to one pod, or in shares to several. Absent, the
	// device is served whole.
	// +optional
	Sharing *DeviceSharing `json:"sharing,omitempty"`

	// MIG is how a GPU in MIG mode can be partitioned: its GPU instance
	// profiles, where each may be placed, and the instances on it now.
	// Absent for a GPU whose MIG mode is off and for every other device.
	// +optional
	MIG *DeviceMIG `json:"mig,omitempty"`
}

// DeviceAttribute is one typed value. Exactly one field is set.
//
// +kubebuilder:validation:MinProperties=1
// +kubebuilder:validation:MaxProperties=1
type DeviceAttribute struct {
	// The Go field names carry a Value suffix so that they do not clash with the
	// String method; the API names stay natural (as in resource.k8s.io).

	// StringValue is compared for equality only.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	StringValue *string `json:"string,omitempty"`

	// IntValue is an integer, e.g. a NUMA node or an MTU.
	// +optional
	IntValue *int64 `json:"int,omitempty"`

	// BoolValue is true or false.
	// +optional
	BoolValue *bool `json:"bool,omitempty"`

	// QuantityValue is an amount with a unit in Kubernetes quantity notation, e.g.
	// memory "40Gi" or a hugepage size "1Gi". At most 64 characters, an exponent
	// within e-18 and e18, a magnitude of at most 4Ei (docs/resource-classes.md,
	// "Bounds"): the schema checks the spelling, the scheduler the magnitude.
	// +optional
	QuantityValue *resource.Quantity `json:"quantity,omitempty"`

	// BandwidthValue is a rate in bits per second with a decimal prefix, e.g. "100Gbps".
	// +optional
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?([kKmMgGtTpP]([bB][pP][sS])?|[bB][pP][sS])$`
	BandwidthValue *string `json:"bandwidth,omitempty"`

	// VersionValue is a dot-separated list of numbers, e.g. "8.0" or "535.104.05":
	// at most 8 parts of at most 9 digits.
	// +optional
	// +kubebuilder:validation:MaxLength=80
	// +kubebuilder:validation:Pattern=`^[vV]?[0-9]{1,9}(\.[0-9]{1,9}){0,7}$`
	VersionValue *string `json:"version,omitempty"`
}

// NodeDevicesList is a list of NodeDevices.
//
// +kubebuilder:object:root=true
type NodeDevicesList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeDevices `json:"items"`
}
