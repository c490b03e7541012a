package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ResourceNamePrefix is the prefix of the extended resource a container requests to
// get devices of a class: `class.resclass.io/<class-name>: N` in resources.limits.
const ResourceNamePrefix = "class.resclass.io/"

// ResourceClass is a named, portable class of devices ("any NVIDIA GPU with at least
// 30G of memory") that pods request as the extended resource
// class.resclass.io/<name>. The spec cannot change after creation; delete and
// recreate a class to change what it selects.
//
// The name becomes the name part of an extended resource, so it is limited to 63
// characters.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=rsclass,categories=resclass
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Allocatable",type=string,JSONPath=`.status.allocatable`,description="Healthy devices in the cluster that the class selects"
// +kubebuilder:printcolumn:name="Requested",type=string,JSONPath=`.status.requested`,description="Of those, devices held by pods, whichever class they were taken through"
// +kubebuilder:printcolumn:name="Available",type=string,JSONPath=`.status.available`,description="Devices a new pod of the class can still get: allocatable - requested"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="name must be at most 63 characters: it becomes the extended resource class.resclass.io/<name>"
type ResourceClass struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec says which devices the class selects. Immutable.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: delete and recreate the ResourceClass to change what it selects"
	Spec ResourceClassSpec `json:"spec"`

	// Status is written by the resclass scheduler.
	// +optional
	Status ResourceClassStatus `json:"status,omitempty"`
}

// ResourceClassSpec selects devices.
// +kubebuilder:validation:XValidation:rule="!(has(self.share) && has(self.createMIG) && self.createMIG)",message="a share class cannot create MIG slices: a slice is one pod's, whole"
type ResourceClassSpec struct {
	// ResourceSelector selects a device when ANY of its entries matches. A null or
	// empty list selects no device.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	ResourceSelector []ResourcePropertySelector `json:"resourceSelector,omitempty"`

	// Share, when set, makes this a share class: it selects only devices
	// that serve shares (DeviceSharing), and a container's request of N
	// units gets N times Share on one device (docs/sharing.md). Without it
	// the class selects only devices served whole, and a request of N gets
	// N devices.
	// +optional
	Share *ResourceShare `json:"share,omitempty"`

	// CreateMIG, when true, lets the class select MIG slices that do not
	// exist yet: the potential slices of GPUs an operator marked for dynamic
	// MIG (docs/mig.md). Each is evaluated as a device of kind nvidia-mig
	// with the attributes of its profile and parent GPU; the scheduler picks
	// profile and placement and the node agent creates the slice for the
	// pod. Without it the class selects existing devices only, as before.
	// A share class cannot create slices.
	// +optional
	CreateMIG bool `json:"createMIG,omitempty"`
}

// ResourcePropertySelector matches a device when ALL of its expressions match. A
// selector without expressions matches no device.
type ResourcePropertySelector struct {
	// MatchExpressions are ANDed.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	MatchExpressions []ResourceSelectorRequirement `json:"matchExpressions,omitempty"`
}

// ResourceSelectorRequirement relates a device attribute (Key) to Values through
// Operator. Comparisons are typed by the attribute: quantities ("30G", "80Gi"),
// bandwidth ("40Gbps"), versions ("8.0", "535.104.05"), integers, booleans and
// strings. See docs/resource-classes.md for the rules.
//
// +kubebuilder:validation:XValidation:rule="self.operator in ['Exists', 'DoesNotExist'] ? !has(self.values) || size(self.values) == 0 : has(self.values) && size(self.values) > 0",message="In and NotIn need at least one value, Eq, Gt, GtEq, Lt and LtEq exactly one, Exists and DoesNotExist none"
// +kubebuilder:validation:XValidation:rule="!(self.operator in ['Eq', 'Gt', 'GtEq', 'Lt', 'LtEq']) || !has(self.values) || size(self.values) == 1",message="Eq, Gt, GtEq, Lt and LtEq take exactly one value"
// +kubebuilder:validation:XValidation:rule="!has(self.values) || self.values.all(v, !v.matches('^[-+.0-9]+[eE][-+]?0*([1-9]..|[2-9].|19)'))",message="a value that starts as a number with an exponent must keep the exponent within e-18 and e18 (write large sizes with a suffix, e.g. 1Ei)"
type ResourceSelectorRequirement struct {
	// Key names the device attribute, e.g. "memory", "speed", "size".
	// "kind" (or "Kind", as the original proposal writes it) is the device kind and
	// "id" the device id.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Key string `json:"key"`

	// Operator relates the attribute to Values.
	// +required
	Operator ResourceSelectorOperator `json:"operator"`

	// Values to compare the attribute with.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=128
	Values []string `json:"values,omitempty"`
}

// ResourceSelectorOperator relates a device attribute to a requirement's values.
// +kubebuilder:validation:Enum=In;NotIn;Eq;Exists;DoesNotExist;Gt;GtEq;Lt;LtEq
type ResourceSelectorOperator string

const (
	// ResourceSelectorOpIn matches when the attribute equals one of the values.
	ResourceSelectorOpIn ResourceSelectorOperator = "In"
	// ResourceSelectorOpNotIn matches when the attribute is absent or equals none of the values.
	ResourceSelectorOpNotIn ResourceSelectorOperator = "NotIn"
	// ResourceSelectorOpEq matches when the attribute equals the single value.
	ResourceSelectorOpEq ResourceSelectorOperator = "Eq"
	// ResourceSelectorOpExists matches when the device has the attribute.
	ResourceSelectorOpExists ResourceSelectorOperator = "Exists"
	// ResourceSelectorOpDoesNotExist matches when the device lacks the attribute.
	ResourceSelectorOpDoesNotExist ResourceSelectorOperator = "DoesNotExist"
	// ResourceSelectorOpGt matches when the attribute is greater than the value.
	ResourceSelectorOpGt ResourceSelectorOperator = "Gt"
	// ResourceSelectorOpGtEq matches when the attribute is greater than or equal to the value.
	ResourceSelectorOpGtEq ResourceSelectorOperator = "GtEq"
	// ResourceSelectorOpLt matches when the attribute is less than the value.
	ResourceSelectorOpLt ResourceSelectorOperator = "Lt"
	// ResourceSelectorOpLtEq matches when the attribute is less than or equal to the value.
	ResourceSelectorOpLtEq ResourceSelectorOperator = "LtEq"
)

// ResourceClassStatus is the cluster-wide supply and use of a class. It holds
// no per-node breakdown: that would make every write cost O(nodes) (a 5000-node
// cluster's status near etcd's request limit, rewritten every second while
// pods bind). `kubectl resclass capacity --nodes` computes it on demand with
// the scheduler's own code.
type ResourceClassStatus struct {
	// Allocatable is the number of healthy devices in the cluster that the class selects.
	// For a share class (spec.share) it counts units instead: per healthy
	// device it selects with no sharing mode change waiting, the units of the
	// class that fit the device's sharing capacity.
	// +optional
	Allocatable resource.Quantity `json:"allocatable,omitempty"`

	// Requested is the number of those devices that a new pod of the class
	// cannot get: held by pods, whichever class they were taken through (a
	// device counts in every class that selects it), or kept for pods whose
	// assignment the scheduler does not believe. A hugepage pool counts as
	// requested when it has no free pages. For a share class, the units of
	// Allocatable that no longer fit what the devices have free.
	// +optional
	Requested resource.Quantity `json:"requested,omitempty"`

	// Available is Allocatable minus Requested: how many devices a new pod of
	// the class can still get in the cluster (for a share class, units: per
	// device, those that fit its free capacity; one container's units must
	// fit one device).
	// +optional
	Available resource.Quantity `json:"available,omitempty"`

	// Conditions of the class, e.g. whether any device matches at all.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ResourceClassList is a list of ResourceClasses.
//
// +kubebuilder:object:root=true
type ResourceClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ResourceClass `json:"items"`
}
