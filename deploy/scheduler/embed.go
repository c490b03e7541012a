// Package scheduler embeds the resclass scheduler's KubeSchedulerConfiguration,
// RBAC and admission policies, so that the e2e harness and the demo run the
// scheduler with the files this directory ships, under the identity they grant
// and within the policies that guard its hand-off.
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

// AssignmentPolicy is assignment-policy.yaml: the admission policies that let
// only the scheduler write the device hand-off annotations, and the scheduler
// nothing else of a pod.
//
//go:embed assignment-policy.yaml
var AssignmentPolicy []byte

// DRAConfig is dra/config.yaml: the stock kube-scheduler profile that serves
// class requests in the extended-resource form on DRA-mode nodes only.
//
//go:embed dra/config.yaml
var DRAConfig []byte

// DRARBAC is dra/rbac.yaml: the ServiceAccount of that profile's scheduler
// and its roles.
//
//go:embed dra/rbac.yaml
var DRARBAC []byte
