package resourceclasses

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// BenchmarkFilterPerNode: one Filter call, as the scheduler makes it on every
// node it filters for a one-GPU pod, on 5000 nodes of 8 GPUs in varied states
// of use (node i runs i%8 one-GPU pods), visited in turn. ns/op is per node.
// As many nodes as SchedulingThroughput's 5000-node variant: visited in turn,
// each node's state has left the core's own caches by its next visit.
// baseline-extended-resource is upstream NodeResourcesFit's Filter of a pod
// requesting nvidia.com/gpu (the benchmark's baseline pods); class is this
// plugin's Filter of a pod requesting one device of a class, on nodes as kwok
// makes them (no class resource in allocatable: the agent's liveness is not
// judged); class-kubelet-offers-class the same on nodes whose kubelet offers
// the class, as a real node's does while its agent serves it (liveness.go);
// class-share the Filter of a pod asking one unit (10Gi) of a share class on
// nodes of 8 GPUs in MPS mode (node i holds i%8 shares of 40Gi), which the
// quick path leaves to the placement (docs/sharing.md).
func BenchmarkFilterPerNode(b *testing.B) {
	const nodes = 5000
	const gpuResource corev1.ResourceName = "nvidia.com/gpu"
	node := func(i int) *corev1.Node {
		name := fmt.Sprintf("kwok-dgx-%05d", i)
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "kwok",
			"node.kubernetes.io/instance-type": "dgx-a100",
		}}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("128"), corev1.ResourceMemory: resource.MustParse("1Ti"),
			corev1.ResourcePods: resource.MustParse("110"), gpuResource: resource.MustParse("8"),
		}}}
	}
	run := func(b *testing.B, pod *corev1.Pod, infos []fwk.NodeInfo, pl interface {
		PreFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status)
		Filter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) *fwk.Status
	}) {
		cs := framework.NewCycleState()
		if _, st := pl.PreFilter(b.Context(), cs, pod, infos); !st.IsSuccess() {
			b.Fatal(st)
		}
		i, fit := 0, 0
		for b.Loop() {
			if pl.Filter(b.Context(), cs, pod, infos[i%nodes]).IsSuccess() {
				fit++
			}
			i++
		}
		if fit == 0 {
			b.Fatal("no node fits")
		}
	}

	b.Run("baseline-extended-resource", func(b *testing.B) {
		infos := make([]fwk.NodeInfo, nodes)
		for i := range infos {
			var running []*corev1.Pod
			for p := range i % 8 {
				running = append(running, requestPod(fmt.Sprintf("p-%d-%d", i, p), gpuResource))
			}
			ni := framework.NewNodeInfo(running...)
			ni.SetNode(node(i))
			infos[i] = ni
		}
		args := &config.NodeResourcesFitArgs{ScoringStrategy: &config.ScoringStrategy{Type: config.LeastAllocated,
			Resources: []config.ResourceSpec{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}}}}
		// DRAExtendedResource off, as in the resclass scheduler by default.
		fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
		fts.EnableDRAExtendedResource = false
		fit, err := noderesources.NewFit(b.Context(), args, nil, fts)
		if err != nil {
			b.Fatal(err)
		}
		run(b, requestPod("p", gpuResource), infos, fit.(*noderesources.Fit))
	})

	class := func(b *testing.B, offered, shares bool) {
		c := newCache()
		c.setClass(gpuClass)
		class := gpuClass.Name
		if shares {
			c.setClass(gpu10g)
			class = gpu10g.Name
		}
		infos := make([]fwk.NodeInfo, nodes)
		for i := range infos {
			n := node(i)
			if offered {
				n.Status.Allocatable[cls(gpuClass.Name)] = resource.MustParse("8")
			}
			ni := framework.NewNodeInfo()
			ni.SetNode(n)
			infos[i] = ni
			var devs []v1alpha1.Device
			for g := range 8 {
				d := gpu(fmt.Sprintf("GPU-%d-%d", i, g), int64(g/4), "80Gi")
				if shares {
					d = sharedGPU(d.ID, int64(g/4), "80Gi", v1alpha1.SharingMPS)
				}
				devs = append(devs, d)
			}
			c.setNodeDevices(nodeDevices(n.Name, devs...))
			if offered {
				c.setKubelet(n) // as the plugin's Node handler does
			}
			for p := range i % 8 {
				pod := gpuPod(fmt.Sprintf("p-%d-%d", i, p), class, 1)
				if shares {
					pod = gpuPod(pod.Name, class, 4)
				}
				d, err := podDemand(pod)
				if err != nil {
					b.Fatal(err)
				}
				if _, u, err := c.reserve(pod, n.Name, d, FirstFit, BinPack); err != nil || u != nil {
					b.Fatalf("reserve: %v %v", err, u)
				}
			}
		}
		pl := &Plugin{args: &Args{Strategy: FirstFit}, shared: &shared{cache: c, synced: func() bool { return true }, waiting: map[types.UID]waitingPod{}}}
		run(b, gpuPod("p", class, 1), infos, pl)
	}
	b.Run("class", func(b *testing.B) { class(b, false, false) })
	b.Run("class-kubelet-offers-class", func(b *testing.B) { class(b, true, false) })
	b.Run("class-share", func(b *testing.B) { class(b, false, true) })
}

// requestPod asks for one of resource and a tenth of a CPU.
func requestPod(name string, res corev1.ResourceName) *corev1.Pod {
	requests := corev1.ResourceList{res: resource.MustParse("1"), corev1.ResourceCPU: resource.MustParse("100m")}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Resources: corev1.ResourceRequirements{
			Requests: requests, Limits: requests}}}}}
}
