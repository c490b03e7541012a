// Package nvml discovers NVIDIA GPUs through NVML and describes them as
// v1alpha1.Devices of kind nvidia-gpu, with the well-known attributes resource
// classes select on; the MIG devices of a GPU in MIG mode as devices of kind
// nvidia-mig (mig.go); and each GPU's NVLinks as attributes (nvlink.go).
//
// NVML is initialised by Open and its device handles are kept for the life of
// the Discoverer; Discover only reads through them, so nothing on a hot path loads
// the library or enumerates the bus. MIG devices and NVLink state are the
// exception: an operator can repartition a GPU, and a link can go down, while the
// node runs, so Discover reads them afresh each time. That is cheap enough because
// Discover runs on resync, not per pod. A node without the NVML library (no
// driver, or no GPU) is not an error storm: Open returns ErrUnavailable, and
// the caller reports it as a condition and opens again later (the driver may
// load after the agent, as the GPU operator's does); Discover returns
// ErrUnavailable once the driver went away, and the caller closes and opens
// again. Library (library.go) finds the library below a driver root and checks
// that it is NVML before anything calls into it.
//
// Discovery is per GPU: a GPU that NVML cannot describe is published unhealthy
// with the reason, by the UUID it had; one that never could be named (no
// handle, no UUID) is left out and listed by Unnamed.
package nvml

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/discovery/sysfs"
)

// ErrUnavailable means NVML cannot be used on this node: the library is missing or
// the driver is not loaded. It is the normal state of a node without GPUs.
var ErrUnavailable = errors.New("NVML is not available")

// AttributeDevicePath is the GPU's device node, e.g. /dev/nvidia3.
const AttributeDevicePath = "devicePath"

// ErrChanged means the driver answers for another number of GPUs than when
// NVML was opened: the handles are stale, and NVML must be opened again.
var ErrChanged = errors.New("the number of GPUs changed")

// Discoverer enumerates the GPUs of one node.
type Discoverer struct {
	lib      lib.Interface
	hostRoot string

	driverVersion     string
	cudaDriverVersion string
	// slots are the GPUs by NVML index.
	slots []slot
	// unnamed are the GPUs the last Discover left out, by index and why.
	unnamed []string
	// faults keeps the faults the health watcher saw across restarts; nil
	// keeps none.
	faults *FaultFile
}

// KeepFaults keeps the GPUs' faults in f (faults.go): the health watcher
// records and clears them, and Discover publishes a GPU with a kept fault
// unhealthy.
func (d *Discoverer) KeepFaults(f *FaultFile) { d.faults = f }

// slot is one GPU: its handle, nil while NVML refuses one, and its UUID once
// read, which names it even when NVML can no longer read it.
type slot struct {
	dev  lib.Device
	uuid string
}

// Open initialises NVML through l (Library.Load on a node; a mock in tests) and keeps
// a handle per GPU. hostRoot prefixes the sysfs paths read for NUMA affinity ("/"
// on a node). Close releases NVML.
func Open(l lib.Interface, hostRoot string) (*Discoverer, error) {
	if ret := l.Init(); ret != lib.SUCCESS {
		if unavailable(ret) {
			return nil, fmt.Errorf("%w: %s", ErrUnavailable, ret.Error())
		}
		return nil, fmt.Errorf("initialising NVML: %s", ret.Error())
	}
	d := &Discoverer{lib: l, hostRoot: hostRoot}
	fail := func(what string, ret lib.Return) (*Discoverer, error) {
		_ = l.Shutdown()
		return nil, fmt.Errorf("NVML %s: %s", what, ret.Error())
	}
	var ret lib.Return
	if d.driverVersion, ret = l.SystemGetDriverVersion(); ret != lib.SUCCESS {
		return fail("driver version", ret)
	}
	cuda, ret := l.SystemGetCudaDriverVersion()
	if ret != lib.SUCCESS {
		return fail("CUDA driver version", ret)
	}
	// NVML encodes CUDA 12.4 as 12040.
	d.cudaDriverVersion = fmt.Sprintf("%d.%d", cuda/1000, cuda%1000/10)
	n, ret := l.DeviceGetCount()
	if ret != lib.SUCCESS {
		return fail("device count", ret)
	}
	// A GPU whose handle or UUID cannot be read is no reason to give up the
	// others: Discover tries it again.
	d.slots = make([]slot, n)
	for i := range d.slots {
		d.name(i)
	}
	return d, nil
}

// name reads the handle and UUID of GPU i where they are still missing, and
// returns why it cannot be named, "" when it can.
func (d *Discoverer) name(i int) string {
	s := &d.slots[i]
	if s.dev == nil {
		dev, ret := d.lib.DeviceGetHandleByIndex(i)
		if ret != lib.SUCCESS {
			return "handle: " + ret.Error()
		}
		s.dev = dev
	}
	if s.uuid == "" {
		uuid, ret := s.dev.GetUUID()
		if ret != lib.SUCCESS {
			return "UUID: " + ret.Error()
		}
		s.uuid = uuid
	}
	return ""
}

// unavailable reports the answers that mean NVML as a whole is gone: the
// driver was unloaded (an upgrade, the GPU operator's driver container
// restarting), or the library was.
func unavailable(ret lib.Return) bool {
	switch ret {
	case lib.ERROR_LIBRARY_NOT_FOUND, lib.ERROR_DRIVER_NOT_LOADED, lib.ERROR_UNINITIALIZED, lib.ERROR_NO_PERMISSION:
		return true
	}
	return false
}

// Close shuts NVML down.
func (d *Discoverer) Close() error {
	if ret := d.lib.Shutdown(); ret != lib.SUCCESS {
		return fmt.Errorf("NVML shutdown: %s", ret.Error())
	}
	return nil
}

// Discover describes every GPU, each followed by its MIG devices when it is in
// MIG mode. A GPU that NVML cannot describe (it fell off the bus, say) is still
// listed, by the UUID it had, as unhealthy with the reason; one that could never
// be named (NVML gave no handle or no UUID for it yet) is left out, and Unnamed
// says which and why. The error is ErrUnavailable when the driver went away,
// ErrChanged when the GPUs changed: either way this Discoverer is done, and the
// caller closes it and opens NVML again.
func (d *Discoverer) Discover() ([]v1alpha1.Device, error) {
	n, ret := d.lib.DeviceGetCount()
	switch {
	case unavailable(ret):
		return nil, fmt.Errorf("%w: %s", ErrUnavailable, ret.Error())
	case ret != lib.SUCCESS:
		return nil, fmt.Errorf("NVML device count: %s", ret.Error())
	case n != len(d.slots):
		return nil, fmt.Errorf("%w: NVML was opened with %d, the driver now reports %d", ErrChanged, len(d.slots), n)
	}
	d.unnamed = d.unnamed[:0]
	gpus := make([]v1alpha1.Device, 0, len(d.slots))
	devs := make([]lib.Device, 0, len(d.slots))
	for i := range d.slots {
		if why := d.name(i); why != "" && d.slots[i].uuid == "" {
			d.unnamed = append(d.unnamed, fmt.Sprintf("GPU %d: %s", i, why))
			continue
		}
		gpus = append(gpus, d.describe(d.slots[i]))
		devs = append(devs, d.slots[i].dev)
	}
	// NVLink peers are named by UUID, so every GPU is described first.
	d.addNVLinks(devs, gpus)
	out := make([]v1alpha1.Device, 0, len(gpus))
	for i := range gpus {
		migs := d.migDevices(devs[i], &gpus[i])
		out = append(out, gpus[i])
		out = append(out, migs...)
	}
	return out, nil
}

// Unnamed lists the GPUs the last Discover left out because they cannot be
// named ("GPU 3: handle: Unknown Error"), for the caller's condition.
func (d *Discoverer) Unnamed() []string {
	return slices.Clone(d.unnamed)
}

func (d *Discoverer) describe(s slot) v1alpha1.Device {
	dev := s.dev
	gpu := v1alpha1.Device{ID: s.uuid, Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{}}
	attrs := gpu.Attributes
	// Each attribute is read on its own: one that this GPU or driver does not
	// support is left out rather than failing the GPU.
	var p problems
	attrs[v1alpha1.AttributeDriverVersion] = v1alpha1.VersionAttribute(d.driverVersion)
	attrs[v1alpha1.AttributeCUDADriverVersion] = v1alpha1.VersionAttribute(d.cudaDriverVersion)
	if name, ret := dev.GetName(); p.check("name", ret) {
		attrs[v1alpha1.AttributeProduct] = v1alpha1.StringAttribute(name)
	}
	if brand, ret := dev.GetBrand(); p.check("brand", ret) {
		attrs[v1alpha1.AttributeBrand] = v1alpha1.StringAttribute(brandName(brand))
	}
	if arch, ret := dev.GetArchitecture(); p.check("architecture", ret) {
		attrs[v1alpha1.AttributeArchitecture] = v1alpha1.StringAttribute(architectureName(arch))
	}
	if mem, ret := dev.GetMemoryInfo(); p.check("memory", ret) {
		attrs[v1alpha1.AttributeMemory] = v1alpha1.QuantityAttribute(*resource.NewQuantity(int64(mem.Total), resource.BinarySI))
	}
	if major, minor, ret := dev.GetCudaComputeCapability(); p.check("compute capability", ret) {
		attrs[v1alpha1.AttributeComputeCapability] = v1alpha1.VersionAttribute(fmt.Sprintf("%d.%d", major, minor))
	}
	// A GPU in MIG mode stays listed, with migEnabled=true: the scheduler does not
	// allocate it whole, only its MIG devices, but it is still the GPU that is
	// there (and the parent the MIG devices name).
	if current, _, ret := dev.GetMigMode(); p.check("MIG mode", ret) {
		attrs[v1alpha1.AttributeMIGEnabled] = v1alpha1.BoolAttribute(current == lib.DEVICE_MIG_ENABLE)
	} else if ret == lib.ERROR_NOT_SUPPORTED {
		attrs[v1alpha1.AttributeMIGEnabled] = v1alpha1.BoolAttribute(false)
	}
	if index, ret := dev.GetIndex(); p.check("index", ret) {
		attrs[v1alpha1.AttributeIndex] = v1alpha1.IntAttribute(int64(index))
	}
	if minor, ret := dev.GetMinorNumber(); p.check("minor number", ret) {
		attrs[v1alpha1.AttributeMinor] = v1alpha1.IntAttribute(int64(minor))
		attrs[AttributeDevicePath] = v1alpha1.StringAttribute("/dev/nvidia" + strconv.Itoa(minor))
	}
	if pci, ret := dev.GetPciInfo(); p.check("PCI info", ret) {
		if busID := pciBusID(pci); busID != "" {
			attrs[v1alpha1.AttributePCIAddress] = v1alpha1.StringAttribute(busID)
			if numa, ok := d.numaNode(busID); ok {
				attrs[v1alpha1.AttributeNUMANode] = v1alpha1.IntAttribute(numa)
			}
			// Where it sits in the PCIe tree, for the scheduler's Topology
			// strategy; a path of another shape publishes none.
			if loc, err := sysfs.PCIeTopology(d.hostRoot, busID); err == nil {
				attrs[v1alpha1.AttributePCIeRoot] = v1alpha1.StringAttribute(loc.Root)
				if loc.Switch != "" {
					attrs[v1alpha1.AttributePCIeSwitch] = v1alpha1.StringAttribute(loc.Switch)
				}
			}
		}
	}
	// The UUID it had names it; that NVML no longer answers for it says it
	// is not fit to hand out.
	if _, ret := dev.GetUUID(); ret != lib.SUCCESS {
		p.add("UUID", ret.Error())
	}
	p.report(&gpu)
	// What a re-probe cannot see is kept (faults.go); what it can, asked:
	// a restarted agent publishes neither GPU healthy.
	for _, why := range []string{pendingRepair(dev), d.keptFault(s.uuid)} {
		if why == "" {
			continue
		}
		if gpu.Healthy {
			gpu.Healthy, gpu.Reason = false, why
		} else {
			gpu.Reason += "; " + why
		}
	}
	return gpu
}

// keptFault is the reason of the GPU's kept fault, "" when none is kept.
func (d *Discoverer) keptFault(uuid string) string {
	if f, ok := d.faults.Get(uuid); ok {
		return f.Reason
	}
	return ""
}

// problems collects what NVML failed to read about one device.
type problems []string

// check reports whether ret is SUCCESS, and records any other answer but
// NOT_SUPPORTED as a problem: what a GPU or driver does not support is left out,
// it is no fault.
func (p *problems) check(what string, ret lib.Return) bool {
	switch ret {
	case lib.SUCCESS:
		return true
	case lib.ERROR_NOT_SUPPORTED:
	default:
		p.add(what, ret.Error())
	}
	return false
}

func (p *problems) add(what, why string) {
	*p = append(*p, what+": "+why)
}

// report marks dev unhealthy when there were problems, after any reason it
// already has.
func (p problems) report(dev *v1alpha1.Device) {
	if len(p) == 0 {
		return
	}
	dev.Healthy = false
	if dev.Reason == "" {
		dev.Reason = "NVML: " + strings.Join(p, "; ")
	} else {
		dev.Reason += "; " + strings.Join(p, "; ")
	}
}

// pciBusID returns the domain:bus:device.function address in the lower-case form
// sysfs and lspci use ("0000:3b:00.0"); NVML reports "00000000:3B:00.0". Anything
// but hex digits, ':' and '.' means the id is unusable, and "" is returned.
func pciBusID(pci lib.PciInfo) string {
	var b []byte
	for _, c := range pci.BusId {
		switch {
		case c == 0:
			return normalizeBusID(string(b))
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f', c == ':', c == '.':
			b = append(b, c)
		case c >= 'A' && c <= 'F':
			b = append(b, c+'a'-'A')
		default:
			return ""
		}
	}
	return normalizeBusID(string(b))
}

// normalizeBusID shortens NVML's 8-digit PCI domain to the 4 digits sysfs uses.
func normalizeBusID(id string) string {
	if parts := strings.SplitN(id, ":", 2); len(parts) == 2 && len(parts[0]) > 4 {
		return parts[0][len(parts[0])-4:] + ":" + parts[1]
	}
	return id
}

// numaNode reads the GPU's NUMA node from sysfs; the kernel reports -1 where the
// platform has none, which is not a node.
func (d *Discoverer) numaNode(busID string) (int64, bool) {
	n, ok := sysfs.ReadInt(filepath.Join(d.hostRoot, "sys/bus/pci/devices", busID, "numa_node"))
	return n, ok && n >= 0
}

func brandName(b lib.BrandType) string {
	switch b {
	case lib.BRAND_NVIDIA:
		return "Nvidia"
	case lib.BRAND_TESLA:
		return "Tesla"
	case lib.BRAND_QUADRO:
		return "Quadro"
	case lib.BRAND_GEFORCE:
		return "GeForce"
	case lib.BRAND_TITAN:
		return "Titan"
	case lib.BRAND_NVIDIA_RTX:
		return "NvidiaRTX"
	case lib.BRAND_GRID:
		return "Grid"
	}
	return "Unknown"
}

func architectureName(a lib.DeviceArchitecture) string {
	switch a {
	case lib.DEVICE_ARCH_KEPLER:
		return "Kepler"
	case lib.DEVICE_ARCH_MAXWELL:
		return "Maxwell"
	case lib.DEVICE_ARCH_PASCAL:
		return "Pascal"
	case lib.DEVICE_ARCH_VOLTA:
		return "Volta"
	case lib.DEVICE_ARCH_TURING:
		return "Turing"
	case lib.DEVICE_ARCH_AMPERE:
		return "Ampere"
	case lib.DEVICE_ARCH_ADA:
		return "Ada"
	case lib.DEVICE_ARCH_HOPPER:
		return "Hopper"
	}
	return "Unknown"
}
