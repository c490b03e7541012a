package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/dra/dradevice"
	"github.com/resclass/resclass/pkg/draplugin"
)

// DRAConfig is where the agent's DRA kubelet plugin lives, on a node in DRA
// mode (v1alpha1.LabelDeviceMode; docs/dra.md, "Nodes").
type DRAConfig struct {
	// RegistrationDir is the kubelet's plugin registration directory
	// (/var/lib/kubelet/plugins_registry when empty).
	RegistrationDir string
	// PluginDataDir holds the plugin's socket and checkpoint
	// (/var/lib/kubelet/plugins/resclass.io when empty).
	PluginDataDir string
}

// Reasons of the Events the DRA mode records on the Node.
const (
	reasonModeChanged    = "DeviceModeChanged"
	reasonNotPublishable = "DeviceNotPublishedToDRA"
)

// ErrModeChanged is what Run returns when the Node's device mode label changes: the
// agent serves one mode for its whole life, and its restart (by the
// DaemonSet's pod) serves the new one.
var ErrModeChanged = errors.New("the node's device mode changed: restarting to serve the new mode")

// draSet is the DRA half of a running agent in DRA mode: the kubelet plugin,
// which also publishes the ResourceSlices through the upstream helper, and
// the CDI spec of the GPUs (named by the per-claim specs).
type draSet struct {
	plugin *draplugin.Plugin
	detach func() // the plugin's device_holder series
	kinds  *devicekind.Registry
	// slices makes the MIG slices claims are allocated (docs/mig.md, "DRA
	// nodes"), with its own ownership record in the plugin's directory.
	slices   *migSlices
	node     *corev1.Node
	recorder record.EventRecorder
	logger   klog.Logger
	// refused is the last set of devices the mapping refused, so that a
	// refusal is reported once, not at every poll.
	refused string

	// mu keeps the CDI spec's writes apart: the work loop's, and those of
	// a prepare that made a slice (which holds the plugin's lock: mu is
	// never held while taking it).
	mu  sync.Mutex
	cdi *cdiSpec
	// devices are the devices last given to update, for the CDI spec.
	devices []v1alpha1.Device
}

// startDRA starts the DRA kubelet plugin.
func (a *Agent) startDRA(ctx context.Context, node *corev1.Node, recorder record.EventRecorder) (*draSet, error) {
	logger := klog.FromContext(ctx)
	c := a.config.DRA
	if c.PluginDataDir == "" {
		c.PluginDataDir = filepath.Join(kubeletplugin.KubeletPluginsDir, dradevice.DriverName)
	}
	spec, err := a.newCDISpec(logger)
	if err != nil {
		return nil, err
	}
	// The MIG ownership record of this mode is the DRA plugin's own: a
	// node that changes mode leaves the other mode's slices alone
	// (docs/mig.md, "DRA nodes").
	ms, err := newMIGSlices(c.PluginDataDir)
	if err != nil {
		logger.Error(err, "MIG ownership record")
		recorder.Event(node, corev1.EventTypeWarning, reasonMIGRecordSetAside, err.Error())
	}
	ms.event = func(eventtype, reason, message string) { recorder.Event(node, eventtype, reason, message) }
	ms.metrics, ms.holder = a.metrics, "ResourceClaim"
	plugin, err := draplugin.New(draplugin.Config{
		NodeName: a.config.NodeName, DriverName: dradevice.DriverName, HostRoot: a.config.HostRoot,
		DeviceListStrategies: a.config.DeviceListStrategies, Kinds: a.config.Kinds,
		CDIDir: a.config.CDISpecDir, PluginDataDir: c.PluginDataDir, RegistrarDir: c.RegistrationDir,
		Client: a.kube, Recorder: recorder, Metrics: a.metrics.dra, Slices: ms,
	})
	if err != nil {
		return nil, err
	}
	// The claims prepared hold the slices; those prepared before a
	// checkpoint that was set aside are not known, and their slices are
	// then destroyed only when the kubelet unprepares them.
	ms.heldBy, ms.synced = plugin.HeldBy, plugin.CheckpointBelieved
	s := &draSet{plugin: plugin, kinds: a.config.Kinds, slices: ms, cdi: spec, node: node, recorder: recorder, logger: logger}
	ms.made = s.writeCDI
	if err := plugin.Start(ctx, a.kube, node.UID); err != nil {
		return nil, err
	}
	logger.Info("DRA mode: serving the DRA kubelet plugin", "driver", dradevice.DriverName, "pluginDir", c.PluginDataDir)
	s.detach = a.metrics.handoff.AttachHolders(plugin)
	return s, nil
}

func (s *draSet) stop() {
	s.detach()
	s.plugin.Stop()
}

// draInventory is what a DRA-mode node publishes as its NodeDevices: the
// discovery conditions, and no device. Its devices are DRA's to allocate (its
// ResourceSlices are their inventory), and the resclass scheduler, the
// ResourceClass status and kubectl resclass read NodeDevices: an empty one
// (rather than none, or one left from device-plugin mode) keeps them from
// counting the devices, without the agent needing to delete anything.
func draInventory(status v1alpha1.NodeDevicesStatus) v1alpha1.NodeDevicesStatus {
	status.Devices = nil
	status.Summary = v1alpha1.DeviceSummary{}
	return status
}

// update gives the plugin the node's devices and publishes them as the
// node's pool of ResourceSlices (the helper's controller writes only what
// differs from the apiserver's copy). A device given to nobody (a GPU in MIG
// mode: its MIG devices are published) is left out, as is a device the
// mapping refuses (reported once per change as an Event on the Node).
func (s *draSet) update(ctx context.Context, devices []v1alpha1.Device) {
	s.mu.Lock()
	s.devices = devices
	s.mu.Unlock()
	s.writeCDI()
	var allocatable []v1alpha1.Device
	for i := range devices {
		if s.kinds.Allocation(&devices[i]) != devicekind.Unallocatable {
			allocatable = append(allocatable, devices[i])
		}
	}
	mapped, refused := dradevice.Devices(allocatable)
	names := make(map[string]string, len(mapped))
	for i := range mapped {
		if id, ok := dradevice.ID(&mapped[i]); ok {
			names[mapped[i].Name] = id
		}
	}
	migs, potentials, migRefused := migPotentials(devices)
	refused = append(refused, migRefused...)
	for _, g := range migs {
		for i := range g.Devices {
			names[g.Devices[i].Name] = g.Potentials[i].ID
		}
	}
	s.plugin.SetDevices(append(slices.Clip(devices), potentials...), names)
	if key := errorsKey(refused); key != s.refused {
		s.refused = key
		for _, err := range refused {
			s.logger.Info("device not published to DRA", "reason", err.Error())
			s.recorder.Event(s.node, corev1.EventTypeWarning, reasonNotPublishable, err.Error())
		}
	}
	if err := s.plugin.Helper().PublishResources(ctx, driverResources(s.node.Name, mapped, migs)); err != nil {
		s.logger.Error(err, "publishing the ResourceSlices")
	}
}

// writeCDI writes the CDI spec of the devices last given to update and of
// the MIG slices made since: a prepare that made a slice calls it before it
// answers with the slice's CDI name.
func (s *draSet) writeCDI() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cdi.update(s.slices.withMade(s.devices))
}

// migPotentials maps the potential MIG slices of the GPUs marked for dynamic
// MIG (dradevice.MIGPotentials); a GPU whose slices cannot be mapped is
// refused as a whole.
func migPotentials(devices []v1alpha1.Device) (migs []*dradevice.MIGGPU, potentials []v1alpha1.Device, refused []error) {
	for i := range devices {
		g, err := dradevice.MIGPotentials(&devices[i])
		switch {
		case err != nil:
			refused = append(refused, fmt.Errorf("the MIG slices of GPU %s %w: %w", devices[i].ID, dradevice.ErrRefused, err))
		case g != nil:
			migs = append(migs, g)
			potentials = append(potentials, g.Potentials...)
		}
	}
	return migs, potentials, refused
}

// driverResources is the node's one pool, named after the node, in slices of
// at most ResourceSliceMaxDevicesWithAdvancedFeatures (64) devices: the most a
// slice may hold once a device is tainted (unhealthy), so that a device
// turning unhealthy never moves devices between slices. The GPUs marked for
// dynamic MIG follow: their counter sets in slices of their own (at most
// ResourceSliceMaxCounterSets, 8, each), and each GPU's potential slices in a
// slice of its own (25 on an A100: within the 64 of a slice whose devices
// consume counters).
func driverResources(node string, devices []resourceapi.Device, migs []*dradevice.MIGGPU) resourceslice.DriverResources {
	var out []resourceslice.Slice
	for len(devices) > 0 {
		n := min(len(devices), resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures)
		out = append(out, resourceslice.Slice{Devices: devices[:n]})
		devices = devices[n:]
	}
	for len(migs) > 0 {
		n := min(len(migs), resourceapi.ResourceSliceMaxCounterSets)
		var sets []resourceapi.CounterSet
		for _, g := range migs[:n] {
			sets = append(sets, g.Counters)
		}
		out = append(out, resourceslice.Slice{SharedCounters: sets})
		for _, g := range migs[:n] {
			out = append(out, resourceslice.Slice{Devices: g.Devices})
		}
		migs = migs[n:]
	}
	if len(out) == 0 {
		out = []resourceslice.Slice{{}}
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: {Slices: out}}}
}

func errorsKey(errs []error) string {
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	slices.Sort(msgs)
	return strings.Join(msgs, "\n")
}

// deleteStaleSlices removes the ResourceSlices of the agent's driver on its
// node, left from DRA mode, when it starts in device-plugin mode: the stock
// allocator must not hand out what the device-plugin endpoints serve.
func (a *Agent) deleteStaleSlices(ctx context.Context) error {
	sel := fields.AndSelectors(
		fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, a.config.NodeName),
		fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, dradevice.DriverName),
	).String()
	list, err := a.kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return fmt.Errorf("listing the node's ResourceSlices: %w", err)
	}
	for _, s := range list.Items {
		if err := a.kube.ResourceV1().ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting ResourceSlice %s: %w", s.Name, err)
		}
		klog.FromContext(ctx).Info("device-plugin mode: deleted a ResourceSlice left from DRA mode", "resourceSlice", s.Name)
	}
	return nil
}

// modeChanged says whether node's labels select another mode than mode, and
// records it on the Node.
func modeChanged(logger klog.Logger, recorder record.EventRecorder, node *corev1.Node, mode string) bool {
	now := v1alpha1.DeviceModeOf(node.Labels)
	if now == mode {
		return false
	}
	logger.Info("the node's device mode changed; restarting to serve it", "from", mode, "to", now, "label", v1alpha1.LabelDeviceMode)
	recorder.Eventf(node, corev1.EventTypeNormal, reasonModeChanged, "%s is now %s (was %s): the node agent restarts to serve its devices through %s only", v1alpha1.LabelDeviceMode, now, mode, now)
	return true
}
