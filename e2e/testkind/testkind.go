// Package testkind is a device kind that exists only in the e2e tests: a
// made-up FPGA read from a sysfs-like directory. It proves that adding a kind
// is one package and one registration line (docs/architecture.md, "Adding a
// kind"): TestDeviceKindSeam registers it with
//
//	nodeagent.Config{Kinds: kinds.Builtin.With(testkind.Kind{})}
//
// and the node agent discovers, labels and hands it off, and the real
// scheduler places it, without a change to any other package. The scheduler
// binary does not know the kind: an unknown kind is counted as exclusive
// devices, which this one is.
package testkind

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
)

const (
	// Name is the Device.Kind of the kind.
	Name = "e2e-fpga"
	// Dir is where, below the host root, each FPGA is a directory holding
	// the files "cells" (logic cells) and "minor" (its device node's minor).
	Dir = "sys/class/e2e-fpga"
	// AttributeCells is the number of logic cells (int).
	AttributeCells = "logicCells"
	// EnvVisible names the container's FPGAs (every class's).
	EnvVisible = "E2E_FPGA_VISIBLE_DEVICES"
	// LabelCount is the number of FPGAs on the node.
	LabelCount = devicekind.LabelPrefix + "e2e-fpga.count"
	// Condition reports whether FPGA discovery works on the node.
	Condition = "E2EFPGAsDiscovered"
)

// Kind is the e2e-fpga kind.
type Kind struct{}

var (
	_ devicekind.Kind   = Kind{}
	_ devicekind.Poller = Kind{}
)

// Names: one kind.
func (Kind) Names() []string { return []string{Name} }

// Attributes: the logic cells.
func (Kind) Attributes() map[string]v1alpha1.AttributeType {
	return map[string]v1alpha1.AttributeType{AttributeCells: v1alpha1.AttributeTypeInt}
}

// Discover lists the directories under Dir.
func (Kind) Discover(opts devicekind.DiscoverOptions) ([]v1alpha1.Device, metav1.Condition) {
	entries, err := os.ReadDir(filepath.Join(opts.HostRoot, Dir))
	var out []v1alpha1.Device
	for _, e := range entries {
		dir := filepath.Join(opts.HostRoot, Dir, e.Name())
		d := v1alpha1.Device{ID: "fpga-" + e.Name(), Kind: Name, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{}}
		for file, attr := range map[string]string{"cells": AttributeCells, "minor": v1alpha1.AttributeMinor} {
			b, rerr := os.ReadFile(filepath.Join(dir, file))
			n, perr := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			if rerr != nil || perr != nil {
				d.Healthy, d.Reason = false, "cannot read "+file
				continue
			}
			d.Attributes[attr] = v1alpha1.IntAttribute(n)
		}
		out = append(out, d)
	}
	return out, devicekind.DiscoveryCondition(Condition, err, fmt.Sprintf("%d FPGAs", len(out)))
}

// Allocation: one pod per FPGA.
func (Kind) Allocation(*v1alpha1.Device) devicekind.Allocation { return devicekind.Exclusive }

// LabelKeys lists the label of the kind.
func (Kind) LabelKeys() []string { return []string{LabelCount} }

// Labels count the FPGAs.
func (Kind) Labels(devices []*v1alpha1.Device) map[string]string {
	return map[string]string{LabelCount: strconv.Itoa(len(devices))}
}

// Summarize: NodeDevices has no FPGA column.
func (Kind) Summarize(s v1alpha1.DeviceSummary, _ *v1alpha1.Device) v1alpha1.DeviceSummary {
	return s
}

// ContainerEdits name every FPGA of the container and hand over the class's
// device nodes.
func (Kind) ContainerEdits(_ *devicekind.Handoff, class, all []*v1alpha1.Device, e *devicekind.ContainerEdits) error {
	ids := make([]string, len(all))
	for i, d := range all {
		ids[i] = d.ID
	}
	e.Env[EnvVisible] = strings.Join(ids, ",")
	for _, d := range class {
		if n := d.Attributes[v1alpha1.AttributeMinor].IntValue; n != nil {
			if p := "/dev/e2e-fpga" + strconv.FormatInt(*n, 10); !slices.Contains(e.DeviceNodes, p) {
				e.DeviceNodes = append(e.DeviceNodes, p)
			}
		}
	}
	return nil
}
