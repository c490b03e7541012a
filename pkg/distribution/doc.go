// Package distribution is the pure half of the ResourceDistribution controller and
// webhook: it reads a distribution's spec (which namespaces, what object) and builds
// the copies, without talking to the API server.
//
// A ResourceDistribution copies one Secret or ConfigMap (spec.resource, a complete
// v1 object without a namespace) into many namespaces and keeps the copies in sync.
//
// # Targets
//
// Each option of spec.targets that is set selects a set of namespaces, and the
// distribution goes to the INTERSECTION of the sets of all the options set (the
// seed proposal's "special case 3"):
//
//   - excludedNamespaces: every namespace except kube-system, kube-public and the
//     listed ones. It is also the default: with no option set, the distribution goes
//     to every namespace except kube-system and kube-public.
//   - includedNamespaces: exactly the listed namespaces. kube-system and kube-public
//     are only excluded by the excludedNamespaces rule, so listing kube-system here
//     alone targets it; combined with excludedNamespaces it is dropped again.
//   - namespaceLabelSelector: the namespaces whose labels match. An empty selector
//     ({}) is set and matches every namespace.
//
// A namespace that is being deleted is never a target: nothing can be created in it.
// See Targets.
//
// # Copies
//
// Every copy carries the resource's own labels and annotations plus the
// distribution's: an owner reference to the distribution (controller, so deleting
// the distribution garbage-collects its copies), the label LabelDistribution (so a
// controller can cache and watch only copies), and the annotations
// v1alpha1.AnnotationDistributedBy, AnnotationDistributedTime and
// AnnotationContentHash. See Resource.Copy.
//
// The content hash (Resource.Hash) covers what a copy holds (kind, type, data,
// binaryData, immutable, the resource's labels and annotations) and decides whether
// a copy needs an update: a copy whose recorded hash equals the resource's is left
// alone (Resource.UpToDate). As the seed asks, a copy edited directly is therefore
// not reverted; it is rewritten when the distribution's resource changes.
package distribution
