// Package quota implements the "covering quota" rule of the kube-apiserver's
// ResourceQuota admission plugin (its limitedResources configuration) for a
// validating admission webhook that sees pod CREATE requests.
//
// On managed clusters the apiserver's --admission-control-config-file cannot
// be set, so operators cannot tell the apiserver that, say, pods of priority
// class cluster-services may only be created in namespaces that have a
// ResourceQuota for them. The webhook enforces that rule instead, with the
// apiserver's own configuration file and the apiserver's own semantics:
//
//  1. The pod's limited scopes are the matchScopes of the limitedResources
//     entries for "pods" (API group "") that the pod matches.
//  2. A limited scope is covered when some ResourceQuota of the namespace has
//     a scope (spec.scopes or spec.scopeSelector) of the same scope name that
//     the pod matches. Coverage is by scope name, as upstream: a quota
//     "PriorityClass In [a]" covers a limited scope "PriorityClass Exists" for
//     a pod of class a, but not for a pod of class b (the pod does not match
//     the quota's scope).
//  3. The pod's limited resources are the resources it consumes (positive
//     quota usage, e.g. requests.example.com/gpu) whose name contains one of
//     the entries' matchContains strings. A limited resource is covered when a
//     ResourceQuota that matches the pod (all of its scopes match) lists it
//     in spec.hard.
//
// Resources are checked before scopes and the first failing check is
// reported, with the apiserver's messages ("insufficient quota to consume:
// ..." and "insufficient quota to match these scopes: ..."), so a pod gets
// the same answer from the webhook as it would from a self-managed
// apiserver configured with the same file.
//
// Parity comes from reuse, not re-implementation: configuration files are
// decoded by the ResourceQuota plugin's own scheme
// (k8s.io/apiserver/pkg/admission/plugin/resourcequota.LoadConfiguration,
// strict: unknown fields are errors) and pods are judged by the apiserver's
// pod quota evaluator (k8s.io/kubernetes/pkg/quota/v1/evaluator/core), whose
// MatchingScopes, Matches, MatchingResources, UncoveredQuotaScopes and Usage
// are what the plugin calls.
//
// Deliberate differences from the apiserver, each because the webhook's
// situation differs:
//   - A quota covers resources by spec.hard, not status.hard: the quota
//     existing is what this rule is about; the apiserver itself rejects pods
//     while a new quota's status is still unknown.
//   - The scope name CrossNamespaceAffinity (as written in an early proposal)
//     is accepted as an alias of CrossNamespacePodAffinity and normalized
//     after decoding, so denials name the upstream scope.
//   - A matchScopes entry without operator means Exists (upstream defines no
//     default; its evaluator ignores the operator of every scope except
//     PriorityClass and fails on an empty one for PriorityClass).
//   - Parse validates more than upstream (scope names, operators, values,
//     empty matchContains) and fails instead of silently allowing pods, as
//     the apiserver does when a configured scope cannot be evaluated.
//   - Only entries for pods are enforced. Other entries are accepted and
//     reported by Config.Warnings. (The apiserver also applies the matchScopes
//     of non-pod entries to pods; this package does not.)
//
// This package never counts usage and never compares usage against hard
// limits: that stays with the apiserver's ResourceQuota admission, which
// runs after the webhook on every request regardless.
package quota
