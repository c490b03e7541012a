package handoff

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
)

// NewHandoff is what the kinds' container edits read: the host root, the
// device-list strategies in force and how to look a device up. The
// device-plugin path (Allocator) and the DRA path (pkg/draplugin) build it the
// same way, so that a container gets the same thing through either.
func NewHandoff(hostRoot string, strategies Strategies, device func(id string) *v1alpha1.Device) devicekind.Handoff {
	if hostRoot == "" {
		hostRoot = "/"
	}
	return devicekind.Handoff{
		HostRoot:       hostRoot,
		EnvVar:         strategies.Has(StrategyEnvVar),
		CDICRI:         strategies.Has(StrategyCDICRI),
		CDIAnnotations: strategies.Has(StrategyCDIAnnotations),
		Device:         device,
	}
}

// Edits is what a container gets for its devices of class: the class's device
// ids in RESCLASS_DEVICES_<CLASS>, then each kind's container edits in the
// registry's order. classDevices are the class's devices (h.Device must know
// each); all returns the container's devices of a kind across all its classes
// (see the note on EnvClassDevicesPrefix). It is the one implementation of
// "what a container gets": the device-plugin Allocate answer and the DRA
// plugin's CDI spec are both built from it. Device nodes are host paths, not
// yet checked for existence (ExistingDeviceNodes).
func Edits(kinds *devicekind.Registry, h *devicekind.Handoff, class string, classDevices []string, all func(devicekind.Kind) []*v1alpha1.Device) (devicekind.ContainerEdits, error) {
	e := devicekind.ContainerEdits{Env: map[string]string{ClassEnv(class): strings.Join(classDevices, ",")}}
	devices := make([]*v1alpha1.Device, len(classDevices))
	for i, id := range classDevices {
		if devices[i] = h.Device(id); devices[i] == nil {
			return e, fmt.Errorf("device %s of class %s is no longer on this node", id, class)
		}
	}
	for _, k := range kinds.Kinds() {
		var mine []*v1alpha1.Device
		for _, d := range devices {
			if kinds.Kind(d.Kind) == k {
				mine = append(mine, d)
			}
		}
		if len(mine) == 0 {
			continue
		}
		if err := k.ContainerEdits(h, mine, all(k), &e); err != nil {
			return e, fmt.Errorf("devices of class %s: %w", class, err)
		}
	}
	return e, nil
}

// ExistingDeviceNodes keeps the device nodes the host has (below hostRoot): a
// runtime fails a container whose device node is missing.
func ExistingDeviceNodes(hostRoot string, paths []string) []string {
	var out []string
	for _, p := range paths {
		if _, err := os.Stat(filepath.Join(hostRoot, p)); err == nil {
			out = append(out, p)
		}
	}
	return out
}
