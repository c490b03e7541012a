// Package scheduler embeds the resclass scheduler's KubeSchedulerConfiguration,
// and RBAC, so that the e2e harness and the demo run the scheduler with the
// files this directory ships, under the identity they grant.
package scheduler

import _ "embed"

// Config is config.yaml.
//
//go:embed config.yaml
var Config []byte

// RBAC is rbac.yaml: the scheduler's ServiceAccount and its roles.
//
//go:embed rbac.yaml
var RBAC []byte
