package nodeagent

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	"github.com/resclass/resclass/pkg/client/informers/externalversions"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/deviceplugin"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/introspection"
	"github.com/resclass/resclass/pkg/inventory"
	agentv1 "github.com/resclass/resclass/proto/resclass/agent/v1"
)

// Config is what a running agent needs besides its clients.
type Config struct {
	// NodeName is the node the agent runs on (the pod's spec.nodeName).
	NodeName string
	// HostRoot is where the host's / is mounted ("/" when not in a container).
	HostRoot string
	// IncludeVirtualNICs also publishes interfaces without hardware behind them.
	IncludeVirtualNICs bool
	// PollInterval is how often the kinds that are devicekind.Pollers are
	// re-read (NICs and hugepage pools, sysfs only: link state, free pages).
	PollInterval time.Duration
	// ResyncInterval is how often the kinds that are devicekind.Openers are
	// described again (the GPUs, through NVML) and the published objects
	// compared with the inventory, whatever else happens.
	ResyncInterval time.Duration
	// OpenRetryMax is the longest wait between attempts to open a source
	// that does not open (NVML; the waits double from a second). Default 30
	// seconds.
	OpenRetryMax time.Duration
	// DeviceGracePeriod is how long an opened source's devices are kept
	// through passes that fail to describe them (grace.go). Default 5
	// minutes; negative keeps none.
	DeviceGracePeriod time.Duration
	// ShutdownTimeout bounds how long the agent, when stopping, waits for its
	// Events to be written. Default 10 seconds.
	ShutdownTimeout time.Duration
	// ShutdownDelay is how long a stopping agent keeps its endpoints serving
	// after it announced that it stops: a pod the scheduler bound before it
	// read the announcement still reaches the kubelet and gets its Allocate.
	// Default 2 seconds; negative: none.
	ShutdownDelay time.Duration
	// StallTimeout is how long the worker may go without finishing a pass
	// before Live fails (/healthz). Default six poll intervals, at least two
	// minutes (stallTimeout).
	StallTimeout time.Duration

	// PluginDir is the kubelet's device-plugin directory, where the agent serves
	// one endpoint per ResourceClass that selects a local device; "" serves
	// none (the agent then only publishes the inventory).
	PluginDir string
	// HugepagePoolSlots is how many slots a hugepage pool is to the kubelet
	// (docs/hugepages.md).
	HugepagePoolSlots int
	// WaitForPod bounds how long a kubelet call waits for the agent's pod
	// cache to show the pod it is about.
	WaitForPod time.Duration
	// PodResourcesSocket is the kubelet's PodResources API, which the
	// hand-off asks which pod the kubelet admits when several wait for the
	// same devices (kubeletpods.DefaultSocket on a node); "" does not ask,
	// and the oldest pod is taken. PodResourcesTimeout bounds one question
	// (default a second).
	PodResourcesSocket  string
	PodResourcesTimeout time.Duration
	// IntrospectionSocket is where the agent serves its own gRPC API
	// (proto/resclass/agent/v1) for `node-agent status`; "" serves none.
	IntrospectionSocket string

	// DeviceListStrategies say how GPUs are named to the container runtime
	// (handoff.DefaultStrategy, cdi-cri, when empty). With a CDI strategy the
	// agent keeps the CDI spec of the node's GPUs in CDISpecDir
	// (cdispec.DefaultDir when empty: set it in tests, or the host's is written),
	// naming the driver's files below CDIDriverRoot (a host path, "/" when
	// empty).
	DeviceListStrategies handoff.Strategies
	CDISpecDir           string
	CDIDriverRoot        string
	// NVIDIARuntimeConfigs are the host paths (read below HostRoot) of the
	// NVIDIA container runtime's config.toml, checked at every publish pass
	// for the GPUIsolation condition (pkg/gpuisolation);
	// gpuisolation.DefaultRuntimeConfigs when nil, none when empty (the
	// condition then says it cannot be checked).
	NVIDIARuntimeConfigs []string

	// Kinds are the device kinds the agent discovers (those that are
	// devicekind.Pollers or devicekind.Openers), labels and hands out;
	// kinds.Builtin when nil. A kind's own settings are given here: NVML's
	// library, or a mock in tests, with
	// kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{...}});
	// without it the GPUs are not discovered. A test adds its
	// own kind with kinds.Builtin.With (docs/architecture.md, "Adding a
	// kind").
	Kinds *devicekind.Registry

	// MPSDir is the host directory of the MPS control daemons
	// (mpsstate.DefaultDir when empty): their states are read below
	// HostRoot, and a container given an MPS share mounts its GPU's pipe
	// directory and the clients' /dev/shm from it (docs/sharing.md). The
	// nvidia-gpu kind in Kinds must be given the same (nvidiagpu.Kind.MPSDir).
	MPSDir string

	// DRA is where the DRA kubelet plugin lives when the Node's
	// v1alpha1.LabelDeviceMode selects DRA mode (docs/dra.md, "Nodes").
	DRA DRAConfig
}

// Agent discovers its node's devices and keeps the node's NodeDevices object and
// labels in step with them.
type Agent struct {
	config   Config
	resclass versioned.Interface
	kube     kubernetes.Interface
	metrics  *metrics
	// published is set once the inventory has been published (for /readyz).
	published atomic.Bool
	// worker is the worker's heartbeat, endpoints the device-plugin
	// endpoints while they run (for /healthz).
	worker    *heartbeat
	endpoints atomic.Pointer[deviceplugin.Manager]
}

// New returns an agent; Run starts it.
func New(config Config, resclass versioned.Interface, kube kubernetes.Interface) *Agent {
	return newAgent(config, resclass, kube, nil)
}

func newAgent(config Config, resclass versioned.Interface, kube kubernetes.Interface, m *metrics) *Agent {
	if config.PollInterval <= 0 {
		config.PollInterval = 10 * time.Second
	}
	if config.ResyncInterval <= 0 {
		config.ResyncInterval = 5 * time.Minute
	}
	if config.OpenRetryMax <= 0 {
		config.OpenRetryMax = 30 * time.Second
	}
	if config.DeviceGracePeriod == 0 {
		config.DeviceGracePeriod = DefaultDeviceGracePeriod
	}
	if config.PodResourcesTimeout <= 0 {
		config.PodResourcesTimeout = time.Second
	}
	if config.ShutdownDelay == 0 {
		config.ShutdownDelay = 2 * time.Second
	}
	if config.ShutdownTimeout <= 0 {
		config.ShutdownTimeout = 10 * time.Second
	}
	if config.Kinds == nil {
		config.Kinds = kinds.Builtin
	}
	if m == nil {
		m = newMetrics()
	}
	if config.StallTimeout <= 0 {
		config.StallTimeout = stallTimeout(config.PollInterval)
	}
	return &Agent{config: config, resclass: resclass, kube: kube, metrics: m, worker: newHeartbeat(config.StallTimeout, m.registry)}
}

// Run publishes the inventory until ctx ends. It waits for its Node to exist
// (the agent may start before the kubelet registers it) and for the apiserver
// to answer: an unreachable or failing apiserver at start is retried with
// backoff, never an exit, so a control-plane upgrade does not crash-loop every
// agent. Until the first publish, Published is false (/readyz).
//
// What triggers a publish: a health event of an opened source (a GPU's, at
// once), the poll (NICs' link state, free hugepages), the resync, and any change of the NodeDevices
// object or the Node made by someone else — a deleted NodeDevices is
// re-created within moments. Publishing writes only what differs from the
// apiserver's copy, so the triggers cost reads, not writes. The triggers meet
// in one work queue (client-go's workqueue), which one worker drains: a burst
// of triggers is one pass, and a pass that fails to publish is retried by the
// queue's rate limiter, 1 s doubling to a minute.
//
// A source that does not open (NVML: no driver yet, a wrong library) is tried
// again with backoff, up to OpenRetryMax apart, and a source found gone at a
// resync is closed and tried again likewise: its devices are published once
// it opens, with no restart.
//
// When ctx ends, Run first announces it: NodeDevices' condition AgentServing
// turns False, which the scheduler reads as "place nothing here", and the
// endpoints go on serving for ShutdownDelay, for the pods bound before the
// scheduler read it. Then it shuts down in the reverse order of start: the
// work queue and its triggers stop, the device-plugin endpoints drain (their sockets
// removed at once, the kubelet's calls in flight let finish, with the pods
// informer still running for them), the introspection API stops and its
// socket is removed, the informers stop, the health watchers
// stop, every Event recorded is written (ShutdownTimeout at most), the opened
// sources are closed; then it returns nil.
func (a *Agent) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("node", a.config.NodeName)
	ctx = klog.NewContext(ctx, logger)

	node := a.waitForNode(ctx)
	if node == nil {
		return nil // ctx ended
	}
	r, err := a.start(ctx, node)
	defer r.stop()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r.work(ctx)
	logger.Info("shutting down")
	r.announceStop(logger)
	if r.modeChanged {
		return ErrModeChanged
	}
	return nil
}

// The work queue's items: what a pass does.
const (
	// passPublish discovers the polled kinds, applies health and publishes.
	passPublish = "publish"
	// passDescribe and an Opener's SourceName describe that source's devices
	// again (opening it if it is not open) before a publish pass.
	passDescribe = "describe/"
)

// running is a started agent: everything start created, the state its
// worker keeps between passes, and how to stop it.
type running struct {
	a      *Agent
	node   *corev1.Node
	cancel context.CancelFunc
	// stops undo start, run last to first.
	stops []func()
	// bg are the goroutines start started: the triggers, the servers, the
	// health watcher.
	bg sync.WaitGroup

	recorder   record.EventRecorder
	src        *sources
	queue      workqueue.TypedDelayingInterface[string]
	publishing workqueue.TypedRateLimiter[string] // backoff of failed publishes
	opening    workqueue.TypedRateLimiter[string] // backoff of sources that do not open, by pass
	plugins    *pluginSet
	// slices makes MIG slices for pods, with plugins, or for claims, with
	// dra; migLabels are the Node's MIG labels at the last pass
	// (migLabels).
	slices      *migSlices
	migLabels   string
	introspect  *introspectionSource
	pub         *inventory.Publisher
	nodeDevices interface {
		Get(string) (*v1alpha1.NodeDevices, error)
	}
	nodes interface {
		Get(string) (*corev1.Node, error)
	}

	// The node's device mode at start (one for the agent's life); dra is
	// set in DRA mode, modeChanged once the label says otherwise.
	mode        string
	dra         *draSet
	modeChanged bool

	// stopServing stops the device-plugin endpoints, which serve past ctx's
	// end until the stop is announced (announceStop); nil without them.
	stopServing context.CancelFunc

	// The worker's state (the opened sources' is in src).
	prev      map[string]v1alpha1.Device
	published *v1alpha1.NodeDevicesStatus // the last status published
	sharing   *sharingModes
	isolation *isolation
	retryAt   time.Time // no publish before: the last one failed
}

// start creates and starts every part of the agent, in order; r.stop undoes
// what was started, in reverse, also when start fails half-way.
func (a *Agent) start(ctx context.Context, node *corev1.Node) (*running, error) {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithCancel(ctx)
	r := &running{a: a, node: node, cancel: cancel, isolation: newIsolation(a.config), sharing: newSharingModes(a.config.HostRoot, a.config.MPSDir)}
	r.queue = workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Logger: &logger})
	r.publishing = workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, time.Minute)
	r.opening = workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, a.config.OpenRetryMax)

	// The kinds' opened sources (NVML), closed last.
	r.src = newSources(a.config.Kinds, devicekind.DiscoverOptions{HostRoot: a.config.HostRoot, IncludeVirtual: a.config.IncludeVirtualNICs})
	r.onStop(r.src.close)
	// The first passes open them, queued before any informer can queue a
	// publish: a publish before them would carry an empty condition, which
	// the apiserver refuses.
	for _, o := range r.src.opened {
		r.queue.Add(o.pass)
	}
	// Events, written before the sources close and after everything that
	// records them.
	events := newEvents(ctx, a.kube, a.config.NodeName)
	r.recorder = events
	reportStrategies(logger, a.config.DeviceListStrategies)
	r.onStop(func() { events.flush(ctx, a.config.ShutdownTimeout) })
	// The health watchers run while their source is open (describe starts
	// them).
	r.onStop(func() {
		for _, o := range r.src.opened {
			o.stopWatch()
		}
	})

	// Informers on this node's two objects only; any change triggers a pass.
	trigger := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { r.queue.Add(passPublish) },
		UpdateFunc: func(any, any) { r.queue.Add(passPublish) },
		DeleteFunc: func(any) { r.queue.Add(passPublish) },
	}
	byName := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", a.config.NodeName).String()
	}
	rf := externalversions.NewSharedInformerFactoryWithOptions(a.resclass, 0, externalversions.WithTweakListOptions(byName))
	kf := kubeinformers.NewSharedInformerFactoryWithOptions(a.kube, 0, kubeinformers.WithTweakListOptions(byName))
	r.nodeDevices = rf.Resclass().V1alpha1().NodeDevices().Lister()
	r.nodes = kf.Core().V1().Nodes().Lister()
	if _, err := rf.Resclass().V1alpha1().NodeDevices().Informer().AddEventHandler(trigger); err != nil {
		return r, err
	}
	if _, err := kf.Core().V1().Nodes().Informer().AddEventHandler(trigger); err != nil {
		return r, err
	}
	rf.Start(ctx.Done())
	kf.Start(ctx.Done())
	r.onStop(rf.Shutdown)
	r.onStop(kf.Shutdown)
	rf.WaitForCacheSync(ctx.Done())
	kf.WaitForCacheSync(ctx.Done())

	// The kubelet-facing half: the ResourceClasses (a change triggers a
	// pass), the pods bound to this node (for pkg/handoff), the endpoints.
	// A kubelet call that arrives must find the pods it is about, so the
	// endpoints are served once both informers are synced.
	// One node, one mode (docs/dra.md, "Nodes"): device-plugin endpoints or
	// the DRA kubelet plugin, never both.
	r.mode = v1alpha1.DeviceModeOf(node.Labels)
	if r.mode == v1alpha1.DeviceModeDRA {
		var err error
		if r.dra, err = a.startDRA(ctx, node, r.recorder); err != nil {
			return r, err
		}
		r.onStop(r.dra.stop)
		r.slices = r.dra.slices
	} else if err := a.deleteStaleSlices(ctx); err != nil {
		logger.Error(err, "device-plugin mode: ResourceSlices left from DRA mode not deleted")
	}
	if a.config.PluginDir != "" && r.mode == v1alpha1.DeviceModeDevicePlugin {
		cf := externalversions.NewSharedInformerFactory(a.resclass, 0)
		classes := cf.Resclass().V1alpha1().ResourceClasses()
		if _, err := classes.Informer().AddEventHandler(trigger); err != nil {
			return r, err
		}
		cf.Start(ctx.Done())
		r.onStop(cf.Shutdown)
		pf := handoff.NodePods(a.kube, a.config.NodeName)
		kubelet, closeKubelet, err := a.newKubeletPods()
		if err != nil {
			return r, err
		}
		r.onStop(closeKubelet)
		// MIG slices made on demand (docs/mig.md): the record of the slices
		// made before is read first, so that none is taken for someone
		// else's.
		ms, err := newMIGSlices(a.config.PluginDir)
		if err != nil {
			logger.Error(err, "MIG ownership record")
			r.recorder.Event(r.node, corev1.EventTypeWarning, reasonMIGRecordSetAside, err.Error())
		}
		ms.event = func(eventtype, reason, message string) { r.recorder.Event(r.node, eventtype, reason, message) }
		ms.metrics = a.metrics
		allocator := a.newAllocator(r.recorder, pf.Core().V1().Pods().Informer(), kubelet, ms)
		ms.heldBy, ms.synced = allocator.HeldBy, allocator.HasSynced
		r.slices = ms
		// The pods outlive ctx: a stopping agent drains its endpoints, and an
		// Allocate in flight may be waiting for its pod to reach the cache.
		// They stop after the endpoints (stops run last first).
		podsCtx, stopPods := context.WithCancel(context.WithoutCancel(ctx))
		pf.Start(podsCtx.Done())
		r.onStop(pf.Shutdown)
		r.onStop(stopPods)
		spec, err := a.newCDISpec(logger)
		if err != nil {
			return r, err
		}
		r.goroutine(func() {
			if err := allocator.Run(ctx, filepath.Join(a.config.PluginDir, handoff.CheckpointFile)); err != nil && ctx.Err() == nil {
				logger.Error(err, "allocator stopped")
			}
		})
		if !cache.WaitForCacheSync(ctx.Done(), classes.Informer().HasSynced, allocator.HasSynced) {
			return r, ctx.Err()
		}
		manager := a.newManager(allocator)
		a.endpoints.Store(manager)
		r.onStop(func() { a.endpoints.Store(nil) })
		serveCtx, stopServing := context.WithCancel(context.WithoutCancel(ctx))
		r.stopServing = stopServing
		r.goroutine(func() {
			if err := manager.Run(serveCtx); err != nil {
				logger.Error(err, "device plugins stopped")
			}
		})
		r.plugins = &pluginSet{classes: classes.Lister(), matcher: newClassMatcher(a.config.Kinds, a.config.HugepagePoolSlots), allocator: allocator, manager: manager, cdi: spec, slices: ms}
		ms.made = r.plugins.refresh
	}

	// A slice made or destroyed changes its GPU's instances: described
	// again (the queue and the sources' passes are safe from Allocate's and
	// the DRA plugin's goroutines).
	if r.slices != nil {
		r.slices.changed = func() { r.src.redescribeAll(r.queue) }
	}

	// The introspection API (node-agent status).
	r.introspect = newIntrospectionSource()
	if a.config.IntrospectionSocket != "" {
		r.goroutine(func() {
			if err := introspection.Serve(ctx, a.config.IntrospectionSocket, r.introspect); err != nil {
				logger.Error(err, "introspection API not served", "socket", a.config.IntrospectionSocket)
			}
		})
	}

	// The triggers: the poll and the resync (the first pass is queued above).
	r.pub = &inventory.Publisher{Resclass: a.resclass, Kube: a.kube, Node: node, Kinds: a.config.Kinds}
	resync := []string{passPublish}
	if len(r.src.opened) > 0 {
		resync = resync[:0]
		for _, o := range r.src.opened {
			resync = append(resync, o.pass)
		}
	}
	r.goroutine(func() { r.every(ctx, a.config.PollInterval, passPublish) })
	r.goroutine(func() { r.every(ctx, a.config.ResyncInterval, resync...) })
	r.onStop(r.queue.ShutDown)
	return r, nil
}

// stop undoes start, last step first: ctx's end stops the goroutines and the
// informers, and each step waits for what it started.
func (r *running) stop() {
	r.cancel()
	if r.stopServing != nil {
		r.stopServing()
	}
	r.bg.Wait()
	for i := len(r.stops) - 1; i >= 0; i-- {
		r.stops[i]()
	}
}

// onStop adds a step to stop.
func (r *running) onStop(f func()) { r.stops = append(r.stops, f) }

// goroutine runs f in the background until stop.
func (r *running) goroutine(f func()) {
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		f()
	}()
}

// every adds passes to the queue every interval until ctx ends.
func (r *running) every(ctx context.Context, interval time.Duration, passes ...string) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, pass := range passes {
				r.queue.Add(pass)
			}
		}
	}
}

// work drains the queue, one pass at a time, until ctx ends. It beats the
// agent's heartbeat after every pass (/healthz).
func (r *running) work(ctx context.Context) {
	go func() { <-ctx.Done(); r.queue.ShutDown() }()
	r.a.worker.beat()
	defer r.a.worker.stop()
	for {
		pass, shutdown := r.queue.Get()
		if shutdown {
			return
		}
		for _, o := range r.src.opened {
			if pass == o.pass {
				r.redescribe(ctx, o)
			}
		}
		r.publishPass(ctx)
		r.queue.Done(pass)
		r.a.worker.beat()
	}
}

// startWatch watches the health of o's devices while o is open: each event
// triggers a pass.
func (r *running) startWatch(ctx context.Context, o *opened) {
	logger := klog.FromContext(ctx).WithValues("source", o.kind.SourceName())
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	src := o.src
	go func() {
		defer close(done)
		err := src.WatchHealth(wctx, func(e devicekind.HealthEvent) {
			o.health.set(e)
			if e.Healthy {
				// The source's description may carry the fault too (a
				// kept GPU fault): describe it again.
				r.queue.Add(o.pass)
				return
			}
			r.queue.Add(passPublish)
		})
		if err != nil {
			logger.Error(err, "health is not watched")
		}
	}()
	o.stopWatch = func() { cancel(); <-done; o.stopWatch = func() {} }
}

// redescribe describes o's devices again, opening o first if it is not open;
// a source that does not open, or went away, is tried again at the pace of
// the opening backoff.
func (r *running) redescribe(ctx context.Context, o *opened) {
	logger := klog.FromContext(ctx).WithValues("source", o.kind.SourceName())
	start := time.Now()
	wasOpen := o.src != nil
	if !wasOpen && r.src.open(o) {
		logger.Info("source opened")
		r.opening.Forget(o.pass)
		r.startWatch(ctx, o)
	}
	kept := o.describe(time.Now(), r.a.config.DeviceGracePeriod)
	r.a.metrics.discovery.WithLabelValues(o.kind.SourceName()).Observe(time.Since(start).Seconds())
	r.reportKept(ctx, o, kept)
	if o.src != nil {
		return
	}
	if wasOpen {
		// Gone while open: its watcher stops, what it said is stale.
		logger.Info("source went away; opening it again", "reason", o.cond.Message)
		o.stopWatch()
		o.health.reset()
	}
	first := r.opening.NumRequeues(o.pass) == 0
	delay := r.opening.When(o.pass)
	if first {
		logger.Info("source not opened; trying again with backoff", "reason", o.cond.Message, "retryIn", delay, "maxInterval", r.a.config.OpenRetryMax)
	} else {
		logger.V(2).Info("source not opened", "reason", o.cond.Message, "retryIn", delay)
	}
	r.queue.AddAfter(o.pass, delay)
}

// publishPass discovers the polled kinds, applies health, updates the
// endpoints and the introspection API, and publishes what changed. After a
// failed publish, passes wait for the retry to publish: an apiserver that
// refuses the inventory is not asked again at poll rate.
func (r *running) publishPass(ctx context.Context) {
	logger := klog.FromContext(ctx)
	a := r.a
	start := time.Now()
	host, hostConds := r.src.discoverHost()
	a.metrics.discovery.WithLabelValues("sysfs").Observe(time.Since(start).Seconds())
	devices, conds := r.src.described()
	devices = append(devices, host...)
	r.src.applyHealth(devices)
	r.applySharing(logger, devices)
	// The labels applySharing read: the Node's, or the last ones read.
	applyMIGModes(r.sharing.labels, devices)
	if key := migLabels(r.sharing.labels); key != r.migLabels {
		r.migLabels = key
		r.src.redescribeAll(r.queue)
	}
	var owned map[string]bool
	if r.slices != nil {
		r.slices.setSources(r.src.slicer(), devices)
		r.slices.reconcile(logger)
		owned = r.slices.mark(devices)
	}
	status := assemble(a.config.Kinds, devices, append(conds, hostConds...)...)
	// Judged on the GPUs found, before DRA mode empties the published list.
	isolated := r.isolation.check(int(status.Summary.GPUs))
	meta.SetStatusCondition(&status.Conditions, isolated)
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionAgentServing, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentServing,
		Message: "the node agent serves this node's devices",
	})
	r.isolation.report(ctx, r.recorder, r.node, a.metrics, isolated)
	r.prev = a.reportHealth(ctx, r.recorder, r.node, r.introspect.HealthHub, r.prev, status.Devices)
	a.metrics.observe(status.Devices)
	if r.plugins != nil {
		r.plugins.update(status.Devices, owned)
	}
	// A slice made for a pod is the pod's: its MIG device is not published
	// as a device of its own (the GPU's instances say it is there).
	// A copy: the endpoints keep the list they were given.
	if len(owned) > 0 {
		status.Devices = slices.DeleteFunc(slices.Clone(status.Devices), func(d v1alpha1.Device) bool { return owned[d.ID] })
	}
	if r.dra != nil {
		r.dra.update(ctx, status.Devices)
	}
	if node, err := r.nodes.Get(a.config.NodeName); err == nil && modeChanged(logger, r.recorder, node, r.mode) {
		r.modeChanged = true
		r.queue.ShutDown()
		return
	}
	r.introspect.update(status.Devices, r.plugins)

	if time.Now().Before(r.retryAt) {
		return
	}
	if r.dra != nil {
		status = draInventory(status)
	}
	if err := a.publish(ctx, r.pub, r.nodeDevices, r.nodes, status); err != nil {
		delay := r.publishing.When(passPublish)
		logger.Error(err, "publishing the inventory", "retryIn", delay)
		a.metrics.publishes.WithLabelValues("error").Inc()
		r.retryAt = time.Now().Add(delay)
		r.queue.AddAfter(passPublish, delay)
		return
	}
	r.publishing.Forget(passPublish)
	r.retryAt = time.Time{}
	r.published = &status
	a.published.Store(true)
}

// applySharing sets each GPU's sharing mode (sharing.go) from the Node's
// labels and the pods that hold it.
func (r *running) applySharing(logger klog.Logger, devices []v1alpha1.Device) {
	in := sharingInput{
		event: func(eventtype, reason, message string) { r.recorder.Event(r.node, eventtype, reason, message) },
	}
	if node, err := r.nodes.Get(r.a.config.NodeName); err == nil {
		in.node = node
	}
	switch {
	case r.plugins != nil:
		in.holders, in.holderKind = r.plugins.allocator.Holders, "pods"
	case r.dra != nil:
		in.holders, in.holderKind = r.dra.plugin.Holders, "ResourceClaims"
	}
	var published map[string]v1alpha1.SharingMode
	in.published = func(id string) (v1alpha1.SharingMode, bool) {
		if published == nil {
			published = map[string]v1alpha1.SharingMode{}
			if nd, err := r.nodeDevices.Get(r.a.config.NodeName); err == nil {
				for _, d := range nd.Status.Devices {
					// A GPU published without sharing was served whole: by
					// an agent before sharing, or in MIG mode.
					published[d.ID] = v1alpha1.SharingExclusive
					if d.Sharing != nil {
						published[d.ID] = d.Sharing.Mode
					}
				}
			}
		}
		m, ok := published[id]
		return m, ok
	}
	if again := r.sharing.apply(logger, devices, in); again > 0 {
		r.queue.AddAfter(passPublish, again)
	}
}

// announceTimeout bounds the write that announces the stop: an apiserver
// that does not answer within it is not waited for, the kubelet will say it.
const announceTimeout = 5 * time.Second

// announceStop publishes the last status with AgentServing False, so that
// the scheduler places no more pods here, and keeps the endpoints serving
// for ShutdownDelay: a pod bound before the scheduler read it reaches the
// kubelet within moments and gets its Allocate. Without this, the scheduler
// learns that the agent is gone from the kubelet's next node status sync (10 s
// by default), and the pods it binds meanwhile fail admission. A failed
// announcement costs only that: the kubelet still says it.
func (r *running) announceStop(logger klog.Logger) {
	if r.published == nil || r.pub == nil {
		return // nothing published: the scheduler places nothing here
	}
	status := r.published.DeepCopy()
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionAgentServing, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonAgentShuttingDown,
		Message: "the node agent is stopping; its device-plugin endpoints drain",
	})
	ctx, cancel := context.WithTimeout(context.Background(), announceTimeout)
	defer cancel()
	if err := r.a.publish(ctx, r.pub, r.nodeDevices, r.nodes, *status); err != nil {
		logger.Error(err, "the stop not announced: the scheduler learns it from the kubelet's next node status")
		return
	}
	if r.stopServing == nil || r.a.config.ShutdownDelay <= 0 {
		logger.Info("the stop announced")
		return
	}
	logger.Info("the stop announced; the endpoints serve the pods bound before it", "delay", r.a.config.ShutdownDelay)
	time.Sleep(r.a.config.ShutdownDelay)
}

// waitForNode gets the agent's Node, waiting for it to be registered and for
// the apiserver to answer, with backoff up to 30 seconds apart; nil when ctx
// ended first.
func (a *Agent) waitForNode(ctx context.Context) *corev1.Node {
	logger := klog.FromContext(ctx)
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Cap: 30 * time.Second, Steps: 1 << 30}
	for {
		node, err := a.kube.CoreV1().Nodes().Get(ctx, a.config.NodeName, metav1.GetOptions{})
		switch {
		case err == nil:
			return node
		case ctx.Err() != nil:
			return nil
		case apierrors.IsNotFound(err):
			logger.Info("waiting for the Node to be registered")
		default:
			logger.Error(err, "waiting for the apiserver", "retryIn", backoff.Duration)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff.Step()):
		}
	}
}

func (a *Agent) publish(ctx context.Context, pub *inventory.Publisher, nds interface {
	Get(string) (*v1alpha1.NodeDevices, error)
}, nodes interface {
	Get(string) (*corev1.Node, error)
}, status v1alpha1.NodeDevicesStatus) error {
	logger := klog.FromContext(ctx)
	current, err := nds.Get(a.config.NodeName)
	if apierrors.IsNotFound(err) {
		current = nil
	} else if err != nil {
		return err
	}
	node, err := nodes.Get(a.config.NodeName)
	if err != nil {
		return fmt.Errorf("getting Node %s: %w", a.config.NodeName, err)
	}
	if node.UID != pub.Node.UID {
		// The Node was deleted and registered again: own the inventory by
		// the new one, or the garbage collector deletes it.
		logger.Info("Node re-created; re-owning NodeDevices", "uid", node.UID)
		pub.Node = node
	}
	wrote, err := pub.Publish(ctx, current, status)
	if err != nil {
		return err
	}
	result := "unchanged"
	if wrote {
		result = "written"
		logger.V(2).Info("published NodeDevices", "devices", len(status.Devices), "unhealthy", status.Summary.Unhealthy)
	}
	a.metrics.publishes.WithLabelValues(result).Inc()
	if _, err := pub.PublishLabels(ctx, node, a.config.Kinds.NodeLabels(status.Devices)); err != nil {
		return err
	}
	return nil
}

// reportHealth records an Event on the Node for each device whose health
// changed since prev, and returns the devices by id for the next call. The
// first call (prev nil) reports the devices that start unhealthy. The hub
// (`node-agent status --watch`) gets every new device's state and every change,
// and forgets the devices that are gone.
func (a *Agent) reportHealth(ctx context.Context, recorder record.EventRecorder, node *corev1.Node, hub *introspection.HealthHub, prev map[string]v1alpha1.Device, devices []v1alpha1.Device) map[string]v1alpha1.Device {
	logger := klog.FromContext(ctx)
	now := timestamppb.Now()
	next := make(map[string]v1alpha1.Device, len(devices))
	for _, d := range devices {
		next[d.ID] = d
		old, known := prev[d.ID]
		if !known || old.Healthy != d.Healthy || old.Reason != d.Reason {
			hub.Publish(&agentv1.HealthEvent{DeviceId: d.ID, Kind: d.Kind, Healthy: d.Healthy, Reason: d.Reason, Time: now})
		}
		switch {
		case !d.Healthy && (!known || old.Healthy || old.Reason != d.Reason):
			logger.Info("device unhealthy", "device", d.ID, "kind", d.Kind, "reason", d.Reason)
			recorder.Eventf(node, corev1.EventTypeWarning, "DeviceUnhealthy", "%s %s is unhealthy: %s", d.Kind, d.ID, d.Reason)
			a.metrics.transitions.WithLabelValues(d.Kind, "unhealthy").Inc()
		case d.Healthy && known && !old.Healthy:
			logger.Info("device healthy again", "device", d.ID, "kind", d.Kind)
			recorder.Eventf(node, corev1.EventTypeNormal, "DeviceHealthy", "%s %s is healthy again", d.Kind, d.ID)
			a.metrics.transitions.WithLabelValues(d.Kind, "healthy").Inc()
		}
	}
	for id := range prev {
		if _, ok := next[id]; !ok {
			hub.Forget(id)
		}
	}
	return next
}

// cloneDevices copies devices deeply enough for applyHealth to mark the copy.
func cloneDevices(devices []v1alpha1.Device) []v1alpha1.Device {
	out := make([]v1alpha1.Device, len(devices))
	for i, d := range devices {
		d.Attributes = maps.Clone(d.Attributes)
		out[i] = d
	}
	return out
}
