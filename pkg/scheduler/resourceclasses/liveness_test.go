package resourceclasses

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// kubeletNode is a Node whose kubelet reports allocatable (resource ->
// count), as its status sync writes it.
func kubeletNode(name string, allocatable map[corev1.ResourceName]int64) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourcePods: resource.MustParse("110"),
	}}}
	for r, v := range allocatable {
		n.Status.Allocatable[r] = *resource.NewQuantity(v, resource.DecimalSI)
	}
	return n
}

func TestKubeletClassesUnserves(t *testing.T) {
	for _, tc := range []struct {
		name        string
		allocatable map[corev1.ResourceName]int64
		unserved    []string // of gpu, nic
	}{
		{"every class offered", map[corev1.ResourceName]int64{cls("gpu"): 8, cls("nic"): 2}, nil},
		{"endpoint gone: the kubelet reports 0", map[corev1.ResourceName]int64{cls("gpu"): 8, cls("nic"): 0}, []string{"nic"}},
		{"both gone", map[corev1.ResourceName]int64{cls("gpu"): 0, cls("nic"): 0}, []string{"gpu", "nic"}},
		{"class never registered while another is offered", map[corev1.ResourceName]int64{cls("gpu"): 8}, []string{"nic"}},
		{"class never registered while another class is at 0", map[corev1.ResourceName]int64{cls("other"): 0}, []string{"gpu", "nic"}},
		{"no class resource at all (kwok, or before the first registration)", map[corev1.ResourceName]int64{"example.com/gpu": 8}, nil},
		{"nothing reported", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := kubeletClassesOf(kubeletNode("n", tc.allocatable))
			var got []string
			for _, class := range []string{"gpu", "nic"} {
				if k.unserves(class) {
					got = append(got, class)
				}
			}
			if !slices.Equal(got, tc.unserved) {
				t.Errorf("unserved %v, want %v (from %v)", got, tc.unserved, k)
			}
		})
	}
}

// TestFilterRefusesNodeWhoseAgentIsGone: a node whose kubelet offers none of a
// requested class is refused, unresolvable, with the class in the reason,
// even though its NodeDevices says the devices are free; the answer is the
// same from the Snapshot (why-pending). A node whose devices do not fit says
// that first.
func TestFilterRefusesNodeWhoseAgentIsGone(t *testing.T) {
	nds := []*v1alpha1.NodeDevices{
		nodeDevices("live", gpu("g0", 0, "80Gi"), nic("eth0", 0)),
		nodeDevices("dead", gpu("g0", 0, "80Gi"), nic("eth0", 0)),
		nodeDevices("half", gpu("g0", 0, "80Gi"), nic("eth0", 0)),
		nodeDevices("sim", gpu("g0", 0, "80Gi"), nic("eth0", 0)),
		nodeDevices("stopping", gpu("g0", 0, "80Gi"), nic("eth0", 0)),
	}
	// The agent said it stops; its kubelet has not noticed yet.
	nds[4].Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionAgentServing, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonAgentShuttingDown}}
	nodes := []*corev1.Node{
		kubeletNode("live", map[corev1.ResourceName]int64{cls("gpu"): 1, cls("gpu-big"): 1, cls("nic"): 1}),
		kubeletNode("dead", map[corev1.ResourceName]int64{cls("gpu"): 0, cls("gpu-big"): 0, cls("nic"): 0}),
		kubeletNode("half", map[corev1.ResourceName]int64{cls("gpu"): 1, cls("gpu-big"): 1}),
		kubeletNode("sim", nil), // a simulated node: no device manager
		kubeletNode("stopping", map[corev1.ResourceName]int64{cls("gpu"): 1, cls("gpu-big"): 1, cls("nic"): 1}),
	}
	kubeletSays := (&nodeState{}).notServing
	stopping := (&nodeState{stopping: true}).notServing
	h := newHarness(t, FirstFit, nds, allClasses)
	// The kubelets' status reaches the plugin through the scheduler's Node
	// informer, as in the scheduler.
	var list []corev1.Node
	for _, n := range nodes {
		if _, err := h.client.CoreV1().Nodes().Update(h.ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		list = append(list, *n)
	}
	h.waitFor("the kubelets' reports in the cache", func() bool {
		h.plugin.cache.mu.RLock()
		defer h.plugin.cache.mu.RUnlock()
		return h.plugin.cache.nodes["dead"].kubelet != nil && h.plugin.cache.nodes["half"].kubelet != nil
	})
	snap := snapshotOf(nds, allClasses).WithNodes(list)
	pair := testPod("pair", ctr{name: "app", limits: map[corev1.ResourceName]string{cls("gpu"): "1", cls("nic"): "1"}})
	for _, tc := range []struct {
		pod    *corev1.Pod
		node   string
		reason string // "": fits
	}{
		{gpuPod("one", "gpu", 1), "live", ""},
		{gpuPod("one", "gpu", 1), "dead", kubeletSays("gpu")},
		{gpuPod("one", "gpu", 1), "stopping", stopping("gpu")},
		{gpuPod("one", "gpu", 1), "half", ""},
		{gpuPod("one", "gpu", 1), "sim", ""},
		{pair, "live", ""},
		{pair, "dead", kubeletSays("gpu")},
		{pair, "half", kubeletSays("nic")},
		{pair, "stopping", stopping("gpu")},
		{pair, "sim", ""},
		// The devices decide first: a node that could not take the pod with
		// its agent up says why.
		{gpuPod("two", "gpu", 2), "dead", "Insufficient free devices of class gpu"},
	} {
		t.Run(fmt.Sprintf("%s on %s", tc.pod.Name, tc.node), func(t *testing.T) {
			_, st := h.fits(tc.pod, tc.node)
			_, fits, err := snap.Fit(tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			var f NodeFit
			for _, f = range fits {
				if f.Node == tc.node {
					break
				}
			}
			switch {
			case tc.reason == "":
				if !st.IsSuccess() || !f.Fits {
					t.Errorf("Filter %v, snapshot %+v; want it to fit", st, f)
				}
			case strings.HasPrefix(tc.reason, "node agent not serving"):
				wantCode(t, st, fwk.UnschedulableAndUnresolvable, tc.reason)
				if f.Fits || f.Reason != tc.reason || !f.Unresolvable {
					t.Errorf("snapshot %+v, want unresolvable %q", f, tc.reason)
				}
			default:
				wantCode(t, st, fwk.Unschedulable, tc.reason)
				if f.Fits || f.Reason != tc.reason {
					t.Errorf("snapshot %+v, want %q", f, tc.reason)
				}
			}
		})
	}
	// Without the Nodes (no right to read them), the snapshot judges by
	// NodeDevices alone: the devices, and the agent's word that it stops.
	_, fits, _ := snapshotOf(nds, allClasses).Fit(gpuPod("one", "gpu", 1))
	for _, f := range fits {
		if want := f.Node != "stopping"; f.Fits != want || (!want && f.Reason != stopping("gpu")) {
			t.Errorf("without Nodes: %+v, want every node but stopping to fit", f)
		}
	}
}

// TestAgentBackHint: a waiting pod is retried when a node's kubelet starts
// offering a class it requests, and not for any other change of a Node's
// allocatable.
func TestAgentBackHint(t *testing.T) {
	p := &Plugin{}
	waiting := gpuPod("waiting", "gpu", 1)
	sidecarGPU := testPod("sidecar", ctr{name: "s", kind: sidecar, limits: map[corev1.ResourceName]string{cls("gpu"): "1"}}, ctr{name: "app"})
	node := func(gpu, nic int64, cpu string) *corev1.Node {
		n := kubeletNode("n1", map[corev1.ResourceName]int64{cls("gpu"): gpu, cls("nic"): nic})
		n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse(cpu)
		return n
	}
	noGPU := kubeletNode("n1", map[corev1.ResourceName]int64{cls("nic"): 1})
	for _, tc := range []struct {
		name     string
		pod      *corev1.Pod
		old, new any
		want     fwk.QueueingHint
	}{
		{"the class's endpoint is back", waiting, node(0, 1, "64"), node(8, 1, "64"), fwk.Queue},
		{"the class registered for the first time", waiting, noGPU, node(8, 1, "64"), fwk.Queue},
		{"a new node offering the class", waiting, nil, node(8, 1, "64"), fwk.Queue},
		{"requested by an init container", sidecarGPU, node(0, 1, "64"), node(8, 1, "64"), fwk.Queue},
		{"the class goes", waiting, node(8, 1, "64"), node(0, 1, "64"), fwk.QueueSkip},
		{"a device of the class heals", waiting, node(7, 1, "64"), node(8, 1, "64"), fwk.QueueSkip},
		{"another class is back", waiting, node(0, 0, "64"), node(0, 1, "64"), fwk.QueueSkip},
		{"CPU changes", waiting, node(8, 1, "64"), node(8, 1, "32"), fwk.QueueSkip},
		{"a new node without the class", waiting, nil, noGPU, fwk.QueueSkip},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.agentBack(klog.Background(), tc.pod, tc.old, tc.new)
			if err != nil || got != tc.want {
				t.Errorf("agentBack = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestAgentBackUpdatesTheCacheFirst: the pod the hint queues is retried at
// once, maybe before the plugin's Node handler has run; the hint hands the
// Node's report to the cache itself, so the retry finds the node served.
func TestAgentBackUpdatesTheCacheFirst(t *testing.T) {
	c := newCache()
	c.setClass(gpuClass)
	c.setNodeDevices(nodeDevices("n1", gpu("g0", 0, "80Gi")))
	gone := kubeletNode("n1", map[corev1.ResourceName]int64{cls("gpu"): 0})
	c.setKubelet(gone)
	pod := gpuPod("waiting", "gpu", 1)
	d, err := podDemand(pod)
	if err != nil {
		t.Fatal(err)
	}
	if why, ok := c.fits("n1", nil, d); ok || why.reason != (&nodeState{}).notServing("gpu") {
		t.Fatalf("agent gone: fits = %+v, %v; want %q", why, ok, (&nodeState{}).notServing("gpu"))
	}
	p := &Plugin{shared: &shared{cache: c}}
	back := kubeletNode("n1", map[corev1.ResourceName]int64{cls("gpu"): 1})
	if hint, err := p.agentBack(klog.Background(), pod, gone, back); err != nil || hint != fwk.Queue {
		t.Fatalf("agentBack = %v, %v; want Queue", hint, err)
	}
	if why, ok := c.fits("n1", nil, d); !ok {
		t.Errorf("after the hint, before any Node handler: %+v, want the pod to fit", why)
	}
}

// TestPreemptionFindsNoRoomWhereTheAgentIsGone: a full node whose agent is
// gone is refused for its devices first (preemption may try it), and again,
// for the agent, once preemption's what-if removes the victim: no pod is
// evicted for a node that could not run the preemptor.
func TestPreemptionFindsNoRoomWhereTheAgentIsGone(t *testing.T) {
	low := boundPod(t, "low", "n1", "n1", "gpu", "g0")
	h := newHarness(t, FirstFit, []*v1alpha1.NodeDevices{nodeDevices("n1", gpu("g0", 0, "80Gi"))}, allClasses, low)
	h.waitFor("the hold", func() bool { return h.holds(low.UID) })
	if _, err := h.client.CoreV1().Nodes().Update(h.ctx, kubeletNode("n1", map[corev1.ResourceName]int64{cls("gpu"): 0}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the kubelet's report in the cache", func() bool {
		h.plugin.cache.mu.RLock()
		defer h.plugin.cache.mu.RUnlock()
		return h.plugin.cache.nodes["n1"].kubelet != nil
	})
	high := gpuPod("high", "gpu", 1)
	cs, st := h.fits(high, "n1")
	wantCode(t, st, fwk.Unschedulable, "Insufficient free devices of class gpu")
	what := cs.Clone()
	if st := h.fw.RunPreFilterExtensionRemovePod(h.ctx, what, high, podInfo(t, low), h.nodes["n1"]); !st.IsSuccess() {
		t.Fatalf("RemovePod: %v", st)
	}
	wantCode(t, h.filter(what, high, "n1"), fwk.UnschedulableAndUnresolvable, (&nodeState{}).notServing("gpu"))
}
