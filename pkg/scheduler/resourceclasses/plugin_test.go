package resourceclasses

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/metrics/testutil"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedulerapi "k8s.io/kubernetes/pkg/scheduler/apis/config"
	internalcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultbinder"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/queuesort"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	schedulermetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
	tf "k8s.io/kubernetes/pkg/scheduler/testing/framework"
	"k8s.io/utils/ptr"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
)

// These tests run the plugin through its real factory, New, inside the real
// scheduler framework: New builds its resclass client from the handle's
// KubeConfig, so the harness serves NodeDevices and ResourceClasses from a small
// fake API server (list, and a watch that stays quiet), and the pods from a fake
// clientset through the framework's informer factory, as kube-scheduler does.

// ---- devices, classes and pods ----

func gpu(id string, numa int64, memory string) v1alpha1.Device {
	d := v1alpha1.Device{ID: id, Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeMemory: {QuantityValue: ptr.To(resource.MustParse(memory))},
	}}
	setNUMA(&d, numa)
	return d
}

func nic(id string, numa int64) v1alpha1.Device {
	d := v1alpha1.Device{ID: id, Kind: v1alpha1.DeviceKindNIC, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{}}
	setNUMA(&d, numa)
	return d
}

// hugePool is a hugepage pool as the node agent publishes it (docs/hugepages.md).
func hugePool(id string, numa int64, size string, total, free int64) v1alpha1.Device {
	d := v1alpha1.Device{ID: id, Kind: v1alpha1.DeviceKindHugePages, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeSize:         {QuantityValue: ptr.To(resource.MustParse(size))},
		v1alpha1.AttributePagesTotal:   {IntValue: ptr.To(total)},
		v1alpha1.AttributePagesFree:    {IntValue: ptr.To(free)},
		v1alpha1.AttributeResourceName: {StringValue: ptr.To("hugepages-" + size)},
	}}
	setNUMA(&d, numa)
	return d
}

// setNUMA: a negative numa publishes none, as for a machine-wide pool.
func setNUMA(d *v1alpha1.Device, numa int64) {
	if numa >= 0 {
		d.Attributes[v1alpha1.AttributeNUMANode] = v1alpha1.DeviceAttribute{IntValue: ptr.To(numa)}
	}
}

func unhealthy(d v1alpha1.Device) v1alpha1.Device {
	d.Healthy = false
	return d
}

func migEnabled(d v1alpha1.Device) v1alpha1.Device {
	d.Attributes[v1alpha1.AttributeMIGEnabled] = v1alpha1.DeviceAttribute{BoolValue: ptr.To(true)}
	return d
}

func nodeDevices(name string, devs ...v1alpha1.Device) *v1alpha1.NodeDevices {
	return &v1alpha1.NodeDevices{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"}, Status: v1alpha1.NodeDevicesStatus{Devices: devs}}
}

func expr(key string, op v1alpha1.ResourceSelectorOperator, values ...string) v1alpha1.ResourceSelectorRequirement {
	return v1alpha1.ResourceSelectorRequirement{Key: key, Operator: op, Values: values}
}

func rclass(name string, exprs ...v1alpha1.ResourceSelectorRequirement) *v1alpha1.ResourceClass {
	return &v1alpha1.ResourceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Generation: 1},
		Spec:       v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: exprs}}},
	}
}

// The classes the tests use. gpu and gpu-big overlap: every big GPU is also a gpu.
var (
	gpuClass    = rclass("gpu", expr("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindNvidiaGPU))
	bigGPUClass = rclass("gpu-big", expr("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindNvidiaGPU), expr(v1alpha1.AttributeMemory, v1alpha1.ResourceSelectorOpGtEq, "80Gi"))
	nicClass    = rclass("nic", expr("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindNIC))
	hpClass     = rclass("hp-1g", expr("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindHugePages), expr(v1alpha1.AttributeSize, v1alpha1.ResourceSelectorOpGtEq, "1Gi"))
	allClasses  = []*v1alpha1.ResourceClass{gpuClass, bigGPUClass, nicClass, hpClass}
)

func cls(class string) corev1.ResourceName {
	return corev1.ResourceName(v1alpha1.ResourceNamePrefix + class)
}

type containerKind int

const (
	app containerKind = iota
	initC
	sidecar // an init container with restartPolicy Always
)

type ctr struct {
	name   string
	kind   containerKind
	limits map[corev1.ResourceName]string
}

// testPod builds a pod whose containers set limits only: requests default to them
// for extended resources and hugepages, which is how users write them.
func testPod(name string, ctrs ...ctr) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)}}
	for _, c := range ctrs {
		k := corev1.Container{Name: c.name, Image: "busybox", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{}}}
		for r, q := range c.limits {
			k.Resources.Limits[r] = resource.MustParse(q)
		}
		switch c.kind {
		case app:
			p.Spec.Containers = append(p.Spec.Containers, k)
		case initC:
			p.Spec.InitContainers = append(p.Spec.InitContainers, k)
		case sidecar:
			k.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
			p.Spec.InitContainers = append(p.Spec.InitContainers, k)
		}
	}
	return p
}

// gpuPod is a one-container pod asking for n devices of class.
func gpuPod(name, class string, n int) *corev1.Pod {
	return testPod(name, ctr{name: "app", limits: map[corev1.ResourceName]string{cls(class): fmt.Sprint(n)}})
}

// boundPod is a pod bound to node that carries a resclass assignment of ids of
// class to its container "app", as PreBind writes it.
func boundPod(t *testing.T, name, node, assignedNode, class string, ids ...string) *corev1.Pod {
	t.Helper()
	p := gpuPod(name, class, len(ids))
	p.Spec.NodeName = node
	p.Status.Phase = corev1.PodRunning
	anns, err := assignment.Annotations(&assignment.Assignment{Node: assignedNode, Containers: []assignment.Container{{Name: "app", Classes: map[string][]string{class: ids}}}})
	if err != nil {
		t.Fatal(err)
	}
	p.Annotations = anns
	return p
}

// ---- a fake resclass API server ----

// fakeResclassAPI serves the lists New's informers read. Watches stay open and
// quiet until the test ends; a watch asking for initial events (WatchList) is
// refused as an apiserver without that feature would, so client-go lists instead.
type fakeResclassAPI struct {
	nodeDevices []v1alpha1.NodeDevices
	classes     []v1alpha1.ResourceClass
	stop        chan struct{}
}

func (a *fakeResclassAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	gv := v1alpha1.SchemeGroupVersion.String()
	var list runtime.Object
	switch r.URL.Path {
	case "/apis/resclass.io/v1alpha1/nodedevices":
		list = &v1alpha1.NodeDevicesList{TypeMeta: metav1.TypeMeta{APIVersion: gv, Kind: "NodeDevicesList"}, ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: a.nodeDevices}
	case "/apis/resclass.io/v1alpha1/resourceclasses":
		list = &v1alpha1.ResourceClassList{TypeMeta: metav1.TypeMeta{APIVersion: gv, Kind: "ResourceClassList"}, ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: a.classes}
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	q := r.URL.Query()
	switch {
	case r.Method != http.MethodGet:
		writeAPIStatus(w, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed)
	case q.Get("watch") != "" && q.Get("sendInitialEvents") == "true":
		writeAPIStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest)
	case q.Get("watch") != "":
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-a.stop:
		}
	default:
		_ = json.NewEncoder(w).Encode(list)
	}
}

func writeAPIStatus(w http.ResponseWriter, code int, reason metav1.StatusReason) {
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(&metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: "not supported by the fake"})
}

// recordingActivator is the scheduling queue's side of Handle.Activate.
type recordingActivator struct {
	mu        sync.Mutex
	activated []string
}

func (r *recordingActivator) Activate(_ klog.Logger, pods map[string]*corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.activated = append(r.activated, slices.Sorted(maps.Keys(pods))...)
}

func (r *recordingActivator) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.activated)
}

// ---- the harness ----

type harness struct {
	t         *testing.T
	ctx       context.Context
	fw        framework.Framework
	plugin    *Plugin
	client    *fake.Clientset
	activator *recordingActivator
	nodes     map[string]fwk.NodeInfo
	// profile adds a scheduling profile named name, with the plugin's args
	// rawArgs, to the same scheduler.
	profile func(name, rawArgs string) (framework.Framework, *Plugin)
	// recorder gets the plugin's Events; its buffer outlasts any test (a full
	// one would block the plugin).
	recorder *events.FakeRecorder
}

// newHarness starts a framework whose ResourceClasses plugin, with strategy and
// the default assignmentWrite (Binding), sees nds and classes through its
// informers and pods (plus one Node per NodeDevices) in the fake clientset.
// Status writing is off: it needs a leader election the tests do not exercise.
func newHarness(t *testing.T, strategy Strategy, nds []*v1alpha1.NodeDevices, classes []*v1alpha1.ResourceClass, pods ...*corev1.Pod) *harness {
	t.Helper()
	return newHarnessWithArgs(t, fmt.Sprintf(`{"strategy":%q,"statusUpdateInterval":"0s"}`, strategy), nds, classes, pods...)
}

// newHarnessWithArgs is newHarness with the plugin's args as JSON. The plugin is
// the first binder, DefaultBinder the second, as deploy/scheduler/config.yaml
// configures them.
func newHarnessWithArgs(t *testing.T, rawArgs string, nds []*v1alpha1.NodeDevices, classes []*v1alpha1.ResourceClass, pods ...*corev1.Pod) *harness {
	t.Helper()
	// The framework instruments plugins with the scheduler's metrics, which
	// kube-scheduler registers at start-up (once; later calls do nothing).
	schedulermetrics.Register()
	api := &fakeResclassAPI{stop: make(chan struct{})}
	for _, nd := range nds {
		api.nodeDevices = append(api.nodeDevices, *nd)
	}
	for _, rc := range classes {
		api.classes = append(api.classes, *rc)
	}
	srv := httptest.NewServer(api)
	t.Cleanup(func() {
		close(api.stop)
		srv.Close()
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // runs before the server closes: informers stop first

	h := &harness{t: t, ctx: ctx, activator: &recordingActivator{}, nodes: map[string]fwk.NodeInfo{}, recorder: events.NewFakeRecorder(1000)}
	var objs []runtime.Object
	var nodes []*corev1.Node
	for _, nd := range nds {
		// A test labels a Node through its NodeDevices' labels (dramode_test.go).
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nd.Name, Labels: nd.Labels}}
		nodes = append(nodes, node)
		objs = append(objs, node)
		ni := framework.NewNodeInfo()
		ni.SetNode(node)
		h.nodes[nd.Name] = ni
	}
	for _, p := range pods {
		objs = append(objs, p)
	}
	h.client = fake.NewClientset(objs...)
	informerFactory := informers.NewSharedInformerFactory(h.client, 0)

	// profile makes one scheduling profile's framework; the profiles of one
	// scheduler share its informer factory.
	h.profile = func(name, rawArgs string) (framework.Framework, *Plugin) {
		var plugin *Plugin
		factory := func(ctx context.Context, obj runtime.Object, fh fwk.Handle) (fwk.Plugin, error) {
			pl, err := New(ctx, obj, fh)
			if err == nil {
				plugin = pl.(*Plugin)
			}
			return pl, err
		}
		args := &runtime.Unknown{ContentType: runtime.ContentTypeJSON, Raw: []byte(rawArgs)}
		fw, err := tf.NewFramework(ctx, []tf.RegisterPluginFunc{
			tf.RegisterQueueSortPlugin(queuesort.Name, queuesort.New),
			tf.RegisterPluginAsExtensions(Name, factory, "PreFilter", "Filter", "PreScore", "Score", "Reserve", "PreBind", "Bind"),
			tf.RegisterBindPlugin(defaultbinder.Name, defaultbinder.New),
			withPluginArgs(args),
		}, name,
			frameworkruntime.WithClientSet(h.client),
			frameworkruntime.WithKubeConfig(&rest.Config{Host: srv.URL}),
			frameworkruntime.WithInformerFactory(informerFactory),
			frameworkruntime.WithSnapshotSharedLister(internalcache.NewSnapshot(nil, nodes)),
			frameworkruntime.WithPodActivator(h.activator),
			frameworkruntime.WithEventRecorder(h.recorder),
		)
		if err != nil {
			t.Fatalf("NewFramework: %v", err)
		}
		return fw, plugin
	}
	h.fw, h.plugin = h.profile("default-scheduler", rawArgs)
	informerFactory.Start(ctx.Done())
	informerFactory.WaitForCacheSync(ctx.Done())
	h.waitFor("the plugin's informers to sync", func() bool { return h.plugin.synced() })
	return h
}

func withPluginArgs(args runtime.Object) tf.RegisterPluginFunc {
	return func(_ *frameworkruntime.Registry, profile *schedulerapi.KubeSchedulerProfile) {
		profile.PluginConfig = append(profile.PluginConfig, schedulerapi.PluginConfig{Name: Name, Args: args})
	}
}

// waitFor polls for what informers deliver asynchronously.
func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	if err := wait.PollUntilContextTimeout(h.ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		h.t.Fatalf("waiting for %s: %v", what, err)
	}
}

func (h *harness) holds(uid types.UID) bool {
	h.plugin.cache.mu.RLock()
	defer h.plugin.cache.mu.RUnlock()
	return h.plugin.cache.pods[uid] != nil
}

// blockedOn is what node's pods hold, which devices unknown, per class.
func (h *harness) blockedOn(node string) map[string]int {
	h.plugin.cache.mu.RLock()
	defer h.plugin.cache.mu.RUnlock()
	if n := h.plugin.cache.nodes[node]; n != nil {
		return maps.Clone(n.blocked)
	}
	return nil
}

func (h *harness) preFilter(pod *corev1.Pod) (fwk.CycleState, *fwk.PreFilterResult, *fwk.Status) {
	cs := framework.NewCycleState()
	res, st, _ := h.fw.RunPreFilterPlugins(h.ctx, cs, pod)
	return cs, res, st
}

func (h *harness) filter(cs fwk.CycleState, pod *corev1.Pod, node string) *fwk.Status {
	h.t.Helper()
	ni, ok := h.nodes[node]
	if !ok {
		h.t.Fatalf("no node %s", node)
	}
	return h.fw.RunFilterPlugins(h.ctx, cs, pod, ni)
}

// fits runs PreFilter and Filter for pod on node and returns Filter's status.
func (h *harness) fits(pod *corev1.Pod, node string) (fwk.CycleState, *fwk.Status) {
	h.t.Helper()
	cs, _, st := h.preFilter(pod)
	if !st.IsSuccess() {
		h.t.Fatalf("PreFilter %s: %v", pod.Name, st)
	}
	return cs, h.filter(cs, pod, node)
}

// reserve runs PreFilter, Filter and Reserve, each of which must succeed, and
// returns the cycle state and the devices the pod got.
func (h *harness) reserve(pod *corev1.Pod, node string) (fwk.CycleState, *assignment.Assignment) {
	h.t.Helper()
	cs, st := h.fits(pod, node)
	if !st.IsSuccess() {
		h.t.Fatalf("Filter %s on %s: %v", pod.Name, node, st)
	}
	if st := h.fw.RunReservePluginsReserve(h.ctx, cs, pod, node); !st.IsSuccess() {
		h.t.Fatalf("Reserve %s on %s: %v", pod.Name, node, st)
	}
	s, ok := getState(cs)
	if !ok || s.placed == nil {
		h.t.Fatalf("Reserve %s left no placement in the cycle state", pod.Name)
	}
	return cs, s.placed
}

// scores runs PreScore and Score over nodes and returns this plugin's scores; a
// plugin that PreScore skipped has none.
func (h *harness) scores(cs fwk.CycleState, pod *corev1.Pod, nodes ...string) map[string]int64 {
	h.t.Helper()
	var infos []fwk.NodeInfo
	for _, n := range nodes {
		infos = append(infos, h.nodes[n])
	}
	if st := h.fw.RunPreScorePlugins(h.ctx, cs, pod, infos); !st.IsSuccess() {
		h.t.Fatalf("PreScore: %v", st)
	}
	ns, st := h.fw.RunScorePlugins(h.ctx, cs, pod, infos)
	if !st.IsSuccess() {
		h.t.Fatalf("Score: %v", st)
	}
	out := map[string]int64{}
	for _, n := range ns {
		for _, s := range n.Scores {
			if s.Name == Name {
				out[n.Name] = s.Score
			}
		}
	}
	if len(out) == 0 && len(nodes) > 0 && h.plugin.args.Strategy != FirstFit {
		// PreScore skipped scoring (FirstFit scores nothing): it does so
		// otherwise only when every node would
		// score the same. Those scores, from the plugin's cache as PreScore
		// computed them, must then be equal.
		s, ok := getState(cs)
		if !ok {
			h.t.Fatalf("no Score for pod %s and no state", pod.Name)
		}
		scores := h.plugin.cache.scores(nodes, s.demand, h.plugin.args.Strategy)
		for i, n := range nodes {
			if scores[i] != scores[0] {
				h.t.Fatalf("PreScore skipped scoring, but %s scores %d and %s %d", n, scores[i], nodes[0], scores[0])
			}
			out[n] = scores[i]
		}
	}
	return out
}

func wantCode(t *testing.T, st *fwk.Status, code fwk.Code, msgContains ...string) {
	t.Helper()
	if st.Code() != code {
		t.Fatalf("status %v, want code %v", st, code)
	}
	for _, m := range msgContains {
		if !strings.Contains(st.Message(), m) {
			t.Errorf("status message %q does not contain %q", st.Message(), m)
		}
	}
}

// ---- the framework and New ----

func TestNewRejectsInvalidArgs(t *testing.T) {
	schedulermetrics.Register()
	_, err := tf.NewFramework(t.Context(), []tf.RegisterPluginFunc{
		tf.RegisterQueueSortPlugin(queuesort.Name, queuesort.New),
		tf.RegisterBindPlugin(defaultbinder.Name, defaultbinder.New),
		tf.RegisterPluginAsExtensions(Name, New, "PreFilter", "Filter"),
		withPluginArgs(&runtime.Unknown{Raw: []byte(`{"strategy":"Random"}`)}),
	}, "default-scheduler", frameworkruntime.WithKubeConfig(&rest.Config{Host: "http://127.0.0.1:1"}))
	if err == nil || !strings.Contains(err.Error(), "strategy") {
		t.Fatalf("NewFramework with strategy Random: err %v, want one naming the strategy", err)
	}
}

// ---- PreFilter ----

func TestPreFilter(t *testing.T) {
	h := newHarness(t, FirstFit,
		[]*v1alpha1.NodeDevices{
			nodeDevices("n1", gpu("g0", 0, "80Gi"), gpu("g1", 0, "80Gi"), nic("nic0", 0)),
			nodeDevices("n2", gpu("h0", 0, "80Gi"), gpu("h1", 0, "80Gi")),
		},
		append(slices.Clone(allClasses), rclass("fpga", expr("kind", v1alpha1.ResourceSelectorOpIn, "fpga"))))

	t.Run("no class requests: skipped", func(t *testing.T) {
		p := testPod("plain", ctr{name: "app", limits: map[corev1.ResourceName]string{corev1.ResourceCPU: "1"}})
		cs, res, st := h.preFilter(p)
		if !st.IsSuccess() || !res.AllNodes() {
			t.Fatalf("PreFilter: %v, %v; want success for all nodes", res, st)
		}
		if !cs.GetSkipFilterPlugins().Has(Name) {
			t.Errorf("the plugin returned no Skip for a pod without class requests (skipped: %v)", cs.GetSkipFilterPlugins())
		}
		if _, ok := getState(cs); ok {
			t.Errorf("state written for a pod without class requests")
		}
	})

	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		msgs []string
	}{
		{"fractional count", gpuPodQ("half", "gpu", "500m"), []string{"not a whole number", `"app"`}},
		{"negative count", gpuPodQ("neg", "gpu", "-1"), []string{"not a whole number"}},
		{"absurd count", gpuPodQ("huge", "gpu", "1M"), []string{"between 0 and 65536"}},
		{"unknown class", gpuPod("tpu", "tpu", 1), []string{`ResourceClass "tpu" does not exist`}},
		{"class with no device anywhere", gpuPod("fpga", "fpga", 1), []string{"no node has devices of class fpga"}},
		{"init containers leave more for reuse than the next container takes", testPod("ambiguous",
			ctr{name: "setup", kind: initC, limits: map[corev1.ResourceName]string{cls("gpu"): "2"}},
			ctr{name: "main", limits: map[corev1.ResourceName]string{cls("gpu"): "1"}},
		), []string{`container "main" requests 1`, "leave 2 of them for reuse"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, st := h.preFilter(tc.pod)
			wantCode(t, st, fwk.UnschedulableAndUnresolvable, tc.msgs...)
			if st.Plugin() != Name {
				t.Errorf("rejected by %q, want %q", st.Plugin(), Name)
			}
		})
	}

	t.Run("nodes narrowed to those with every class", func(t *testing.T) {
		p := testPod("gpu-nic", ctr{name: "app", limits: map[corev1.ResourceName]string{cls("gpu"): "1", cls("nic"): "1"}})
		_, res, st := h.preFilter(p)
		if !st.IsSuccess() {
			t.Fatal(st)
		}
		if res.AllNodes() || !res.NodeNames.Equal(sets.New("n1")) {
			t.Errorf("PreFilterResult %v, want only n1 (n2 has no NIC)", res)
		}
		_, res, st = h.preFilter(gpuPod("gpu-only", "gpu", 1))
		if !st.IsSuccess() || !res.AllNodes() {
			t.Errorf("PreFilter for a class on every node: %v, %v; want all nodes", res, st)
		}
	})

	for _, tc := range []struct {
		name  string
		pod   *corev1.Pod
		draws int
		// want is each container's share of the drawn devices: the indices of
		// the draws it gets, in the order the kubelet forms them.
		want map[string][]int
	}{
		{"init 1 then app 2: the app reuses the init container's device", testPod("reuse",
			ctr{name: "setup", kind: initC, limits: map[corev1.ResourceName]string{cls("gpu"): "1"}},
			ctr{name: "main", limits: map[corev1.ResourceName]string{cls("gpu"): "2"}},
		), 2, map[string][]int{"setup": {0}, "main": {0, 1}}},
		{"sidecar keeps its device: draws add up", testPod("sidecar",
			ctr{name: "proxy", kind: sidecar, limits: map[corev1.ResourceName]string{cls("gpu"): "1"}},
			ctr{name: "main", limits: map[corev1.ResourceName]string{cls("gpu"): "1"}},
		), 2, map[string][]int{"proxy": {0}, "main": {1}}},
		{"two app containers draw separately", testPod("two",
			ctr{name: "a", limits: map[corev1.ResourceName]string{cls("gpu"): "1"}},
			ctr{name: "b", limits: map[corev1.ResourceName]string{cls("gpu"): "1"}},
		), 2, map[string][]int{"a": {0}, "b": {1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, placed := h.reserve(tc.pod, "n1")
			t.Cleanup(func() { h.fw.RunReservePluginsUnreserve(h.ctx, cs, tc.pod, "n1") })
			s, _ := getState(cs)
			if got := s.demand.draws["gpu"]; got != tc.draws {
				t.Errorf("draws %d, want %d", got, tc.draws)
			}
			drawn := map[int]string{}
			for name, idx := range tc.want {
				got := placed.Devices(name, "gpu")
				if len(got) != len(idx) {
					t.Fatalf("container %s got %v, want %d devices", name, got, len(idx))
				}
				for k, i := range idx {
					if prev, ok := drawn[i]; ok && prev != got[k] {
						t.Errorf("container %s got %v: draw %d is %s elsewhere", name, got, i, prev)
					}
					drawn[i] = got[k]
				}
			}
			if len(slices.Compact(slices.Sorted(maps.Values(drawn)))) != tc.draws {
				t.Errorf("assignment %+v does not use %d distinct devices", placed.Containers, tc.draws)
			}
		})
	}
}

func gpuPodQ(name, class, q string) *corev1.Pod {
	return testPod(name, ctr{name: "app", limits: map[corev1.ResourceName]string{cls(class): q}})
}

func TestPreFilterWaitsForSync(t *testing.T) {
	p := &Plugin{args: &Args{Strategy: FirstFit}, shared: &shared{cache: newCache(), synced: func() bool { return false }, waiting: map[types.UID]waitingPod{}}}
	_, st := p.PreFilter(t.Context(), framework.NewCycleState(), gpuPod("early", "gpu", 1), nil)
	wantCode(t, st, fwk.Error, "not synced")
}

// ---- Filter ----

func TestFilterMatchesOverlappingClasses(t *testing.T) {
	// g-big is the only big GPU; both GPUs are of class gpu.
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", gpu("g-big", 0, "80Gi"), gpu("g-small", 0, "40Gi"))}, allClasses)

	// Counting per class accepts: each class alone has the devices.
	for _, p := range []*corev1.Pod{gpuPod("two-gpu", "gpu", 2), gpuPod("one-big", "gpu-big", 1)} {
		if _, st := h.fits(p, "n1"); !st.IsSuccess() {
			t.Fatalf("%s alone: %v", p.Name, st)
		}
	}
	// Together they need three devices of two.
	both := testPod("big-and-two", ctr{name: "app", limits: map[corev1.ResourceName]string{cls("gpu"): "2", cls("gpu-big"): "1"}})
	_, st := h.fits(both, "n1")
	wantCode(t, st, fwk.Unschedulable, "together", "gpu, gpu-big")

	// Greedily, in class order, gpu would take g-big (published first) and leave
	// gpu-big nothing; the matching gives gpu the small one.
	pod := testPod("one-each", ctr{name: "app", limits: map[corev1.ResourceName]string{cls("gpu"): "1", cls("gpu-big"): "1"}})
	_, placed := h.reserve(pod, "n1")
	if got := placed.Devices("app", "gpu-big"); !slices.Equal(got, []string{"g-big"}) {
		t.Errorf("gpu-big got %v, want [g-big]", got)
	}
	if got := placed.Devices("app", "gpu"); !slices.Equal(got, []string{"g-small"}) {
		t.Errorf("gpu got %v, want [g-small]", got)
	}
}

func TestFilterSkipsUnusableDevices(t *testing.T) {
	// g-bound is held by a bound pod, read from its annotation by the informer.
	holder := boundPod(t, "holder", "n1", "n1", "gpu", "g-bound")
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1",
		unhealthy(gpu("g-sick", 0, "80Gi")),
		migEnabled(gpu("g-mig", 0, "80Gi")),
		gpu("g-bound", 0, "80Gi"),
		gpu("g-free1", 0, "80Gi"),
		gpu("g-free2", 0, "80Gi"),
	)}, allClasses, holder)
	h.waitFor("the bound pod's devices to be held", func() bool { return h.holds(holder.UID) })

	if _, st := h.fits(gpuPod("three", "gpu", 3), "n1"); st.Code() != fwk.Unschedulable {
		t.Fatalf("3 GPUs where 2 are usable: %v, want Unschedulable", st)
	}
	_, placed := h.reserve(gpuPod("two", "gpu", 2), "n1")
	if got := placed.Devices("app", "gpu"); !slices.Equal(got, []string{"g-free1", "g-free2"}) {
		t.Errorf("got %v, want the two free healthy GPUs not in MIG mode", got)
	}
	_, st := h.fits(gpuPod("one-more", "gpu", 1), "n1")
	wantCode(t, st, fwk.Unschedulable, "Insufficient free devices of class gpu")

	// A MIG-mode GPU is never given, even when it is the only one of its class.
	h2 := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", migEnabled(gpu("g-mig", 0, "80Gi")))}, allClasses)
	_, st = h2.fits(gpuPod("mig", "gpu-big", 1), "n1")
	wantCode(t, st, fwk.Unschedulable, "Insufficient free devices of class gpu-big")
}

// TestFilterRefusesNodeWithoutTheClass: when most nodes have devices of every
// class, PreFilter does not narrow (the framework's copy of a large set would
// cost more per pod than it saves), and Filter refuses the others as
// unresolvable, as PreFilter would have left them out.
func TestFilterRefusesNodeWithoutTheClass(t *testing.T) {
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{
		nodeDevices("n1", gpu("g0", 0, "80Gi"), nic("nic0", 0)),
		nodeDevices("n2", gpu("g0", 0, "80Gi"), nic("nic0", 0)),
		nodeDevices("n3", gpu("g0", 0, "80Gi")),
	}, allClasses)
	p := testPod("gpu-nic", ctr{name: "app", limits: map[corev1.ResourceName]string{cls("gpu"): "1", cls("nic"): "1"}})
	cs, res, st := h.preFilter(p)
	if !st.IsSuccess() || !res.AllNodes() {
		t.Fatalf("PreFilter with 2 of 3 nodes eligible: %v, %v; want all nodes", res, st)
	}
	wantCode(t, h.filter(cs, p, "n3"), fwk.UnschedulableAndUnresolvable, "no device of class nic on the node")
	if st := h.filter(cs, p, "n1"); !st.IsSuccess() {
		t.Errorf("n1: %v, want it to fit", st)
	}
}

func TestFilterNodeWithoutNodeDevices(t *testing.T) {
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", gpu("g0", 0, "80Gi"))}, allClasses)
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}
	ni := framework.NewNodeInfo()
	ni.SetNode(other)
	h.nodes["bare"] = ni
	_, st := h.fits(gpuPod("p", "gpu", 1), "bare")
	wantCode(t, st, fwk.Unschedulable, "no NodeDevices")
}

// ---- strategies ----

// holdDirectly makes pod uid hold ids of class on node through the cache, as
// Reserve or the pod informer would.
func holdDirectly(c *cache, uid types.UID, node, class string, ids ...string) {
	a := &assignment.Assignment{Node: node, Containers: []assignment.Container{{Name: "app", Classes: map[string][]string{class: ids}}}}
	raw, _ := assignment.Encode(a)
	h := newHolding(uid, a, nil)
	h.raw = presentAnnotation(raw)
	c.hold(h)
}

func TestStrategiesChooseDevices(t *testing.T) {
	// Two NUMA nodes with two GPUs each; one GPU is taken. BinPack and NUMAAligned
	// take the last free GPU of the fuller NUMA node, Spread one of the emptier,
	// FirstFit the first free one published; Topology, like BinPack, the one
	// whose taking leaves the fewest free pairs broken (the GPU alone on its
	// NUMA node).
	fourGPUs := nodeDevices("n1", gpu("g0", 0, "80Gi"), gpu("g1", 0, "80Gi"), gpu("g2", 1, "80Gi"), gpu("g3", 1, "80Gi"))
	for _, tc := range []struct {
		taken string
		want  map[Strategy]string
	}{
		{"g3", map[Strategy]string{FirstFit: "g0", BinPack: "g2", Spread: "g0", NUMAAligned: "g2", Topology: "g2"}},
		{"g0", map[Strategy]string{FirstFit: "g1", BinPack: "g1", Spread: "g2", NUMAAligned: "g1", Topology: "g1"}},
	} {
		for _, s := range strategies {
			t.Run(fmt.Sprintf("%s taken/%s", tc.taken, s), func(t *testing.T) {
				h := newHarness(t, s, []*v1alpha1.NodeDevices{fourGPUs}, allClasses)
				holdDirectly(h.plugin.cache, "other", "n1", "gpu", tc.taken)
				_, placed := h.reserve(gpuPod("p", "gpu", 1), "n1")
				if got := placed.Devices("app", "gpu"); !slices.Equal(got, []string{tc.want[s]}) {
					t.Errorf("got %v, want [%s]", got, tc.want[s])
				}
			})
		}
	}

	t.Run("FirstFit takes devices in published order", func(t *testing.T) {
		h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", gpu("g-c", 0, "80Gi"), gpu("g-a", 0, "80Gi"), gpu("g-b", 0, "80Gi"))}, allClasses)
		_, placed := h.reserve(gpuPod("p", "gpu", 2), "n1")
		if got := placed.Devices("app", "gpu"); !slices.Equal(got, []string{"g-c", "g-a"}) {
			t.Errorf("got %v, want [g-c g-a]", got)
		}
	})
}

func TestStrategiesScoreNodes(t *testing.T) {
	nds := []*v1alpha1.NodeDevices{
		nodeDevices("full", gpu("f0", 0, "80Gi"), gpu("f1", 0, "80Gi"), gpu("f2", 1, "80Gi"), gpu("f3", 1, "80Gi")),
		nodeDevices("empty", gpu("e0", 0, "80Gi"), gpu("e1", 0, "80Gi"), gpu("e2", 1, "80Gi"), gpu("e3", 1, "80Gi")),
	}
	// On "full" two of four GPUs are held, so placing one more uses 3/4; on
	// "empty" 1/4.
	for _, tc := range []struct {
		s    Strategy
		want map[string]int64
	}{
		{BinPack, map[string]int64{"full": 75, "empty": 25}},
		{Spread, map[string]int64{"full": 25, "empty": 75}},
		{FirstFit, map[string]int64{}}, // PreScore skips: other plugins choose
	} {
		t.Run(string(tc.s), func(t *testing.T) {
			h := newHarness(t, tc.s, nds, allClasses)
			holdDirectly(h.plugin.cache, "other", "full", "gpu", "f0", "f2")
			pod := gpuPod("p", "gpu", 1)
			cs, _, st := h.preFilter(pod)
			if !st.IsSuccess() {
				t.Fatal(st)
			}
			got := h.scores(cs, pod, "full", "empty")
			if !maps.Equal(got, tc.want) {
				t.Errorf("scores %v, want %v", got, tc.want)
			}
			if skipped := cs.GetSkipScorePlugins().Has(Name); skipped != (tc.s == FirstFit) {
				t.Errorf("scoring skipped: %v, want it skipped for FirstFit only (here the nodes score differently)", skipped)
			}
		})
	}

	// Every node scores the same: PreScore skips scoring, which changes no
	// ranking, and the scores it computed are the strategy's.
	t.Run("NUMAAligned, every node the same", func(t *testing.T) {
		h := newHarness(t, NUMAAligned, nds, allClasses)
		pod := gpuPod("p", "gpu", 1)
		cs, _, st := h.preFilter(pod)
		if !st.IsSuccess() {
			t.Fatal(st)
		}
		got := h.scores(cs, pod, "full", "empty")
		if !cs.GetSkipScorePlugins().Has(Name) {
			t.Errorf("scoring not skipped, with every node scoring the same")
		}
		if want := map[string]int64{"full": fwk.MaxScore, "empty": fwk.MaxScore}; !maps.Equal(got, want) {
			t.Errorf("scores %v, want %v", got, want)
		}
		if !h.plugin.cache.numaCertain("gpu") {
			t.Error("every GPU publishes its NUMA node, yet PreScore cannot know the scores without visiting the nodes")
		}
	})

	// One GPU somewhere publishes no NUMA node: a one-GPU pod there scores
	// less, so PreScore must look at the nodes. Once that node goes, the
	// class is certain again.
	t.Run("NUMAAligned, a device without NUMA node", func(t *testing.T) {
		h := newHarness(t, NUMAAligned, append([]*v1alpha1.NodeDevices{nodeDevices("unknown", gpu("u0", -1, "80Gi"))}, nds...), allClasses)
		pod := gpuPod("p", "gpu", 1)
		cs, _, st := h.preFilter(pod)
		if !st.IsSuccess() {
			t.Fatal(st)
		}
		if h.plugin.cache.numaCertain("gpu") {
			t.Error("a GPU without NUMA node, yet the class counts as certain")
		}
		got := h.scores(cs, pod, "unknown", "empty")
		if cs.GetSkipScorePlugins().Has(Name) {
			t.Error("scoring skipped, with the nodes scoring differently")
		}
		if got["empty"] != fwk.MaxScore || got["unknown"] >= got["empty"] {
			t.Errorf("scores %v, want %d for empty and less for unknown", got, fwk.MaxScore)
		}
		h.plugin.cache.deleteNodeDevices("unknown")
		if !h.plugin.cache.numaCertain("gpu") {
			t.Error("the GPU without NUMA node is gone, yet the class is not certain")
		}
	})

	t.Run(string(NUMAAligned), func(t *testing.T) {
		h := newHarness(t, NUMAAligned, []*v1alpha1.NodeDevices{
			nodeDevices("aligned", gpu("a-g", 0, "80Gi"), nic("a-nic", 0)),
			nodeDevices("split", gpu("s-g", 0, "80Gi"), nic("s-nic", 1)),
		}, allClasses)
		pod := testPod("p", ctr{name: "app", limits: map[corev1.ResourceName]string{cls("gpu"): "1", cls("nic"): "1"}})
		cs, _, st := h.preFilter(pod)
		if !st.IsSuccess() {
			t.Fatal(st)
		}
		// The exact score of a split node is a tuning choice; that it is below an
		// aligned one is the strategy.
		got := h.scores(cs, pod, "aligned", "split")
		if got["aligned"] != fwk.MaxScore || got["split"] >= got["aligned"] || got["split"] <= 0 {
			t.Errorf("scores %v, want %d for aligned and less, but more than 0, for split", got, fwk.MaxScore)
		}
	})
}

func TestNUMAAlignedPlacesGPUNICAndPoolTogether(t *testing.T) {
	// Published so that taking the first of each class mixes NUMA nodes; the
	// pool of NUMA node 0 has no free pages, so only NUMA node 1 takes all three.
	nd := nodeDevices("n1",
		gpu("g0", 0, "80Gi"), gpu("g1", 1, "80Gi"),
		nic("nic-a", 1), nic("nic-b", 0),
		hugePool("hugepages-1Gi-numa0", 0, "1Gi", 8, 0), hugePool("hugepages-1Gi-numa1", 1, "1Gi", 8, 8),
	)
	pod := testPod("dpdk", ctr{name: "fwd", limits: map[corev1.ResourceName]string{cls("gpu"): "1", cls("nic"): "1", cls("hp-1g"): "1", "hugepages-1Gi": "2Gi"}})
	want := map[string][]string{"gpu": {"g1"}, "nic": {"nic-a"}, "hp-1g": {"hugepages-1Gi-numa1"}}

	h := newHarness(t, NUMAAligned, []*v1alpha1.NodeDevices{nd}, allClasses)
	cs, placed := h.reserve(pod, "n1")
	for class, ids := range want {
		if got := placed.Devices("fwd", class); !slices.Equal(got, ids) {
			t.Errorf("NUMAAligned: %s got %v, want %v", class, got, ids)
		}
	}
	h.fw.RunReservePluginsUnreserve(h.ctx, cs, pod, "n1")
	cs, _, _ = h.preFilter(pod)
	if got := h.scores(cs, pod, "n1"); got["n1"] != fwk.MaxScore {
		t.Errorf("score %v, want %d for a node where the pod fits on one NUMA node", got, fwk.MaxScore)
	}

	// The same pod under FirstFit: GPU from NUMA 0, NIC from NUMA 1.
	h = newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nd}, allClasses)
	_, placed = h.reserve(pod, "n1")
	if got := placed.Devices("fwd", "gpu"); !slices.Equal(got, []string{"g0"}) {
		t.Errorf("FirstFit: gpu got %v, want [g0] (the test's premise)", got)
	}
}

// ---- hugepage pools ----

func hugePod(name string, class string, n int, native map[corev1.ResourceName]string) *corev1.Pod {
	limits := map[corev1.ResourceName]string{cls(class): fmt.Sprint(n)}
	maps.Copy(limits, native)
	return testPod(name, ctr{name: "app", limits: limits})
}

func TestHugepagePools(t *testing.T) {
	const poolID = "hugepages-1Gi-numa0"
	// 8 pages reserved, 4 of them free as the kernel reports it.
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", hugePool(poolID, 0, "1Gi", 8, 4))}, allClasses)
	gi := func(n int) map[corev1.ResourceName]string {
		return map[corev1.ResourceName]string{"hugepages-1Gi": fmt.Sprintf("%dGi", n)}
	}

	t.Run("two units of a pool class", func(t *testing.T) {
		_, st := h.fits(hugePod("two", "hp-1g", 2, gi(2)), "n1")
		wantCode(t, st, fwk.UnschedulableAndUnresolvable, `container "app" requests 2`)
	})
	t.Run("no native hugepages request", func(t *testing.T) {
		_, st := h.fits(hugePod("none", "hp-1g", 1, nil), "n1")
		wantCode(t, st, fwk.UnschedulableAndUnresolvable, "requests no hugepages-<size>")
	})
	t.Run("pages of another size", func(t *testing.T) {
		_, st := h.fits(hugePod("2mi", "hp-1g", 1, map[corev1.ResourceName]string{"hugepages-2Mi": "2Gi"}), "n1")
		// Another node may have pools of that size: retryable, but saying why.
		wantCode(t, st, fwk.Unschedulable, "has the page size its containers request")
	})
	t.Run("more than pagesFree", func(t *testing.T) {
		_, st := h.fits(hugePod("five", "hp-1g", 1, gi(5)), "n1")
		wantCode(t, st, fwk.Unschedulable, "no hugepage pool of class hp-1g")
	})

	// pagesFree lags: 4 free pages are still reported after a pod is given 4,
	// so pagesTotal minus the charges of assigned pods is what stops a third.
	var reserved []fwk.CycleState
	var pods []*corev1.Pod
	for _, name := range []string{"first", "second"} {
		p := hugePod(name, "hp-1g", 1, gi(4))
		cs, placed := h.reserve(p, "n1")
		if got := placed.Devices("app", "hp-1g"); !slices.Equal(got, []string{poolID}) {
			t.Fatalf("%s got %v, want the pool", name, got)
		}
		reserved, pods = append(reserved, cs), append(pods, p)
	}
	third := hugePod("third", "hp-1g", 1, gi(1))
	_, st := h.fits(third, "n1")
	wantCode(t, st, fwk.Unschedulable, "no hugepage pool")

	h.fw.RunReservePluginsUnreserve(h.ctx, reserved[1], pods[1], "n1")
	if _, st := h.fits(third, "n1"); !st.IsSuccess() {
		t.Errorf("after Unreserve released 4Gi: %v", st)
	}
}

func TestHugepageChargeOfBoundPod(t *testing.T) {
	const poolID = "hugepages-1Gi-numa0"
	// A bound pod assigned to the pool with 6Gi of native requests: only 2 of the
	// 8 pages are left to others, although all 8 are still reported free.
	holder := boundPod(t, "holder", "n1", "n1", "hp-1g", poolID)
	holder.Spec.Containers[0].Resources.Limits = corev1.ResourceList{cls("hp-1g"): resource.MustParse("1"), "hugepages-1Gi": resource.MustParse("6Gi")}
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", hugePool(poolID, 0, "1Gi", 8, 8))}, allClasses, holder)
	h.waitFor("the holder's pages to be charged", func() bool { return h.holds(holder.UID) })

	gi := func(n int) map[corev1.ResourceName]string {
		return map[corev1.ResourceName]string{"hugepages-1Gi": fmt.Sprintf("%dGi", n)}
	}
	if _, st := h.fits(hugePod("three", "hp-1g", 1, gi(3)), "n1"); st.Code() != fwk.Unschedulable {
		t.Errorf("3Gi with 2Gi left: %v, want Unschedulable", st)
	}
	if _, st := h.fits(hugePod("two", "hp-1g", 1, gi(2)), "n1"); !st.IsSuccess() {
		t.Errorf("2Gi with 2Gi left: %v", st)
	}
}

func TestHugepageDrawsOfOnePodShareThePoolFreePages(t *testing.T) {
	// Two app containers each draw a pool and 3Gi; one pool has 4Gi free, so the
	// second draw must go to the other pool.
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1",
		hugePool("hp0", 0, "1Gi", 4, 4), hugePool("hp1", 1, "1Gi", 4, 4))}, allClasses)
	pod := testPod("two-apps",
		ctr{name: "a", limits: map[corev1.ResourceName]string{cls("hp-1g"): "1", "hugepages-1Gi": "3Gi"}},
		ctr{name: "b", limits: map[corev1.ResourceName]string{cls("hp-1g"): "1", "hugepages-1Gi": "3Gi"}},
	)
	_, placed := h.reserve(pod, "n1")
	if a, b := placed.Devices("a", "hp-1g"), placed.Devices("b", "hp-1g"); !slices.Equal(a, []string{"hp0"}) || !slices.Equal(b, []string{"hp1"}) {
		t.Errorf("a got %v, b got %v; want hp0 and hp1", a, b)
	}
	third := hugePod("third", "hp-1g", 1, map[corev1.ResourceName]string{"hugepages-1Gi": "2Gi"})
	if _, st := h.fits(third, "n1"); st.Code() != fwk.Unschedulable {
		t.Errorf("2Gi with 1Gi left in each pool: %v, want Unschedulable", st)
	}
}

// poolCharged is what the pods holding pool id on node are charged, in bytes.
func poolCharged(h *harness, node, id string) int64 {
	c := h.plugin.cache
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := c.nodes[node]
	return n.devices[n.index[id]].pool.charged
}

// A pod's charge on a pool is the kubelet's (and kube-scheduler's) request of
// the pool's page size by the containers that draw from it: init containers run
// one at a time, beside the sidecars started before them, before the app
// containers and all sidecars run together (component-helpers' PodRequests).
func TestHugepageChargeIsThePodsRequest(t *testing.T) {
	hp := func(pages string) map[corev1.ResourceName]string {
		return map[corev1.ResourceName]string{cls("hp-1g"): "1", "hugepages-1Gi": pages}
	}
	for _, tc := range []struct {
		name  string
		pod   *corev1.Pod
		total int64 // pages in the pool, all free
		want  int64 // the pod's request, in Gi
	}{
		// max(2, 1+1): the init container's pages are back before the apps start.
		// Counting each draw apart (the init's and first app's pool, then the
		// second app's) would want 3Gi and turn the pod away.
		{"init then two apps in a pool just big enough", testPod("init-apps",
			ctr{name: "warm", kind: initC, limits: hp("2Gi")},
			ctr{name: "a", limits: hp("1Gi")},
			ctr{name: "b", limits: hp("1Gi")},
		), 2, 2},
		// max(1+2, 1+1): the sidecar runs beside the init container.
		{"sidecar before an init container", testPod("sidecar-init",
			ctr{name: "proxy", kind: sidecar, limits: hp("1Gi")},
			ctr{name: "warm", kind: initC, limits: hp("2Gi")},
			ctr{name: "main", limits: hp("1Gi")},
		), 8, 3},
		{"two apps", testPod("apps",
			ctr{name: "a", limits: hp("1Gi")},
			ctr{name: "b", limits: hp("2Gi")},
		), 8, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := resourcehelper.PodRequests(defaultRequests(tc.pod), resourcehelper.PodResourcesOptions{})["hugepages-1Gi"]
			if want.Value() != tc.want<<30 {
				t.Fatalf("the test's premise: PodRequests says %s, want %dGi", want.String(), tc.want)
			}
			h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", hugePool("hp0", 0, "1Gi", tc.total, tc.total))}, allClasses)
			h.reserve(tc.pod, "n1")
			if got := poolCharged(h, "n1", "hp0"); got != want.Value() {
				t.Errorf("pool charged %d bytes, want the pod's request %s", got, want.String())
			}
			// What is left is exactly what another pod may take.
			left := tc.total - tc.want
			if left > 0 {
				if _, st := h.fits(hugePod("rest", "hp-1g", 1, map[corev1.ResourceName]string{"hugepages-1Gi": fmt.Sprintf("%dGi", left)}), "n1"); !st.IsSuccess() {
					t.Errorf("%dGi left: %v", left, st)
				}
			}
			if _, st := h.fits(hugePod("more", "hp-1g", 1, map[corev1.ResourceName]string{"hugepages-1Gi": fmt.Sprintf("%dGi", left+1)}), "n1"); st.IsSuccess() {
				t.Errorf("%dGi fits where %dGi are left", left+1, left)
			}
		})
	}
}

// defaultRequests copies pod with requests set from limits, as the apiserver
// defaults them for hugepages and extended resources.
func defaultRequests(pod *corev1.Pod) *corev1.Pod {
	p := pod.DeepCopy()
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range cs {
			cs[i].Resources.Requests = cs[i].Resources.Limits.DeepCopy()
		}
	}
	return p
}

// ---- Reserve, Unreserve, PreBind, Bind ----

// preBindArgs select the PreBind patch instead of the default write in the
// Binding.
const preBindArgs = `{"strategy":"FirstFit","assignmentWrite":"PreBind","statusUpdateInterval":"0s"}`

// TestProfilesShareTheDevices: the profiles of one scheduler share one cache, as
// they share kube-scheduler's: the devices a pod of one profile is assumed to
// hold are taken for the next pod of another profile, before any binding.
func TestProfilesShareTheDevices(t *testing.T) {
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", gpu("g0", 0, "80Gi"))}, allClasses)
	fw, second := h.profile("second", preBindArgs)
	if second.shared != h.plugin.shared {
		t.Fatalf("the second profile's plugin has its own devices")
	}
	first := gpuPod("first", "gpu", 1)
	h.reserve(first, "n1")

	pod := gpuPod("next", "gpu", 1)
	cs := framework.NewCycleState()
	if _, st, _ := fw.RunPreFilterPlugins(h.ctx, cs, pod); !st.IsSuccess() {
		t.Fatalf("PreFilter in the second profile: %v", st)
	}
	st := fw.RunFilterPlugins(h.ctx, cs, pod, h.nodes["n1"])
	wantCode(t, st, fwk.Unschedulable, "Insufficient free devices of class gpu")
}

func TestReserveHoldsUnreserveReleases(t *testing.T) {
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", gpu("g0", 0, "80Gi"), gpu("g1", 0, "80Gi"))}, allClasses)
	first := gpuPod("first", "gpu", 2)
	cs, _ := h.reserve(first, "n1")
	if !h.plugin.cache.isAssumed(first.UID) {
		t.Errorf("Reserve did not hold the devices as assumed")
	}

	second := gpuPod("second", "gpu", 1)
	_, st := h.fits(second, "n1")
	wantCode(t, st, fwk.Unschedulable, "Insufficient free devices of class gpu")

	h.fw.RunReservePluginsUnreserve(h.ctx, cs, first, "n1")
	if h.holds(first.UID) {
		t.Errorf("Unreserve left the devices held")
	}
	// The second pod was turned away for lack of devices: freeing them moves it
	// back to the active queue.
	if got := h.activator.got(); !slices.Contains(got, "default/second") {
		t.Errorf("activated %v, want default/second", got)
	}
	if _, st := h.fits(second, "n1"); !st.IsSuccess() {
		t.Errorf("after Unreserve: %v", st)
	}
}

func TestPreBindWritesAssignment(t *testing.T) {
	pod := testPod("p", ctr{name: "app", limits: map[corev1.ResourceName]string{cls("gpu"): "1", cls("gpu-big"): "1"}})
	staleCompat := assignment.CompatKey("gpu", "g-old")
	pod.Annotations = map[string]string{
		assignment.AnnotationKey: `{"node":"n0","containers":[{"name":"app","classes":{"gpu":["g-old"]}}]}`,
		staleCompat:              "1",
		"example.com/keep":       "yes",
	}
	h := newHarnessWithArgs(t, preBindArgs, []*v1alpha1.NodeDevices{nodeDevices("n1", gpu("g-big", 0, "80Gi"), gpu("g-small", 0, "40Gi"))}, allClasses, pod)
	bindings := apiserverBinding(h.client)
	cs, placed := h.reserve(pod, "n1")
	// No PreBind work: kube-scheduler would patch nominatedNodeName first.
	if st := h.fw.RunPreBindPreFlights(h.ctx, cs, pod, "n1"); !st.IsSkip() {
		t.Fatalf("PreBindPreFlight: %v, want Skip (the patch is Bind's)", st)
	}
	// The patch comes first at the bind extension point; DefaultBinder binds.
	var patchedBeforeBinding bool
	h.client.PrependReactor("create", "pods", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() == "binding" {
			cur, err := h.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), "default", "p")
			_, found, _ := assignment.FromPod(cur.(*corev1.Pod))
			patchedBeforeBinding = err == nil && found
		}
		return false, nil, nil
	})
	if st := h.fw.RunBindPlugins(h.ctx, cs, pod, "n1"); !st.IsSuccess() {
		t.Fatalf("Bind: %v", st)
	}
	if !patchedBeforeBinding {
		t.Errorf("the pod was bound before its assignment was patched in")
	}
	if all := bindings(); len(all) != 1 || len(all[0].Annotations) != 0 {
		t.Errorf("Bindings %+v, want one without annotations (DefaultBinder's)", all)
	}

	got, err := h.client.CoreV1().Pods("default").Get(h.ctx, "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, found, err := assignment.FromPod(got)
	if !found || err != nil {
		t.Fatalf("written assignment: found %v, %v", found, err)
	}
	want := &assignment.Assignment{Node: "n1", Containers: []assignment.Container{{Name: "app", Classes: map[string][]string{"gpu": {"g-small"}, "gpu-big": {"g-big"}}}}}
	if !assignmentsEqual(a, want) || !assignmentsEqual(a, placed) {
		t.Errorf("written %+v, want %+v (Reserve placed %+v)", a, want, placed)
	}
	for _, key := range []string{assignment.CompatKey("gpu", "g-small"), assignment.CompatKey("gpu-big", "g-big")} {
		if got.Annotations[key] != "1" {
			t.Errorf("compat key %s = %q, want 1", key, got.Annotations[key])
		}
	}
	if _, ok := got.Annotations[staleCompat]; ok {
		t.Errorf("stale compat key %s survived", staleCompat)
	}
	if got.Annotations["example.com/keep"] != "yes" {
		t.Errorf("an unrelated annotation was removed: %v", got.Annotations)
	}

	// The informer sees the pod on n1 with the same assignment, which
	// confirms the hold instead of replacing it.
	if got.Spec.NodeName != "n1" {
		t.Errorf("bound to %q, want n1", got.Spec.NodeName)
	}
	h.waitFor("the bound pod to confirm the assumed hold", func() bool { return h.holds(pod.UID) && !h.plugin.cache.isAssumed(pod.UID) })
}

func TestUnreserveAfterPreBindRemovesAnnotations(t *testing.T) {
	pod := gpuPod("p", "gpu", 1)
	pod.Annotations = map[string]string{"example.com/keep": "yes"}
	h := newHarnessWithArgs(t, preBindArgs, []*v1alpha1.NodeDevices{nodeDevices("n1", gpu("g0", 0, "80Gi"))}, allClasses, pod)
	cs, _ := h.reserve(pod, "n1")
	// The patch went in, the binding failed.
	h.client.PrependReactor("create", "pods", func(action clienttesting.Action) (bool, runtime.Object, error) {
		return action.GetSubresource() == "binding", nil, errors.New("binding refused")
	})
	if st := h.fw.RunBindPlugins(h.ctx, cs, pod, "n1"); st.IsSuccess() {
		t.Fatalf("Bind with a failing binding: %v, want an error", st)
	}
	if got, _ := h.client.CoreV1().Pods("default").Get(h.ctx, "p", metav1.GetOptions{}); got == nil || got.Annotations[assignment.AnnotationKey] == "" {
		t.Fatalf("the assignment was not patched in before the binding: %v", got)
	}
	h.fw.RunReservePluginsUnreserve(h.ctx, cs, pod, "n1")
	got, err := h.client.CoreV1().Pods("default").Get(h.ctx, "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for key := range got.Annotations {
		if assignment.IsAnnotation(key) {
			t.Errorf("annotation %s left on an unreserved pod", key)
		}
	}
	if got.Annotations["example.com/keep"] != "yes" {
		t.Errorf("an unrelated annotation was removed: %v", got.Annotations)
	}
	if h.holds(pod.UID) {
		t.Errorf("devices still held after Unreserve")
	}
}

func TestPreBindPatchFailure(t *testing.T) {
	pod := gpuPod("p", "gpu", 1)
	h := newHarnessWithArgs(t, preBindArgs, []*v1alpha1.NodeDevices{nodeDevices("n1", gpu("g0", 0, "80Gi"))}, allClasses, pod)
	patches := 0
	h.client.PrependReactor("patch", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		patches++
		return true, nil, errors.New("apiserver unavailable")
	})
	bindings := apiserverBinding(h.client)
	cs, _ := h.reserve(pod, "n1")
	st := h.fw.RunBindPlugins(h.ctx, cs, pod, "n1")
	if st.IsSuccess() || st.IsRejected() {
		t.Fatalf("Bind with a failing patch: %v, want an error", st)
	}
	if all := bindings(); len(all) != 0 {
		t.Errorf("bound without the assignment: %+v", all)
	}
	if !strings.Contains(st.Message(), "writing the device assignment") || !strings.Contains(st.Message(), "apiserver unavailable") {
		t.Errorf("message %q does not say what failed", st.Message())
	}
	// Nothing was written, so Unreserve has nothing to remove.
	h.fw.RunReservePluginsUnreserve(h.ctx, cs, pod, "n1")
	if patches != 1 {
		t.Errorf("%d patches, want 1 (Unreserve must not patch a pod Bind did not write)", patches)
	}
	if h.holds(pod.UID) {
		t.Errorf("devices still held after Unreserve")
	}
}

// apiserverBinding makes the fake clientset bind as the apiserver does (the fake
// only records a Binding): the pod gets the Binding's node and its annotations
// merged into the pod's. It returns the Bindings created so far.
func apiserverBinding(client *fake.Clientset) func() []*corev1.Binding {
	var mu sync.Mutex
	var bindings []*corev1.Binding
	client.PrependReactor("create", "pods", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "binding" {
			return false, nil, nil
		}
		b := action.(clienttesting.CreateAction).GetObject().(*corev1.Binding)
		mu.Lock()
		bindings = append(bindings, b.DeepCopy())
		mu.Unlock()
		gvr := corev1.SchemeGroupVersion.WithResource("pods")
		obj, err := client.Tracker().Get(gvr, b.Namespace, b.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		pod.Spec.NodeName = b.Target.Name
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		maps.Copy(pod.Annotations, b.Annotations)
		return true, b, client.Tracker().Update(gvr, pod, b.Namespace)
	})
	return func() []*corev1.Binding {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(bindings)
	}
}

func TestBindWritesAssignmentInBinding(t *testing.T) {
	fresh := gpuPod("fresh", "gpu", 1)
	// retried carries the annotations of an earlier attempt that failed.
	retried := gpuPod("retried", "gpu", 1)
	staleCompat := assignment.CompatKey("gpu", "g-old")
	retried.Annotations = map[string]string{
		assignment.AnnotationKey: `{"node":"n0","containers":[{"name":"app","classes":{"gpu":["g-old"]}}]}`,
		staleCompat:              "1",
		"example.com/keep":       "yes",
	}
	plain := testPod("plain", ctr{name: "app", limits: map[corev1.ResourceName]string{corev1.ResourceCPU: "1"}})
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", gpu("g0", 0, "80Gi"), gpu("g1", 0, "80Gi"))}, allClasses, fresh, retried, plain)
	bindings := apiserverBinding(h.client)

	for _, pod := range []*corev1.Pod{fresh, retried} {
		t.Run(pod.Name, func(t *testing.T) {
			cs, placed := h.reserve(pod, "n1")
			// PreBind has work only where stale annotations must go: the
			// assignment itself travels in the Binding.
			stale := pod == retried
			st := h.fw.RunPreBindPreFlights(h.ctx, cs, pod, "n1")
			if stale && !st.IsSuccess() || !stale && !st.IsSkip() {
				t.Fatalf("PreBindPreFlight: %v; want PreBind to run: %v", st, stale)
			}
			if stale {
				if st := h.fw.RunPreBindPlugins(h.ctx, cs, pod, "n1"); !st.IsSuccess() {
					t.Fatalf("PreBind: %v", st)
				}
				got, err := h.client.CoreV1().Pods("default").Get(h.ctx, pod.Name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				for key := range got.Annotations {
					if assignment.IsAnnotation(key) {
						t.Errorf("stale annotation %s left by PreBind", key)
					}
				}
			}
			if st := h.fw.RunBindPlugins(h.ctx, cs, pod, "n1"); !st.IsSuccess() {
				t.Fatalf("Bind: %v", st)
			}
			all := bindings()
			if len(all) == 0 {
				t.Fatal("no Binding created")
			}
			b := all[len(all)-1]
			want, err := assignment.Annotations(placed)
			if err != nil {
				t.Fatal(err)
			}
			if b.Name != pod.Name || b.UID != pod.UID || b.Target.Kind != "Node" || b.Target.Name != "n1" || !maps.Equal(b.Annotations, want) {
				t.Errorf("Binding %+v, want %s to n1 with annotations %v", b, pod.Name, want)
			}

			got, err := h.client.CoreV1().Pods("default").Get(h.ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			a, found, err := assignment.FromPod(got)
			if !found || err != nil || !assignmentsEqual(a, placed) || got.Spec.NodeName != "n1" {
				t.Errorf("bound pod on %q with assignment %+v (found %v, %v), want %+v on n1", got.Spec.NodeName, a, found, err, placed)
			}
			if _, ok := got.Annotations[staleCompat]; ok {
				t.Errorf("stale compat key %s survived", staleCompat)
			}
			if stale && got.Annotations["example.com/keep"] != "yes" {
				t.Errorf("an unrelated annotation was removed: %v", got.Annotations)
			}
			h.waitFor("the bound pod to confirm the assumed hold", func() bool { return h.holds(pod.UID) && !h.plugin.cache.isAssumed(pod.UID) })
		})
	}

	// A pod without class requests is left to DefaultBinder: a Binding without
	// annotations.
	cs, _, st := h.preFilter(plain)
	if !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := h.fw.RunBindPlugins(h.ctx, cs, plain, "n1"); !st.IsSuccess() {
		t.Fatalf("Bind of a pod without class requests: %v", st)
	}
	all := bindings()
	if b := all[len(all)-1]; b.Name != "plain" || len(b.Annotations) != 0 {
		t.Errorf("Binding %+v, want plain without annotations", b)
	}
}

func TestBindFailure(t *testing.T) {
	pod := gpuPod("p", "gpu", 1)
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", gpu("g0", 0, "80Gi"))}, allClasses, pod)
	h.client.PrependReactor("create", "pods", func(action clienttesting.Action) (bool, runtime.Object, error) {
		return action.GetSubresource() == "binding", nil, errors.New("apiserver unavailable")
	})
	cs, _ := h.reserve(pod, "n1")
	st := h.fw.RunBindPlugins(h.ctx, cs, pod, "n1")
	if st.IsSuccess() || st.IsSkip() || !strings.Contains(st.Message(), "apiserver unavailable") {
		t.Fatalf("Bind with a failing apiserver: %v, want its error", st)
	}
	h.fw.RunReservePluginsUnreserve(h.ctx, cs, pod, "n1")
	if h.holds(pod.UID) {
		t.Errorf("devices still held after Unreserve")
	}
	for _, a := range h.client.Actions() {
		if a.GetVerb() == "patch" {
			t.Errorf("unexpected %v: nothing was written that Unreserve must remove", a)
		}
	}
}

func assignmentsEqual(a, b *assignment.Assignment) bool {
	x, err1 := assignment.Encode(a)
	y, err2 := assignment.Encode(b)
	return err1 == nil && err2 == nil && x == y
}

// ---- the cache rebuilt from pods ----

func TestCacheRebuiltFromBoundPods(t *testing.T) {
	bound := boundPod(t, "bound", "n1", "n1", "gpu", "g0")
	foreign := boundPod(t, "foreign", "n1", "n2", "gpu", "h0") // names another node
	done := boundPod(t, "done", "n1", "n1", "gpu", "g1")
	done.Status.Phase = corev1.PodSucceeded
	pending := boundPod(t, "pending", "", "n1", "gpu", "g1")
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{
		nodeDevices("n1", gpu("g0", 0, "80Gi"), gpu("g1", 0, "80Gi"), gpu("g2", 0, "80Gi")),
		nodeDevices("n2", gpu("h0", 0, "80Gi")),
	}, allClasses, bound, foreign, done, pending)
	h.waitFor("the bound pod's devices to be held", func() bool { return h.holds(bound.UID) })
	// The informer listed every pod before it synced, so the others are decided.
	for _, p := range []*corev1.Pod{done, pending} {
		if h.holds(p.UID) {
			t.Errorf("pod %s holds devices", p.Name)
		}
	}
	// The pod whose assignment names another node runs on n1, on devices
	// nobody can tell: it holds one of n1's, which one unknown.
	if got := h.blockedOn("n1"); !maps.Equal(got, map[string]int{"gpu": 1}) {
		t.Errorf("n1 blocked %v, want gpu: 1 (the pod whose assignment names n2)", got)
	}

	_, placed := h.reserve(gpuPod("one", "gpu", 1), "n1")
	if got := placed.Devices("app", "gpu"); !slices.Equal(got, []string{"g1"}) {
		t.Errorf("got %v, want [g1]: g0 is the bound pod's", got)
	}
	if _, st := h.fits(gpuPod("on-n2", "gpu", 1), "n2"); !st.IsSuccess() {
		t.Errorf("h0, named by an assignment for another node than the pod's, is not free: %v", st)
	}
	waiting := gpuPod("waiting", "gpu", 1)
	if _, st := h.fits(waiting, "n1"); st.Code() != fwk.Unschedulable {
		t.Fatalf("n1 full: %v, want Unschedulable", st)
	}

	// The bound pod finishes: its device is free again and the waiting pod is
	// activated.
	bound.Status.Phase = corev1.PodSucceeded
	if _, err := h.client.CoreV1().Pods("default").UpdateStatus(h.ctx, bound, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the finished pod to release its devices", func() bool { return !h.holds(bound.UID) })
	if _, st := h.fits(waiting, "n1"); !st.IsSuccess() {
		t.Errorf("after the holder finished: %v", st)
	}
	if got := h.activator.got(); !slices.Contains(got, "default/waiting") {
		t.Errorf("activated %v, want default/waiting", got)
	}

	// A deleted pod releases too.
	again := boundPod(t, "again", "n2", "n2", "gpu", "h0")
	if _, err := h.client.CoreV1().Pods("default").Create(h.ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the new pod's devices to be held", func() bool { return h.holds(again.UID) })
	if _, st := h.fits(gpuPod("on-n2-again", "gpu", 1), "n2"); st.Code() != fwk.Unschedulable {
		t.Errorf("h0 held: %v, want Unschedulable", st)
	}
	if err := h.client.CoreV1().Pods("default").Delete(h.ctx, "again", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the deleted pod to release its devices", func() bool { return !h.holds(again.UID) })
}

// TestDeletedHolderFreedBeforeThePluginHearsOfIt: the scheduler's event
// handler hears of a holder's deletion and requeues the pods waiting for its
// devices, while this plugin's own handler of the same event may not have run.
// The queueing hint frees the devices first, so the retry finds them free
// instead of preempting again; what the plugin's handler then delivers late
// (an older update of the pod) does not hold them again.
func TestDeletedHolderFreedBeforeThePluginHearsOfIt(t *testing.T) {
	holder := boundPod(t, "holder", "n1", "n1", "gpu", "g0")
	holder.UID = "holder-uid"
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", gpu("g0", 0, "80Gi"))}, allClasses, holder)
	h.waitFor("the holder's devices to be held", func() bool { return h.holds(holder.UID) })
	waiting := gpuPod("waiting", "gpu", 1)
	if _, st := h.fits(waiting, "n1"); st.Code() != fwk.Unschedulable {
		t.Fatalf("g0 held: %v, want Unschedulable", st)
	}
	logger := klog.Background()

	// A pod whose binding failed is sent as deleted too, but it is still there.
	if hint, _ := h.plugin.holderGone(logger, waiting, holder, nil); hint != fwk.Queue {
		t.Errorf("hint %v, want Queue", hint)
	}
	if !h.holds(holder.UID) {
		t.Fatal("a pod the informer still has lost its devices")
	}

	// The informer's store drops the pod before any handler runs; only the
	// scheduler's has run.
	store := h.plugin.handle.SharedInformerFactory().Core().V1().Pods().Informer().GetStore()
	if err := store.Delete(holder); err != nil {
		t.Fatal(err)
	}
	if hint, _ := h.plugin.holderGone(logger, waiting, holder, nil); hint != fwk.Queue {
		t.Errorf("hint %v, want Queue", hint)
	}
	if _, st := h.fits(waiting, "n1"); !st.IsSuccess() {
		t.Errorf("after the hint for the deleted holder: %v, want g0 free", st)
	}
	// The plugin's handler delivers an update from before the deletion.
	h.plugin.podChanged(holder.DeepCopy())
	if h.holds(holder.UID) {
		t.Error("an update delivered after the deletion was reported holds the devices again")
	}
	// Then the deletion itself: nothing is remembered of the pod any more.
	h.plugin.podDeleted(holder)
	h.plugin.cache.mu.RLock()
	_, remembered := h.plugin.cache.gone[holder.UID]
	h.plugin.cache.mu.RUnlock()
	if remembered {
		t.Error("the deleted pod is still remembered after its deletion was delivered")
	}

	// The other order: the plugin's handler delivers the deletion first, then
	// the hint runs (once per waiting pod). Nothing is left remembered, or
	// nothing would ever forget it.
	second := boundPod(t, "second", "n1", "n1", "gpu", "g0")
	second.UID = "second-uid"
	h.plugin.podChanged(second)
	if !h.holds(second.UID) {
		t.Fatal("the second holder holds nothing")
	}
	h.plugin.podDeleted(second)
	for range 3 {
		h.plugin.holderGone(logger, waiting, second, nil)
	}
	h.plugin.cache.mu.RLock()
	remembered = len(h.plugin.cache.gone) > 0
	h.plugin.cache.mu.RUnlock()
	if remembered {
		t.Error("a pod whose deletion was delivered before the hint ran is remembered as gone, for ever")
	}
}

func TestHoldingFromPod(t *testing.T) {
	pool := "hugepages-1Gi-numa0"
	withPages := boundPod(t, "pages", "n1", "n1", "hp-1g", pool)
	withPages.Spec.Containers[0].Resources.Limits["hugepages-1Gi"] = resource.MustParse("2Gi")
	garbled := boundPod(t, "garbled", "n1", "n1", "gpu", "g0")
	garbled.Annotations[assignment.AnnotationKey] = `{"node":"n1"`
	failed := boundPod(t, "failed", "n1", "n1", "gpu", "g0")
	failed.Status.Phase = corev1.PodFailed
	missing := gpuPod("missing", "gpu", 1)
	missing.Spec.NodeName = "n1"
	plain := testPod("plain", ctr{name: "app"})
	plain.Spec.NodeName = "n1"
	inflated := boundPod(t, "inflated", "n1", "n1", "gpu", "g0", "g1", "g2")
	inflated.Spec.Containers[0].Resources.Limits[cls("gpu")] = resource.MustParse("1")
	otherClass := boundPod(t, "other-class", "n1", "n1", "gpu", "g0")
	otherClass.Spec.Containers[0].Resources.Limits = corev1.ResourceList{cls("gpu-big"): resource.MustParse("1")}
	// An init container's devices are reused by the next container: it must
	// begin with them.
	reuse := testPod("reuse", ctr{name: "init", kind: initC, limits: map[corev1.ResourceName]string{cls("gpu"): "1"}},
		ctr{name: "app", limits: map[corev1.ResourceName]string{cls("gpu"): "2"}})
	reuse.Spec.NodeName = "n1"
	reuseOK, reuseBad := reuse.DeepCopy(), reuse.DeepCopy()
	for p, app := range map[*corev1.Pod][]string{reuseOK: {"g0", "g1"}, reuseBad: {"g1", "g2"}} {
		anns, err := assignment.Annotations(&assignment.Assignment{Node: "n1", Containers: []assignment.Container{
			{Name: "init", Init: true, Classes: map[string][]string{"gpu": {"g0"}}}, {Name: "app", Classes: map[string][]string{"gpu": app}}}})
		if err != nil {
			t.Fatal(err)
		}
		p.Annotations = anns
	}

	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		flaw string              // the inconsistency's reason; "" for none
		want map[string][]string // the devices; nil: no holding
	}{
		{"bound", boundPod(t, "bound", "n1", "n1", "gpu", "g0", "g1"), "", map[string][]string{"gpu": {"g0", "g1"}}},
		{"not bound", boundPod(t, "pending", "", "n1", "gpu", "g0"), "", nil},
		{"failed", failed, "", nil},
		{"no requests, no assignment", plain, "", nil},
		{"requests, no assignment", missing, "missing", map[string][]string{}},
		{"another node", boundPod(t, "foreign", "n1", "n2", "gpu", "g0"), "node", map[string][]string{}},
		{"garbled", garbled, "garbled", map[string][]string{}},
		{"inflated", inflated, "requests", map[string][]string{}},
		{"a class not requested", otherClass, "requests", map[string][]string{}},
		{"init reuse", reuseOK, "", map[string][]string{"gpu": {"g0", "g1"}}},
		{"init devices not reused", reuseBad, "requests", map[string][]string{}},
		{"pool", withPages, "", map[string][]string{"hp-1g": {pool}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := holdingFromPod(tc.pod)
			if tc.want == nil {
				if h != nil {
					t.Fatalf("holding %+v, want none", h)
				}
				return
			}
			if h == nil || h.node != tc.pod.Spec.NodeName || h.uid != tc.pod.UID || h.trusted {
				t.Fatalf("holding %+v, want one learned (not trusted yet) on %s", h, tc.pod.Spec.NodeName)
			}
			if raw, ok := tc.pod.Annotations[assignment.AnnotationKey]; ok && h.raw != "="+raw || !ok && h.raw != absentAnnotation {
				t.Errorf("raw %q", h.raw)
			}
			if got := ""; h.flaw != nil {
				got = h.flaw.reason
				if got != tc.flaw {
					t.Errorf("flaw %+v, want reason %q", h.flaw, tc.flaw)
				}
			} else if tc.flaw != "" {
				t.Errorf("no flaw, want reason %q", tc.flaw)
			}
			if !maps.EqualFunc(h.devices, tc.want, slices.Equal) {
				t.Errorf("devices %v, want %v", h.devices, tc.want)
			}
			// Whatever the annotation says, the pod holds its requests when not believed.
			if d, _ := podDemand(tc.pod); d != nil && !maps.Equal(h.draws, d.draws) {
				t.Errorf("draws %v, want %v", h.draws, d.draws)
			}
		})
	}

	// The pool's users carry the native request the pool is charged with.
	h := holdingFromPod(withPages)
	if users := h.users[pool]; len(users) != 1 || pageBytes(users, "hugepages-1Gi") != 2<<30 {
		t.Errorf("pool users %+v, want the container with 2Gi", users)
	}
}

// ---- class status ----

func TestClassStatus(t *testing.T) {
	c := newCache()
	for _, rc := range append(slices.Clone(allClasses), rclass("fpga", expr("kind", v1alpha1.ResourceSelectorOpIn, "fpga"))) {
		c.setClass(rc)
	}
	c.setNodeDevices(nodeDevices("n1",
		gpu("big", 0, "80Gi"), gpu("small", 0, "40Gi"), gpu("small2", 0, "40Gi"),
		unhealthy(gpu("sick", 0, "80Gi")), migEnabled(gpu("mig", 0, "80Gi")),
		hugePool("hp", 0, "1Gi", 8, 8), hugePool("hp-full", 0, "1Gi", 8, 0),
	))
	c.setNodeDevices(nodeDevices("n2", gpu("big2", 0, "80Gi"), nic("nic0", 0)))
	holdDirectly(c, "a", "n1", "gpu-big", "big") // big is also a gpu: requested in both classes
	holdDirectly(c, "b", "n1", "gpu", "small")
	holdDirectly(c, "c", "n1", "hp-1g", "hp") // a pool with free pages stays available

	type nodeCounts = []NodeStatus
	want := map[string]struct {
		alloc, req int64
		nodes      nodeCounts
	}{
		// big, small, small2 on n1 and big2 on n2; sick and mig are not
		// allocatable.
		"gpu":     {4, 2, nodeCounts{{Name: "n1", Allocatable: 3, Requested: 2}, {Name: "n2", Allocatable: 1}}},
		"gpu-big": {2, 1, nodeCounts{{Name: "n1", Allocatable: 1, Requested: 1}, {Name: "n2", Allocatable: 1}}},
		"nic":     {1, 0, nodeCounts{{Name: "n2", Allocatable: 1}}},
		"hp-1g":   {2, 1, nodeCounts{{Name: "n1", Allocatable: 2, Requested: 1}}},
		"fpga":    {0, 0, nil},
	}
	got, perNode := c.classStatusLocked(true)
	if !reflect.DeepEqual(got, c.classStatus()) {
		t.Errorf("status with the per-node breakdown %v, without %v", got, c.classStatus())
	}
	if len(got) != len(want) {
		t.Errorf("status for %v, want %d classes", slices.Sorted(maps.Keys(got)), len(want))
	}
	for class, w := range want {
		s, ok := got[class]
		if !ok {
			t.Errorf("no status for %s", class)
			continue
		}
		if s.Allocatable.Value() != w.alloc || s.Requested.Value() != w.req || s.Available.Value() != w.alloc-w.req {
			t.Errorf("%s: allocatable %s requested %s available %s, want %d, %d and %d", class,
				s.Allocatable.String(), s.Requested.String(), s.Available.String(), w.alloc, w.req, w.alloc-w.req)
		}
		if !slices.Equal(perNode[class], w.nodes) {
			t.Errorf("%s: nodes %+v, want %+v", class, perNode[class], w.nodes)
		}
	}

	// Releasing a pod lowers requested in every class that selects its
	// device.
	c.release("a")
	got = c.classStatus()
	if s := got["gpu-big"]; s.Requested.Value() != 0 || s.Allocatable.Value() != 2 {
		t.Errorf("gpu-big after release: allocatable %s requested %s, want 2 and 0", s.Allocatable.String(), s.Requested.String())
	}
	if s := got["gpu"]; s.Requested.Value() != 1 {
		t.Errorf("gpu after release: requested %s, want 1", s.Requested.String())
	}
}

// TestClassStatusIsWhatANewPodGets: for every class on every node,
// allocatable − requested devices fit a new pod of the class and one more
// does not, with overlapping classes and pods whose assignment is not
// believed (blocked) on the node.
func TestClassStatusIsWhatANewPodGets(t *testing.T) {
	c := newCache()
	for _, rc := range allClasses {
		c.setClass(rc)
	}
	c.setNodeDevices(suspectNode()) // g0..g2 80Gi, g3 40Gi, nic0
	c.setNodeDevices(nodeDevices("n2", gpu("h0", 0, "80Gi"), gpu("h1", 1, "40Gi"), gpu("h2", 1, "40Gi")))
	holdDirectly(c, "a", "n1", "gpu", "g0")
	holdDirectly(c, "b", "n2", "gpu", "h1")
	// Not believed (another node named): holds one gpu-big on n1 and one gpu
	// on n2, which ones unknown.
	c.hold(holdingFromPod(boundPod(t, "forged-1", "n1", "elsewhere", "gpu-big", "g1")))
	c.hold(holdingFromPod(boundPod(t, "forged-2", "n2", "elsewhere", "gpu", "h0")))

	status := c.classNodeStatus()
	for _, class := range []string{"gpu", "gpu-big"} {
		if len(status[class]) != 2 {
			t.Errorf("%s: status on %d nodes, want 2", class, len(status[class]))
		}
		for _, ns := range status[class] {
			room := int(ns.Allocatable - ns.Requested)
			c.mu.RLock()
			n := c.nodes[ns.Name]
			fit := func(k int) bool {
				d, err := podDemand(gpuPod("new", class, k))
				if err != nil {
					t.Fatal(err)
				}
				_, u := n.place(d, FirstFit)
				return u == nil
			}
			if room > 0 && !fit(room) {
				t.Errorf("%s on %s: status says %d free, but a pod asking %d does not fit", class, ns.Name, room, room)
			}
			if fit(room + 1) {
				t.Errorf("%s on %s: status says %d free, but a pod asking %d fits", class, ns.Name, room, room+1)
			}
			c.mu.RUnlock()
			t.Logf("%s on %s: allocatable %d, requested %d", class, ns.Name, ns.Allocatable, ns.Requested)
		}
	}
}

// ---- assignments the cache does not believe (docs/scheduler.md, "Trust model") ----

// suspectNode has four GPUs, three of them big, and a NIC.
func suspectNode() *v1alpha1.NodeDevices {
	return nodeDevices("n1", gpu("g0", 0, "80Gi"), gpu("g1", 0, "80Gi"), gpu("g2", 0, "80Gi"), gpu("g3", 0, "40Gi"), nic("nic0", 0))
}

// wantRoomFor checks that n1 has room for exactly room devices of class: a
// pod asking room fits, one asking room+1 does not.
func (h *harness) wantRoomFor(class string, room int) {
	h.t.Helper()
	if room > 0 {
		if _, st := h.fits(gpuPod(fmt.Sprintf("room-%d", room), class, room), "n1"); !st.IsSuccess() {
			h.t.Errorf("a pod asking %d %s does not fit: %v", room, class, st)
		}
	}
	if _, st := h.fits(gpuPod(fmt.Sprintf("room-%d", room+1), class, room+1), "n1"); st.Code() != fwk.Unschedulable {
		h.t.Errorf("a pod asking %d %s: %v, want Unschedulable", room+1, class, st)
	}
}

// waitEvent waits for the plugin's Event that contains every part.
func (h *harness) waitEvent(parts ...string) string {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.ctx, 10*time.Second)
	defer cancel()
	for {
		select {
		case e := <-h.recorder.Events:
			if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(e, p) }) {
				return e
			}
		case <-ctx.Done():
			h.t.Fatalf("no Event with %q", parts)
			return ""
		}
	}
}

func untrustedCount(t *testing.T, reason string) float64 {
	t.Helper()
	v, err := testutil.GetCounterMetricValue(untrustedAssignments.WithLabelValues(reason))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestLearnedAssignmentMustFitThePod: a bound pod's annotation, read as after a
// restart, counts only when it fits the pod; otherwise the pod holds what it
// requests on its node, which devices unknown, and an Event and the metric say
// so.
func TestLearnedAssignmentMustFitThePod(t *testing.T) {
	withAnnotation := func(p *corev1.Pod, raw string) *corev1.Pod {
		p.Annotations = map[string]string{assignment.AnnotationKey: raw}
		return p
	}
	inflated := boundPod(t, "inflated", "n1", "n1", "gpu", "g0", "g1", "g2")
	inflated.Spec.Containers[0].Resources.Limits[cls("gpu")] = resource.MustParse("1")
	removed := gpuPod("removed", "gpu", 1)
	removed.Spec.NodeName, removed.Status.Phase = "n1", corev1.PodRunning
	for _, tc := range []struct {
		name, reason string
		pod          *corev1.Pod
		class        string // what the pod requests (1 device)
		room         int    // what n1 has left for class
	}{
		{"garbled", "garbled", withAnnotation(boundPod(t, "garbled", "n1", "n1", "gpu", "g0"), `{"node":`), "gpu", 3},
		{"removed", "missing", removed, "gpu", 3},
		{"inflated", "requests", inflated, "gpu", 3},
		{"wrong node", "node", boundPod(t, "wrong-node", "n1", "n2", "gpu", "g0"), "gpu", 3},
		{"unknown device", "device", boundPod(t, "unknown-device", "n1", "n1", "gpu", "g9"), "gpu", 3},
		// g3 has 40Gi: gpu-big does not select it.
		{"device not selected by the class", "class", boundPod(t, "not-selected", "n1", "n1", "gpu-big", "g3"), "gpu-big", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := untrustedCount(t, tc.reason)
			h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{suspectNode()}, allClasses, tc.pod)
			h.waitFor("the pod's hold", func() bool { return h.holds(tc.pod.UID) })
			h.waitFor("the node's blocked devices", func() bool { return len(h.blockedOn("n1")) > 0 })
			if got := h.blockedOn("n1"); !maps.Equal(got, map[string]int{tc.class: 1}) {
				t.Errorf("blocked %v, want %s: 1", got, tc.class)
			}
			h.wantRoomFor(tc.class, tc.room)
			h.waitEvent("Warning DeviceAssignmentNotBelieved", "("+tc.reason+")")
			if got := untrustedCount(t, tc.reason) - before; got != 1 {
				t.Errorf("%s counted %v times, want 1", tc.reason, got)
			}
			// The pod's status updates neither report nor change anything again.
			tc.pod.Status.Conditions = append(tc.pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
			if _, err := h.client.CoreV1().Pods("default").UpdateStatus(h.ctx, tc.pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			h.waitFor("the status update", func() bool {
				p, err := h.plugin.handle.SharedInformerFactory().Core().V1().Pods().Lister().Pods("default").Get(tc.pod.Name)
				return err == nil && len(p.Status.Conditions) > 0
			})
			if got := untrustedCount(t, tc.reason) - before; got != 1 {
				t.Errorf("after a status update, %s counted %v times, want 1", tc.reason, got)
			}
			// Finishing releases what it held.
			tc.pod.Status.Phase = corev1.PodSucceeded
			if _, err := h.client.CoreV1().Pods("default").UpdateStatus(h.ctx, tc.pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			h.waitFor("the finished pod to release", func() bool { return !h.holds(tc.pod.UID) })
			if got := h.blockedOn("n1"); len(got) != 0 {
				t.Errorf("blocked %v after the pod finished", got)
			}
		})
	}

	// A consistent assignment counts as it says.
	t.Run("consistent", func(t *testing.T) {
		pod := boundPod(t, "fits", "n1", "n1", "gpu", "g3")
		h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{suspectNode()}, allClasses, pod)
		h.waitFor("the pod's hold", func() bool { return h.holds(pod.UID) })
		if got := h.blockedOn("n1"); len(got) != 0 {
			t.Errorf("blocked %v, want none", got)
		}
		h.wantRoomFor("gpu-big", 3) // g3 is not big: every big one is free
		h.wantRoomFor("gpu", 3)
	})

	// Blocked devices never make a node refuse more than its free devices:
	// here trusted pods hold every GPU and a garbled one asks one more.
	t.Run("blocked beyond the free devices", func(t *testing.T) {
		all := boundPod(t, "all", "n1", "n1", "gpu", "g0", "g1", "g2", "g3")
		garbled := withAnnotation(boundPod(t, "garbled", "n1", "n1", "gpu", "g0"), "not json")
		h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{suspectNode()}, allClasses, all, garbled)
		h.waitFor("both holds", func() bool { return h.holds(all.UID) && h.holds(garbled.UID) })
		h.wantRoomFor("gpu", 0)
		h.wantRoomFor("nic", 1)
	})
}

// TestDecidedAssignmentStands: once the scheduler has bound a pod with the
// devices it chose, a changed annotation neither frees them nor adds any.
func TestDecidedAssignmentStands(t *testing.T) {
	for _, tc := range []struct {
		name, reason string
		change       func(anns map[string]string)
	}{
		{"garbled", "garbled", func(a map[string]string) { a[assignment.AnnotationKey] = `{"node":` }},
		{"removed", "removed", func(a map[string]string) {
			for k := range a {
				delete(a, k)
			}
		}},
		{"inflated", "changed", func(a map[string]string) {
			a[assignment.AnnotationKey] = `{"node":"n1","containers":[{"name":"app","classes":{"gpu":["g0","g1","g2"]}}]}`
		}},
		{"moved to another device", "changed", func(a map[string]string) {
			a[assignment.AnnotationKey] = `{"node":"n1","containers":[{"name":"app","classes":{"gpu":["g1"]}}]}`
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := untrustedCount(t, tc.reason)
			h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{suspectNode()}, allClasses)
			pod := gpuPod("decided", "gpu", 1)
			_, placed := h.reserve(pod, "n1")
			if got := placed.Devices("app", "gpu"); !slices.Equal(got, []string{"g0"}) {
				t.Fatalf("reserved %v, want [g0]", got)
			}
			// The pod as the apiserver has it after the Binding.
			bound := pod.DeepCopy()
			bound.Spec.NodeName, bound.Status.Phase = "n1", corev1.PodRunning
			anns, err := assignment.Annotations(placed)
			if err != nil {
				t.Fatal(err)
			}
			bound.Annotations = anns
			if _, err := h.client.CoreV1().Pods("default").Create(h.ctx, bound, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			h.waitFor("the binding to confirm the hold", func() bool { return h.holds(pod.UID) && !h.plugin.cache.isAssumed(pod.UID) })

			tc.change(bound.Annotations)
			if _, err := h.client.CoreV1().Pods("default").Update(h.ctx, bound, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			h.waitEvent("Warning DeviceAssignmentNotBelieved", "("+tc.reason+")", "gpu=g0")
			if got := untrustedCount(t, tc.reason) - before; got != 1 {
				t.Errorf("%s counted %v times, want 1", tc.reason, got)
			}
			// Still exactly g0 held: three GPUs left, and they are g1..g3.
			h.wantRoomFor("gpu", 3)
			if _, placed := h.reserve(gpuPod("next", "gpu", 3), "n1"); !slices.Equal(placed.Devices("app", "gpu"), []string{"g1", "g2", "g3"}) {
				t.Errorf("the next pod got %v, want [g1 g2 g3]", placed.Devices("app", "gpu"))
			}
			if got := h.blockedOn("n1"); len(got) != 0 {
				t.Errorf("blocked %v, want none", got)
			}
		})
	}
}

// TestClassArrivingAfterPodsIsRechecked: after a restart the pods' informer may
// deliver bound pods before the ResourceClasses. A pod's annotation is then
// checked against a node whose devices no class selects yet, so it is not
// believed (and blocks nothing: no pod can ask for a class the scheduler does
// not know, and the scheduler places nothing before its informers synced).
// When the class arrives, recheck believes it, and the pod holds the devices
// its annotation names, no more.
func TestClassArrivingAfterPodsIsRechecked(t *testing.T) {
	c := newCache()
	var reported []string
	c.untrusted = func(_ *holding, why *inconsistency) { reported = append(reported, why.reason) }
	c.setNodeDevices(suspectNode())
	pod := boundPod(t, "early", "n1", "n1", "gpu", "g1")
	c.hold(holdingFromPod(pod))

	held := func() (trusted bool, blocked map[string]int, holders []int) {
		c.mu.RLock()
		defer c.mu.RUnlock()
		n := c.nodes["n1"]
		for _, d := range n.devices {
			holders = append(holders, d.holders)
		}
		return c.pods[pod.UID].trusted, maps.Clone(n.blocked), holders
	}
	if trusted, blocked, holders := held(); trusted || len(blocked) != 0 || slices.Max(holders) != 0 {
		t.Fatalf("before the class: trusted %v, blocked %v, holders %v; want untrusted, nothing held", trusted, blocked, holders)
	}
	if !slices.Equal(reported, []string{"class"}) {
		t.Errorf("reported %v before the class, want [class]", reported)
	}

	c.setClass(gpuClass)
	c.recheck()
	trusted, blocked, holders := held()
	if !trusted || len(blocked) != 0 {
		t.Errorf("after the class: trusted %v, blocked %v; want trusted, none blocked", trusted, blocked)
	}
	// suspectNode publishes g0, g1, g2, g3, nic0: only g1 is held.
	if want := []int{0, 1, 0, 0, 0}; !slices.Equal(holders, want) {
		t.Errorf("holders per device %v, want %v", holders, want)
	}
	if len(reported) != 1 {
		t.Errorf("reported %v, want the one report from before the class", reported)
	}

	// A later class change leaves a trusted holding alone.
	c.setClass(bigGPUClass)
	c.recheck()
	if _, _, again := held(); !slices.Equal(again, holders) {
		t.Errorf("holders %v after another class, want %v", again, holders)
	}
}

// TestCompatAnnotationQuantity: the seed's key of each device carries the
// quantity the pod takes of it: 1 per exclusive device, the draws a hugepage
// pool serves (two containers on one pool: 2).
func TestCompatAnnotationQuantity(t *testing.T) {
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1",
		hugePool("hp0", 0, "1Gi", 8, 8), gpu("g0", 0, "80Gi"), gpu("g1", 0, "80Gi"))}, allClasses)
	pod := testPod("two-apps",
		ctr{name: "a", limits: map[corev1.ResourceName]string{cls("hp-1g"): "1", "hugepages-1Gi": "2Gi", cls("gpu"): "2"}},
		ctr{name: "b", limits: map[corev1.ResourceName]string{cls("hp-1g"): "1", "hugepages-1Gi": "2Gi"}},
	)
	cs, _ := h.reserve(pod, "n1")
	s, _ := getState(cs)
	for key, want := range map[string]string{
		assignment.CompatKey("hp-1g", "hp0"): "2",
		assignment.CompatKey("gpu", "g0"):    "1",
		assignment.CompatKey("gpu", "g1"):    "1",
	} {
		if got := s.annotations[key]; got != want {
			t.Errorf("%s = %q, want %q", key, got, want)
		}
	}
}
