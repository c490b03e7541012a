package nodeagent

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	"github.com/resclass/resclass/pkg/client/informers/externalversions"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	nvmldiscovery "github.com/resclass/resclass/pkg/discovery/nvml"
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
	// NVML is the NVML binding when NVMLLibrary is nil: a mock in tests.
	NVML lib.Interface
	// PollInterval is how often NICs and hugepage pools are re-read (sysfs
	// only: link state, free pages).
	PollInterval time.Duration
	// ResyncInterval is how often the GPUs are re-described through NVML and
	// the published objects compared with the inventory, whatever else happens.
	ResyncInterval time.Duration
	// Health tunes the GPU health watcher.
	Health nvmldiscovery.HealthOptions
	// NVMLLibrary finds and checks the NVML library at each attempt to open
	// NVML, on a node; nil uses NVML as it is (a mock in tests).
	NVMLLibrary *nvmldiscovery.Library
	// NVMLRetryMax is the longest wait between attempts to open NVML (the
	// waits double from a second). Default 30 seconds.
	NVMLRetryMax time.Duration
	// ShutdownTimeout bounds how long the agent, when stopping, waits for its
	// Events to be written. Default 10 seconds.
	ShutdownTimeout time.Duration

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
	// IntrospectionSocket is where the agent serves its own gRPC API
	// (proto/resclass/agent/v1) for `node-agent status`; "" serves none.
	IntrospectionSocket string

	// DeviceListStrategies say how GPUs are named to the container runtime
	// (envvar when empty). With a CDI strategy the agent keeps the CDI spec
	// of the node's GPUs in CDISpecDir (cdispec.DefaultDir when empty),
	// naming the driver's files below CDIDriverRoot (a host path, "/" when
	// empty).
	DeviceListStrategies handoff.Strategies
	CDISpecDir           string
	CDIDriverRoot        string

	// Kinds are the device kinds the agent discovers (those that are
	// devicekind.Pollers), labels and hands out; kinds.Builtin when nil. A
	// test adds its own kind here (docs/architecture.md, "Adding a kind").
	Kinds *devicekind.Registry
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
	if config.NVMLRetryMax <= 0 {
		config.NVMLRetryMax = 30 * time.Second
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
	return &Agent{config: config, resclass: resclass, kube: kube, metrics: m}
}

// Run publishes the inventory until ctx ends. It waits for its Node to exist
// (the agent may start before the kubelet registers it) and for the apiserver
// to answer: an unreachable or failing apiserver at start is retried with
// backoff, never an exit, so a control-plane upgrade does not crash-loop every
// agent. Until the first publish, Published is false (/readyz).
//
// What triggers a publish: a GPU health event (at once), the poll (NICs'
// link state, free hugepages), the resync, and any change of the NodeDevices
// object or the Node made by someone else — a deleted NodeDevices is
// re-created within moments. Publishing writes only what differs from the
// apiserver's copy, so the triggers cost reads, not writes.
//
// NVML that does not open (no driver yet, a wrong library) is tried again with
// backoff, up to NVMLRetryMax apart, and NVML found gone at a resync is closed
// and tried again likewise: the GPUs are published once it opens, with no
// restart.
//
// When ctx ends, Run shuts down in order: the device-plugin endpoints and the
// introspection API stop and their sockets are removed, the health watcher
// stops, every Event recorded is written (ShutdownTimeout at most), NVML is
// shut down; then it returns nil.
func (a *Agent) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("node", a.config.NodeName)
	ctx = klog.NewContext(ctx, logger)

	node := a.waitForNode(ctx)
	if node == nil {
		return nil // ctx ended
	}

	events := newEvents(ctx, a.kube, a.config.NodeName)
	var recorder record.EventRecorder = events
	src := &sources{opts: sourceOptions{hostRoot: a.config.HostRoot, includeVirtual: a.config.IncludeVirtualNICs, kinds: a.config.Kinds, library: a.config.NVMLLibrary, nvml: a.config.NVML}}
	// bg are the goroutines that serve a socket or record Events.
	var bg sync.WaitGroup
	// The health watcher runs while NVML is open; stopWatch stops it and
	// waits for it.
	stopWatch := func() {}
	// The shutdown, in order: ctx has ended, so the endpoints and the
	// introspection API are stopping; once they are gone (sockets removed),
	// the watcher stops, the Events are written, and NVML is shut down.
	defer func() {
		bg.Wait()
		stopWatch()
		events.flush(ctx, a.config.ShutdownTimeout)
		src.close()
	}()

	// Informers on this node's two objects only.
	byName := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", a.config.NodeName).String()
	}
	rf := externalversions.NewSharedInformerFactoryWithOptions(a.resclass, 0, externalversions.WithTweakListOptions(byName))
	kf := kubeinformers.NewSharedInformerFactoryWithOptions(a.kube, 0, kubeinformers.WithTweakListOptions(byName))
	ndLister := rf.Resclass().V1alpha1().NodeDevices().Lister()
	nodeLister := kf.Core().V1().Nodes().Lister()
	trigger := make(chan struct{}, 1)
	kick := func() {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { kick() },
		UpdateFunc: func(any, any) { kick() },
		DeleteFunc: func(any) { kick() },
	}
	if _, err := rf.Resclass().V1alpha1().NodeDevices().Informer().AddEventHandler(handler); err != nil {
		return err
	}
	if _, err := kf.Core().V1().Nodes().Informer().AddEventHandler(handler); err != nil {
		return err
	}
	rf.Start(ctx.Done())
	kf.Start(ctx.Done())
	defer rf.Shutdown()
	defer kf.Shutdown()
	rf.WaitForCacheSync(ctx.Done())
	kf.WaitForCacheSync(ctx.Done())

	var plugins *pluginSet
	if a.config.PluginDir != "" {
		var err error
		if plugins, err = a.startPlugins(ctx, &bg, recorder, handler); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}

	introspect := newIntrospectionSource()
	if a.config.IntrospectionSocket != "" {
		bg.Add(1)
		go func() {
			defer bg.Done()
			if err := introspection.Serve(ctx, a.config.IntrospectionSocket, introspect); err != nil {
				logger.Error(err, "introspection API not served", "socket", a.config.IntrospectionSocket)
			}
		}()
	}

	health := make(chan nvmldiscovery.HealthEvent, 16)
	startWatch := func() {
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		gpus := src.gpus
		go func() {
			defer close(done)
			err := gpus.WatchHealth(wctx, a.config.Health, func(e nvmldiscovery.HealthEvent) {
				select {
				case health <- e:
				case <-wctx.Done():
				}
			})
			if err != nil {
				logger.Error(err, "GPU health is not watched")
			}
		}()
		stopWatch = func() { cancel(); <-done; stopWatch = func() {} }
	}

	pub := &inventory.Publisher{Resclass: a.resclass, Kube: a.kube, Node: node}
	unhealthyGPUs := map[string]string{}
	var (
		gpus    []v1alpha1.Device
		gpuCond metav1.Condition
		prev    map[string]v1alpha1.Device
	)
	// NVML is opened here, and again after it failed or went away, at the
	// pace of nvmlBackoff.
	nvmlRetry := time.NewTimer(time.Hour)
	nvmlRetry.Stop()
	defer nvmlRetry.Stop()
	nvmlBackoff := wait.Backoff{Duration: time.Second, Factor: 2, Cap: a.config.NVMLRetryMax, Steps: 1 << 30}
	rediscoverGPUs := func() {
		start := time.Now()
		wasOpen := src.gpus != nil
		if !wasOpen && src.openNVML() {
			logger.Info("NVML opened")
			nvmlBackoff.Duration = time.Second
			startWatch()
		}
		gpus, gpuCond = src.discoverGPUs()
		a.metrics.discovery.WithLabelValues("nvml").Observe(time.Since(start).Seconds())
		if src.gpus != nil {
			return
		}
		if wasOpen {
			// Gone while open: its watcher stops, what it said is stale.
			logger.Info("NVML went away; opening it again", "reason", gpuCond.Message)
			stopWatch()
			clear(unhealthyGPUs)
		}
		first := nvmlBackoff.Duration == time.Second
		delay := nvmlBackoff.Step()
		if first {
			logger.Info("NVML not opened; trying again with backoff", "reason", gpuCond.Message, "retryIn", delay, "maxInterval", a.config.NVMLRetryMax)
		} else {
			logger.V(2).Info("NVML not opened", "reason", gpuCond.Message, "retryIn", delay)
		}
		nvmlRetry.Reset(delay)
	}
	rediscoverGPUs()

	poll := time.NewTicker(a.config.PollInterval)
	defer poll.Stop()
	resync := time.NewTicker(a.config.ResyncInterval)
	defer resync.Stop()
	retry := time.NewTimer(0)
	defer retry.Stop()
	var retryAt time.Time
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Cap: time.Minute, Steps: 1 << 30}
	for {
		select {
		case <-ctx.Done():
			logger.Info("shutting down")
			return nil
		case e := <-health:
			if e.Healthy {
				delete(unhealthyGPUs, e.ID)
			} else {
				unhealthyGPUs[e.ID] = e.Reason
			}
		case <-resync.C:
			rediscoverGPUs()
		case <-nvmlRetry.C:
			rediscoverGPUs()
		case <-poll.C:
		case <-trigger:
		case <-retry.C:
		}

		start := time.Now()
		host, hostConds := src.discoverHost()
		a.metrics.discovery.WithLabelValues("sysfs").Observe(time.Since(start).Seconds())
		devices := append(cloneDevices(gpus), host...)
		applyHealth(devices, unhealthyGPUs)
		status := assemble(src.kinds(), devices, append([]metav1.Condition{gpuCond}, hostConds...)...)
		prev = a.reportHealth(ctx, recorder, node, introspect.HealthHub, prev, status.Devices)
		a.metrics.observe(status.Devices)
		if plugins != nil {
			plugins.update(status.Devices)
		}
		introspect.update(status.Devices, plugins)

		// After a failed publish, polls and events wait for the retry: an
		// apiserver that refuses the inventory is not asked again at poll rate.
		if time.Now().Before(retryAt) {
			continue
		}
		if err := a.publish(ctx, pub, ndLister, nodeLister, status); err != nil {
			delay := backoff.Step()
			logger.Error(err, "publishing the inventory", "retryIn", delay)
			a.metrics.publishes.WithLabelValues("error").Inc()
			retryAt = time.Now().Add(delay)
			retry.Reset(delay)
			continue
		}
		backoff.Duration, retryAt = time.Second, time.Time{}
		a.published.Store(true)
	}
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
