package handoff

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
)

// EnvClassDevicesPrefix starts the variable that names a class's devices
// (ClassEnv); docs/node-agent.md lists every variable a container gets.
//
// The kubelet merges the responses of every resource a container requests, and
// for environment variables the last one wins. So the variables that describe
// devices of a kind (NVIDIA_VISIBLE_DEVICES, RESCLASS_NIC_*, RESCLASS_HUGEPAGES_*,
// each kind's own: devicekind.Kind.ContainerEdits) name the kind's devices of
// every class the container was assigned, read from the assignment: each
// class's response then carries the same value, whatever order the kubelet
// merges them in. Only RESCLASS_DEVICES_<CLASS> is per class.
const EnvClassDevicesPrefix = "RESCLASS_DEVICES_"

// ClassEnv is the name of the variable holding a class's device ids:
// RESCLASS_DEVICES_ and the class name upper-cased, with each character that
// is not a letter or digit replaced by "_" (nvidia.high.mem:
// RESCLASS_DEVICES_NVIDIA_HIGH_MEM).
func ClassEnv(class string) string {
	return EnvClassDevicesPrefix + strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, class)
}

// response is what container m gets for its devices of class: the class's
// device ids, and each kind's container edits (in the registry's order).
func (a *Allocator) response(m match, class string) (*pluginapi.ContainerAllocateResponse, error) {
	resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{ClassEnv(class): strings.Join(m.devices, ",")}}
	for _, id := range m.devices {
		if a.device(id) == nil {
			return nil, fmt.Errorf("device %s of class %s is no longer on this node", id, class)
		}
	}
	e := devicekind.ContainerEdits{Env: resp.Envs}
	for _, k := range a.kinds.Kinds() {
		var mine []*v1alpha1.Device
		for _, id := range m.devices {
			if d := a.device(id); a.kinds.Kind(d.Kind) == k {
				mine = append(mine, d)
			}
		}
		if len(mine) == 0 {
			continue
		}
		if err := k.ContainerEdits(&a.handoff, mine, a.containerDevices(m, k), &e); err != nil {
			return nil, fmt.Errorf("devices of class %s: %w", class, err)
		}
	}
	resp.Devices = a.existing(e.DeviceNodes)
	for _, n := range e.CDIDevices {
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: n})
	}
	resp.Annotations = e.Annotations
	return resp, nil
}

// containerDevices are m's container's devices of kind k across all its
// classes, in assignment order (classes sorted): see the note on the
// environment above.
func (a *Allocator) containerDevices(m match, k devicekind.Kind) []*v1alpha1.Device {
	var out []*v1alpha1.Device
	for _, c := range m.pod.assignment.Containers {
		if c.Name != m.container {
			continue
		}
		for _, cl := range slices.Sorted(maps.Keys(c.Classes)) {
			for _, id := range c.Classes[cl] {
				if d := a.device(id); d != nil && a.kinds.Kind(d.Kind) == k && !slices.Contains(out, d) {
					out = append(out, d)
				}
			}
		}
	}
	return out
}

// existing hands over the device nodes the host has, read-write at the same
// path: a runtime fails a container whose device node is missing.
func (a *Allocator) existing(paths []string) []*pluginapi.DeviceSpec {
	var out []*pluginapi.DeviceSpec
	for _, p := range paths {
		if _, err := os.Stat(filepath.Join(a.cfg.HostRoot, p)); err == nil {
			out = append(out, &pluginapi.DeviceSpec{ContainerPath: p, HostPath: p, Permissions: "rw"})
		}
	}
	return out
}
