package handoff

import (
	"fmt"
	"slices"
	"strings"
)

// DeviceListStrategy is how a container's GPUs reach the container runtime,
// as NVIDIA's device plugin calls it (its --device-list-strategy):
//
//   - envvar: NVIDIA_VISIBLE_DEVICES and the device nodes. NVIDIA's container
//     runtime (or its hook) reads the variable and injects the driver; every
//     runtime gets the device nodes.
//   - cdi-cri: the CDI names in the CRI field of the Allocate response
//     (ContainerAllocateResponse.CdiDevices), which the kubelet passes in
//     CreateContainer's CDIDevices. Needs a runtime with CDI enabled
//     (containerd 1.7+ with enable_cdi, 2.x by default; CRI-O).
//   - cdi-annotations: the same names in a cdi.k8s.io/ container annotation,
//     for runtimes that read CDI requests from annotations only (containerd
//     1.7 before the kubelet's CRI field existed, CRI-O).
//
// With a CDI strategy the agent writes the CDI spec that resolves the names
// (pkg/cdispec), and sends no device nodes of its own for GPUs: the spec has
// them. Strategies combine, as in NVIDIA's plugin (envvar,cdi-cri).
//
// cdi-cri is the default (issue 35): envvar works only where NVIDIA's runtime
// takes NVIDIA_VISIBLE_DEVICES from unprivileged containers, and such a
// runtime takes it from every container, so any pod that sets the variable
// (or whose image does) gets the node's GPUs whatever the scheduler assigned.
// A CDI name reaches the runtime only from the kubelet, which has it from the
// agent, so a hardened runtime (docs/node-agent.md, "GPU isolation") loses
// nothing with it.
type DeviceListStrategy string

const (
	StrategyEnvVar         DeviceListStrategy = "envvar"
	StrategyCDICRI         DeviceListStrategy = "cdi-cri"
	StrategyCDIAnnotations DeviceListStrategy = "cdi-annotations"
)

// Strategies are the device-list strategies in force; empty means
// DefaultStrategy.
type Strategies []DeviceListStrategy

// DefaultStrategy is the strategy in force when none is set.
const DefaultStrategy = StrategyCDICRI

var knownStrategies = []DeviceListStrategy{StrategyEnvVar, StrategyCDICRI, StrategyCDIAnnotations}

// maxStrategyValue bounds what ParseStrategies reads: the longest valid
// value is all three, comma-separated.
const maxStrategyValue = 256

// ParseStrategies reads a comma-separated list of strategies
// ("envvar", "cdi-cri,envvar"). Duplicates count once; an unknown or empty
// entry is an error naming it.
func ParseStrategies(s string) (Strategies, error) {
	if len(s) > maxStrategyValue {
		return nil, fmt.Errorf("device list strategy: %d bytes, at most %d", len(s), maxStrategyValue)
	}
	var out Strategies
	for part := range strings.SplitSeq(s, ",") {
		st := DeviceListStrategy(strings.TrimSpace(part))
		if !slices.Contains(knownStrategies, st) {
			return nil, fmt.Errorf("device list strategy %q: want one or more of envvar, cdi-cri, cdi-annotations, comma-separated", part)
		}
		if !slices.Contains(out, st) {
			out = append(out, st)
		}
	}
	return out, nil
}

// Has says whether st is in force (DefaultStrategy when none is set).
func (s Strategies) Has(st DeviceListStrategy) bool {
	if len(s) == 0 {
		return st == DefaultStrategy
	}
	return slices.Contains(s, st)
}

// Isolated says whether the strategies keep a container to the GPUs the
// scheduler assigned it on a node whose runtime is hardened: false with
// envvar, alone or beside a CDI strategy, because the response then relies on
// a runtime that reads NVIDIA_VISIBLE_DEVICES from unprivileged containers,
// and such a runtime reads it from any container that sets it itself. The
// agent reports an unisolated node at start (a Warning Event on its Node);
// the check of the node's runtime configuration reads the same answer.
func (s Strategies) Isolated() bool { return !s.Has(StrategyEnvVar) }

// CDI says whether a CDI strategy is in force, so that the spec must be
// written.
func (s Strategies) CDI() bool { return s.Has(StrategyCDICRI) || s.Has(StrategyCDIAnnotations) }

// String is the comma-separated list.
func (s Strategies) String() string {
	if len(s) == 0 {
		return string(DefaultStrategy)
	}
	parts := make([]string, len(s))
	for i, st := range s {
		parts[i] = string(st)
	}
	return strings.Join(parts, ",")
}

// Set implements pflag.Value.
func (s *Strategies) Set(v string) error {
	parsed, err := ParseStrategies(v)
	if err != nil {
		return err
	}
	*s = parsed
	return nil
}

// Type implements pflag.Value.
func (s *Strategies) Type() string { return "strategies" }
