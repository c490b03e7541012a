package nodeagent

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/cdispec"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/deviceplugin"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/kubeletpods"
	"github.com/resclass/resclass/pkg/mig"
	"github.com/resclass/resclass/pkg/selector"
)

// classMatcher turns the node's devices and the cluster's ResourceClasses into
// the device-plugin endpoints to serve: one per class that selects at least one
// local device (healthy or not: an unhealthy device is advertised as such, so
// the kubelet's allocatable shrinks and grows with health).
type classMatcher struct {
	kinds     *devicekind.Registry // a pool is advertised as poolSlots slots
	poolSlots int

	// compiled caches each class's compiled selector by the class's
	// resourceVersion: classes are never compiled per pass.
	compiled map[string]compiledClass

	mu sync.Mutex
	// served: device id -> the classes serving it, for introspection.
	served map[string][]string
}

type compiledClass struct {
	resourceVersion string
	class           *selector.Class
}

func newClassMatcher(kinds *devicekind.Registry, poolSlots int) *classMatcher {
	return &classMatcher{kinds: kinds, poolSlots: poolSlots, compiled: map[string]compiledClass{}, served: map[string][]string{}}
}

// endpoints returns resource name -> advertised devices.
// Potential MIG slices (mig.Potentials) are advertised to the classes with
// createMIG that select them, by their slice ids.
func (m *classMatcher) endpoints(classes []*v1alpha1.ResourceClass, devices, potentials []v1alpha1.Device) map[string][]deviceplugin.Device {
	prepared := make([]*selector.Device, 0, len(devices)+len(potentials))
	for i := range devices {
		prepared = append(prepared, selector.NewDevice(&devices[i]))
	}
	for i := range potentials {
		prepared = append(prepared, selector.NewPotentialDevice(&potentials[i]))
	}
	devices = append(slices.Clip(devices), potentials...)
	out := map[string][]deviceplugin.Device{}
	served := map[string][]string{}
	seen := map[string]bool{}
	for _, rc := range classes {
		seen[rc.Name] = true
		c := m.compile(rc)
		if c == nil {
			continue
		}
		var list []deviceplugin.Device
		for i, d := range prepared {
			if !c.Matches(d) {
				continue
			}
			served[d.ID] = append(served[d.ID], rc.Name)
			numa := -1
			if n := devices[i].Attributes[v1alpha1.AttributeNUMANode].IntValue; n != nil {
				numa = int(*n)
			}
			// A share class (which selects only devices that serve shares)
			// sees each device as the units of its share that fit it.
			shareSlots := 0
			if unit, ok := c.Share(); ok {
				_, capacity, _ := d.Sharing()
				shareSlots = handoff.ShareSlots(unit, capacity)
			}
			for _, id := range handoff.KubeletIDs(m.kinds, &devices[i], m.poolSlots, shareSlots) {
				list = append(list, deviceplugin.Device{ID: id, Healthy: devices[i].Healthy, NUMANode: numa})
			}
		}
		if len(list) > 0 {
			out[v1alpha1.ResourceNamePrefix+rc.Name] = list
		}
	}
	for name := range m.compiled {
		if !seen[name] {
			delete(m.compiled, name)
		}
	}
	for id := range served {
		slices.Sort(served[id])
	}
	m.mu.Lock()
	m.served = served
	m.mu.Unlock()
	return out
}

// compile returns rc's compiled selector, nil for a class that does not
// compile (the webhook refuses those; one created without it serves nothing).
func (m *classMatcher) compile(rc *v1alpha1.ResourceClass) *selector.Class {
	if c, ok := m.compiled[rc.Name]; ok && c.resourceVersion == rc.ResourceVersion {
		return c.class
	}
	c, errs := selector.Compile(&rc.Spec, field.NewPath("spec"))
	if len(errs) > 0 {
		c = nil
	}
	m.compiled[rc.Name] = compiledClass{resourceVersion: rc.ResourceVersion, class: c}
	return c
}

// classesOf returns the classes serving each device.
func (m *classMatcher) classesOf() map[string][]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.served)
}

// pluginSet is the kubelet-facing half of the agent: the class informer, the
// allocator (with its pod informer) and the endpoints.
type pluginSet struct {
	classes interface {
		List(labels.Selector) ([]*v1alpha1.ResourceClass, error)
	}
	matcher   *classMatcher
	allocator *handoff.Allocator
	manager   *deviceplugin.Manager
	// cdi keeps the CDI spec with a CDI strategy; nil otherwise.
	cdi *cdiSpec
	// slices makes MIG slices; nil on an agent that makes none.
	slices *migSlices

	// mu orders the work loop's updates with those a slice made asks for
	// (refresh), from an Allocate.
	mu sync.Mutex
	// devices are the devices last described, and owned those of them that
	// are MIG devices of slices made for pods (migSlices.mark).
	devices []v1alpha1.Device
	owned   map[string]bool
}

// newAllocator answers the kubelet's calls from the assignments of pods, the
// informer of the node's pods (handoff.NodePods).
func (a *Agent) newAllocator(recorder record.EventRecorder, pods cache.SharedIndexInformer, kubelet handoff.KubeletPods, ms *migSlices) *handoff.Allocator {
	cfg := handoff.Config{
		Node: a.config.NodeName, HostRoot: a.config.HostRoot, PoolSlots: a.config.HugepagePoolSlots,
		WaitForPod: a.config.WaitForPod, Recorder: recorder, Metrics: a.metrics.handoff,
		DeviceListStrategies: a.config.DeviceListStrategies, Kinds: a.config.Kinds,
		KubeletPods: kubelet,
	}
	if ms != nil {
		cfg.Slices = ms
	}
	return handoff.New(cfg, pods)
}

// newKubeletPods is the client of the kubelet's PodResources API, nil without
// a socket; stop closes it.
func (a *Agent) newKubeletPods() (kubelet handoff.KubeletPods, stop func(), err error) {
	if a.config.PodResourcesSocket == "" {
		return nil, func() {}, nil
	}
	c, err := kubeletpods.New(a.config.PodResourcesSocket, a.config.PodResourcesTimeout)
	if err != nil {
		return nil, func() {}, err
	}
	return c, func() { _ = c.Close() }, nil
}

// newCDISpec keeps the CDI spec with a CDI strategy; nil otherwise.
func (a *Agent) newCDISpec(logger klog.Logger) (*cdiSpec, error) {
	if !a.config.DeviceListStrategies.CDI() {
		return nil, nil
	}
	w, err := cdispec.NewWriter(a.config.CDISpecDir)
	if err != nil {
		return nil, err
	}
	return &cdiSpec{
		writer: w, logger: logger, metrics: a.metrics,
		config: cdispec.Config{HostRoot: a.config.HostRoot, DriverRoot: a.config.CDIDriverRoot, Kinds: a.config.Kinds},
	}, nil
}

// newManager serves the endpoints allocator answers for, counting
// registrations and restarts. An endpoint that stops lets the kubelet's calls
// in flight finish (drainTimeout).
func (a *Agent) newManager(allocator *handoff.Allocator) *deviceplugin.Manager {
	m := deviceplugin.NewManager(a.config.PluginDir, allocator, deviceplugin.Observer{
		Registered: func(resource string, err error) {
			result := "ok"
			if err != nil {
				result = "error"
			}
			a.metrics.registrations.WithLabelValues(resource, result).Inc()
		},
		Restarted: func(resource string) { a.metrics.restarts.WithLabelValues(resource).Inc() },
	})
	m.SetDrainTimeout(a.drainTimeout())
	return m
}

// drainTimeout is how long a stopping endpoint waits for the kubelet's calls
// in flight: the longest a call may take, waiting for its pod (WaitForPod)
// and asking the kubelet which pod it admits (PodResourcesTimeout), with a
// second to answer. 5 seconds with the defaults.
func (a *Agent) drainTimeout() time.Duration {
	wait := a.config.WaitForPod
	if wait <= 0 {
		wait = handoff.DefaultWaitForPod
	}
	return wait + a.config.PodResourcesTimeout + time.Second
}

// update serves the classes' endpoints for the current devices; owned are
// the MIG devices of slices made for pods, which the allocator and the CDI
// spec know and no endpoint advertises.
func (p *pluginSet) update(devices []v1alpha1.Device, owned map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devices, p.owned = devices, owned
	p.apply()
}

// refresh applies the devices again with the slices made since: a slice
// made in Allocate is in the CDI spec and the allocator before its answer.
func (p *pluginSet) refresh() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.apply()
}

func (p *pluginSet) apply() {
	classes, _ := p.classes.List(labels.Everything())
	slices.SortFunc(classes, func(a, b *v1alpha1.ResourceClass) int { return strings.Compare(a.Name, b.Name) })
	all, advertised := p.devices, p.devices
	var potentials []v1alpha1.Device
	if p.slices != nil {
		all = p.slices.withMade(p.devices)
		advertised = slices.DeleteFunc(slices.Clone(p.devices), func(d v1alpha1.Device) bool { return p.owned[d.ID] })
		for i := range all {
			if _, pots, err := mig.Potentials(&all[i]); err == nil {
				for _, pot := range pots {
					potentials = append(potentials, pot.Device)
				}
			}
		}
	}
	// The CDI spec and the allocator first: a new endpoint's first Allocate
	// must find its devices, and the runtime their CDI names.
	p.cdi.update(all)
	p.allocator.SetDevices(append(slices.Clip(all), potentials...))
	p.manager.Set(p.matcher.endpoints(classes, advertised, potentials))
}

// cdiSpec keeps the CDI spec of the node's GPUs current: generated again when
// a GPU's identity, device node, MIG placement or driver version changes, and
// written again when it differs from the file or the file is gone.
type cdiSpec struct {
	writer  *cdispec.Writer
	config  cdispec.Config
	logger  klog.Logger
	metrics *metrics

	key  string
	spec *specs.Spec
}

func (c *cdiSpec) update(devices []v1alpha1.Device) {
	if c == nil {
		return
	}
	if key := cdiKey(c.config.Kinds, devices); key != c.key || c.spec == nil {
		spec, err := cdispec.Generate(c.config, devices)
		if err != nil {
			c.logger.Error(err, "generating the CDI spec")
			c.metrics.cdiWrites.WithLabelValues("error").Inc()
			return
		}
		c.key, c.spec = key, spec
	}
	wrote, err := c.writer.Write(c.spec)
	switch {
	case err != nil:
		c.logger.Error(err, "writing the CDI spec; containers given GPUs by CDI name fail until it is written", "path", c.writer.Path())
		c.metrics.cdiWrites.WithLabelValues("error").Inc()
	case wrote:
		c.logger.Info("CDI spec written", "path", c.writer.Path(), "devices", len(cdispecDevices(c.spec)))
		c.metrics.cdiWrites.WithLabelValues("written").Inc()
	}
}

func cdispecDevices(s *specs.Spec) []specs.Device {
	if s == nil {
		return nil
	}
	return s.Devices
}

// cdiKey is what the spec depends on among devices: the devices it names
// (those of a devicekind.CDIKind) with every attribute, so that a change of
// identity, device node, MIG placement or driver version generates it again.
func cdiKey(kinds *devicekind.Registry, devices []v1alpha1.Device) string {
	var b strings.Builder
	for i := range devices {
		d := &devices[i]
		if _, ok := kinds.Kind(d.Kind).(devicekind.CDIKind); !ok {
			continue
		}
		b.WriteString(d.ID)
		for _, name := range slices.Sorted(maps.Keys(d.Attributes)) {
			b.WriteString("|" + name + "=" + d.Attributes[name].String())
		}
		b.WriteString("\n")
	}
	return b.String()
}
