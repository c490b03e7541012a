package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Annotations the ResourceDistribution controller puts on every copy it makes.
const (
	// AnnotationDistributedBy names the distribution a copy belongs to,
	// "resource-distribution:<name>".
	AnnotationDistributedBy = "resclass.io/resource-distributed-by"
	// AnnotationDistributedTime is when the copy was last written (RFC 3339).
	AnnotationDistributedTime = "resclass.io/resource-distributed-time"
	// AnnotationContentHash is a hash of the distributed content, to decide
	// whether a copy needs an update.
	AnnotationContentHash = "resclass.io/resource-content-hash"
)

// The author record: the identity that wrote a ResourceDistribution's current
// spec, one annotation per field, each in a canonical form that an in-apiserver
// admission policy can build from the request's user and compare exactly
// (pkg/distribution.Author says the form; deploy/webhook/author-policy.yaml is
// the policy). resclass's mutating webhook writes them on a create and on an
// update that changes the spec; the policy refuses, with or without the
// webhook, a record that is not the requester's on such a write and any
// change of it on other writes. The controller writes a copy only where this
// identity may write the object itself (a SubjectAccessReview per namespace
// and verb; docs/distribution.md, "Authorization").
const (
	// AnnotationAuthorPrefix begins every annotation of the record: keys
	// with it other than the four below are refused on a spec write and
	// make the record invalid, so that a later field cannot be planted.
	AnnotationAuthorPrefix = "resclass.io/spec-author"
	// AnnotationAuthorUser is the user name, verbatim.
	AnnotationAuthorUser = AnnotationAuthorPrefix + ".user"
	// AnnotationAuthorUID is the user's UID, verbatim ("" when it has none).
	AnnotationAuthorUID = AnnotationAuthorPrefix + ".uid"
	// AnnotationAuthorGroups is the groups, escaped, deduplicated, sorted and
	// joined by ",".
	AnnotationAuthorGroups = AnnotationAuthorPrefix + ".groups"
	// AnnotationAuthorExtra is the extra attributes, "key=value,value"
	// escaped, sorted and joined by ";".
	AnnotationAuthorExtra = AnnotationAuthorPrefix + ".extra"
	// AnnotationAuthorJSON is where resclass before the record above kept
	// the author, as JSON, which no admission policy can check: the
	// controller no longer trusts it (docs/distribution.md, "Upgrading").
	AnnotationAuthorJSON = AnnotationAuthorPrefix
)

// ResourceDistribution copies one Secret or ConfigMap into many namespaces and keeps
// the copies in sync (OpenKruise's proposal, under resclass.io).
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=rsdist,categories=resclass
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=`.spec.resource.kind`
// +kubebuilder:printcolumn:name="Resource",type=string,JSONPath=`.spec.resource.metadata.name`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desired`
// +kubebuilder:printcolumn:name="Succeeded",type=integer,JSONPath=`.status.succeeded`
// +kubebuilder:printcolumn:name="Unauthorized",type=integer,JSONPath=`.status.unauthorized`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ResourceDistribution struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what to distribute and where.
	// +required
	Spec ResourceDistributionSpec `json:"spec"`

	// Status is written by the controller.
	// +optional
	Status ResourceDistributionStatus `json:"status,omitempty"`
}

// ResourceDistributionSpec is what to distribute and where.
type ResourceDistributionSpec struct {
	// Resource is the complete Secret or ConfigMap to distribute. Its apiVersion, kind
	// and name cannot change after creation.
	// +required
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:EmbeddedResource
	// +kubebuilder:validation:XValidation:rule="has(self.apiVersion) && self.apiVersion == 'v1' && has(self.kind) && self.kind in ['Secret', 'ConfigMap']",message="resource must be a v1 Secret or ConfigMap"
	// +kubebuilder:validation:XValidation:rule="has(self.metadata) && has(self.metadata.name) && size(self.metadata.name) > 0 && size(self.metadata.name) <= 253 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="resource.metadata.name is required and must be a DNS subdomain (lower case, digits, '-' and '.')"
	// +kubebuilder:validation:XValidation:rule="self.apiVersion == oldSelf.apiVersion && self.kind == oldSelf.kind && self.metadata.name == oldSelf.metadata.name",message="resource apiVersion, kind and metadata.name are immutable"
	Resource runtime.RawExtension `json:"resource"`

	// Targets selects the namespaces. With no option set, every namespace but
	// kube-system, kube-public and resclass's own (resclass-system); with
	// several, the intersection of their results.
	// +optional
	Targets ResourceDistributionTargets `json:"targets,omitempty"`
}

// ResourceDistributionTargets selects namespaces. kube-system, kube-public and
// resclass's own namespace are targeted only by includedNamespaces naming them
// (with no other option set): the excludedNamespaces rule and a label selector
// never reach them.
type ResourceDistributionTargets struct {
	// ExcludedNamespaces: every namespace except these.
	// +optional
	// +listType=map
	// +listMapKey=name
	ExcludedNamespaces []ResourceDistributionNamespace `json:"excludedNamespaces,omitempty"`

	// IncludedNamespaces: only these namespaces.
	// +optional
	// +listType=map
	// +listMapKey=name
	IncludedNamespaces []ResourceDistributionNamespace `json:"includedNamespaces,omitempty"`

	// NamespaceLabelSelector: the namespaces whose labels match.
	// +optional
	NamespaceLabelSelector *metav1.LabelSelector `json:"namespaceLabelSelector,omitempty"`
}

// ResourceDistributionNamespace names a namespace.
type ResourceDistributionNamespace struct {
	// Name of the namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
}

// ResourceDistributionStatus is what the controller observed and did.
type ResourceDistributionStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Description says, in a sentence, how the distribution stands.
	// +optional
	Description string `json:"description,omitempty"`

	// Desired is the number of target namespaces.
	// +optional
	Desired int32 `json:"desired,omitempty"`

	// Succeeded is the number of target namespaces holding an up-to-date copy.
	// +optional
	Succeeded int32 `json:"succeeded,omitempty"`

	// Distributed is the number of namespaces holding a copy: the up-to-date
	// ones and those the author may no longer update or delete.
	// +optional
	Distributed int32 `json:"distributed,omitempty"`

	// DistributedResources maps each namespace holding a copy to the copy's
	// resourceVersion: the first ones by name, as many as the controller's
	// --distribution-status-max-copies (default 1000), so that the status
	// stays far below etcd's request limit. When Distributed is larger, the
	// map leaves some out and admission treats every namespace not targeted
	// as one that may hold a copy (docs/distribution.md, "Where the copies
	// are").
	// +optional
	// +kubebuilder:validation:MaxProperties=10000
	DistributedResources map[string]string `json:"distributedResources,omitempty"`

	// Conflicting is the number of target namespaces holding a same-named
	// object this distribution does not own; it is left untouched there.
	// +optional
	Conflicting int32 `json:"conflicting,omitempty"`

	// ConflictingNamespaces names them, the first MaxConflictingNamespaces
	// (100) by name; Conflicting minus its length were left out, so that the
	// status stays small however many namespaces hold such an object.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=100
	ConflictingNamespaces []ResourceDistributionNamespace `json:"conflictingNamespaces,omitempty"`

	// Unauthorized is the number of namespaces where the distribution's
	// author may not make a write the copy needs (SubjectAccessReview), so
	// that write was not made.
	// +optional
	Unauthorized int32 `json:"unauthorized,omitempty"`

	// UnauthorizedNamespaces names them with the verb refused, the first
	// MaxUnauthorizedNamespaces (100) by name; Unauthorized minus its length
	// were left out, so that the status stays small however many namespaces
	// a distribution targets.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=100
	UnauthorizedNamespaces []ResourceDistributionUnauthorizedNamespace `json:"unauthorizedNamespaces,omitempty"`

	// AuthorSince is when the controller first saw the spec of
	// AuthorGeneration, and so its author record: the controller's
	// --distribution-author-max-age counts from it. Only the controller
	// writes the status, so no requester chooses it (docs/distribution.md,
	// "The author's groups, and when they are refreshed").
	// +optional
	AuthorSince *metav1.Time `json:"authorSince,omitempty"`

	// AuthorGeneration is the generation AuthorSince belongs to; a spec
	// written since (a new author record) starts a new AuthorSince.
	// +optional
	AuthorGeneration int64 `json:"authorGeneration,omitempty"`

	// Conditions of the distribution.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MaxUnauthorizedNamespaces bounds status.unauthorizedNamespaces.
const MaxUnauthorizedNamespaces = 100

// MaxConflictingNamespaces bounds status.conflictingNamespaces.
const MaxConflictingNamespaces = 100

// ResourceDistributionUnauthorizedNamespace is a namespace where the
// distribution's author may not make the write its copy needs.
type ResourceDistributionUnauthorizedNamespace struct {
	// Name of the namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`

	// Verb the author may not do there on the copy's kind: create (no copy
	// is made), update (the copy keeps its old content) or delete (the copy
	// stays).
	// +required
	// +kubebuilder:validation:Enum=create;update;delete
	Verb string `json:"verb"`

	// Reason says what was not written, and why.
	// +required
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason"`
}

// ResourceDistributionList is a list of ResourceDistributions.
//
// +kubebuilder:object:root=true
type ResourceDistributionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ResourceDistribution `json:"items"`
}
