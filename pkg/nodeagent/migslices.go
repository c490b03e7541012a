package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/internal/sealed"
	"github.com/resclass/resclass/pkg/mig"
)

// MIGRecordFile is the node agent's MIG ownership record, in its plugin
// directory (root's only): the slices it made and for which pod
// (docs/mig.md, "Creation and ownership").
const MIGRecordFile = "resclass-mig-owned.json"

// migSlices makes the MIG slices the scheduler chose (docs/mig.md): at
// Allocate, on a GPU marked for dynamic MIG, through the NVML source; it
// keeps the ownership record on the node, and destroys a slice it made once
// no pod holds it (reconcile). It never touches an instance it did not make.
type migSlices struct {
	path string

	// slicer is the open NVML source, nil while NVML is not open: the work
	// loop sets it, Allocate reads it.
	slicer atomic.Pointer[nvidiagpu.Slicer]
	// gpus are the GPUs as last described, by id (set by the work loop).
	gpus atomic.Pointer[map[string]*v1alpha1.Device]
	// heldBy lists the live pods whose assignment names a device id
	// (handoff.Allocator.HeldBy); synced says the pods are known.
	heldBy func(id string) []types.UID
	synced func() bool
	// made tells the allocator and the CDI spec about a MIG device made,
	// before the answer that names it.
	made func()
	// changed asks for the GPUs to be described again: a slice was made or
	// destroyed. It may be called from any goroutine.
	changed func()
	// event records an Event on the Node.
	event func(eventtype, reason, message string)
	// holder names what holds a slice in messages: "pod", or "ResourceClaim"
	// on a DRA node (the record's owner is then the claim's UID).
	holder string
	// metrics counts what it does; nil counts nothing.
	metrics *metrics

	mu     sync.Mutex
	record mig.Record
	// devices are the MIG devices of the record's slices, by their UUID, as
	// described when made or found: the allocator and the CDI spec need
	// them before discovery lists them.
	devices map[string]v1alpha1.Device
	// gone are the MIG devices of slices destroyed or forgotten that the
	// last description may still list: hidden as the record's are until a
	// description no longer does, or a destroyed slice's device would be
	// published, and given, as a device of its own.
	gone map[string]bool
}

// Reasons of the Events on the Node.
const (
	reasonMIGRecordSetAside = "MIGRecordSetAside"
	reasonMIGSliceDestroyed = "MIGSliceDestroyed"
)

// newMIGSlices reads the ownership record in dir. A record that cannot be
// believed is set aside (sealed.SetAside, the reason logged and returned):
// the agent then knows of no slice it made, and so destroys none.
func newMIGSlices(dir string) (*migSlices, error) {
	m := &migSlices{path: filepath.Join(dir, MIGRecordFile), devices: map[string]v1alpha1.Device{}, gone: map[string]bool{}}
	data, err := sealed.ReadFile(m.path, mig.MaxRecordBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return m, nil
	case err != nil:
		return m, fmt.Errorf("reading the MIG ownership record: %w", err)
	}
	r, err := mig.ParseRecord(data)
	if err != nil {
		aside, rerr := sealed.SetAside(m.path, time.Now())
		if rerr != nil {
			return m, fmt.Errorf("%w; setting it aside: %w", err, rerr)
		}
		return m, fmt.Errorf("%w: set aside as %s; the slices it listed are left alone", err, filepath.Base(aside))
	}
	m.record = *r
	return m, nil
}

// save writes the record, whole or not at all, and counts its slices.
// With m.mu held.
func (m *migSlices) save() error {
	if m.metrics != nil {
		m.metrics.migOwned.Set(float64(len(m.record.Instances)))
	}
	data, err := m.record.Marshal()
	if err != nil {
		return err
	}
	return sealed.WriteFile(m.path, data)
}

// setSources records what the work loop last saw: the open NVML source
// (nil: not open) and the devices described.
func (m *migSlices) setSources(slicer nvidiagpu.Slicer, devices []v1alpha1.Device) {
	if slicer == nil {
		m.slicer.Store(nil)
	} else {
		m.slicer.Store(&slicer)
	}
	gpus := map[string]*v1alpha1.Device{}
	for i := range devices {
		if devices[i].Kind == v1alpha1.DeviceKindNvidiaGPU {
			gpus[devices[i].ID] = devices[i].DeepCopy()
		}
	}
	m.gpus.Store(&gpus)
}

func (m *migSlices) gpu(id string) *v1alpha1.Device {
	if g := m.gpus.Load(); g != nil {
		return (*g)[id]
	}
	return nil
}

func (m *migSlices) source() nvidiagpu.Slicer {
	if s := m.slicer.Load(); s != nil {
		return *s
	}
	return nil
}

// Ensure makes the slice sliceID for pod, or finds the one made for it
// before (handoff.SliceMaker). A slice of the same place made for a pod
// that holds it no more is destroyed first.
func (m *migSlices) Ensure(ctx context.Context, pod types.UID, sliceID string) (*v1alpha1.Device, error) {
	d, fresh, err := m.ensure(ctx, pod, sliceID)
	switch {
	case err != nil:
		m.count("failed")
	case fresh:
		m.count("made")
		if m.made != nil {
			m.made()
		}
		m.change()
	}
	return d, err
}

// count counts a slice by result.
func (m *migSlices) count(result string) {
	if m.metrics != nil {
		m.metrics.migSlices.WithLabelValues(result).Inc()
	}
}

// change asks for the GPUs to be described again.
func (m *migSlices) change() {
	if m.changed != nil {
		m.changed()
	}
}

func (m *migSlices) ensure(ctx context.Context, pod types.UID, sliceID string) (d *v1alpha1.Device, fresh bool, err error) {
	gpuID, profile, start, ok := mig.ParseSliceID(sliceID)
	if !ok {
		return nil, false, fmt.Errorf("%q is not a MIG slice", sliceID)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	src := m.source()
	for _, o := range slices.Clone(m.record.Instances) {
		if o.GPU != gpuID || o.Start != start {
			continue
		}
		if o.Profile == profile && o.Pod == string(pod) {
			if d, known := m.devices[o.Device]; known {
				return &d, false, nil
			}
			return nil, false, fmt.Errorf("made before (MIG device %s), but not described yet", o.Device)
		}
		if slices.Contains(m.heldBy(mig.SliceID(o.GPU, o.Profile, o.Start)), types.UID(o.Pod)) {
			return nil, false, fmt.Errorf("%w: by the slice %s@%d made for %s %s, which still holds it", mig.ErrPlacementTaken, o.Profile, o.Start, m.holderName(), o.Pod)
		}
		if src == nil {
			return nil, false, errors.New("NVML is not open")
		}
		if err := m.destroyLocked(src, o); err != nil {
			return nil, false, err
		}
	}
	gpu := m.gpu(gpuID)
	switch {
	case gpu == nil:
		return nil, false, fmt.Errorf("no GPU %s on this node", gpuID)
	case !mig.Dynamic(gpu):
		return nil, false, fmt.Errorf("GPU %s is not marked for dynamic MIG (label %s or %s%s)", gpuID, v1alpha1.LabelGPUMIG, v1alpha1.LabelGPUMIGDevicePrefix, gpuID)
	case src == nil:
		return nil, false, errors.New("NVML is not open")
	}
	gi, dev, err := src.CreateSlice(gpu, profile, start)
	if err != nil {
		return nil, false, err
	}
	m.record.Instances = append(m.record.Instances, mig.Owned{GPU: gpuID, Profile: profile, Start: start, GPUInstance: gi, Device: dev.ID, Pod: string(pod)})
	if err := m.save(); err != nil {
		// Unrecorded, it would never be destroyed: not made, then.
		m.record.Instances = m.record.Instances[:len(m.record.Instances)-1]
		if derr := src.DestroySlice(gpuID, gi); derr != nil {
			return nil, false, fmt.Errorf("recording the slice: %w; destroying it again: %w", err, derr)
		}
		return nil, false, fmt.Errorf("recording the slice: %w", err)
	}
	m.devices[dev.ID] = dev
	klog.FromContext(ctx).Info("MIG slice made", "slice", sliceID, "device", dev.ID, "gpuInstance", gi, m.holderName(), pod)
	return &dev, true, nil
}

// destroyLocked destroys o and forgets it.
func (m *migSlices) destroyLocked(src nvidiagpu.Slicer, o mig.Owned) error {
	if err := src.DestroySlice(o.GPU, o.GPUInstance); err != nil {
		return err
	}
	m.forgetLocked(o)
	m.count("destroyed")
	if err := m.save(); err != nil {
		return fmt.Errorf("destroyed, but the ownership record is not written: %w", err)
	}
	return nil
}

func (m *migSlices) forgetLocked(o mig.Owned) {
	m.record.Instances = slices.DeleteFunc(m.record.Instances, func(x mig.Owned) bool { return x == o })
	delete(m.devices, o.Device)
	if o.Device != "" {
		m.gone[o.Device] = true
	}
	m.change()
}

// holderName is what holds a slice, for messages.
func (m *migSlices) holderName() string {
	if m.holder == "" {
		return "pod"
	}
	return m.holder
}

// reconcile destroys the slices made for pods that hold them no more and
// forgets those that are gone (mig.Reconcile). It waits for the pods to be
// known: before, every slice would look unheld. It reports whether it
// changed anything.
func (m *migSlices) reconcile(logger klog.Logger) bool {
	src := m.source()
	if src == nil || !m.synced() {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.record.Instances) == 0 {
		return false
	}
	var existing []mig.Existing
	seen := map[string]bool{}
	for _, o := range m.record.Instances {
		if seen[o.GPU] {
			continue
		}
		seen[o.GPU] = true
		gpu := m.gpu(o.GPU)
		if gpu == nil {
			// Not described now (NVML blips): decided at a later pass.
			return false
		}
		found, err := src.SliceInstances(gpu)
		if err != nil {
			logger.Error(err, "MIG slices not reconciled", "gpu", o.GPU)
			return false
		}
		existing = append(existing, found...)
	}
	live := map[string]bool{}
	for _, o := range m.record.Instances {
		for _, uid := range m.heldBy(mig.SliceID(o.GPU, o.Profile, o.Start)) {
			live[string(uid)] = true
		}
	}
	_, destroy, forget := mig.Reconcile(&m.record, existing, func(pod string) bool { return live[pod] })
	for _, o := range forget {
		logger.Info("MIG slice gone behind the agent's back: forgotten", "gpu", o.GPU, "profile", o.Profile, "start", o.Start, m.holderName(), o.Pod)
		m.forgetLocked(o)
		m.count("forgotten")
	}
	if len(forget) > 0 {
		if err := m.save(); err != nil {
			logger.Error(err, "writing the MIG ownership record")
		}
	}
	changed := len(forget) > 0
	for _, o := range destroy {
		m.destroyed(logger, src, o, fmt.Sprintf("%s %s, which it was made for, holds it no more", m.holderName(), o.Pod))
		changed = true
	}
	return changed
}

// destroyed destroys o (destroyLocked), says so in the log and an Event on
// the Node, why being the Event's reason; a failure is logged and left to a
// later pass. With m.mu held.
func (m *migSlices) destroyed(logger klog.Logger, src nvidiagpu.Slicer, o mig.Owned, why string) {
	if err := m.destroyLocked(src, o); err != nil {
		logger.Error(err, "MIG slice", "gpu", o.GPU, "profile", o.Profile, "start", o.Start, m.holderName(), o.Pod)
		return
	}
	logger.Info("MIG slice destroyed", "gpu", o.GPU, "profile", o.Profile, "start", o.Start, m.holderName(), o.Pod, "why", why)
	if m.event != nil {
		m.event("Normal", reasonMIGSliceDestroyed, fmt.Sprintf("MIG slice %s@%d on GPU %s destroyed: %s", o.Profile, o.Start, o.GPU, why))
	}
}

// mark marks, on the GPUs of devices, the instances the agent made
// (Created), remembers their MIG devices as described, and returns those
// devices' ids: they are not published as devices of their own, as they
// are their pods'. The devices of slices destroyed that devices still
// lists (described before the destruction) are among them.
func (m *migSlices) mark(devices []v1alpha1.Device) map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	owned := map[string]bool{}
	for _, o := range m.record.Instances {
		owned[o.Device] = true
	}
	listed := map[string]bool{}
	for i := range devices {
		d := &devices[i]
		if m.gone[d.ID] {
			listed[d.ID] = true
			owned[d.ID] = true
			continue
		}
		switch {
		case d.MIG != nil:
			for j := range d.MIG.Instances {
				in := &d.MIG.Instances[j]
				in.Created = slices.ContainsFunc(m.record.Instances, func(o mig.Owned) bool {
					return o.GPU == d.ID && o.Profile == in.Profile && o.Start == int(in.Start)
				})
			}
		case d.Kind == v1alpha1.DeviceKindNvidiaMIG && owned[d.ID]:
			m.devices[d.ID] = *d.DeepCopy()
		}
	}
	for id := range m.gone {
		if !listed[id] {
			delete(m.gone, id)
		}
	}
	return owned
}

// withMade is devices and, after them, the MIG devices of the slices made
// that devices does not list (made since the last description): what the
// allocator and the CDI spec must know. devices itself when there are none.
func (m *migSlices) withMade(devices []v1alpha1.Device) []v1alpha1.Device {
	m.mu.Lock()
	defer m.mu.Unlock()
	var extra []v1alpha1.Device
	for _, id := range slices.Sorted(maps.Keys(m.devices)) {
		if !slices.ContainsFunc(devices, func(x v1alpha1.Device) bool { return x.ID == id }) {
			extra = append(extra, m.devices[id])
		}
	}
	if len(extra) == 0 {
		return devices
	}
	return append(slices.Clip(devices), extra...)
}

// Release destroys the slices made for owner that nothing holds now
// (draplugin.SliceMaker): on a DRA node, once the kubelet unprepared the
// claim they were made for. A slice not destroyed (NVML not open, an error)
// is left to reconcile.
func (m *migSlices) Release(ctx context.Context, owner types.UID) {
	logger := klog.FromContext(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	src := m.source()
	for _, o := range slices.Clone(m.record.Instances) {
		if o.Pod != string(owner) || slices.Contains(m.heldBy(mig.SliceID(o.GPU, o.Profile, o.Start)), owner) {
			continue
		}
		if src == nil {
			logger.Info("MIG slice not destroyed: NVML is not open; tried again at a later pass", "gpu", o.GPU, "profile", o.Profile, "start", o.Start, m.holderName(), owner)
			continue
		}
		m.destroyed(logger, src, o, fmt.Sprintf("%s %s, which it was made for, is unprepared", m.holderName(), owner))
	}
}
