// Package devicekind is the seam between the code that is the same for every
// device and what a kind of device ("nvidia-gpu", "nic", "huge-pages") means:
// one Kind per package (pkg/devicekind/nvidiagpu, nic, hugepages), listed in a
// Registry (pkg/devicekind/kinds). The node agent, the scheduler and the
// selector ask the registry; none of them switches on kind names.
//
// The shape follows NVIDIA's k8s-device-plugin (one resource manager per
// device type) and the DRA example driver (one Profile per kind: enumerate
// devices, turn an allocation into container edits). docs/architecture.md
// ("Device kinds") describes the contract and walks through adding a kind.
//
// A device whose kind no registered Kind publishes is still published,
// selected and handed out: it is an exclusive device with no well-known
// attributes, no node labels, and a container gets only its ids
// (RESCLASS_DEVICES_<CLASS>). So the scheduler and the webhook need a kind
// registered only when it is not exclusive or has typed attributes.
package devicekind

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// Kind is one kind of device: everything the three binaries need to know
// about it beyond the NodeDevices API.
type Kind interface {
	// Names are the Device.Kind values the kind publishes, its own name
	// first: nvidia-gpu also publishes the MIG devices of its GPUs
	// (nvidia-mig).
	Names() []string
	// Attributes are its well-known attributes and their types. A device
	// publishing one with another type has a problem (the scheduler gives it
	// to nobody), and a ResourceClass value for one of these keys must parse
	// as the type. Kinds may share an attribute (numaNode) only with the same
	// type.
	Attributes() map[string]v1alpha1.AttributeType
	// Allocation says how the scheduler counts d.
	Allocation(d *v1alpha1.Device) Allocation
	// LabelKeys are the node labels the kind may set.
	LabelKeys() []string
	// Labels summarises the node's devices of the kind as node labels (keys
	// from LabelKeys; none when it has no device).
	Labels(devices []*v1alpha1.Device) map[string]string
	// Summarize returns s with d counted in the NodeDevices summary
	// (kubectl get nodedevices' columns); a kind without a column returns s.
	// Values, not a pointer: the summary is built at every poll and a
	// pointer passed to an interface method escapes to the heap.
	Summarize(s v1alpha1.DeviceSummary, d *v1alpha1.Device) v1alpha1.DeviceSummary
	// ContainerEdits adds to e what a container gets for devices of the
	// kind: class are those of the class being allocated, all are the
	// container's devices of the kind across all its classes, in assignment
	// order. e.Env is never nil; e.Annotations may be.
	ContainerEdits(h *Handoff, class, all []*v1alpha1.Device, e *ContainerEdits) error
}

// Poller is a Kind the node agent discovers by reading the host at every poll
// (sysfs: cheap). A kind read through a library that is opened once and
// watched for health (NVML) is an Opener instead.
type Poller interface {
	// Discover lists the kind's devices on the host, with the condition the
	// NodeDevices status reports for it (type, and True when discovery
	// worked). It is called at every poll.
	Discover(opts DiscoverOptions) ([]v1alpha1.Device, metav1.Condition)
}

// Opener is a Kind discovered through a source with a lifecycle of its own:
// a library opened once, whose devices are watched for health between
// descriptions (NVML). The node agent opens it at start and, while it does
// not open, again with backoff; it describes the devices after opening and at
// every resync, watches their health while it is open, and closes it when a
// description finds it gone (then opens it again) and when the agent stops.
type Opener interface {
	// SourceName names the source in metrics and logs ("nvml").
	SourceName() string
	// Open opens the source; the error says why it did not, and the agent
	// tries again.
	Open(opts DiscoverOptions) (Source, error)
	// NotOpen is the condition the NodeDevices status reports while the
	// source is not open, err saying why.
	NotOpen(err error) metav1.Condition
}

// Source is an Opener's open source.
type Source interface {
	// Describe lists the devices, with the condition the NodeDevices status
	// reports for them. An error means the source is gone (a driver
	// unloaded, the devices changed): the agent closes it, reports
	// NotOpen(err) and opens it again.
	Describe() ([]v1alpha1.Device, metav1.Condition, error)
	// WatchHealth reports the devices' health changes until ctx ends; an
	// error means their health is not watched.
	WatchHealth(ctx context.Context, report func(HealthEvent)) error
	// Close releases the source.
	Close()
}

// HealthEvent says that a device became unhealthy or healthy again.
type HealthEvent struct {
	ID      string
	Healthy bool
	// Reason says why the device is unhealthy; empty when it is healthy.
	Reason string
}

// HealthInheritor is a Kind whose devices share the health of the device they
// are part of: a MIG device is unhealthy when its GPU is (NVML reports faults
// per GPU).
type HealthInheritor interface {
	// InheritedHealth says whether d is unhealthy because of another
	// device, and why; unhealthy gives the health watchers' reason for a
	// device id.
	InheritedHealth(d *v1alpha1.Device, unhealthy func(id string) (string, bool)) (reason string, sick bool)
}

// NodeCapacityReporter is a Kind whose devices the kubelet also reports as
// node capacity (a hugepage pool's pages, as hugepages-<size>), which a
// simulated node must report alike.
type NodeCapacityReporter interface {
	// NodeCapacity adds d's share of the node's capacity to c.
	NodeCapacity(d *v1alpha1.Device, c corev1.ResourceList)
}

// CDIKind is a Kind whose devices the CDI spec the node agent writes names
// (pkg/cdispec), so that the CDI names its ContainerEdits give resolve.
type CDIKind interface {
	// CDIDeviceNodes lists the host device nodes a container of d needs,
	// its CDI device's edits; false leaves d out of the spec.
	CDIDeviceNodes(h *CDIHost, d *v1alpha1.Device) ([]string, bool)
}

// CDIHost is what CDIDeviceNodes may read.
type CDIHost struct {
	// Device looks up a device of the node by id (nil when unknown): a MIG
	// device's GPU, for one.
	Device func(id string) *v1alpha1.Device
	// CapabilityMinor is the device minor of a driver capability by its
	// path in the driver's table ("gpu0/gi1/access" in NVIDIA's
	// /proc/driver/nvidia-caps/mig-minors), read when first asked.
	CapabilityMinor func(name string) (uint32, bool)
}

// DiscoverOptions are what a Poller and an Opener read.
type DiscoverOptions struct {
	// HostRoot is where the host's / is mounted ("/" on the node itself).
	HostRoot string
	// IncludeVirtual also lists virtual devices (NICs: veth, bridges).
	IncludeVirtual bool
}

// Allocation is how the scheduler counts a device.
type Allocation int

const (
	// Exclusive devices go to one pod each: a class request of n takes n of
	// them.
	Exclusive Allocation = iota
	// Pool devices are shared by the pods they serve, which draw from them;
	// a pool publishes its size, pagesTotal, pagesFree and the kubelet
	// resource its pages are requested as (resourceName), and the kubelet
	// sees it as PoolSlots slot devices (docs/hugepages.md).
	Pool
	// Unallocatable devices are published but given to nobody, e.g. a GPU in
	// MIG mode, which is served through its MIG devices: giving the whole GPU
	// too would hand the same silicon to two pods.
	Unallocatable
	// Shared devices serve shares: pods of share classes take parts of their
	// capacity (Device.Sharing, docs/sharing.md), and the kubelet sees each
	// as one slot device per unit of each share class that selects it.
	Shared
)

// Handoff is what ContainerEdits may read from the node agent's hand-off.
type Handoff struct {
	// HostRoot is where the host's / is (device nodes and sysfs below it).
	HostRoot string
	// EnvVar, CDICRI and CDIAnnotations are the device-list strategies in
	// force (pkg/handoff, DeviceListStrategy); kinds without CDI devices
	// ignore them.
	EnvVar, CDICRI, CDIAnnotations bool
	// Device looks up a device of the node by id (nil when unknown): a MIG
	// device's parent GPU, for one.
	Device func(id string) *v1alpha1.Device
}

// ContainerEdits is what a container gets for its devices, merged into the
// kubelet's Allocate response: each kind adds its own.
type ContainerEdits struct {
	// Env is added to the container's environment.
	Env map[string]string
	// DeviceNodes are host paths (below Handoff.HostRoot) handed to the
	// container at the same path, read-write; one the host lacks is left out.
	DeviceNodes []string
	// CDIDevices are fully-qualified CDI device names, for the CRI field.
	CDIDevices []string
	// Annotations are container annotations (CDI requests, for runtimes that
	// read them there).
	Annotations map[string]string
	// Mounts are host directories the container gets (an MPS server's pipe
	// directory); the kubelet keeps the first mount of a container path when
	// several classes' responses name it.
	Mounts []Mount
}

// Mount is a host directory a container gets at ContainerPath.
type Mount struct {
	HostPath      string
	ContainerPath string
	ReadOnly      bool
}

// ShareEditor is a Kind whose shared devices (Allocation Shared) need edits
// of their own for a container's share: the limits of an MPS client. The
// hand-off calls it, after ContainerEdits, for each device the container
// holds a share of; share is what the container takes of d, summed over its
// share classes, by capacity name (v1alpha1.CapacityMemory in bytes,
// v1alpha1.CapacityCompute in percent).
type ShareEditor interface {
	ShareEdits(h *Handoff, d *v1alpha1.Device, share map[string]int64, e *ContainerEdits) error
}

// AddDeviceNodes adds paths to e.DeviceNodes, taking the slice itself when
// there is none yet (Allocate is on the kubelet's path: no copy).
func (e *ContainerEdits) AddDeviceNodes(paths []string) {
	if len(e.DeviceNodes) == 0 {
		e.DeviceNodes = paths
		return
	}
	e.DeviceNodes = append(e.DeviceNodes, paths...)
}

// Registry lists the kinds. It is built once and never changed, so it is
// read without locks.
type Registry struct {
	kinds  []Kind
	byName map[string]Kind
	attrs  map[string]v1alpha1.AttributeType
	labels []string
}

// NewRegistry lists kinds, in the order their container edits are merged. It
// panics when two kinds publish the same name or give one attribute two
// types: a programming error, caught by any test that builds the registry.
func NewRegistry(kinds ...Kind) *Registry {
	r := &Registry{byName: map[string]Kind{}, attrs: map[string]v1alpha1.AttributeType{}}
	for _, k := range kinds {
		r.add(k)
	}
	return r
}

func (r *Registry) add(k Kind) {
	for _, name := range k.Names() {
		if _, dup := r.byName[name]; dup {
			panic(fmt.Sprintf("devicekind: kind %q registered twice", name))
		}
		r.byName[name] = k
	}
	for name, t := range k.Attributes() {
		if old, ok := r.attrs[name]; ok && old != t {
			panic(fmt.Sprintf("devicekind: attribute %q is a %s and a %s", name, old, t))
		}
		r.attrs[name] = t
	}
	for _, l := range k.LabelKeys() {
		if !slices.Contains(r.labels, l) {
			r.labels = append(r.labels, l)
		}
	}
	r.kinds = append(r.kinds, k)
}

// With returns a new registry of r's kinds and kinds: how a binary or a test
// adds a kind of its own.
func (r *Registry) With(kinds ...Kind) *Registry {
	return NewRegistry(append(slices.Clone(r.kinds), kinds...)...)
}

// Configured returns a new registry in which k takes the place of the kind
// that publishes k's first name, in its order: how the node agent gives a
// kind its settings (NVML's library, a mock in tests). It panics when no kind
// publishes that name.
func (r *Registry) Configured(k Kind) *Registry {
	i := slices.Index(r.kinds, r.byName[k.Names()[0]])
	if i < 0 {
		panic(fmt.Sprintf("devicekind: no kind %q to configure", k.Names()[0]))
	}
	kinds := slices.Clone(r.kinds)
	kinds[i] = k
	return NewRegistry(kinds...)
}

// Kinds lists the kinds in registration order. The slice is the registry's
// own (the hand-off reads it on every Allocate): do not modify it.
func (r *Registry) Kinds() []Kind { return r.kinds }

// Kind returns the kind that publishes devices named name, or nil.
func (r *Registry) Kind(name string) Kind { return r.byName[name] }

// AttributeType is the type of a well-known attribute, or "" for any other
// key.
func (r *Registry) AttributeType(name string) v1alpha1.AttributeType { return r.attrs[name] }

// Attributes lists every well-known attribute and its type.
func (r *Registry) Attributes() map[string]v1alpha1.AttributeType { return maps.Clone(r.attrs) }

// Allocation says how the scheduler counts d: Exclusive for a kind not
// registered.
func (r *Registry) Allocation(d *v1alpha1.Device) Allocation {
	if k := r.byName[d.Kind]; k != nil {
		return k.Allocation(d)
	}
	return Exclusive
}

// InheritedHealth says whether d is unhealthy because of a device it is part
// of (HealthInheritor); false for a kind without such devices.
func (r *Registry) InheritedHealth(d *v1alpha1.Device, unhealthy func(id string) (string, bool)) (string, bool) {
	if k, ok := r.byName[d.Kind].(HealthInheritor); ok {
		return k.InheritedHealth(d, unhealthy)
	}
	return "", false
}

// NodeCapacity is what the kubelet reports as node capacity for devices
// (NodeCapacityReporter), summed.
func (r *Registry) NodeCapacity(devices []v1alpha1.Device) corev1.ResourceList {
	c := corev1.ResourceList{}
	for i := range devices {
		if k, ok := r.byName[devices[i].Kind].(NodeCapacityReporter); ok {
			k.NodeCapacity(&devices[i], c)
		}
	}
	return c
}

// IsLabel says whether key is a node label some kind may set.
func (r *Registry) IsLabel(key string) bool { return slices.Contains(r.labels, key) }

// NodeLabels computes every kind's labels for a node's devices.
func (r *Registry) NodeLabels(devices []v1alpha1.Device) map[string]string {
	byKind := map[Kind][]*v1alpha1.Device{}
	for i := range devices {
		if k := r.byName[devices[i].Kind]; k != nil {
			byKind[k] = append(byKind[k], &devices[i])
		}
	}
	labels := map[string]string{}
	for _, k := range r.kinds {
		if len(byKind[k]) > 0 {
			maps.Copy(labels, k.Labels(byKind[k]))
		}
	}
	return labels
}

// Summarize counts devices by kind for NodeDevices' printer columns.
func (r *Registry) Summarize(devices []v1alpha1.Device) v1alpha1.DeviceSummary {
	var s v1alpha1.DeviceSummary
	for i := range devices {
		d := &devices[i]
		if k := r.byName[d.Kind]; k != nil {
			s = k.Summarize(s, d)
		}
		if !d.Healthy {
			s.Unhealthy++
		}
	}
	return s
}

// LabelPrefix starts every node label a kind sets.
const LabelPrefix = "resclass.io/"

// LabelValue turns free text (a product name) into a label value: spaces
// become dashes, other characters a label value cannot hold are dropped, and
// the value is cut to 63 characters on an alphanumeric.
func LabelValue(s string) string {
	var b strings.Builder
	for _, c := range strings.TrimSpace(s) {
		switch {
		case c == ' ':
			b.WriteByte('-')
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
			b.WriteRune(c)
		}
	}
	v := b.String()
	if len(v) > validation.LabelValueMaxLength {
		v = v[:validation.LabelValueMaxLength]
	}
	return strings.Trim(v, "-_.")
}

// DiscoveryCondition is the condition of a Poller's discovery: True with what
// it found, or False with why it failed.
func DiscoveryCondition(typ string, err error, found string) metav1.Condition {
	if err != nil {
		return metav1.Condition{Type: typ, Status: metav1.ConditionFalse, Reason: "Failed", Message: err.Error()}
	}
	return metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: "Discovered", Message: found}
}
