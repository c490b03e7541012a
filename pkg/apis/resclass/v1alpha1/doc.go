// Package v1alpha1 is the resclass.io/v1alpha1 API: ResourceClass, NodeDevices and
// ResourceDistribution.
//
// +kubebuilder:object:generate=true
// +groupName=resclass.io
package v1alpha1
