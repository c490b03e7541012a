// Package gpuisolation judges whether a node keeps every container to the GPUs
// the scheduler assigned it, as far as the node agent can see, and says so as
// the GPUIsolation condition of the node's NodeDevices.
//
// Why it is needed: the NVIDIA container runtime (or its hook) injects the
// GPUs named by a container's NVIDIA_VISIBLE_DEVICES. Unless its
// config.toml sets accept-nvidia-visible-devices-envvar-when-unprivileged =
// false (the key's default is true), an unprivileged container that sets the
// variable itself, in its pod spec or its image's ENV, gets any GPU of the
// node, whatever the scheduler assigned. No admission policy can see an
// image's ENV, so only the runtime can close that route.
//
// How it is judged, in order:
//
//  1. Each configuration file the agent is told of (DefaultRuntimeConfigs:
//     where the toolkit's packages and the GPU operator put it) is read below
//     the host root, bounded (MaxRuntimeConfigSize, regular files only) and
//     parsed. Files not found are skipped.
//  2. A file that accepts the variable from unprivileged containers, or lacks
//     the key (the default accepts it), makes the node unisolated
//     (RuntimeAcceptsEnvVar). It wins over everything below: a route exists.
//  3. A node that publishes no GPU, and whose files prove nothing, has
//     nothing to isolate that the agent knows of (NoGPUs, status Unknown;
//     no Event, no kubectl line). Its files still count when they accept the
//     variable (2.): the agent may be unable to see GPUs that are there.
//  4. On a node with GPUs, the agent's own device-list strategy envvar names
//     them through that very variable, which works only on a runtime that
//     accepts it from any pod: unisolated (EnvVarStrategy).
//  5. A file that exists but cannot be read or parsed, or no file at all,
//     leaves the node unknown (RuntimeConfigUnreadable, RuntimeConfigInvalid,
//     RuntimeConfigNotFound): never isolated by default.
//  6. Otherwise every file found refuses the variable (and GPUs, if any, are
//     named through CDI): isolated, the only status True.
//
// What it cannot see: a runtime configured elsewhere than the files it is
// told of, or a runtime that is not NVIDIA's. docs/node-agent.md, "GPU
// isolation", says what an operator does about each verdict.
package gpuisolation

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConditionType is the NodeDevices condition this package writes.
const ConditionType = "GPUIsolation"

// The condition's reasons.
const (
	ReasonIsolated                = "Isolated"
	ReasonRuntimeAcceptsEnvVar    = "RuntimeAcceptsEnvVar"
	ReasonEnvVarStrategy          = "EnvVarStrategy"
	ReasonRuntimeConfigNotFound   = "RuntimeConfigNotFound"
	ReasonRuntimeConfigUnreadable = "RuntimeConfigUnreadable"
	ReasonRuntimeConfigInvalid    = "RuntimeConfigInvalid"
	ReasonNoGPUs                  = "NoGPUs"
)

// State is the verdict in one word: the agent's metric label and what the
// kubectl plugin reports.
type State string

const (
	StateIsolated   State = "isolated"
	StateUnisolated State = "unisolated"
	StateUnknown    State = "unknown"
	StateNoGPUs     State = "no-gpus"
)

// States are every State, in a fixed order (for a gauge per state).
var States = []State{StateIsolated, StateUnisolated, StateUnknown, StateNoGPUs}

// StateOf reads a GPUIsolation condition back as its State.
func StateOf(c metav1.Condition) State {
	switch {
	case c.Status == metav1.ConditionTrue:
		return StateIsolated
	case c.Status == metav1.ConditionFalse:
		return StateUnisolated
	case c.Reason == ReasonNoGPUs:
		return StateNoGPUs
	}
	return StateUnknown
}

// Runtime is what the configuration files say, read at one moment.
type Runtime struct {
	Files []File
}

// Check reads every file of paths (host paths) below hostRoot.
func Check(hostRoot string, paths []string) Runtime {
	r := Runtime{Files: make([]File, 0, len(paths))}
	for _, p := range paths {
		r.Files = append(r.Files, ReadRuntimeConfig(hostRoot, p))
	}
	return r
}

// Input is what the verdict needs besides the files.
type Input struct {
	// GPUs is how many GPUs the node publishes.
	GPUs int
	// EnvVarStrategy says the agent names GPUs through NVIDIA_VISIBLE_DEVICES
	// (its device-list strategy includes envvar).
	EnvVarStrategy bool
}

// Condition judges the node (see the package's doc for the order).
func (r Runtime) Condition(in Input) metav1.Condition {
	cond := func(status metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: ConditionType, Status: status, Reason: reason, Message: msg}
	}
	var accepting, refusing, notFound, broken []File
	for _, f := range r.Files {
		switch {
		case f.Status == FileRead && f.Config.AcceptEnvVarUnprivileged:
			accepting = append(accepting, f)
		case f.Status == FileRead:
			refusing = append(refusing, f)
		case f.Status == FileNotFound:
			notFound = append(notFound, f)
		default:
			broken = append(broken, f)
		}
	}
	strategy := ""
	if in.EnvVarStrategy {
		strategy = "; the agent's --device-list-strategy includes envvar, which needs exactly that: use cdi-cri"
	}

	switch {
	case len(accepting) > 0:
		return cond(metav1.ConditionFalse, ReasonRuntimeAcceptsEnvVar,
			"GPUs not isolated: the NVIDIA container runtime accepts NVIDIA_VISIBLE_DEVICES from unprivileged containers ("+
				describeAccepting(accepting)+"), so any pod may take any GPU of the node: set "+
				KeyAcceptEnvVarUnprivileged+" = false"+strategy)
	case in.GPUs == 0 && len(broken) > 0:
		return cond(metav1.ConditionUnknown, ReasonNoGPUs,
			"no GPUs published, nothing to isolate; "+describeBroken(broken))
	case in.GPUs == 0 && len(refusing) == 0:
		return cond(metav1.ConditionUnknown, ReasonNoGPUs,
			"no GPUs published, nothing to isolate; "+describeMissing(notFound))
	case in.GPUs > 0 && in.EnvVarStrategy:
		return cond(metav1.ConditionFalse, ReasonEnvVarStrategy,
			"GPUs not isolated: the agent's --device-list-strategy includes envvar: containers get their GPUs through NVIDIA_VISIBLE_DEVICES, "+
				"which works only on a runtime that accepts it from any pod: use cdi-cri and set "+KeyAcceptEnvVarUnprivileged+" = false")
	case len(broken) > 0:
		reason := ReasonRuntimeConfigInvalid
		if broken[0].Status == FileUnreadable {
			reason = ReasonRuntimeConfigUnreadable
		}
		return cond(metav1.ConditionUnknown, reason, "GPU isolation cannot be checked: "+describeBroken(broken))
	case len(refusing) == 0:
		return cond(metav1.ConditionUnknown, ReasonRuntimeConfigNotFound, "GPU isolation cannot be checked: "+describeMissing(notFound))
	}
	paths := make([]string, len(refusing))
	for i, f := range refusing {
		paths[i] = f.Path
	}
	return cond(metav1.ConditionTrue, ReasonIsolated,
		"the NVIDIA container runtime refuses NVIDIA_VISIBLE_DEVICES from unprivileged containers ("+
			strings.Join(paths, ", ")+": "+KeyAcceptEnvVarUnprivileged+" = false) and GPUs are named through CDI")
}

func describeAccepting(files []File) string {
	parts := make([]string, len(files))
	for i, f := range files {
		if f.Config.AcceptEnvVarDefaulted {
			parts[i] = fmt.Sprintf("%s has no %s, whose default is true", f.Path, KeyAcceptEnvVarUnprivileged)
		} else {
			parts[i] = fmt.Sprintf("%s: %s = true", f.Path, KeyAcceptEnvVarUnprivileged)
		}
	}
	return strings.Join(parts, "; ")
}

func describeBroken(files []File) string {
	parts := make([]string, len(files))
	for i, f := range files {
		parts[i] = fmt.Sprintf("%s is %s: %v", f.Path, f.Status, f.Err)
	}
	return strings.Join(parts, "; ")
}

func describeMissing(files []File) string {
	if len(files) == 0 {
		return "no NVIDIA container runtime configuration file is named (--nvidia-runtime-config)"
	}
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = f.Path
	}
	return "no NVIDIA container runtime configuration at " + strings.Join(paths, " or ") +
		" (a runtime without one accepts NVIDIA_VISIBLE_DEVICES from any pod; name the file the runtime reads with --nvidia-runtime-config)"
}
