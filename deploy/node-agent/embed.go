// Package nodeagent embeds the node agent's admission policies that the e2e
// harness and the demo install with every cluster, so that every test's pods
// are admitted (or refused) by the files this directory ships.
package nodeagent

import _ "embed"

// GPUIsolationPolicy is gpu-isolation-policy.yaml: no pod picks its own GPUs
// through NVIDIA_* variables or cdi.k8s.io/ annotations.
//
//go:embed gpu-isolation-policy.yaml
var GPUIsolationPolicy []byte
