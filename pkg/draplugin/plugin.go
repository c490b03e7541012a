// Package draplugin is the node agent's DRA kubelet plugin (docs/dra.md,
// "Nodes"): on a node in DRA mode the stock scheduler allocates ResourceClaims
// from the ResourceSlices the agent publishes, and the kubelet asks this
// plugin, through the upstream helper (k8s.io/dynamic-resource-allocation/
// kubeletplugin), to prepare them. What a container gets for its devices is
// pkg/handoff's Edits, the same as on the device-plugin path: the environment
// and the device nodes go into a CDI spec per claim, and the GPUs' own CDI
// names (the agent's spec, pkg/cdispec) are passed as they are. A claim's
// share of a GPU that serves shares gets handoff.ShareEdits, from what the
// claim consumes of the GPU's capacities (share.go).
//
// The claims prepared are kept in a checkpoint in the plugin's directory, so
// that a restarted agent answers the kubelet's repeated prepare the same way,
// unprepares claims whose objects are gone, and never prepares one device for
// two claims.
package draplugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/handoff"
)

// Event reasons, on the ResourceClaim and the pods it is reserved for.
const (
	ReasonPrepareFailed = "DevicePrepareFailed"
	// ReasonCheckpointSetAside is on the Node: the checkpoint could not be
	// believed and was set aside.
	ReasonCheckpointSetAside = "DRACheckpointSetAside"
)

// CDI kind of the per-claim devices: resclass.io/claim=<claim uid>-<request>.
const (
	CDIVendor = "resclass.io"
	CDIClass  = "claim"
	CDIKind   = CDIVendor + "/" + CDIClass
)

// Config configures a Plugin.
type Config struct {
	// NodeName is the node; its pool in the driver's ResourceSlices has its
	// name.
	NodeName string
	// DriverName is the DRA driver name the agent publishes under.
	DriverName string
	// HostRoot is where the host's / is (device nodes below it).
	HostRoot string
	// DeviceListStrategies say how GPUs are named (as on the device-plugin
	// path; cdi-annotations has no DRA equivalent and counts as cdi-cri).
	DeviceListStrategies handoff.Strategies
	// Kinds say what a container gets for each kind (kinds.Builtin when nil).
	Kinds *devicekind.Registry
	// CDIDir is where the per-claim CDI specs are written (cdi's
	// /var/run/cdi when empty).
	CDIDir string
	// PluginDataDir is the plugin's directory: its socket and its
	// checkpoint (/var/lib/kubelet/plugins/<driver> when empty).
	PluginDataDir string
	// RegistrarDir is the kubelet's plugin registration directory
	// (/var/lib/kubelet/plugins_registry when empty).
	RegistrarDir string
	// ClassOf names the ResourceClass a DeviceClass stands for (for
	// RESCLASS_DEVICES_<CLASS>); the DeviceClass name itself when nil.
	ClassOf func(deviceClass string) string
	// Client reads the pod a claim is prepared for and the pod's other
	// claims, so that each request's CDI device names every device of the
	// requests its containers use (container.go); nil: each names its own.
	Client kubernetes.Interface
	// Recorder records Events on claims and pods; nil records none.
	Recorder record.EventRecorder
	// Metrics, if set, counts outcomes and latencies.
	Metrics *Metrics
	// Slices, if set, makes the MIG slices claims are allocated
	// (slices.go); nil refuses such a claim.
	Slices SliceMaker
}

// Plugin prepares and unprepares the claims of the agent's devices, and
// streams their health to the kubelet (DRAResourceHealth, which the upstream
// helper serves when the plugin implements it).
type Plugin struct {
	drahealthv1alpha1.UnimplementedDRAResourceHealthServer

	cfg     Config
	kinds   *devicekind.Registry
	handoff devicekind.Handoff

	mu      sync.Mutex
	devices map[string]*v1alpha1.Device // by resclass id
	ids     map[string]string           // DRA device name -> resclass id
	cp      *Checkpoint
	cdi     *cdi.Cache
	// setAside: the checkpoint read at start could not be believed.
	setAside bool
	// held is the checkpoint's claims by device, and pending the slices
	// made during the prepare call in progress, by slice id, whose claims
	// hold them before the checkpoint says so: what HeldBy answers, under
	// heldMu, not p.mu.
	heldMu  sync.Mutex
	held    map[string][]types.UID
	pending map[string]types.UID

	helper *kubeletplugin.Helper
	health *healthHub
}

// New returns a plugin with the checkpoint read from cfg.PluginDataDir; Start
// serves it to the kubelet. A checkpoint that cannot be believed is set
// aside (setaside.go), reported in the log and as a Warning Event on the
// Node, and the plugin starts with no claims prepared: the kubelet's
// unprepare of a claim prepared before still removes its CDI spec, but until
// then a device of such a claim is not refused to another one (the
// scheduler's allocation, which never gives a device twice, still holds).
// An error means the directory or the CDI spec directory cannot be used.
func New(cfg Config) (*Plugin, error) {
	if cfg.Kinds == nil {
		cfg.Kinds = kinds.Builtin
	}
	if cfg.PluginDataDir == "" {
		cfg.PluginDataDir = filepath.Join(kubeletplugin.KubeletPluginsDir, cfg.DriverName)
	}
	if cfg.RegistrarDir == "" {
		cfg.RegistrarDir = kubeletplugin.KubeletRegistryDir
	}
	if cfg.CDIDir == "" {
		cfg.CDIDir = cdi.DefaultDynamicDir
	}
	if cfg.ClassOf == nil {
		cfg.ClassOf = func(dc string) string { return dc }
	}
	if cfg.HostRoot == "" {
		cfg.HostRoot = "/"
	}
	strategies := cfg.DeviceListStrategies
	if strategies.Has(handoff.StrategyCDIAnnotations) && !strategies.Has(handoff.StrategyCDICRI) {
		strategies = append(slices.Clone(strategies), handoff.StrategyCDICRI)
	}
	// The kubelet creates its registration directory when its plugin
	// watcher starts, which may be after the agent.
	for _, dir := range []string{cfg.PluginDataDir, cfg.RegistrarDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, err
		}
	}
	cp, aside, err := loadOrSetAside(filepath.Join(cfg.PluginDataDir, CheckpointFile), time.Now())
	if err != nil {
		return nil, err
	}
	if aside != nil {
		klog.Background().Error(aside.Err, "DRA checkpoint set aside; started with no claims prepared", "path", aside.Path, "setAsideAs", aside.As)
		if cfg.Recorder != nil {
			node := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: cfg.NodeName, UID: types.UID(cfg.NodeName)}
			cfg.Recorder.Eventf(node, corev1.EventTypeWarning, ReasonCheckpointSetAside, "%s", aside.Error())
		}
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cfg.CDIDir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI spec directory %s: %w", cfg.CDIDir, err)
	}
	// devices stays nil until the first SetDevices: Holdings tells "not
	// known yet" from "none".
	p := &Plugin{cfg: cfg, kinds: cfg.Kinds, cp: cp, cdi: cache, ids: map[string]string{}, health: newHealthHub(), setAside: aside != nil}
	p.noteHeld()
	p.handoff = handoff.NewHandoff(cfg.HostRoot, strategies, p.device)
	return p, nil
}

// Start serves the plugin to the kubelet (registration and DRA sockets)
// until ctx ends or Stop. kube reads the claims.
func (p *Plugin) Start(ctx context.Context, kube kubernetes.Interface, nodeUID types.UID) error {
	h, err := kubeletplugin.Start(ctx, p,
		kubeletplugin.DriverName(p.cfg.DriverName),
		kubeletplugin.NodeName(p.cfg.NodeName),
		kubeletplugin.NodeUID(nodeUID),
		kubeletplugin.KubeClient(kube),
		kubeletplugin.PluginDataDirectoryPath(p.cfg.PluginDataDir),
		kubeletplugin.RegistrarDirectoryPath(p.cfg.RegistrarDir),
	)
	if err != nil {
		return fmt.Errorf("starting the DRA kubelet plugin: %w", err)
	}
	p.helper = h
	return nil
}

// Helper is the running upstream helper (nil before Start): it publishes the
// ResourceSlices.
func (p *Plugin) Helper() *kubeletplugin.Helper { return p.helper }

// Stop stops serving; the sockets are removed, the checkpoint stays.
func (p *Plugin) Stop() { p.helper.Stop() }

// SetDevices gives the plugin the node's devices and the DRA device name of
// each published one (name -> resclass id). It keeps copies.
func (p *Plugin) SetDevices(devices []v1alpha1.Device, names map[string]string) {
	m := make(map[string]*v1alpha1.Device, len(devices))
	for i := range devices {
		d := devices[i].DeepCopy()
		m[d.ID] = d
	}
	health := make(map[string]deviceHealth, len(names))
	for name, id := range names {
		if d := m[id]; d != nil {
			health[name] = deviceHealth{healthy: d.Healthy, reason: d.Reason}
		}
	}
	p.health.set(time.Now(), health)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devices, p.ids = m, maps.Clone(names)
}

// device is called with p.mu held (from prepare).
func (p *Plugin) device(id string) *v1alpha1.Device { return p.devices[id] }

// Prepared lists the claims prepared, by UID (for introspection and tests).
func (p *Plugin) Prepared() map[types.UID]PreparedClaim {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.cp.Claims)
}

// Holders lists the claims prepared on device id (a resclass id), by
// namespace and name, each a share or the whole device: what holds a GPU
// whose sharing mode is to change, on a DRA node, where the claims the
// kubelet prepared are the pods' hold (the device-plugin path's is
// handoff.Allocator.Holders). The checkpoint keeps them across restarts.
func (p *Plugin) Holders(id string) []handoff.Holder {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []handoff.Holder
	for _, pc := range p.cp.Claims {
		for _, d := range pc.Devices {
			if d.ID == id {
				out = append(out, handoff.Holder{Namespace: pc.Namespace, Name: pc.Name, Share: d.Share != nil})
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b handoff.Holder) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
func (p *Plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	start := time.Now()
	defer p.cfg.Metrics.observe("prepare", start)
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.settled()
	logger := klog.FromContext(ctx)
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	var added []types.UID
	changed := false
	call := newPrepareCall(claims)
	for _, claim := range claims {
		pc, outcome, err := p.prepare(ctx, claim, call)
		p.cfg.Metrics.claim("prepare", outcome)
		if err != nil {
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			p.warn(claim, err)
			// A slice made for it before another failed is not left
			// behind; the kubelet's retry makes it again.
			p.release(ctx, []types.UID{claim.UID})
			continue
		}
		switch old, had := p.cp.Claims[claim.UID]; {
		case outcome == "prepared":
			if !had {
				added = append(added, claim.UID)
			}
			p.cp.Claims[claim.UID] = *pc
			changed = true
			logger.V(2).Info("prepared", "claim", klog.KObj(claim), "devices", sortedIDs(*pc))
		case !slices.Equal(old.Pods, pc.Pods) || !sameClasses(old, *pc):
			// The same devices, for other pods now (a shared claim), or
			// recorded by an agent before classes were.
			p.cp.Claims[claim.UID] = *pc
			changed = true
		}
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: resultDevices(pc)}
	}
	if changed {
		if err := p.cp.Save(p.checkpointPath()); err != nil {
			// Nothing is prepared unless it is recorded: forget this call's
			// new claims and fail the call (a slice made for one of them is
			// released).
			for _, uid := range added {
				delete(p.cp.Claims, uid)
			}
			p.release(ctx, added)
			return nil, fmt.Errorf("writing the checkpoint: %w", err)
		}
		p.noteHeld()
	}
	return out, nil
}

func (p *Plugin) checkpointPath() string { return filepath.Join(p.cfg.PluginDataDir, CheckpointFile) }

// prepare works out one claim: its devices (this driver's results only), the
// CDI spec of its requests, written. It returns the outcome for the metric.
// call holds what this PrepareResourceClaims call has read (container.go).
func (p *Plugin) prepare(ctx context.Context, claim *resourceapi.ResourceClaim, call *prepareCall) (*PreparedClaim, string, error) {
	if claim.Status.Allocation == nil {
		return nil, "invalid", fmt.Errorf("ResourceClaim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	pc := &PreparedClaim{Namespace: claim.Namespace, Name: claim.Name, Pods: reservedPods(claim)}
	byRequest := map[string][]int{} // request -> indexes into pc.Devices
	// made maps the potential slices of the claim to the MIG devices made
	// for them: what the handoff gives.
	var made map[string]string
	given := func(id string) string {
		if m, ok := made[id]; ok {
			return m
		}
		return id
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != p.cfg.DriverName {
			continue
		}
		if r.Pool != p.cfg.NodeName {
			return nil, "invalid", fmt.Errorf("device %s/%s is in pool %q, not this node's (%s)", r.Pool, r.Device, r.Pool, p.cfg.NodeName)
		}
		id, ok := p.ids[r.Device]
		if !ok || p.devices[id] == nil {
			return nil, "invalid", fmt.Errorf("device %s is not on node %s (any more)", r.Device, p.cfg.NodeName)
		}
		share, err := readShare(&r, p.devices[id])
		if err != nil {
			return nil, "invalid", fmt.Errorf("ResourceClaim %s/%s: %w", claim.Namespace, claim.Name, err)
		}
		// Shares of a device this claim was given under other requests, or
		// under the same one twice, count as other claims' do.
		var taken []assignment.Share
		for _, d := range pc.Devices {
			if d.Pool == r.Pool && d.Device == r.Device {
				if d.Share == nil || share == nil {
					return nil, "invalid", fmt.Errorf("ResourceClaim %s/%s has device %s twice, not as shares", claim.Namespace, claim.Name, r.Device)
				}
				taken = append(taken, d.Share)
			}
		}
		for _, uid := range slices.Sorted(maps.Keys(p.cp.Claims)) {
			if uid == claim.UID {
				continue
			}
			other := p.cp.Claims[uid]
			for _, d := range other.Devices {
				if d.Pool != r.Pool || d.Device != r.Device {
					continue
				}
				if d.Share == nil || share == nil {
					return nil, "conflict", fmt.Errorf("device %s (%s) is already prepared for ResourceClaim %s/%s: refusing to hand one device to two claims", r.Device, id, other.Namespace, other.Name)
				}
				taken = append(taken, d.Share)
			}
		}
		if share != nil {
			if err := fitsWith(r.Device, p.devices[id], taken, share); err != nil {
				return nil, "conflict", fmt.Errorf("ResourceClaim %s/%s: %w", claim.Namespace, claim.Name, err)
			}
		}
		// Made once it is known to be this claim's alone.
		if isSlice(id) {
			d, err := p.makeSlice(ctx, claim.UID, id)
			if err != nil {
				return nil, "error", err
			}
			if made == nil {
				made = map[string]string{}
			}
			made[id] = d.ID
		}
		byRequest[r.Request] = append(byRequest[r.Request], len(pc.Devices))
		pc.Devices = append(pc.Devices, PreparedDevice{Request: r.Request, Pool: r.Pool, Device: r.Device, ID: id, Share: share})
	}
	if len(pc.Devices) == 0 {
		return nil, "invalid", fmt.Errorf("ResourceClaim %s/%s has no device of driver %s", claim.Namespace, claim.Name, p.cfg.DriverName)
	}
	spec := &specs.Spec{Version: specs.CurrentVersion, Kind: CDIKind}
	for _, request := range slices.Sorted(maps.Keys(byRequest)) {
		idx := byRequest[request]
		ids := make([]string, len(idx))
		for i, j := range idx {
			ids[i] = given(pc.Devices[j].ID)
		}
		class := p.cfg.ClassOf(deviceClassOf(claim, request))
		for _, j := range idx {
			pc.Devices[j].Class = class
		}
		// What the request's containers get of every request they use
		// (container.go), or of this one only.
		all := ids
		parent, _, _ := strings.Cut(request, "/")
		set := p.companions(ctx, claim, parent, call)
		if set.ok {
			all = set.all
		} else {
			klog.FromContext(ctx).V(3).Info("the request's CDI device names its own devices only", "claim", klog.KObj(claim), "request", request, "reason", set.why)
		}
		e, err := handoff.Edits(p.kinds, &p.handoff, class, ids, func(k devicekind.Kind) []*v1alpha1.Device {
			var out []*v1alpha1.Device
			for _, id := range all {
				if d := p.devices[given(id)]; d != nil && p.kinds.Kind(d.Kind) == k && !slices.Contains(out, d) {
					out = append(out, d)
				}
			}
			return out
		})
		if err != nil {
			return nil, "invalid", err
		}
		if same := set.byClass[class]; set.ok && len(same) > 0 {
			e.Env[handoff.ClassEnv(class)] = strings.Join(same, ",")
		}
		// A share is of one device (docs/sharing.md: never spread). The
		// request's CDI device carries the shares of its containers summed
		// (container.go), or its own only.
		if slices.ContainsFunc(idx, func(j int) bool { return pc.Devices[j].Share != nil }) {
			if len(idx) != 1 {
				return nil, "invalid", fmt.Errorf("ResourceClaim %s/%s: request %s has %d devices, some of them shares: a share is of one device (count 1)", claim.Namespace, claim.Name, request, len(idx))
			}
			shares, devices := map[string]assignment.Share{class: pc.Devices[idx[0]].Share}, map[string][]string{class: ids}
			if set.ok && len(set.shares) > 0 {
				shares, devices = set.shares, set.shareDevices
			}
			if err := handoff.ShareEdits(p.kinds, &p.handoff, shares, devices, &e); err != nil {
				return nil, "invalid", fmt.Errorf("ResourceClaim %s/%s: request %s: %w", claim.Namespace, claim.Name, request, err)
			}
		}
		name := cdiDeviceName(claim.UID, request)
		dev := specs.Device{Name: name, ContainerEdits: specs.ContainerEdits{}}
		for _, k := range slices.Sorted(maps.Keys(e.Env)) {
			dev.ContainerEdits.Env = append(dev.ContainerEdits.Env, k+"="+e.Env[k])
		}
		for _, n := range handoff.ExistingDeviceNodes(p.cfg.HostRoot, e.DeviceNodes) {
			dev.ContainerEdits.DeviceNodes = append(dev.ContainerEdits.DeviceNodes, &specs.DeviceNode{Path: n, HostPath: filepath.Join(p.cfg.HostRoot, n), Permissions: "rw"})
		}
		for _, m := range e.Mounts {
			// Host directories (an MPS server's pipe directory and its
			// clients' /dev/shm), bound as the kubelet binds the device-plugin
			// path's mounts.
			options := []string{"rbind", "rw"}
			if m.ReadOnly {
				options[1] = "ro"
			}
			dev.ContainerEdits.Mounts = append(dev.ContainerEdits.Mounts, &specs.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Type: "bind", Options: options})
		}
		spec.Devices = append(spec.Devices, dev)
		// The request's first device carries the claim's CDI device and the
		// GPUs' own CDI names: the kubelet gives a container the CDI devices
		// of every device of the requests it uses.
		first := &pc.Devices[idx[0]]
		first.CDIDeviceIDs = append([]string{CDIKind + "=" + name}, e.CDIDevices...)
	}
	if err := p.cdi.WriteSpec(spec, specFile(claim.UID)); err != nil {
		return nil, "error", fmt.Errorf("writing the CDI spec of ResourceClaim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	if old, ok := p.cp.Claims[claim.UID]; ok && sameDevices(old, *pc) {
		return pc, "repeated", nil
	}
	return pc, "prepared", nil
}

// reservedPods are the pods claim is reserved for, sorted, at most the API's
// bound of them.
func reservedPods(claim *resourceapi.ResourceClaim) []string {
	var pods []string
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" && len(pods) < maxPodsPerClaim {
			pods = append(pods, r.Name)
		}
	}
	slices.Sort(pods)
	return slices.Compact(pods)
}

// sameClasses says whether a and b record the same class for each device.
func sameClasses(a, b PreparedClaim) bool {
	return slices.EqualFunc(a.Devices, b.Devices, func(x, y PreparedDevice) bool { return x.Class == y.Class })
}

// Holdings are the devices of the prepared claims, once for each pod a
// claim was reserved for: the node agent's device_holder series on a DRA
// node. A claim prepared by an agent that did not record its pods has none
// until the kubelet prepares it again. Until the agent's first inventory
// reaches the plugin (SetDevices, just after a restart) there are none: the
// devices' kinds are not known yet, and a series with kind "unknown" would
// say they left the node.
func (p *Plugin) Holdings() []handoff.Holding {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.devices == nil {
		return nil
	}
	var out []handoff.Holding
	for _, pc := range p.cp.Claims {
		for _, d := range pc.Devices {
			kind := "unknown"
			if dev := p.devices[d.ID]; dev != nil {
				kind = dev.Kind
			}
			for _, pod := range pc.Pods {
				out = append(out, handoff.Holding{Class: d.Class, Device: d.ID, Kind: kind, Namespace: pc.Namespace, Pod: pod})
			}
		}
	}
	return out
}

// deviceClassOf is the DeviceClass of request (or of its subrequest) in the
// claim's spec; "" when the spec does not say (the class is then the
// request's name).
func deviceClassOf(claim *resourceapi.ResourceClaim, request string) string {
	parent, sub, _ := strings.Cut(request, "/")
	for _, r := range claim.Spec.Devices.Requests {
		if r.Name != parent {
			continue
		}
		if r.Exactly != nil {
			return r.Exactly.DeviceClassName
		}
		for _, s := range r.FirstAvailable {
			if s.Name == sub {
				return s.DeviceClassName
			}
		}
	}
	return request
}

func sameDevices(a, b PreparedClaim) bool {
	return slices.EqualFunc(a.Devices, b.Devices, func(x, y PreparedDevice) bool {
		return x.Request == y.Request && x.Pool == y.Pool && x.Device == y.Device && x.ID == y.ID && slices.Equal(x.CDIDeviceIDs, y.CDIDeviceIDs) && maps.Equal(x.Share, y.Share)
	})
}

// cdiDeviceName is unique per claim and request, never reused (the claim's
// UID): a runtime's cached spec can never resolve it to another claim's
// devices. CDI names allow letters, digits, '_', '-', '.' and ':'.
func cdiDeviceName(uid types.UID, request string) string {
	return string(uid) + "-" + strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.', r == '_':
			return r
		}
		return '_'
	}, request)
}

func specFile(uid types.UID) string { return CDIVendor + "-" + CDIClass + "_" + string(uid) + ".json" }

func resultDevices(pc *PreparedClaim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, len(pc.Devices))
	for i, d := range pc.Devices {
		out[i] = kubeletplugin.Device{Requests: []string{d.Request}, PoolName: d.Pool, DeviceName: d.Device, CDIDeviceIDs: d.CDIDeviceIDs}
	}
	return out
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin: the claim's CDI
// spec is removed and it leaves the checkpoint. A claim not prepared here is
// not an error (the kubelet repeats itself after restarts).
func (p *Plugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	start := time.Now()
	defer p.cfg.Metrics.observe("unprepare", start)
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	removed := map[types.UID]PreparedClaim{}
	for _, c := range claims {
		if err := p.cdi.RemoveSpec(specFile(c.UID)); err != nil && !errors.Is(err, os.ErrNotExist) {
			out[c.UID] = fmt.Errorf("removing the CDI spec of ResourceClaim %s: %w", c.NamespacedName, err)
			p.cfg.Metrics.claim("unprepare", "error")
			continue
		}
		out[c.UID] = nil
		pc, ok := p.cp.Claims[c.UID]
		if !ok {
			p.cfg.Metrics.claim("unprepare", "unknown")
			continue
		}
		removed[c.UID] = pc
		delete(p.cp.Claims, c.UID)
		p.cfg.Metrics.claim("unprepare", "unprepared")
	}
	if len(removed) > 0 {
		if err := p.cp.Save(p.checkpointPath()); err != nil {
			maps.Copy(p.cp.Claims, removed)
			return nil, fmt.Errorf("writing the checkpoint: %w", err)
		}
		p.noteHeld()
	}
	// Every claim unprepared, known or not: one prepared before a
	// checkpoint set aside may hold a slice the record names.
	uids := make([]types.UID, 0, len(claims))
	for _, c := range claims {
		if out[c.UID] == nil {
			uids = append(uids, c.UID)
		}
	}
	p.release(ctx, uids)
	klog.FromContext(ctx).V(2).Info("unprepared", "claims", len(removed))
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin: errors of the helper's
// background work (publishing ResourceSlices, its gRPC servers) are logged;
// the next publish pass tries again.
func (p *Plugin) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg, "recoverable", errors.Is(err, kubeletplugin.ErrRecoverable))
}

// warn records a failed prepare where users look: on the claim and on the
// pods it is reserved for.
func (p *Plugin) warn(claim *resourceapi.ResourceClaim, err error) {
	if p.cfg.Recorder == nil {
		return
	}
	reason := ReasonPrepareFailed
	if errors.Is(err, errSlice) {
		reason = handoff.ReasonMIGSliceFailed
	}
	p.cfg.Recorder.Eventf(claim, corev1.EventTypeWarning, reason, "node %s: %v", p.cfg.NodeName, err)
	for _, r := range claim.Status.ReservedFor {
		if r.Resource != "pods" || r.APIGroup != "" {
			continue
		}
		pod := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: claim.Namespace, Name: r.Name, UID: r.UID}
		p.cfg.Recorder.Eventf(pod, corev1.EventTypeWarning, reason, "ResourceClaim %s on node %s: %v", claim.Name, p.cfg.NodeName, err)
	}
}

// sortedIDs is for logs.
func sortedIDs(pc PreparedClaim) []string {
	out := make([]string, len(pc.Devices))
	for i, d := range pc.Devices {
		out[i] = d.ID
	}
	sort.Strings(out)
	return out
}
