// Package nvidiagpu is the device kind of NVIDIA GPUs and their MIG devices:
// their attributes, node labels, how the scheduler counts them, what a
// container gets and the devices of the CDI spec, and their discovery as a
// devicekind.Opener, whose source the node agent opens, retries and watches
// for health.
//
// The source is NVML, loaded through cgo, which the scheduler, the webhook
// and kubectl-resclass, asking this kind too, must not link (a binary that
// links Go's plugin package, as kubectl-resclass does, binds every symbol at
// start and would not start without libnvidia-ml). So it lives apart, in
// nvmlsource, and the agent gives it to the kind: Kind{NVML:
// &nvmlsource.NVML{...}}.
package nvidiagpu

import (
	"errors"
	"fmt"
	"hash/fnv"
	"path"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/cdispec"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvlink"
	"github.com/resclass/resclass/pkg/mig"
	"github.com/resclass/resclass/pkg/mpsstate"
)

// EnvVisibleDevices names the container's GPUs and MIG devices (every class's)
// for NVIDIA's container runtime, with the envvar device-list strategy.
const EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"

// The node labels of the kind.
const (
	// LabelCount is the number of GPUs (whole GPUs, MIG mode or not).
	LabelCount = devicekind.LabelPrefix + "gpu.count"
	// LabelProduct is the GPUs' product name with spaces as dashes
	// ("NVIDIA-A100-SXM4-40GB"), or "mixed" when the node has several.
	LabelProduct = devicekind.LabelPrefix + "gpu.product"
	// LabelMemory is the memory of the node's smallest GPU ("40Gi").
	LabelMemory = devicekind.LabelPrefix + "gpu.memory"
	// LabelMIG is "true" when a GPU is in MIG mode.
	LabelMIG = devicekind.LabelPrefix + "gpu.mig"
	// LabelMPS is "true" while a GPU of the node is in MPS mode: the MPS
	// control DaemonSet runs on the nodes it marks (docs/sharing.md). It is
	// the mode in force, not the one asked for: a GPU leaving MPS keeps its
	// daemon until the last client is gone.
	LabelMPS = devicekind.LabelPrefix + "gpu-sharing-mps"
)

// The environment of a container given an MPS share (docs/sharing.md): the
// server's pipe directory and the client limits of its share.
const (
	EnvMPSPipeDirectory = "CUDA_MPS_PIPE_DIRECTORY"
	EnvMPSMemLimit      = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	EnvMPSThreads       = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
)

// cdiAnnotationPlugin is the plugin part of the cdi.k8s.io/ annotation key
// (cdi.AnnotationKey: "vendor.device-type" by convention).
const cdiAnnotationPlugin = "resclass.io.gpu"

// controlDevices are the device nodes every CUDA container needs besides its
// GPUs'.
var controlDevices = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}

// Condition reports whether GPU discovery through NVML works on the node.
const Condition = "NVMLAvailable"

// Kind is the nvidia-gpu kind. NVML is how the node agent reads the GPUs
// (nvmlsource.NVML); nil in the binaries that do not discover.
//
// MPSDir is the host directory of the MPS control daemons
// (mpsstate.DefaultDir when empty): a container given an MPS share mounts
// its GPU's pipe directory and the clients' /dev/shm from it.
type Kind struct {
	NVML   NVML
	MPSDir string
}

// NVML is the kind's source (package nvmlsource).
type NVML interface {
	Open(opts devicekind.DiscoverOptions) (devicekind.Source, error)
	NotOpen(err error) metav1.Condition
}

// Slicer creates and destroys MIG slices on GPUs marked for dynamic MIG
// (docs/mig.md): the NVML source, open, implements it. A source's
// description never shows a slice half made: creation and description
// exclude each other, so the agent's own repartition never marks a GPU
// unhealthy.
type Slicer interface {
	// CreateSlice creates the slice of profile at start on gpu (as
	// described) and describes its MIG device; a placement taken is
	// mig.ErrPlacementTaken.
	CreateSlice(gpu *v1alpha1.Device, profile string, start int) (gpuInstance uint32, device v1alpha1.Device, err error)
	// DestroySlice destroys GPU instance gpuInstance of GPU gpu and its
	// compute instances; one already gone is no error.
	DestroySlice(gpu string, gpuInstance uint32) error
	// SliceInstances lists gpu's GPU instances.
	SliceInstances(gpu *v1alpha1.Device) ([]mig.Existing, error)
}

// errNoSource is why the GPUs are not discovered by a kind without a source.
var errNoSource = errors.New("NVML is not available: no NVML source in this binary")

// SourceName names NVML in metrics and logs.
func (Kind) SourceName() string { return "nvml" }

// Open opens NVML through the kind's source.
func (k Kind) Open(opts devicekind.DiscoverOptions) (devicekind.Source, error) {
	if k.NVML == nil {
		return nil, errNoSource
	}
	return k.NVML.Open(opts)
}

// NotOpen says why NVML is not open.
func (k Kind) NotOpen(err error) metav1.Condition {
	if k.NVML == nil {
		return metav1.Condition{Type: Condition, Status: metav1.ConditionFalse, Reason: "Unavailable", Message: err.Error()}
	}
	return k.NVML.NotOpen(err)
}

var (
	_ devicekind.Kind            = Kind{}
	_ devicekind.Opener          = Kind{}
	_ devicekind.HealthInheritor = Kind{}
	_ devicekind.CDIKind         = Kind{}
	_ devicekind.ShareEditor     = Kind{}
)

// PeerLinks, ParsePeerLinks and MaxNVLinks are the nvlinkPeerLinks codec
// (package nvlink), for the scheduler, which reads GPUs through this kind.
type PeerLinks = nvlink.PeerLinks

// ParsePeerLinks reads a nvlinkPeerLinks value.
func ParsePeerLinks(s string) (PeerLinks, error) { return nvlink.ParsePeerLinks(s) }

// MaxNVLinks bounds the links of one pair of GPUs.
const MaxNVLinks = nvlink.MaxNVLinks

// PeerIndex is the index by which the nvlinkPeerLinks of other GPUs name d:
// its NVML index, when d is a whole GPU (a MIG device is no NVLink peer).
func PeerIndex(d *v1alpha1.Device) (int64, bool) {
	if v := d.Attributes[v1alpha1.AttributeIndex].IntValue; v != nil && d.Kind == v1alpha1.DeviceKindNvidiaGPU {
		return *v, true
	}
	return 0, false
}

// InheritedHealth: a MIG device is unhealthy when its GPU is; NVML reports
// faults per GPU.
func (Kind) InheritedHealth(d *v1alpha1.Device, unhealthy func(id string) (string, bool)) (string, bool) {
	if d.Kind != v1alpha1.DeviceKindNvidiaMIG {
		return "", false
	}
	parent := d.Attributes[v1alpha1.AttributeParent].StringValue
	if parent == nil {
		return "", false
	}
	if reason, sick := unhealthy(*parent); sick {
		return "GPU " + *parent + ": " + reason, true
	}
	return "", false
}

// Names: GPUs and the MIG devices of GPUs in MIG mode.
func (Kind) Names() []string {
	return []string{v1alpha1.DeviceKindNvidiaGPU, v1alpha1.DeviceKindNvidiaMIG}
}

// Attributes are what NVML discovery publishes.
func (Kind) Attributes() map[string]v1alpha1.AttributeType {
	return map[string]v1alpha1.AttributeType{
		v1alpha1.AttributeMemory:            v1alpha1.AttributeTypeQuantity,
		v1alpha1.AttributeProduct:           v1alpha1.AttributeTypeString,
		v1alpha1.AttributeBrand:             v1alpha1.AttributeTypeString,
		v1alpha1.AttributeArchitecture:      v1alpha1.AttributeTypeString,
		v1alpha1.AttributeComputeCapability: v1alpha1.AttributeTypeVersion,
		v1alpha1.AttributeDriverVersion:     v1alpha1.AttributeTypeVersion,
		v1alpha1.AttributeCUDADriverVersion: v1alpha1.AttributeTypeVersion,
		v1alpha1.AttributeMIGEnabled:        v1alpha1.AttributeTypeBool,
		v1alpha1.AttributeIndex:             v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeMinor:             v1alpha1.AttributeTypeInt,
		v1alpha1.AttributePCIAddress:        v1alpha1.AttributeTypeString,
		v1alpha1.AttributeNUMANode:          v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeParent:            v1alpha1.AttributeTypeString,
		v1alpha1.AttributeMIGProfile:        v1alpha1.AttributeTypeString,
		v1alpha1.AttributeGPUInstanceID:     v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeComputeInstanceID: v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeMultiprocessors:   v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeDecoders:          v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeJPEGs:             v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeOFAs:              v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeNVLinkPeers:       v1alpha1.AttributeTypeString,
		v1alpha1.AttributeNVLinks:           v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeNVLinkPeerLinks:   v1alpha1.AttributeTypeString,
		v1alpha1.AttributePCIeRoot:          v1alpha1.AttributeTypeString,
		v1alpha1.AttributePCIeSwitch:        v1alpha1.AttributeTypeString,
	}
}

// Allocation: a GPU in MIG mode is served through its MIG devices; giving the
// whole GPU too would hand the same silicon to two pods. A GPU in a sharing
// mode serves shares (MIG devices are not shared: MPS on MIG is not
// supported).
func (Kind) Allocation(d *v1alpha1.Device) devicekind.Allocation {
	if d.Kind != v1alpha1.DeviceKindNvidiaGPU {
		return devicekind.Exclusive
	}
	if b := d.Attributes[v1alpha1.AttributeMIGEnabled].BoolValue; b != nil && *b {
		return devicekind.Unallocatable
	}
	if d.Sharing != nil && d.Sharing.Mode.Shares() {
		return devicekind.Shared
	}
	return devicekind.Exclusive
}

// LabelKeys lists the labels of the kind.
func (Kind) LabelKeys() []string {
	return []string{LabelCount, LabelProduct, LabelMemory, LabelMIG, LabelMPS}
}

// Labels summarise the whole GPUs (MIG devices are not counted).
func (Kind) Labels(devices []*v1alpha1.Device) map[string]string {
	labels := map[string]string{}
	var (
		gpus      int
		products  = map[string]bool{}
		productOK = true
		minMemory *resource.Quantity
		mig       bool
		mps       bool
	)
	for _, d := range devices {
		if d.Kind != v1alpha1.DeviceKindNvidiaGPU {
			continue
		}
		a := d.Attributes
		gpus++
		if p := a[v1alpha1.AttributeProduct].StringValue; p != nil {
			products[*p] = true
		} else {
			productOK = false
		}
		if m := a[v1alpha1.AttributeMemory].QuantityValue; m != nil && (minMemory == nil || m.Cmp(*minMemory) < 0) {
			minMemory = m
		}
		if b := a[v1alpha1.AttributeMIGEnabled].BoolValue; b != nil && *b {
			mig = true
		}
		if d.Sharing != nil && d.Sharing.Mode == v1alpha1.SharingMPS {
			mps = true
		}
	}
	if gpus == 0 {
		return labels
	}
	labels[LabelCount] = strconv.Itoa(gpus)
	switch {
	case len(products) == 1 && productOK:
		for p := range products {
			if v := devicekind.LabelValue(p); v != "" {
				labels[LabelProduct] = v
			}
		}
	case len(products) > 1:
		labels[LabelProduct] = "mixed"
	}
	if minMemory != nil {
		labels[LabelMemory] = minMemory.String()
	}
	if mig {
		labels[LabelMIG] = "true"
	}
	if mps {
		labels[LabelMPS] = "true"
	}
	return labels
}

// Summarize counts whole GPUs.
func (Kind) Summarize(s v1alpha1.DeviceSummary, d *v1alpha1.Device) v1alpha1.DeviceSummary {
	if d.Kind == v1alpha1.DeviceKindNvidiaGPU {
		s.GPUs++
	}
	return s
}

// ContainerEdits follow the device-list strategies: envvar sets
// NVIDIA_VISIBLE_DEVICES (every class's GPUs of the container: the kubelet
// merges the classes' responses, the last one wins) and the device nodes;
// cdi-cri and cdi-annotations name the devices in the CDI spec the agent
// writes (pkg/cdispec).
func (Kind) ContainerEdits(h *devicekind.Handoff, class, all []*v1alpha1.Device, e *devicekind.ContainerEdits) error {
	if h.EnvVar {
		e.Env[EnvVisibleDevices] = joinIDs(gpusFirst(all))
		e.AddDeviceNodes(deviceNodes(h, class))
	}
	if !h.CDICRI && !h.CDIAnnotations {
		return nil
	}
	names := make([]string, len(class))
	for i, d := range class {
		names[i] = cdispec.DeviceName(d.ID)
	}
	if h.CDICRI {
		e.CDIDevices = append(e.CDIDevices, names...)
	}
	if h.CDIAnnotations {
		key, err := cdiAnnotationKey(class[0].ID)
		if err != nil {
			return err
		}
		value, err := cdi.AnnotationValue(names)
		if err != nil {
			return fmt.Errorf("CDI annotation: %w", err)
		}
		if e.Annotations == nil {
			e.Annotations = map[string]string{}
		}
		e.Annotations[key] = value
	}
	return nil
}

// ShareEdits: a share of a GPU in MPS mode is an MPS client of the GPU's
// server: its pipe directory and the clients' /dev/shm, mounted from the
// host's MPSDir, and the share's limits as client limits (soft:
// docs/sharing.md, "Enforcement"). The memory limit names device 0: an MPS
// client sees only the devices of its server, which serves this GPU alone.
// A container's MPS shares must all be of one GPU, as one pipe directory
// serves it. Nothing for a GPU time-sliced: its shares are accounting only.
func (k Kind) ShareEdits(_ *devicekind.Handoff, d *v1alpha1.Device, share map[string]int64, e *devicekind.ContainerEdits) error {
	if d.Sharing == nil || d.Sharing.Mode != v1alpha1.SharingMPS {
		return nil
	}
	pipe := path.Join(mpsstate.DefaultDir, d.ID, mpsstate.PipeDir)
	if other, ok := e.Env[EnvMPSPipeDirectory]; ok && other != pipe {
		return fmt.Errorf("the container's MPS shares are of two GPUs (%s and %s): an MPS client has one server", other, pipe)
	}
	dir := k.MPSDir
	if dir == "" {
		dir = mpsstate.DefaultDir
	}
	e.Env[EnvMPSPipeDirectory] = pipe
	e.Mounts = append(e.Mounts,
		devicekind.Mount{HostPath: path.Join(dir, d.ID, mpsstate.PipeDir), ContainerPath: pipe},
		devicekind.Mount{HostPath: path.Join(dir, mpsstate.ShmDir), ContainerPath: "/dev/shm"},
	)
	if m := share[v1alpha1.CapacityMemory]; m > 0 {
		// Whole MiB, at least one: the variable takes no bytes.
		e.Env[EnvMPSMemLimit] = "0=" + strconv.FormatInt(max(m>>20, 1), 10) + "M"
	}
	if c := share[v1alpha1.CapacityCompute]; c > 0 {
		e.Env[EnvMPSThreads] = strconv.FormatInt(c, 10)
	}
	return nil
}

// CDIDeviceNodes: a GPU's device node; a MIG device's are its GPU's and the
// access capabilities of its GPU instance and compute instance. A device
// whose numbers are not published is left out.
func (Kind) CDIDeviceNodes(h *devicekind.CDIHost, d *v1alpha1.Device) ([]string, bool) {
	switch d.Kind {
	case v1alpha1.DeviceKindNvidiaGPU:
		minor := d.Attributes[v1alpha1.AttributeMinor].IntValue
		if minor == nil {
			return nil, false
		}
		return []string{"/dev/nvidia" + strconv.FormatInt(*minor, 10)}, true
	case v1alpha1.DeviceKindNvidiaMIG:
		var parent *v1alpha1.Device
		if p := d.Attributes[v1alpha1.AttributeParent].StringValue; p != nil {
			parent = h.Device(*p)
		}
		if parent == nil {
			return nil, false
		}
		minor := parent.Attributes[v1alpha1.AttributeMinor].IntValue
		gi := d.Attributes[v1alpha1.AttributeGPUInstanceID].IntValue
		ci := d.Attributes[v1alpha1.AttributeComputeInstanceID].IntValue
		if minor == nil || gi == nil || ci == nil {
			return nil, false
		}
		nodes := []string{"/dev/nvidia" + strconv.FormatInt(*minor, 10)}
		// A MIG device is used through its GPU instance's and compute
		// instance's access capabilities.
		for _, c := range []string{
			fmt.Sprintf("gpu%d/gi%d/access", *minor, *gi),
			fmt.Sprintf("gpu%d/gi%d/ci%d/access", *minor, *gi, *ci),
		} {
			if m, ok := h.CapabilityMinor(c); ok {
				nodes = append(nodes, "/dev/nvidia-caps/nvidia-cap"+strconv.FormatUint(uint64(m), 10))
			}
		}
		return nodes, true
	}
	return nil, false
}

// gpusFirst orders devices GPUs first, then MIG devices, each in the order
// given; without MIG devices (the common case) it returns devices as they are.
func gpusFirst(devices []*v1alpha1.Device) []*v1alpha1.Device {
	if !slices.ContainsFunc(devices, func(d *v1alpha1.Device) bool { return d.Kind == v1alpha1.DeviceKindNvidiaMIG }) {
		return devices
	}
	out := make([]*v1alpha1.Device, 0, len(devices))
	for _, kind := range []string{v1alpha1.DeviceKindNvidiaGPU, v1alpha1.DeviceKindNvidiaMIG} {
		for _, d := range devices {
			if d.Kind == kind {
				out = append(out, d)
			}
		}
	}
	return out
}

// deviceNodes lists the device nodes of gpus (a MIG device's are its
// parent's) and the control devices; the hand-off keeps those the host has:
// a runtime fails a container whose device node is missing, and NVIDIA's
// runtime or CDI injects them anyway where the driver is installed.
func deviceNodes(h *devicekind.Handoff, gpus []*v1alpha1.Device) []string {
	var paths []string
	for _, d := range gpus {
		src := d
		if d.Kind == v1alpha1.DeviceKindNvidiaMIG {
			src = nil
			if p := d.Attributes[v1alpha1.AttributeParent].StringValue; p != nil {
				src = h.Device(*p)
			}
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
	return append(paths, controlDevices...)
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
