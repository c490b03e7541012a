// Package distribution embeds the ResourceDistribution controller's RBAC and
// admission policy, so that the e2e harness and the demo run the controller
// under the identity they grant and within the policy that fences its
// writes.
package distribution

import _ "embed"

// RBAC is rbac.yaml: the controller's ServiceAccount and its roles.
//
//go:embed rbac.yaml
var RBAC []byte

// Policy is policy.yaml: the admission policies that let the controller write
// only ResourceDistribution copies, and an ownerReference be added to a
// distribution only by who may delete it and its copies.
//
//go:embed policy.yaml
var Policy []byte
