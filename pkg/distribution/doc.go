// Package distribution is the ResourceDistribution controller (Reconciler) and
// what it shares with the webhook: reading a distribution's spec (which
// namespaces, what object), building the copies, and asking whether a
// distribution's author may write them (Author, Authorizer).
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
//   - excludedNamespaces: every namespace except the protected ones (kube-system,
//     kube-public and resclass's own) and the listed ones. It is also the default:
//     with no option set, the distribution goes to every namespace but the
//     protected ones.
//   - includedNamespaces: exactly the listed namespaces. The protected namespaces
//     are only excluded by the excludedNamespaces and selector rules, so listing
//     kube-system here alone targets it; combined with another option it is
//     dropped again.
//   - namespaceLabelSelector: the namespaces whose labels match, but the
//     protected ones. An empty selector ({}) is set and matches every namespace.
//
// A namespace that is being deleted is never a target: nothing can be created in it.
// See Targets.
//
// # Copies
//
// Every copy carries the resource's own labels and annotations plus the
// distribution's: an owner reference to the distribution (controller, so deleting
// the distribution garbage-collects its copies), the label LabelDistribution (so a
// controller can cache and watch only copies, and only their metadata), and the annotations
// v1alpha1.AnnotationDistributedBy, AnnotationDistributedTime and
// AnnotationContentHash. See Resource.Copy.
//
// The content hash (Resource.Hash) covers what a copy holds (kind, type, data,
// binaryData, immutable, the resource's labels and annotations) and decides whether
// a copy needs an update: a copy whose recorded hash equals the resource's is left
// alone (Resource.UpToDate). As the seed asks, a copy edited directly is therefore
// not reverted; it is rewritten when the distribution's resource changes.
//
// # Authorization
//
// A distribution writes a copy only where its author could write it. The
// author is the identity in the v1alpha1.AnnotationAuthorPrefix annotations,
// recorded by resclass's admission webhook from the request that wrote the
// current spec and bound to that request by an admission policy in the
// apiserver (see Author).
// Before each create, update and delete of a copy the Reconciler asks the
// apiserver whether that identity may do the same (Authorizer, a
// SubjectAccessReview cached for a few seconds), and where not, writes
// nothing and says so in the ConditionAuthorized condition and an Event.
package distribution
