// Package handoff is the node agent's side of the hand-off from the resclass
// scheduler (docs/architecture.md, "The hand-off"): it answers the kubelet's
// GetPreferredAllocation and Allocate calls with the devices the scheduler wrote
// into the pod's resclass.io/assignment annotation.
//
// The kubelet never says which pod it is admitting: a call carries only device
// ids. Ids are unique on a node, so the allocator finds the pod by them, in an
// informer cache of the pods bound to its node (no API call on the path, no lock
// held across calls):
//
//   - GetPreferredAllocation: among the containers whose assignment for the class
//     has the requested size, is still unallocated, lies within the kubelet's
//     available devices and contains its must-include ones, the first in the
//     kubelet's own admission order (oldest pod first, then namespace/name, then
//     the assignment's container order) gets its assigned ids preferred.
//   - Allocate: the container whose assignment for the class is exactly the set
//     of ids the kubelet chose, first in the same order among the unallocated
//     ones. When none is (the kubelet ignored the preference, or the pod has no
//     assignment), Allocate is refused: nothing runs on devices the scheduler did
//     not account for. The container the kubelet most likely meant (the first
//     unallocated one with an assignment of that class and size) gets a
//     DeviceAssignmentMismatch Event, and the refusal is counted.
//
// A pod the informer has not seen yet (the kubelet and the agent watch the same
// apiserver, each at its own pace) is waited for, up to Config.WaitForPod.
//
// When several containers qualify, the order above is a guess: the kubelet may
// see a newer pod before an older one. With Config.KubeletPods the allocator
// asks the kubelet which pods it knows (pkg/kubeletpods) and keeps to those:
// the pod being admitted is one, a pod the kubelet has not seen is not. When
// the kubelet does not answer, the guess stands (counted, and an Event on the
// pod: DeviceAdmissionOrderGuessed).
//
// Hugepage pools are shared: the kubelet sees each pool as Config.PoolSlots
// slot devices "<pool>/<n>" (docs/hugepages.md); the assignment names the pool.
// A device that serves shares is, to each share class, one slot per unit
// "<device>/share/<n>" (share.go); the assignment names the device and the
// container's share, and a container's slots are all of that device.
package handoff

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/kubeletpods"
)

// Event reasons, on the pod.
const (
	ReasonMismatch     = "DeviceAssignmentMismatch"
	ReasonNoAssignment = "NoDeviceAssignment"
	ReasonOrderGuessed = "DeviceAdmissionOrderGuessed"
)

// KubeletPods says which pods the kubelet knows: those it admitted that are
// still active, and the one it is admitting (pkg/kubeletpods).
type KubeletPods interface {
	Known(ctx context.Context) (kubeletpods.Pods, error)
}

// Config configures an Allocator.
type Config struct {
	// Node is the node the agent runs on; only its pods are watched.
	Node string
	// HostRoot is where the host's / is (device nodes and sysfs are looked up
	// below it).
	HostRoot string
	// PoolSlots is how many slot devices a shared hugepage pool is to the
	// kubelet.
	PoolSlots int
	// WaitForPod bounds how long a kubelet call waits for the informer to show
	// the pod it is about.
	WaitForPod time.Duration
	// Recorder records Events on pods; nil records none.
	Recorder record.EventRecorder
	// Metrics, if set, counts outcomes and latencies, and exports the
	// devices' holders while Run runs.
	Metrics *Metrics
	// DeviceListStrategies say how GPUs are named to the runtime (envvar
	// when empty; see DeviceListStrategy).
	DeviceListStrategies Strategies
	// Kinds say what a container gets for each kind of device
	// (kinds.Builtin when nil).
	Kinds *devicekind.Registry
	// KubeletPods, if set, tells the pod the kubelet admits among several
	// that wait for the same devices; nil keeps to the guess of the order.
	KubeletPods KubeletPods
	// Slices, if set, makes the MIG slices assignments name (docs/mig.md)
	// before Allocate answers; nil refuses a container given one.
	Slices SliceMaker
}

// SliceMaker makes MIG slices for pods.
type SliceMaker interface {
	// Ensure makes the MIG slice sliceID (mig.SliceID) for pod, or finds
	// the one made for it before, and returns its MIG device, which the
	// allocator's devices and the CDI spec have by then.
	Ensure(ctx context.Context, pod types.UID, sliceID string) (*v1alpha1.Device, error)
}

// Allocator answers the kubelet's allocation calls for every class endpoint of
// the node.
type Allocator struct {
	cfg      Config
	kinds    *devicekind.Registry
	handoff  devicekind.Handoff // what the kinds' container edits read
	informer cache.SharedIndexInformer
	devices  atomic.Pointer[map[string]*v1alpha1.Device]

	// changed is closed and replaced on every pod event: callers waiting for a
	// pod wait on it.
	changedMu sync.Mutex
	changed   chan struct{}

	// ready is set once the pod cache is filled and the kubelet's checkpoint
	// read: only then do answers account for what containers already hold.
	ready atomic.Bool

	recordsMu sync.Mutex
	allocated map[allocKey]*Record
	refused   []*Record // the latest refusals, newest last
}

type allocKey struct {
	pod       types.UID
	container string
	class     string
}

// DefaultWaitForPod is Config.WaitForPod when unset.
const DefaultWaitForPod = 3 * time.Second

// maxRefusals kept for introspection.
const maxRefusals = 64

// Record is one Allocate answer.
type Record struct {
	PodUID    types.UID
	Namespace string
	Name      string
	Container string
	Class     string
	// Devices are the device ids (pools and shared devices, not slots).
	Devices []string
	// Share is what the container's share of its one device takes, for a
	// share class (docs/sharing.md).
	Share assignment.Share
	// Time is when the agent answered, or, for what it rebuilt from the
	// kubelet's checkpoint after a restart, when it read the checkpoint.
	Time time.Time
	// Refused is set, with Message, for a refused Allocate.
	Refused bool
	Message string
}

// NodePods is an informer factory of the pods bound to node only (field
// selector spec.nodeName): its pod informer is New's. The caller starts it,
// after New, which sets the informer's transform and indexers.
func NodePods(kube kubernetes.Interface, node string) kubeinformers.SharedInformerFactory {
	return kubeinformers.NewSharedInformerFactoryWithOptions(kube, 0, kubeinformers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}))
}

// New returns an allocator that finds the pods in pods, the informer of the
// pods bound to cfg.Node (NodePods), not started yet.
func New(cfg Config, pods cache.SharedIndexInformer) *Allocator {
	if cfg.PoolSlots <= 0 {
		cfg.PoolSlots = 110
	}
	if cfg.WaitForPod <= 0 {
		cfg.WaitForPod = DefaultWaitForPod
	}
	if cfg.HostRoot == "" {
		cfg.HostRoot = "/"
	}
	if cfg.Kinds == nil {
		cfg.Kinds = kinds.Builtin
	}
	a := &Allocator{
		cfg:       cfg,
		kinds:     cfg.Kinds,
		informer:  pods,
		changed:   make(chan struct{}),
		allocated: map[allocKey]*Record{},
	}
	a.handoff = a.kindsHandoff()
	empty := map[string]*v1alpha1.Device{}
	a.devices.Store(&empty)
	// Errors only when the informer has started, which it has not.
	_ = a.informer.SetTransform(toPodInfo)
	_ = a.informer.AddIndexers(indexers)
	_, _ = a.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.notify() },
		UpdateFunc: func(_, obj any) { a.forgetIfTerminal(obj); a.notify() },
		DeleteFunc: func(obj any) { a.forget(obj); a.notify() },
	})
	return a
}

// kindsHandoff is what the kinds' container edits read, from a.cfg: built
// once, so that Allocate does not build it per call.
func (a *Allocator) kindsHandoff() devicekind.Handoff {
	return NewHandoff(a.cfg.HostRoot, a.cfg.DeviceListStrategies, a.device)
}

// Run waits for the pod informer (started by its factory) to sync, then marks
// the allocator ready until ctx ends. checkpoint, if set, is the kubelet's
// device-manager checkpoint: what it lists for class resources counts as
// allocated, so an agent restarted between two pods of a shared pool does not
// hand the same container's slot out twice.
func (a *Allocator) Run(ctx context.Context, checkpoint string) error {
	if !cache.WaitForCacheSync(ctx.Done(), a.informer.HasSynced) {
		return ctx.Err()
	}
	if checkpoint != "" {
		n, err := a.loadCheckpoint(checkpoint)
		if err != nil {
			klog.FromContext(ctx).Error(err, "kubelet checkpoint not read; allocation state starts empty", "path", checkpoint)
		} else {
			klog.FromContext(ctx).Info("allocation state rebuilt from the kubelet's checkpoint", "containers", n)
		}
	}
	a.ready.Store(true)
	// The records are the node's holders for as long as the allocator runs.
	defer a.cfg.Metrics.attach(a)()
	ticker := time.NewTicker(sweepInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			if n := a.sweep(); n > 0 {
				klog.FromContext(ctx).V(2).Info("forgot the allocations of pods gone", "records", n)
			}
		}
	}
}

// sweepInterval is how often records of pods gone are swept.
const sweepInterval = time.Minute

// sweep drops the allocation records of pods the cache no longer has, or has
// finished, and returns how many it dropped. The pod informer's handlers drop
// them as pods go (forget), but an Allocate that found its pod just before
// the pod's deletion was handled records it after: without the sweep that
// record, and the container it names, would stay for the agent's life.
func (a *Allocator) sweep() int {
	live := func(uid types.UID) bool {
		objs, _ := a.informer.GetIndexer().ByIndex(byUID, string(uid))
		return len(objs) == 1 && !objs[0].(*podInfo).terminal()
	}
	a.recordsMu.Lock()
	defer a.recordsMu.Unlock()
	n := 0
	for k := range a.allocated {
		if !live(k.pod) {
			delete(a.allocated, k)
			n++
		}
	}
	return n
}

// HasSynced reports whether the pod cache is filled and the kubelet's
// checkpoint read: endpoints should serve only then.
func (a *Allocator) HasSynced() bool { return a.ready.Load() }

// SetDevices gives the allocator the node's current devices. It keeps a copy:
// the caller goes on using its own (publishing it, for one).
func (a *Allocator) SetDevices(devices []v1alpha1.Device) {
	m := make(map[string]*v1alpha1.Device, len(devices))
	for i := range devices {
		d := devices[i].DeepCopy()
		// Quantity.String caches its result in the Quantity: render each once
		// here, so that concurrent Allocate calls only read.
		for _, attr := range d.Attributes {
			if attr.QuantityValue != nil {
				_ = attr.QuantityValue.String()
			}
		}
		m[d.ID] = d
	}
	a.devices.Store(&m)
}

func (a *Allocator) device(id string) *v1alpha1.Device { return (*a.devices.Load())[id] }

// KubeletIDs are the ids the kubelet knows d by, for one class: its own,
// poolSlots slots of a pool, or shareSlots share slots of a device that
// serves shares (ShareSlots of the class's unit; 0 for a class without one,
// which selects no such device).
func KubeletIDs(kinds *devicekind.Registry, d *v1alpha1.Device, poolSlots, shareSlots int) []string {
	switch kinds.Allocation(d) {
	case devicekind.Pool:
		ids := make([]string, poolSlots)
		for i := range ids {
			ids[i] = d.ID + "/" + strconv.Itoa(i)
		}
		return ids
	case devicekind.Shared:
		return ShareSlotIDs(d.ID, shareSlots)
	}
	return []string{d.ID}
}

// DeviceID is the device a kubelet id names: a slot's pool or shared device,
// or the id itself. Device ids never contain "/" (PCI addresses, UUIDs, pool
// names).
func DeviceID(kubeletID string) string {
	id, _, _ := ParseKubeletID(kubeletID)
	if id == "" {
		id, _, _ = strings.Cut(kubeletID, "/")
	}
	return id
}

func (a *Allocator) notify() {
	a.changedMu.Lock()
	close(a.changed)
	a.changed = make(chan struct{})
	a.changedMu.Unlock()
}

func (a *Allocator) changes() <-chan struct{} {
	a.changedMu.Lock()
	defer a.changedMu.Unlock()
	return a.changed
}

// forget drops the allocation records of a deleted pod.
func (a *Allocator) forget(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*podInfo)
	if !ok {
		return
	}
	a.recordsMu.Lock()
	defer a.recordsMu.Unlock()
	for k := range a.allocated {
		if k.pod == p.UID {
			delete(a.allocated, k)
		}
	}
}

// forgetIfTerminal: the kubelet frees a finished pod's devices.
func (a *Allocator) forgetIfTerminal(obj any) {
	if p, ok := obj.(*podInfo); ok && p.terminal() {
		a.forget(p)
	}
}

func (a *Allocator) isAllocated(k allocKey) bool {
	a.recordsMu.Lock()
	defer a.recordsMu.Unlock()
	return a.allocated[k] != nil
}

// waitFor calls try until it returns true, again after every pod event, until
// WaitForPod has passed.
func (a *Allocator) waitFor(ctx context.Context, try func() bool) bool {
	var timeout <-chan time.Time
	for {
		changed := a.changes()
		if try() {
			return true
		}
		if timeout == nil {
			t := time.NewTimer(a.cfg.WaitForPod)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-changed:
		case <-timeout:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// match is a container of a pod with an assignment for a class.
type match struct {
	pod       *podInfo
	container string
	devices   []string         // assigned device ids for the class
	share     assignment.Share // the container's share, for a share class
}

func (m *match) key(class string) allocKey {
	return allocKey{pod: m.pod.UID, container: m.container, class: class}
}

// first returns, of the live pods indexed under key in index, the first in
// admission order (see compare) with an unallocated container whose assignment
// for class accept takes, and whether another pod has one too. known, if set,
// keeps to the pods it names. It makes one pass without sorting or allocating:
// on a shared pool every pod of the node may be indexed under the key.
func (a *Allocator) first(index, key, class string, accept acceptFunc, known kubeletpods.Pods) (best match, found, others bool) {
	objs, err := a.informer.GetIndexer().ByIndex(index, key)
	if err != nil {
		return match{}, false, false
	}
	for _, o := range objs {
		p := o.(*podInfo)
		if p.assignment == nil || p.assignment.Node != a.cfg.Node || (others && !before(p, best.pod)) {
			continue
		}
		if known != nil && !known[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] {
			continue
		}
		for i := range p.assignment.Containers {
			c := &p.assignment.Containers[i]
			ids, ok := c.Classes[class]
			if !ok || !accept(p, c, ids) {
				continue
			}
			m := match{pod: p, container: c.Name, devices: ids, share: c.Shares[class]}
			if !a.isAllocated(m.key(class)) {
				if found {
					others = true
				}
				if !found || before(p, best.pod) {
					best = m
				}
				found = true
				break
			}
		}
	}
	return best, found, others
}

// acceptFunc says whether container c of pod p, assigned ids of the class,
// is the one a kubelet call is about.
type acceptFunc func(p *podInfo, c *assignment.Container, ids []string) bool

// choose is first, asking the kubelet which pods it knows when several
// qualify: the one it admits is among them. ok false: no pod qualifies yet
// (the caller waits for the informer). A kubelet that does not answer leaves
// the guess of the order.
func (a *Allocator) choose(ctx context.Context, call, index, key, class string, accept acceptFunc) (match, bool) {
	best, found, others := a.first(index, key, class, accept, nil)
	if !others || a.cfg.KubeletPods == nil {
		return best, found
	}
	known, err := a.cfg.KubeletPods.Known(ctx)
	if err != nil {
		a.cfg.Metrics.order(call, "guessed")
		msg := fmt.Sprintf("several pods wait for %s devices and the kubelet did not say which one it admits (%v): guessed the oldest, %s/%s; if the kubelet admits another, the two swap devices against the scheduler's accounting", class, err, best.pod.Namespace, best.pod.Name)
		klog.FromContext(ctx).Info("admission order guessed", "class", class, "pod", klog.KRef(best.pod.Namespace, best.pod.Name), "err", err)
		if a.cfg.Recorder != nil {
			a.cfg.Recorder.Event(best.pod.ref(), corev1.EventTypeWarning, ReasonOrderGuessed, msg)
		}
		return best, true
	}
	m, found, _ := a.first(index, key, class, accept, known)
	if !found {
		// The pod the kubelet admits is not in the cache yet: wait for it.
		a.cfg.Metrics.order(call, "waited")
		return match{}, false
	}
	a.cfg.Metrics.order(call, "asked")
	if m.pod.UID != best.pod.UID {
		klog.FromContext(ctx).V(2).Info("the kubelet admits a newer pod first", "class", class, "pod", klog.KRef(m.pod.Namespace, m.pod.Name), "older", klog.KRef(best.pod.Namespace, best.pod.Name))
	}
	return m, true
}

// Preferred implements deviceplugin.Handler.
func (a *Allocator) Preferred(ctx context.Context, resource string, req *pluginapi.ContainerPreferredAllocationRequest) []string {
	start := time.Now()
	class := strings.TrimPrefix(resource, v1alpha1.ResourceNamePrefix)
	available := map[string][]string{} // device id -> its available kubelet ids
	for _, id := range req.GetAvailableDeviceIDs() {
		dev := DeviceID(id)
		available[dev] = append(available[dev], id)
	}
	must := map[string]string{} // device id -> must-include kubelet id
	for _, id := range req.GetMustIncludeDeviceIDs() {
		must[DeviceID(id)] = id
	}
	size := int(req.GetAllocationSize())
	if isShareRequest(req.GetAvailableDeviceIDs()) || isShareRequest(req.GetMustIncludeDeviceIDs()) {
		return a.preferredShare(ctx, start, class, size, available, req.GetMustIncludeDeviceIDs())
	}
	fits := func(_ *podInfo, c *assignment.Container, ids []string) bool {
		if _, share := c.Shares[class]; share || len(ids) != size {
			return false
		}
		for _, id := range ids {
			if _, ok := available[id]; !ok {
				if _, ok := must[id]; !ok {
					return false
				}
			}
		}
		for dev := range must {
			if !slices.Contains(ids, dev) {
				return false
			}
		}
		return true
	}
	chosen, found := a.preferred(ctx, start, class, size, "assignment", fits)
	if !found {
		return nil
	}
	out := make([]string, 0, size)
	for _, dev := range chosen.devices {
		switch {
		case must[dev] != "":
			out = append(out, must[dev])
		case len(available[dev]) > 0:
			slots := available[dev]
			slices.Sort(slots)
			out = append(out, slots[0])
		}
	}
	return out
}

// preferred waits, as Preferred does, for the first container that fits to
// be known, and counts the call; found is false when none is, and the
// kubelet is left to choose. what names the kind of container sought in the
// log.
func (a *Allocator) preferred(ctx context.Context, start time.Time, class string, size int, what string, fits acceptFunc) (chosen match, found bool) {
	found = a.waitFor(ctx, func() bool {
		var ok bool
		chosen, ok = a.choose(ctx, "preferred", byClass, class, class, fits)
		return ok
	})
	a.cfg.Metrics.observe("preferred", start)
	if !found {
		klog.FromContext(ctx).V(2).Info("no pending "+what+" fits the kubelet's request; leaving the choice to the kubelet", "class", class, "size", size)
	}
	return chosen, found
}

// isShareRequest says whether the kubelet's ids are share slots: a share
// class's endpoint advertises nothing else.
func isShareRequest(kubeletIDs []string) bool {
	for _, id := range kubeletIDs {
		if _, kind, ok := ParseKubeletID(id); ok && kind == shareSlot {
			return true
		}
	}
	return false
}

// preferredShare is Preferred for a share class: the container whose
// assignment names one device with a share of the class and who requests
// size units gets size slots of that device preferred, the must-include
// ones first.
func (a *Allocator) preferredShare(ctx context.Context, start time.Time, class string, size int, available map[string][]string, mustIDs []string) []string {
	must := map[string][]string{} // device id -> its must-include slots
	for _, id := range mustIDs {
		must[DeviceID(id)] = append(must[DeviceID(id)], id)
	}
	fits := func(p *podInfo, c *assignment.Container, ids []string) bool {
		if _, share := c.Shares[class]; !share || len(ids) != 1 || p.count(c.Name, class) != int64(size) {
			return false
		}
		if len(must) > 1 || (len(must) == 1 && must[ids[0]] == nil) {
			return false
		}
		return len(must[ids[0]])+len(available[ids[0]]) >= size
	}
	chosen, found := a.preferred(ctx, start, class, size, "share", fits)
	if !found {
		return nil
	}
	dev := chosen.devices[0]
	out := slices.Clone(must[dev])
	slots := slices.Clone(available[dev])
	slices.SortFunc(slots, compareSlots)
	for _, id := range slots {
		if len(out) == size {
			break
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// compareSlots orders slot ids by number, so that preferences are the
// lowest free slots.
func compareSlots(x, y string) int {
	nx, _ := strconv.Atoi(x[strings.LastIndexByte(x, '/')+1:])
	ny, _ := strconv.Atoi(y[strings.LastIndexByte(y, '/')+1:])
	if c := nx - ny; c != 0 {
		return c
	}
	return strings.Compare(x, y)
}

// Allocate implements deviceplugin.Handler.
func (a *Allocator) Allocate(ctx context.Context, resource string, kubeletIDs []string) (*pluginapi.ContainerAllocateResponse, error) {
	start := time.Now()
	defer a.cfg.Metrics.observe("allocate", start)
	class := strings.TrimPrefix(resource, v1alpha1.ResourceNamePrefix)
	devices, shares, err := a.deviceIDs(kubeletIDs)
	if err != nil {
		a.cfg.Metrics.outcome(class, "invalid")
		return nil, fmt.Errorf("%s: %w", resource, err)
	}
	want := slices.Sorted(slices.Values(devices))
	// Ids are unique within a container's class (assignment.Validate), so equal
	// lengths and containment are set equality. Share slots go to a container
	// with a share of the class that requested as many units; the slots of
	// its one device are then exactly what it was assigned.
	exact := func(p *podInfo, c *assignment.Container, ids []string) bool {
		if _, share := c.Shares[class]; share != shares {
			return false
		}
		if shares && p.count(c.Name, class) != int64(len(kubeletIDs)) {
			return false
		}
		if len(ids) != len(want) {
			return false
		}
		for _, id := range ids {
			if _, ok := slices.BinarySearch(want, id); !ok {
				return false
			}
		}
		return true
	}
	var m match
	if !a.waitFor(ctx, func() bool {
		var ok bool
		m, ok = a.choose(ctx, "allocate", byDevice, deviceKey(class, want[0]), class, exact)
		return ok
	}) {
		return nil, a.refuse(ctx, class, want, shares, kubeletIDs)
	}
	made, err := a.makeSlices(ctx, m)
	if err != nil {
		a.record(m, class, err.Error())
		a.cfg.Metrics.outcome(class, "error")
		if a.cfg.Recorder != nil {
			a.cfg.Recorder.Eventf(m.pod.ref(), corev1.EventTypeWarning, ReasonMIGSliceFailed,
				"container %s: the MIG slice the scheduler chose could not be made: %v; the pod fails admission, and its controller's replacement is placed again", m.container, err)
		}
		return nil, fmt.Errorf("%s: %w", resource, err)
	}
	resp, err := a.response(m, class, made)
	if err != nil {
		a.record(m, class, err.Error())
		a.cfg.Metrics.outcome(class, "error")
		return nil, err
	}
	a.record(m, class, "")
	a.cfg.Metrics.outcome(class, "allocated")
	klog.FromContext(ctx).V(2).Info("allocated", "pod", klog.KRef(m.pod.Namespace, m.pod.Name), "container", m.container, "class", class, "devices", m.devices)
	return resp, nil
}

// deviceIDs maps the kubelet's ids to device ids, and says whether they are
// share slots, refusing what the kubelet never sends: nothing, duplicates,
// ids of no device here or not of the form the device is advertised in,
// share slots mixed with other ids.
func (a *Allocator) deviceIDs(kubeletIDs []string) (devices []string, shares bool, err error) {
	if len(kubeletIDs) == 0 {
		return nil, false, errors.New("allocate request names no devices")
	}
	seen := make(map[string]bool, len(kubeletIDs))
	out := make([]string, 0, len(kubeletIDs))
	for i, kid := range kubeletIDs {
		if seen[kid] {
			return nil, false, fmt.Errorf("device %q requested twice", kid)
		}
		seen[kid] = true
		id, kind, ok := ParseKubeletID(kid)
		d := a.device(id)
		if !ok || d == nil {
			return nil, false, fmt.Errorf("no device %q on this node", kid)
		}
		if want := a.slotKind(d); kind != want {
			return nil, false, fmt.Errorf("no device %q on this node: %s is advertised %s", kid, id, [...]string{"by its id", "as pool slots", "as share slots"}[want])
		}
		if i == 0 {
			shares = kind == shareSlot
		} else if shares != (kind == shareSlot) {
			return nil, false, errors.New("allocate request mixes share slots with other devices")
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out, shares, nil
}

// slotKind is how d is advertised.
func (a *Allocator) slotKind(d *v1alpha1.Device) slotKind {
	switch a.kinds.Allocation(d) {
	case devicekind.Pool:
		return poolSlot
	case devicekind.Shared:
		return shareSlot
	}
	return wholeID
}

// refuse explains why no container has exactly these devices, records it on the
// pod the kubelet most likely meant, and returns the error for the kubelet.
func (a *Allocator) refuse(ctx context.Context, class string, devices []string, shares bool, kubeletIDs []string) error {
	logger := klog.FromContext(ctx)
	likely := func(_ *podInfo, c *assignment.Container, ids []string) bool {
		if _, share := c.Shares[class]; share != shares {
			return false
		}
		return shares || len(ids) == len(devices)
	}
	var m match
	ok := false
	if shares {
		// The container assigned the device of the slots is the likeliest,
		// share or not.
		m, ok, _ = a.first(byClass, class, class, func(_ *podInfo, _ *assignment.Container, ids []string) bool { return slices.Contains(ids, devices[0]) }, nil)
	}
	if !ok {
		m, ok, _ = a.first(byClass, class, class, likely, nil)
	}
	if ok {
		msg := fmt.Sprintf("the kubelet chose %s devices %v for container %q, but the resclass scheduler assigned %v: refusing to run on devices the scheduler did not account for",
			class, devices, m.container, m.devices)
		switch {
		case shares && m.share == nil:
			msg = fmt.Sprintf("the kubelet chose %s share slots %v for container %q, but the resclass scheduler assigned it %v without a share: refusing shares the scheduler did not account for",
				class, kubeletIDs, m.container, m.devices)
		case shares:
			msg = fmt.Sprintf("the kubelet chose %s share slots %v for container %q, but the resclass scheduler assigned a share of %v with %d units: refusing shares the scheduler did not account for",
				class, kubeletIDs, m.container, m.devices, m.pod.count(m.container, class))
		}
		a.cfg.Metrics.outcome(class, "mismatch")
		a.record(m, class, msg)
		if a.cfg.Recorder != nil {
			a.cfg.Recorder.Event(m.pod.ref(), corev1.EventTypeWarning, ReasonMismatch, msg)
		}
		logger.Info("allocation refused: kubelet and scheduler disagree", "pod", klog.KRef(m.pod.Namespace, m.pod.Name), "container", m.container, "class", class, "kubelet", devices, "scheduler", m.devices)
		return errors.New(msg)
	}
	msg := fmt.Sprintf("no pod on node %s was assigned %s devices %v by the resclass scheduler: pods requesting %s%s must be placed by it (schedulerName: resclass-scheduler), which writes the %s annotation",
		a.cfg.Node, class, devices, v1alpha1.ResourceNamePrefix, class, "resclass.io/assignment")
	a.cfg.Metrics.outcome(class, "unassigned")
	objs, _ := a.informer.GetIndexer().ByIndex(byUnassigned, class)
	if p := earliest(objs); p != nil {
		detail := msg
		if p.assignmentErr != nil {
			detail = fmt.Sprintf("the pod's resclass.io/assignment is unusable (%v); %s", p.assignmentErr, msg)
		}
		a.record(match{pod: p, devices: devices}, class, detail)
		if a.cfg.Recorder != nil {
			a.cfg.Recorder.Event(p.ref(), corev1.EventTypeWarning, ReasonNoAssignment, detail)
		}
		logger.Info("allocation refused: pod has no assignment", "pod", klog.KRef(p.Namespace, p.Name), "scheduler", p.schedulerName, "class", class)
		return errors.New(detail)
	}
	logger.Info("allocation refused: no pod holds these devices", "class", class, "devices", devices)
	return errors.New(msg)
}

// record notes an Allocate answer; message set means it was refused.
func (a *Allocator) record(m match, class, message string) {
	r := &Record{
		PodUID: m.pod.UID, Namespace: m.pod.Namespace, Name: m.pod.Name, Container: m.container,
		Class: class, Devices: slices.Clone(m.devices), Share: m.share, Time: time.Now(), Refused: message != "", Message: message,
	}
	a.recordsMu.Lock()
	defer a.recordsMu.Unlock()
	if r.Refused {
		a.refused = append(a.refused, r)
		if len(a.refused) > maxRefusals {
			a.refused = slices.Delete(a.refused, 0, len(a.refused)-maxRefusals)
		}
		return
	}
	a.allocated[m.key(class)] = r
}

// Allocations returns the containers allocated devices (by pod, container,
// class) and the latest refusals.
func (a *Allocator) Allocations() []Record {
	a.recordsMu.Lock()
	out := make([]Record, 0, len(a.allocated)+len(a.refused))
	for _, r := range a.allocated {
		out = append(out, *r)
	}
	for _, r := range a.refused {
		out = append(out, *r)
	}
	a.recordsMu.Unlock()
	slices.SortStableFunc(out, func(x, y Record) int {
		return strings.Compare(x.Namespace+"/"+x.Name+"/"+x.Container+"/"+x.Class, y.Namespace+"/"+y.Name+"/"+y.Container+"/"+y.Class)
	})
	return out
}
