package handoff

import (
	"fmt"
	"hash/fnv"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/cdispec"
)

// The environment a container gets (docs/node-agent.md lists them all).
//
// The kubelet merges the responses of every resource a container requests, and
// for environment variables the last one wins. So the variables that describe
// devices of a kind (NVIDIA_VISIBLE_DEVICES, RESCLASS_NIC_*, RESCLASS_HUGEPAGES_*)
// name the kind's devices of every class the container was assigned, read from
// the assignment: each class's response then carries the same value, whatever
// order the kubelet merges them in. Only RESCLASS_DEVICES_<CLASS> is per class.
const (
	EnvNvidiaVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	EnvClassDevicesPrefix   = "RESCLASS_DEVICES_"
	EnvNICPCIAddresses      = "RESCLASS_NIC_PCI_ADDRESSES"
	EnvNICInterfaces        = "RESCLASS_NIC_INTERFACES"
	EnvHugePagesPool        = "RESCLASS_HUGEPAGES_POOL"
	EnvHugePagesSize        = "RESCLASS_HUGEPAGES_SIZE"
	EnvHugePagesNUMANode    = "RESCLASS_HUGEPAGES_NUMA_NODE"
)

// cdiAnnotationPlugin is the plugin part of the cdi.k8s.io/ annotation key
// (cdi.AnnotationKey: "vendor.device-type" by convention).
const cdiAnnotationPlugin = "resclass.io.gpu"

// nvidiaControlDevices are the device nodes every CUDA container needs besides
// its GPUs'.
var nvidiaControlDevices = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}

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

// response is what container m gets for its devices of class.
func (a *Allocator) response(m match, class string) (*pluginapi.ContainerAllocateResponse, error) {
	resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{ClassEnv(class): strings.Join(m.devices, ",")}}
	// Every device of the container, by kind, in assignment order (classes
	// sorted): see the note on the environment above.
	byKind := map[string][]*v1alpha1.Device{}
	for _, c := range m.pod.assignment.Containers {
		if c.Name != m.container {
			continue
		}
		for _, cl := range slices.Sorted(maps.Keys(c.Classes)) {
			for _, id := range c.Classes[cl] {
				if d := a.device(id); d != nil && !slices.Contains(byKind[d.Kind], d) {
					byKind[d.Kind] = append(byKind[d.Kind], d)
				}
			}
		}
	}
	var gpus, nics, pools []*v1alpha1.Device
	for _, id := range m.devices {
		d := a.device(id)
		if d == nil {
			return nil, fmt.Errorf("device %s of class %s is no longer on this node", id, class)
		}
		switch d.Kind {
		case v1alpha1.DeviceKindNvidiaGPU, v1alpha1.DeviceKindNvidiaMIG:
			gpus = append(gpus, d)
		case v1alpha1.DeviceKindNIC:
			nics = append(nics, d)
		case v1alpha1.DeviceKindHugePages:
			pools = append(pools, d)
		}
	}
	if len(gpus) > 0 {
		all := slices.Concat(byKind[v1alpha1.DeviceKindNvidiaGPU], byKind[v1alpha1.DeviceKindNvidiaMIG])
		strategies := a.cfg.DeviceListStrategies
		if strategies.Has(StrategyEnvVar) {
			resp.Envs[EnvNvidiaVisibleDevices] = joinIDs(all)
			resp.Devices = a.gpuDeviceNodes(gpus)
		}
		names := make([]string, len(gpus))
		for i, d := range gpus {
			names[i] = cdispec.DeviceName(d.ID)
		}
		if strategies.Has(StrategyCDICRI) {
			for _, n := range names {
				resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: n})
			}
		}
		if strategies.Has(StrategyCDIAnnotations) {
			key, err := cdiAnnotationKey(gpus[0].ID)
			if err != nil {
				return nil, err
			}
			value, err := cdi.AnnotationValue(names)
			if err != nil {
				return nil, fmt.Errorf("CDI annotation of class %s: %w", class, err)
			}
			resp.Annotations = map[string]string{key: value}
		}
	}
	if len(nics) > 0 {
		all := byKind[v1alpha1.DeviceKindNIC]
		resp.Envs[EnvNICPCIAddresses] = joinIDs(all)
		var names []string
		for _, d := range all {
			if s := stringAttr(d, v1alpha1.AttributeInterface); s != "" {
				names = append(names, s)
			}
		}
		if len(names) > 0 {
			resp.Envs[EnvNICInterfaces] = strings.Join(names, ",")
		}
		resp.Devices = append(resp.Devices, a.vfioDeviceNodes(nics)...)
	}
	if len(pools) > 0 {
		all := byKind[v1alpha1.DeviceKindHugePages]
		var sizes, numa []string
		for _, d := range all {
			if q := d.Attributes[v1alpha1.AttributeSize].QuantityValue; q != nil {
				sizes = append(sizes, q.String())
			}
			if n := d.Attributes[v1alpha1.AttributeNUMANode].IntValue; n != nil {
				numa = append(numa, strconv.FormatInt(*n, 10))
			}
		}
		resp.Envs[EnvHugePagesPool] = joinIDs(all)
		resp.Envs[EnvHugePagesSize] = strings.Join(sizes, ",")
		// Absent for machine-wide pools: there is no node to name.
		if len(numa) == len(all) {
			resp.Envs[EnvHugePagesNUMANode] = strings.Join(numa, ",")
		}
	}
	return resp, nil
}

// gpuDeviceNodes lists the device nodes of gpus (a MIG device's are its
// parent's) and the control devices, each only if the host has it: a runtime
// fails a container whose device node is missing, and NVIDIA's runtime or CDI
// injects them anyway where the driver is installed.
func (a *Allocator) gpuDeviceNodes(gpus []*v1alpha1.Device) []*pluginapi.DeviceSpec {
	var paths []string
	for _, d := range gpus {
		src := d
		if d.Kind == v1alpha1.DeviceKindNvidiaMIG {
			src = a.device(stringAttr(d, v1alpha1.AttributeParent))
		}
		if src == nil {
			continue
		}
		if n := src.Attributes[v1alpha1.AttributeMinor].IntValue; n != nil {
			if p := "/dev/nvidia" + strconv.FormatInt(*n, 10); !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
		}
	}
	return a.existing(append(paths, nvidiaControlDevices...))
}

// vfioDeviceNodes: a NIC bound to vfio-pci is used through its IOMMU group's
// device node and the VFIO container device.
func (a *Allocator) vfioDeviceNodes(nics []*v1alpha1.Device) []*pluginapi.DeviceSpec {
	var paths []string
	for _, d := range nics {
		if stringAttr(d, v1alpha1.AttributeDriver) != "vfio-pci" {
			continue
		}
		group, err := os.Readlink(filepath.Join(a.cfg.HostRoot, "sys/bus/pci/devices", d.ID, "iommu_group"))
		if err != nil {
			continue
		}
		if p := "/dev/vfio/" + filepath.Base(group); !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		return nil
	}
	return a.existing(append([]string{"/dev/vfio/vfio"}, paths...))
}

func (a *Allocator) existing(paths []string) []*pluginapi.DeviceSpec {
	var out []*pluginapi.DeviceSpec
	for _, p := range paths {
		if _, err := os.Stat(filepath.Join(a.cfg.HostRoot, p)); err == nil {
			out = append(out, &pluginapi.DeviceSpec{ContainerPath: p, HostPath: p, Permissions: "rw"})
		}
	}
	return out
}

// cdiAnnotationKey is the annotation key of a class's response. The kubelet
// merges the annotations of all classes of a container, so each class needs
// its own key: its first device's id is unique in the container. An id too
// long or odd for a key (at most 63 characters with the plugin part) is
// hashed.
func cdiAnnotationKey(firstID string) (string, error) {
	if key, err := cdi.AnnotationKey(cdiAnnotationPlugin, firstID); err == nil {
		return key, nil
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(firstID))
	return cdi.AnnotationKey(cdiAnnotationPlugin, strconv.FormatUint(h.Sum64(), 16))
}

func joinIDs(devices []*v1alpha1.Device) string {
	ids := make([]string, len(devices))
	for i, d := range devices {
		ids[i] = d.ID
	}
	return strings.Join(ids, ",")
}

func stringAttr(d *v1alpha1.Device, name string) string {
	if v := d.Attributes[name].StringValue; v != nil {
		return *v
	}
	return ""
}
