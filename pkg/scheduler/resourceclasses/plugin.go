// Package resourceclasses is the ResourceClasses scheduler plugin: it picks, with
// the node, the exact devices that serve a pod's class.resclass.io/<class>
// requests, and writes them into the pod's assignment annotation for the node
// agent's Allocate (docs/scheduler.md).
package resourceclasses

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"
	"k8s.io/kubernetes/pkg/features"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	"github.com/resclass/resclass/pkg/client/informers/externalversions"
	"github.com/resclass/resclass/pkg/dra"
)

// Name is the plugin's name in the KubeSchedulerConfiguration.
const Name = "ResourceClasses"

const stateKey fwk.StateKey = Name

// Plugin is the ResourceClasses plugin, one per scheduling profile.
type Plugin struct {
	handle fwk.Handle
	args   *Args
	// draClasses: DynamicResources serves class requests on DRA-mode nodes
	// (DRAExtendedResource on in this process), so they pass this plugin
	// there; off (the resclass binary's default), they are refused there,
	// as nothing would allocate them (dramode.go).
	draClasses bool
	*shared
}

// shared is what every profile's plugin in one scheduler shares, as
// kube-scheduler's own cache is: the devices and who holds them, the
// informers that keep them, and the pods waiting for them. A cache per
// profile would not see the devices another profile's pods are assumed to
// hold until their binding comes back through the informer, so two profiles
// could give one device to two pods; and each profile would keep every
// NodeDevices again (with four profiles, three quarters of the scheduler's
// live heap at 5000 nodes, docs/scheduler.md, "5000 nodes and the scheduler's heap").
type shared struct {
	cache  *cache
	synced func() bool
	// pods is the scheduler's pod informer's store: it is updated before any
	// handler hears of a change, so it says whether a pod is really gone
	// (holderGone).
	pods corelisters.PodLister

	mu      sync.Mutex
	waiting map[types.UID]waitingPod // pods with class requests not yet placed

	// profiles are the names of the profiles sharing this state, the
	// schedulerNames of the pods it places (class_pending_pods); under
	// sharedMu.
	profiles map[string]bool
}

// waitingPod is a pod with class requests not yet placed, and its demand,
// which says whether a node's new devices may help it (activateGrown).
type waitingPod struct {
	pod    *corev1.Pod
	demand *demand
}

// sharedBy keeps each scheduler's shared state, by its informer factory: the
// profiles of one scheduler share the factory (one pod informer, one queue).
var (
	sharedMu sync.Mutex
	sharedBy = map[informers.SharedInformerFactory]*shared{}
)

var (
	_ fwk.PreFilterPlugin   = &Plugin{}
	_ fwk.FilterPlugin      = &Plugin{}
	_ fwk.PreScorePlugin    = &Plugin{}
	_ fwk.ScorePlugin       = &Plugin{}
	_ fwk.ReservePlugin     = &Plugin{}
	_ fwk.PreBindPlugin     = &Plugin{}
	_ fwk.EnqueueExtensions = &Plugin{}
)

// New is the plugin's factory, for app.WithPlugin(Name, New).
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := DecodeArgs(obj, os.Getenv("POD_NAMESPACE"))
	if err != nil {
		return nil, err
	}
	p := &Plugin{handle: h, args: args, draClasses: utilfeature.DefaultFeatureGate.Enabled(features.DRAExtendedResource)}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	key := h.SharedInformerFactory()
	if s := sharedBy[key]; s != nil {
		p.shared = s
		s.profiles[h.ProfileName()] = true
		return p, nil
	}
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	p.profiles = map[string]bool{h.ProfileName(): true}
	sharedBy[key] = p.shared
	exporting.CompareAndSwap(nil, p.shared)
	go func() {
		<-ctx.Done()
		sharedMu.Lock()
		delete(sharedBy, key)
		sharedMu.Unlock()
		exporting.CompareAndSwap(p.shared, nil)
	}()
	return p, nil
}

// start makes the shared state with p, the scheduler's first profile's
// plugin: its informers' handlers, and the status writer with p's args
// (statusUpdateInterval and the Lease). The profiles after it share them.
func (p *Plugin) start(ctx context.Context) error {
	h, args := p.handle, p.args
	// The scheduler's config asks for protobuf, which custom resources do not speak.
	cfg := rest.CopyConfig(h.KubeConfig())
	cfg.ContentType, cfg.AcceptContentTypes = runtime.ContentTypeJSON, runtime.ContentTypeJSON
	rc, err := versioned.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("%s: resclass client: %w", Name, err)
	}
	p.shared = &shared{cache: newCache(), waiting: map[types.UID]waitingPod{}}
	p.cache.freed, p.cache.grew = p.activateWaiting, p.activateGrown

	logger := klog.FromContext(ctx).WithName(Name)
	p.cache.untrusted = p.untrusted(logger)
	// Nothing here reads managed fields; they were 37 MB of the scheduler's
	// live heap at 1000 nodes, marked by every garbage collection.
	factory := externalversions.NewSharedInformerFactoryWithOptions(rc, 0, externalversions.WithTransform(stripManagedFields))
	nd := factory.Resclass().V1alpha1().NodeDevices().Informer()
	ndReg, err := nd.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.nodeDevicesChanged(logger, obj.(*v1alpha1.NodeDevices)) },
		UpdateFunc: func(_, obj any) { p.nodeDevicesChanged(logger, obj.(*v1alpha1.NodeDevices)) },
		DeleteFunc: func(obj any) {
			if nd, ok := tombstone[*v1alpha1.NodeDevices](obj); ok {
				p.cache.deleteNodeDevices(nd.Name)
			}
		},
	})
	if err != nil {
		return err
	}
	classes := factory.Resclass().V1alpha1().ResourceClasses()
	rcReg, err := classes.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		// Which devices a class selects decides whether an annotation not yet
		// trusted is believed: check those again (recheck).
		AddFunc: func(obj any) {
			p.cache.setClass(obj.(*v1alpha1.ResourceClass))
			p.cache.recheck()
		},
		UpdateFunc: func(_, obj any) {
			p.cache.setClass(obj.(*v1alpha1.ResourceClass))
			p.cache.recheck()
		},
		DeleteFunc: func(obj any) {
			if rc, ok := tombstone[*v1alpha1.ResourceClass](obj); ok {
				p.cache.deleteClass(rc.Name)
				p.cache.recheck()
			}
		},
	})
	if err != nil {
		return err
	}
	// The scheduler's own pod informer: it starts it, and it holds every pod
	// already, so the devices held are rebuilt from the same watch.
	p.pods = h.SharedInformerFactory().Core().V1().Pods().Lister()
	podReg, err := h.SharedInformerFactory().Core().V1().Pods().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.podChanged(obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { p.podChanged(obj.(*corev1.Pod)) },
		DeleteFunc: func(obj any) {
			if pod, ok := tombstone[*corev1.Pod](obj); ok {
				p.podDeleted(pod)
			}
		},
	})
	if err != nil {
		return err
	}
	// The scheduler's own Node informer: what each kubelet reports of the
	// class resources says whether the node's agent serves them (liveness.go).
	nodeReg, err := h.SharedInformerFactory().Core().V1().Nodes().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.cache.setKubelet(obj.(*corev1.Node)) },
		UpdateFunc: func(_, obj any) { p.cache.setKubelet(obj.(*corev1.Node)) },
		DeleteFunc: func(obj any) {
			if n, ok := tombstone[*corev1.Node](obj); ok {
				p.cache.deleteKubelet(n.Name)
			}
		},
	})
	if err != nil {
		return err
	}
	p.synced = func() bool {
		return ndReg.HasSynced() && rcReg.HasSynced() && podReg.HasSynced() && nodeReg.HasSynced()
	}
	// Readiness and a gauge, with a log line naming what does not sync.
	watchSync(ctx, logger, map[string]func() bool{"NodeDevices": ndReg.HasSynced, "ResourceClasses": rcReg.HasSynced, "Pods": podReg.HasSynced, "Nodes": nodeReg.HasSynced}, syncReportAfter)
	factory.Start(ctx.Done())

	if args.StatusUpdateInterval.Duration > 0 {
		w := newStatusWriter(p.cache, rc, classes.Lister(), h.ClientSet(), args, p.synced)
		p.cache.changed = w.kick
		// The DeviceClass of every class (docs/dra.md, "Classes"), written by
		// the holder of the same Lease. The scheduler's own informer factory
		// has DeviceClasses (its DRA plugin reads them).
		dc, err := dra.NewController(h.ClientSet(), rc, classes, h.SharedInformerFactory().Resource().V1().DeviceClasses(), h.EventRecorder())
		if err != nil {
			return fmt.Errorf("%s: DeviceClass controller: %w", Name, err)
		}
		w.leaders = append(w.leaders, dc.Lead)
		go dc.Run(ctx)
		go w.run(ctx)
	}
	return nil
}

// stripManagedFields is the informers' transform: it drops what nothing here
// reads before the object is stored.
func stripManagedFields(obj any) (any, error) {
	if o, ok := obj.(metav1.Object); ok {
		o.SetManagedFields(nil)
	}
	return obj, nil
}

// tombstone unwraps a deleted object.
func tombstone[T any](obj any) (T, bool) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	t, ok := obj.(T)
	return t, ok
}

// Name returns the plugin's name.
func (p *Plugin) Name() string { return Name }

// nodeDevicesChanged takes a node's new inventory into the cache and reports
// the devices it will give to nobody, once per change: in the log, as a
// Warning Event on the NodeDevices object, and in the invalid_devices metric.
func (p *Plugin) nodeDevicesChanged(logger klog.Logger, nd *v1alpha1.NodeDevices) {
	invalid, changed := p.cache.setNodeDevices(nd)
	if !changed || len(invalid) == 0 {
		return
	}
	var b strings.Builder
	for i, d := range invalid {
		logger.Info("Not giving out a device whose attributes cannot be read", "node", nd.Name, "device", d.id, "reason", d.reason)
		if i < 4 {
			fmt.Fprintf(&b, "; %s: %s", d.id, d.reason)
		}
	}
	if len(invalid) > 4 {
		fmt.Fprintf(&b, "; and %d more (scheduler log)", len(invalid)-4)
	}
	if rec := p.handle.EventRecorder(); rec != nil {
		ref := &v1alpha1.NodeDevices{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "NodeDevices"},
			ObjectMeta: metav1.ObjectMeta{Name: nd.Name, UID: nd.UID, ResourceVersion: nd.ResourceVersion},
		}
		// An Event's note holds at most 1 kB.
		note := fmt.Sprintf("%d device(s) given to no pod until the node agent publishes readable attributes%s", len(invalid), b.String())
		if len(note) > 1000 {
			note = note[:1000]
		}
		rec.Eventf(ref, nil, corev1.EventTypeWarning, "InvalidDevices", "Scheduling", "%s", note)
	}
}

// podChanged keeps the devices a pod holds in step with its phase and, while
// the cache trusts nothing for it yet, its annotation (cache.go, holding).
func (p *Plugin) podChanged(pod *corev1.Pod) {
	if pod.Spec.NodeName == "" {
		return // pending, or between the assignment patch and the binding: Reserve's hold stands
	}
	p.forget(pod.UID)
	if podutil.IsPodTerminal(pod) {
		p.cache.releaseDeleted(pod.UID)
		return
	}
	if preemptedByScheduler(pod) {
		p.reportPreempted(pod)
	}
	raw := annotationState(pod)
	if p.cache.holds(pod.UID, pod.Spec.NodeName, raw) {
		return // a status update of a pod whose devices did not change
	}
	if p.cache.keep(pod, raw) {
		return // what the scheduler decided or believed stands
	}
	h := holdingFromPod(pod)
	if h == nil {
		p.cache.release(pod.UID)
		return
	}
	p.cache.hold(h)
}

// untrusted reports a pod's annotation the cache does not believe: a log line,
// the metric, and a Warning Event on the pod, whose owner is the one to
// explain it. It runs under the cache's lock; none of them blocks.
func (p *Plugin) untrusted(logger klog.Logger) func(h *holding, why *inconsistency) {
	return func(h *holding, why *inconsistency) {
		untrustedAssignments.WithLabelValues(why.reason).Inc()
		held := "the devices " + describeDevices(h.devices) + " stay held"
		if h.blocked != nil {
			held = "it is counted as holding the devices it requests on node " + h.node + ", which ones unknown"
		}
		if len(h.blockedShares) > 0 {
			// claimedShares: never less than the container requests.
			held += ", and its shares as the larger of what it claims and what it requests on the GPUs it names (" + strings.Join(slices.Sorted(maps.Keys(h.blockedShares)), ", ") + ")"
		}
		if h.ref == nil {
			logger.Info("Not believing a pod's device assignment", "podUID", h.uid, "node", h.node, "reason", why.reason, "detail", why.detail)
			return
		}
		logger.Info("Not believing the pod's device assignment", "pod", klog.KRef(h.ref.Namespace, h.ref.Name), "node", h.node,
			"reason", why.reason, "detail", why.detail, "trusted", h.trusted)
		if r := p.handle.EventRecorder(); r != nil {
			r.Eventf(h.ref, nil, corev1.EventTypeWarning, "DeviceAssignmentNotBelieved", "Scheduling",
				"the resclass scheduler does not believe %s (%s): %s; %s until the pod ends", assignment.AnnotationKey, why.reason, why.detail, held)
		}
	}
}

func (p *Plugin) podDeleted(pod *corev1.Pod) {
	p.forget(pod.UID)
	p.cache.releaseDeleted(pod.UID)
}

func (p *Plugin) forget(uid types.UID) {
	p.mu.Lock()
	delete(p.waiting, uid)
	p.mu.Unlock()
}

// activateWaiting moves the pods this plugin may have turned away back to the
// active queue once devices are freed or the classes change (why, for the
// metric). The queueing hints do the same for the scheduler's own events, but
// those can reach the queue before this plugin's informer has updated the
// cache (handlers run independently), and a pod retried against the old cache
// would wait for the next event.
func (p *Plugin) activateWaiting(why string) {
	p.mu.Lock()
	if len(p.waiting) == 0 {
		p.mu.Unlock()
		return
	}
	pods := make(map[string]*corev1.Pod, len(p.waiting))
	for _, w := range p.waiting {
		pods[w.pod.Namespace+"/"+w.pod.Name] = w.pod
	}
	p.mu.Unlock()
	p.activate(why, pods)
}

// activateGrown moves back to the active queue the waiting pods that node's
// new devices may help: those requesting one of classes, which the node gave
// more room (cache.grew), that fit the node now. A NodeDevices change that
// leaves every class as much room as before or less (a pool's free pages
// going down, a device going unhealthy, a condition republished) activates
// nobody: agents republish often, and each pod activated for nothing is a
// scheduling cycle over every node (docs/scheduler.md, "NodeDevices churn").
// A pod not activated here fitted the node before the change, or does not
// fit it now, so this change did not turn it from waiting to placeable there.
func (p *Plugin) activateGrown(node string, classes []string) {
	p.mu.Lock()
	var candidates []waitingPod
	for _, w := range p.waiting {
		if slices.ContainsFunc(w.demand.classes, func(c string) bool { return slices.Contains(classes, c) }) {
			candidates = append(candidates, w)
		}
	}
	p.mu.Unlock()
	var pods map[string]*corev1.Pod
	for _, w := range candidates {
		if _, fits := p.cache.fits(node, nil, w.demand); fits {
			if pods == nil {
				pods = map[string]*corev1.Pod{}
			}
			pods[w.pod.Namespace+"/"+w.pod.Name] = w.pod
		}
	}
	p.activate(activatedNodeDevices, pods)
}

// activate moves pods back to the active queue, counted under why.
func (p *Plugin) activate(why string, pods map[string]*corev1.Pod) {
	if len(pods) == 0 {
		return
	}
	activations.WithLabelValues(why).Add(float64(len(pods)))
	p.handle.Activate(klog.Background(), pods)
}

// state is a pod's class demand and, after Reserve, its placement.
type state struct {
	demand *demand
	placed *assignment.Assignment
	// annotations are placed's, encoded once in Reserve for Bind.
	annotations map[string]string
	patched     bool // Bind patched the annotations in (WriteInPreBind)
	// views are this cycle's what-ifs of nodes (preemption.go), per node name.
	views map[string]*nodeView
	// scores are PreScore's, per node name; nil when it skipped scoring.
	scores map[string]int64
}

// Clone gives preemption's and nominated pods' what-ifs their own views; the
// rest is shared (only Reserve and later write it, on the original).
func (s *state) Clone() fwk.StateData {
	out := *s
	out.views = nil
	for node, v := range s.views {
		if out.views == nil {
			out.views = make(map[string]*nodeView, len(s.views))
		}
		out.views[node] = v.clone()
	}
	return &out
}

func getState(cs fwk.CycleState) (*state, bool) {
	data, err := cs.Read(stateKey)
	if err != nil {
		return nil, false
	}
	s, ok := data.(*state)
	return s, ok
}

// PreFilter reads the pod's class requests; a pod without any skips the plugin.
// It narrows the nodes to those whose devices every requested class selects.
func (p *Plugin) PreFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	d, err := podDemand(pod)
	if err != nil {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	if d == nil {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	if !p.synced() {
		return nil, fwk.AsStatus(fmt.Errorf("the device cache is not synced yet"))
	}
	p.mu.Lock()
	p.waiting[pod.UID] = waitingPod{pod: pod, demand: d}
	p.mu.Unlock()

	eligible, u := p.cache.eligible(d)
	if eligible == nil { // a class that does not exist
		return nil, unfitStatus(u)
	}
	cs.Write(stateKey, &state{demand: d})
	// A PreFilterResult costs the framework a copy of the set and a lookup per
	// name, for every pod: O(eligible nodes), 5000 map operations on a 5000-node
	// cluster. Filter refuses a node without a class in one lookup, so
	// narrowing pays only when it leaves out most nodes (docs/scheduler.md,
	// "Where the time goes"). Filter answers for DRA-mode nodes itself
	// (dramode.go), so without narrowing they need no look either: the scan
	// of every node's labels below is paid only when the result narrows or
	// refuses.
	narrows := func() bool { return eligible.Len()*2 <= len(nodes) }
	if u == nil && !narrows() {
		return nil, nil
	}
	// DRA-mode nodes are the DynamicResources plugin's (Filter passes them)
	// where it serves class requests; else Filter refuses them, and no
	// device-plugin node without the classes is in eligible either.
	if p.draClasses {
		if dra := draNodes(nodes); dra.Len() > 0 {
			eligible, u = eligible.Union(dra), nil
		}
	}
	if u != nil { // no node has devices of every class
		return nil, unfitStatus(u)
	}
	if !narrows() {
		return nil, nil
	}
	return &fwk.PreFilterResult{NodeNames: eligible}, nil
}

// PreFilterExtensions: AddPod and RemovePod (preemption.go) let preemption
// and nominated pods change what Filter sees on a node.
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return p }

// Filter: the node's free, healthy devices serve every class request at once,
// and the node's agent serves every requested class (liveness.go): both
// answered by the cache.
func (p *Plugin) Filter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) *fwk.Status {
	s, ok := getState(cs)
	if !ok {
		return fwk.AsStatus(fmt.Errorf("%s: PreFilter state missing", Name))
	}
	name := ni.Node().Name
	if isDRANode(ni.Node()) {
		if p.draClasses {
			return nil
		}
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, errDRANode)
	}
	if why, ok := p.cache.fits(name, s.views[name], s.demand); !ok {
		return unfitStatus(&why)
	}
	return nil
}

func unfitStatus(u *unfit) *fwk.Status {
	if u.unresolvable {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, u.reason)
	}
	return fwk.NewStatus(fwk.Unschedulable, u.reason)
}

// PreScore scores every feasible node once, under one read lock of the
// cache, for Score to read (but for Topology). It skips scoring for pods
// without class requests, for FirstFit, and when every node scores the
// same: a score equal on every node changes no ranking (the common
// one-device pod under NUMAAligned on nodes that publish their NUMA nodes),
// and skipping it spares the framework's per-node work for this plugin
// (docs/scheduler.md, "Where the class pod's extra CPU went").
func (p *Plugin) PreScore(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	s, ok := getState(cs)
	if !ok || p.args.Strategy == FirstFit {
		return fwk.NewStatus(fwk.Skip)
	}
	if p.args.Strategy == Topology {
		// A node's score is a search over its device sets: Score runs it on
		// the framework's parallel workers, node by node.
		return nil
	}
	if p.args.Strategy == NUMAAligned && len(s.demand.classes) == 1 && s.demand.draws[s.demand.classes[0]] == 1 &&
		p.cache.numaCertain(s.demand.classes[0]) {
		// One device on a NUMA node it publishes: MaxScore on every node,
		// known without visiting one.
		return fwk.NewStatus(fwk.Skip)
	}
	names := make([]string, len(nodes))
	for i, ni := range nodes {
		names[i] = ni.Node().Name
	}
	scores := p.cache.scores(names, s.demand, p.args.Strategy)
	if !slices.ContainsFunc(scores, func(v int64) bool { return v != scores[0] }) {
		return fwk.NewStatus(fwk.Skip)
	}
	s.scores = make(map[string]int64, len(names))
	for i, name := range names {
		s.scores[name] = scores[i]
	}
	return nil
}

// Score ranks a node by the strategy (see Strategy): the score PreScore
// computed for it.
func (p *Plugin) Score(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	s, ok := getState(cs)
	if !ok {
		return 0, nil
	}
	if score, ok := s.scores[ni.Node().Name]; ok {
		return score, nil
	}
	return p.cache.scores([]string{ni.Node().Name}, s.demand, p.args.Strategy)[0], nil
}

// strategyScore is a node's score under strategy from cache.scoreLocked's
// answer.
func strategyScore(strategy Strategy, fits bool, util int64, numas int, quality int64) int64 {
	if !fits {
		return 0
	}
	switch strategy {
	case BinPack:
		return util
	case Spread:
		return fwk.MaxScore - util
	case NUMAAligned:
		// One NUMA node scores highest; each further NUMA node the pod must
		// span lowers the score. Devices that publish no NUMA node (numas 0)
		// score in between: alignment there is unknown, neither promised nor
		// ruled out.
		switch numas {
		case 0:
			return fwk.MaxScore / 2
		case 1:
			return fwk.MaxScore
		}
		return fwk.MaxScore / int64(numas+1)
	case Topology:
		// The best set the node offers, then how full it is: among nodes
		// that offer equally connected sets, the fuller one, so that empty
		// nodes stay whole for large pods.
		return (quality*9 + util) / 10
	}
	return 0
}

// ScoreExtensions: scores are already 0..100.
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return nil }

// Reserve chooses the devices on the chosen node and holds them in the cache, so
// that the next pod's Filter sees them taken before this pod is bound.
func (p *Plugin) Reserve(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	s, ok := getState(cs)
	if !ok {
		return nil
	}
	if ni, err := p.handle.SnapshotSharedLister().NodeInfos().Get(nodeName); err == nil && isDRANode(ni.Node()) {
		p.forget(pod.UID) // DynamicResources allocates its devices
		return nil
	}
	r, u, err := p.cache.reserve(pod, nodeName, s.demand, p.args.Strategy, p.args.ShareStrategy)
	switch {
	case u != nil:
		return unfitStatus(u)
	case err != nil:
		assignments.WithLabelValues("invalid").Inc()
		return fwk.AsStatus(err)
	}
	s.placed, s.annotations = r.assignment, r.annotations
	p.forget(pod.UID)
	reservations.WithLabelValues(string(p.args.Strategy), alignedLabel(r.placement)).Inc()
	if p.args.Strategy == Topology && r.placement.exclusive > 1 {
		topologyQuality.Observe(float64(r.placement.quality))
		klog.FromContext(ctx).V(4).Info("Reserved a topology placement", "pod", klog.KObj(pod), "node", nodeName, "quality", r.placement.quality)
	}
	return nil
}

// reservationAnnotations are the annotations that carry a to the node agent:
// the assignment, and the compatibility key per device (assignment.CompatKey)
// with the quantity the pod takes of it: its fresh draws that the device
// serves (1 for an exclusive device; a hugepage pool may serve several
// containers' draws; a shared device the units of the class it serves).
func reservationAnnotations(a *assignment.Assignment, pl *placement) (map[string]string, error) {
	anns, err := assignment.Annotations(a)
	if err != nil {
		return nil, err
	}
	for class, ids := range pl.drawn {
		counts := map[string]int64{}
		for k, id := range ids {
			if shares := pl.shares[class]; shares != nil {
				counts[id] += shares[k].units
			} else {
				counts[id]++
			}
		}
		for id, n := range counts {
			anns[assignment.CompatKey(class, id)] = strconv.FormatInt(n, 10)
		}
	}
	return anns, nil
}

func alignedLabel(pl *placement) string {
	if pl.numas == 0 {
		return "unknown"
	}
	if pl.aligned {
		return "true"
	}
	return "false"
}

// Unreserve releases what Reserve held and, if Bind already patched in the
// annotations, removes them, so a pod that goes back to the queue does not carry
// devices it does not hold.
func (p *Plugin) Unreserve(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) {
	s, ok := getState(cs)
	if !ok || s.placed == nil {
		return
	}
	if p.cache.isAssumed(pod.UID) {
		p.cache.release(pod.UID)
	}
	// What Bind patched in is known from the placement only: read it before
	// forgetting the placement.
	written := s.annotations
	s.placed, s.annotations = nil, nil
	if s.patched {
		s.patched = false
		patch := staleKeys(pod)
		for key := range written {
			patch[key] = nil
		}
		if err := p.patchAnnotations(ctx, pod, patch); err != nil {
			klog.FromContext(ctx).Error(err, "Removing the device assignment of an unreserved pod", "pod", klog.KObj(pod))
		}
	}
	p.mu.Lock()
	p.waiting[pod.UID] = waitingPod{pod: pod, demand: s.demand}
	p.mu.Unlock()
}

// PreBindPreFlight: only a pod carrying stale resclass annotations (from an
// attempt that failed) gives PreBind work, with WriteInBinding. The
// assignment itself is written at the bind extension point in both modes:
// kube-scheduler patches a pod's nominatedNodeName before any PreBind that has
// work, which would cost every class pod one more API write.
func (p *Plugin) PreBindPreFlight(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	s, ok := getState(cs)
	if !ok || s.placed == nil || p.args.AssignmentWrite != WriteInBinding || len(staleKeys(pod)) == 0 {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	return &fwk.PreBindPreFlightResult{AllowParallel: true}, nil
}

// PreBind removes stale resclass annotations from an earlier attempt, with
// WriteInBinding; Bind writes the assignment.
func (p *Plugin) PreBind(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	s, ok := getState(cs)
	if !ok || s.placed == nil || p.args.AssignmentWrite != WriteInBinding {
		return nil
	}
	patch := staleKeys(pod)
	if len(patch) == 0 {
		return nil
	}
	if err := p.patchAnnotations(ctx, pod, patch); err != nil {
		return fwk.AsStatus(fmt.Errorf("removing a stale device assignment: %w", err))
	}
	return nil
}

// Bind writes the assignment of a pod with devices placed. With
// WriteInBinding it binds the pod through a Binding that carries the
// assignment annotations: the apiserver merges them into the pod as it sets
// spec.nodeName, in one write. With WriteInPreBind it patches the pod with
// them (removing stale resclass keys in the same patch) and hands the binding
// on to the next Bind plugin. Other pods are left to the next Bind plugin.
func (p *Plugin) Bind(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	s, ok := getState(cs)
	if !ok || s.placed == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	if p.args.AssignmentWrite == WriteInPreBind {
		patch := staleKeys(pod)
		for key, value := range s.annotations {
			patch[key] = value
		}
		if err := p.patchAnnotations(ctx, pod, patch); err != nil {
			assignments.WithLabelValues("error").Inc()
			return fwk.AsStatus(fmt.Errorf("writing the device assignment: %w", err))
		}
		s.patched = true
		assignments.WithLabelValues("written").Inc()
		return fwk.NewStatus(fwk.Skip)
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Annotations: s.annotations},
		Target:     corev1.ObjectReference{Kind: "Node", Name: nodeName},
	}
	if err := p.handle.ClientSet().CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		assignments.WithLabelValues("error").Inc()
		return fwk.AsStatus(fmt.Errorf("binding with the device assignment: %w", err))
	}
	assignments.WithLabelValues("written").Inc()
	return nil
}

// staleKeys is a merge patch removing every resclass annotation pod carries.
func staleKeys(pod *corev1.Pod) map[string]any {
	patch := map[string]any{}
	for key := range pod.Annotations {
		if assignment.IsAnnotation(key) {
			patch[key] = nil
		}
	}
	return patch
}

func (p *Plugin) patchAnnotations(ctx context.Context, pod *corev1.Pod, annotations map[string]any) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	_, err = p.handle.ClientSet().CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, body, metav1.PatchOptions{})
	return err
}

// assignment turns a placement into each container's devices and shares.
func (d *demand) assignment(node string, pl *placement) *assignment.Assignment {
	a := &assignment.Assignment{Node: node}
	perContainer := map[string]map[string][]string{}
	shares := map[string]map[string]assignment.Share{}
	for _, class := range slices.Sorted(maps.Keys(pl.drawn)) {
		var byContainer map[string][]string
		if placed := pl.shares[class]; placed == nil {
			byContainer = d.assign(class, pl.drawn[class])
		} else {
			// One device per container, in the pod's order (placeShares).
			byContainer = map[string][]string{}
			k := 0
			for _, c := range d.containers {
				if c.classes[class] == 0 {
					continue
				}
				byContainer[c.name] = pl.drawn[class][k : k+1]
				if shares[c.name] == nil {
					shares[c.name] = map[string]assignment.Share{}
				}
				shares[c.name][class] = assignmentShare(placed[k].amount)
				k++
			}
		}
		for name, ids := range byContainer {
			if perContainer[name] == nil {
				perContainer[name] = map[string][]string{}
			}
			perContainer[name][class] = ids
		}
	}
	for _, c := range d.containers {
		if classes := perContainer[c.name]; len(classes) > 0 {
			a.Containers = append(a.Containers, assignment.Container{Name: c.name, Init: c.init, Classes: classes, Shares: shares[c.name]})
		}
	}
	return a
}
