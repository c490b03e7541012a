package nodeagent

import (
	"errors"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
)

// sources are the node's discovery sources, as the kinds say: those that are
// devicekind.Pollers are read at every poll, and those that are
// devicekind.Openers each have a source that is opened once, described at
// resyncs and watched for health (NVML). A source that does not open is a
// condition, not an error; the agent opens it again with backoff.
type sources struct {
	opts   devicekind.DiscoverOptions
	kinds  *devicekind.Registry
	opened []*opened
}

// opened is one Opener's source and what the agent knows of it.
type opened struct {
	kind devicekind.Opener
	// pass is the work queue's item that describes it again (opening it
	// first when it is not open).
	pass string
	src  devicekind.Source // nil while not open
	err  error             // why src is nil
	// devices and cond are what the last description found, with the
	// devices kept through a failed or partial pass (grace.go).
	devices []v1alpha1.Device
	cond    metav1.Condition
	// known are the devices described before, by id (grace.go).
	known map[string]knownDevice
	// health is what its watcher reported; stopWatch stops the watcher.
	health    watchedHealth
	stopWatch func()
}

// errNotOpened is the reason of a source not opened yet, or closed.
var errNotOpened = errors.New("not opened")

// newSources lists the kinds' sources; it opens none.
func newSources(kinds *devicekind.Registry, opts devicekind.DiscoverOptions) *sources {
	s := &sources{opts: opts, kinds: kinds}
	for _, k := range kinds.Kinds() {
		if o, ok := k.(devicekind.Opener); ok {
			s.opened = append(s.opened, &opened{
				kind: o, pass: passDescribe + o.SourceName(), err: errNotOpened,
				health: watchedHealth{unhealthy: map[string]string{}}, stopWatch: func() {},
			})
		}
	}
	return s
}

// open opens o if it is not open, and reports whether it is.
func (s *sources) open(o *opened) bool {
	if o.src != nil {
		return true
	}
	o.src, o.err = o.kind.Open(s.opts)
	return o.src != nil
}

// describe describes o's devices with its condition. A source found gone
// (the driver unloaded, the devices changed) is closed: the caller opens it
// again. Devices described before and missing now are kept within grace
// (grace.go).
func (o *opened) describe(now time.Time, grace time.Duration) keepResult {
	if o.src != nil {
		devices, cond, err := o.src.Describe()
		if err == nil {
			o.devices, o.cond = devices, cond
			return o.keep(now, grace, nil)
		}
		o.close(err)
	}
	o.devices, o.cond = nil, o.kind.NotOpen(o.err)
	return o.keep(now, grace, o.err)
}

// close releases o's source; err says why, for the condition until it opens
// again.
func (o *opened) close(err error) {
	if o.src != nil {
		o.src.Close()
	}
	o.src, o.err = nil, err
}

// close releases every source.
func (s *sources) close() {
	for _, o := range s.opened {
		o.close(errNotOpened)
	}
}

// describeOnce opens and describes every opened source once (`node-agent
// discover`).
func (s *sources) describeOnce() {
	for _, o := range s.opened {
		s.open(o)
		o.describe(time.Now(), 0)
	}
}

// described are the devices of the opened sources as last described, copied
// for applyHealth to mark, and their conditions.
func (s *sources) described() ([]v1alpha1.Device, []metav1.Condition) {
	var devices []v1alpha1.Device
	conds := make([]metav1.Condition, 0, len(s.opened))
	for _, o := range s.opened {
		devices = append(devices, o.devices...)
		conds = append(conds, o.cond)
	}
	return cloneDevices(devices), conds
}

// discoverHost reads every kind the agent polls (NICs, hugepage pools: sysfs
// only, cheap enough for every poll), in the registry's order.
func (s *sources) discoverHost() ([]v1alpha1.Device, []metav1.Condition) {
	kinds := s.kinds.Kinds()
	var devices []v1alpha1.Device
	conds := make([]metav1.Condition, 0, len(kinds))
	for _, k := range kinds {
		if p, ok := k.(devicekind.Poller); ok {
			found, cond := p.Discover(s.opts)
			if devices == nil {
				devices = found // the first kind's slice, not a copy: this runs at every poll
			} else {
				devices = append(devices, found...)
			}
			conds = append(conds, cond)
		}
	}
	return devices, conds
}

// applyHealth marks the devices the health watchers found unhealthy, and
// those a kind says share the health of an unhealthy device (a MIG device,
// its GPU's).
func (s *sources) applyHealth(devices []v1alpha1.Device) {
	for _, o := range s.opened {
		o.health.mu.Lock()
	}
	applyHealth(s.kinds, devices, func(id string) (string, bool) {
		for _, o := range s.opened {
			if reason, sick := o.health.unhealthy[id]; sick {
				return reason, true
			}
		}
		return "", false
	})
	for _, o := range s.opened {
		o.health.mu.Unlock()
	}
}

func applyHealth(kinds *devicekind.Registry, devices []v1alpha1.Device, unhealthy func(id string) (string, bool)) {
	for i := range devices {
		d := &devices[i]
		reason, sick := unhealthy(d.ID)
		if !sick {
			reason, sick = kinds.InheritedHealth(d, unhealthy)
		}
		if sick && d.Healthy {
			d.Healthy, d.Reason = false, reason
		}
	}
}

// watchedHealth is what a source's health watcher reported: device id -> why
// unhealthy.
type watchedHealth struct {
	mu        sync.Mutex
	unhealthy map[string]string
}

func (h *watchedHealth) set(e devicekind.HealthEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e.Healthy {
		delete(h.unhealthy, e.ID)
	} else {
		h.unhealthy[e.ID] = e.Reason
	}
}

func (h *watchedHealth) get(id string) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	reason, sick := h.unhealthy[id]
	return reason, sick
}

func (h *watchedHealth) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.unhealthy)
}

// assemble makes the NodeDevices status of the sources' devices: sorted by id,
// counted by kind, with the conditions in a fixed order.
func assemble(kinds *devicekind.Registry, devices []v1alpha1.Device, conditions ...metav1.Condition) v1alpha1.NodeDevicesStatus {
	var status v1alpha1.NodeDevicesStatus
	status.Devices = append([]v1alpha1.Device(nil), devices...)
	sort.Slice(status.Devices, func(i, j int) bool { return status.Devices[i].ID < status.Devices[j].ID })
	status.Summary = kinds.Summarize(status.Devices)
	for _, c := range conditions {
		meta.SetStatusCondition(&status.Conditions, c)
	}
	return status
}

// slicer is the open source that makes MIG slices (NVML), nil when none is
// open.
func (s *sources) slicer() nvidiagpu.Slicer {
	for _, o := range s.opened {
		if sl, ok := o.src.(nvidiagpu.Slicer); ok {
			return sl
		}
	}
	return nil
}

// redescribeAll queues a description of every opened source: after a MIG
// slice is made or destroyed, its GPU's instances are described again. Safe
// from any goroutine: the sources and their passes are fixed at start.
func (s *sources) redescribeAll(q interface{ Add(string) }) {
	for _, o := range s.opened {
		q.Add(o.pass)
	}
}
