package handoff

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/mig"
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

// response is what container m gets for its devices of class: Edits, in the
// kubelet's terms.
func (a *Allocator) response(m match, class string, made map[string]*v1alpha1.Device) (*pluginapi.ContainerAllocateResponse, error) {
	// A MIG slice made for the container is its MIG device from here on.
	h := a.handoff
	h.Device = func(id string) *v1alpha1.Device {
		if d := made[id]; d != nil {
			return d
		}
		return a.device(id)
	}
	devices := make([]string, len(m.devices))
	for i, id := range m.devices {
		devices[i] = id
		if d := made[id]; d != nil {
			devices[i] = d.ID
		}
	}
	e, err := Edits(a.kinds, &h, class, devices, func(k devicekind.Kind) []*v1alpha1.Device { return a.containerDevices(m, k, h.Device) })
	if err != nil {
		return nil, err
	}
	// Every class's response carries the container's shares, as its devices
	// of each kind (the note above).
	for _, c := range m.pod.assignment.Containers {
		if c.Name == m.container {
			if err := ShareEdits(a.kinds, &a.handoff, c.Shares, c.Classes, &e); err != nil {
				return nil, err
			}
		}
	}
	resp := &pluginapi.ContainerAllocateResponse{Envs: e.Env, Annotations: e.Annotations}
	for _, p := range ExistingDeviceNodes(a.cfg.HostRoot, e.DeviceNodes) {
		resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: p, HostPath: p, Permissions: "rw"})
	}
	for _, n := range e.CDIDevices {
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: n})
	}
	for _, mnt := range e.Mounts {
		resp.Mounts = append(resp.Mounts, &pluginapi.Mount{ContainerPath: mnt.ContainerPath, HostPath: mnt.HostPath, ReadOnly: mnt.ReadOnly})
	}
	return resp, nil
}

// containerDevices are m's container's devices of kind k across all its
// classes, in assignment order (classes sorted): see the note on the
// environment above.
func (a *Allocator) containerDevices(m match, k devicekind.Kind, device func(string) *v1alpha1.Device) []*v1alpha1.Device {
	var out []*v1alpha1.Device
	for _, c := range m.pod.assignment.Containers {
		if c.Name != m.container {
			continue
		}
		for _, cl := range slices.Sorted(maps.Keys(c.Classes)) {
			for _, id := range c.Classes[cl] {
				if d := device(id); d != nil && a.kinds.Kind(d.Kind) == k && !slices.Contains(out, d) {
					out = append(out, d)
				}
			}
		}
	}
	return out
}

// ReasonMIGSliceFailed is the reason of the Warning Event on a pod whose MIG
// slice could not be made.
const ReasonMIGSliceFailed = "MIGSliceFailed"

// makeSlices makes every MIG slice m's container is assigned, of every
// class: each class's answer names the container's devices of every class
// (the note above), so the first Allocate makes them all. It returns the
// MIG device of each, by slice id.
func (a *Allocator) makeSlices(ctx context.Context, m match) (map[string]*v1alpha1.Device, error) {
	var made map[string]*v1alpha1.Device
	for _, c := range m.pod.assignment.Containers {
		if c.Name != m.container {
			continue
		}
		for _, cl := range slices.Sorted(maps.Keys(c.Classes)) {
			for _, id := range c.Classes[cl] {
				if _, _, _, ok := mig.ParseSliceID(id); !ok {
					continue
				}
				if a.cfg.Slices == nil {
					return nil, fmt.Errorf("MIG slice %s: this node agent makes no MIG slices", id)
				}
				d, err := a.cfg.Slices.Ensure(ctx, m.pod.UID, id)
				if err != nil {
					return nil, fmt.Errorf("MIG slice %s: %w", id, err)
				}
				if made == nil {
					made = map[string]*v1alpha1.Device{}
				}
				made[id] = d
			}
		}
	}
	return made, nil
}
