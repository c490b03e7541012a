package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
)

// TestTopologyPlacement: the real scheduler with strategy Topology (the
// embedded cluster's TopologySchedulerName profile) on kwok nodes of the
// topology profiles.
//
//   - dgx1-hybrid-mesh: a 2-GPU pod, then a 4-GPU pod. The pair takes two
//     GPUs joined by two NVLinks under one switch, and leaves a fully
//     NVLink-connected quad free, which the 4-GPU pod gets (in the plain
//     order the pair would take GPUs 0-1 and the quad 2-5, where 2 and 4
//     share no NVLink).
//   - pcie-4gpu: a pod asking for a GPU and a NIC gets a GPU under the NIC's
//     PCIe switch.
func TestTopologyPlacement(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	var nodes []string
	for _, profile := range []string{"dgx1-hybrid-mesh", "pcie-4gpu"} {
		names, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{Prefix: "topo-" + strings.Split(profile, "-")[0], Count: 1, Profile: profile, Labels: map[string]string{"pool": "topo-" + profile}})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, names...)
	}
	t.Cleanup(func() { deleteNodes(nodes) })
	schedClass(t, ctx, "topo-gpu", req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"))
	schedClass(t, ctx, "topo-nic", req("kind", v1alpha1.ResourceSelectorOpIn, "nic"))
	ns := newNamespace(t, ctx, nil)
	devicesOf := func(node string) map[string]v1alpha1.Device {
		rc, _ := cluster.Resclass()
		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]v1alpha1.Device{}
		for _, d := range nd.Status.Devices {
			out[d.ID] = d
		}
		return out
	}
	run := func(name, pool string, classes map[string]int64) map[string][]string {
		pod := schedPod(ns, name, pool, classes, nil)
		pod.Spec.SchedulerName = framework.TopologySchedulerName
		if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		bound, a := boundAssignment(t, ctx, ns, name)
		out := map[string][]string{}
		for class := range classes {
			out[class] = a.Devices("main", class)
		}
		t.Logf("pod %s on %s: %s", name, bound.Spec.NodeName, bound.Annotations["resclass.io/assignment"])
		return out
	}

	t.Run("hybrid cube mesh", func(t *testing.T) {
		devs := devicesOf(nodes[0])
		index := func(id string) int { return int(*devs[id].Attributes[v1alpha1.AttributeIndex].IntValue) }
		links := func(a, b string) int {
			p, err := nvidiagpu.ParsePeerLinks(*devs[a].Attributes[v1alpha1.AttributeNVLinkPeerLinks].StringValue)
			if err != nil {
				t.Fatal(err)
			}
			return p[index(b)]
		}
		pair := run("pair", "topo-dgx1-hybrid-mesh", map[string]int64{"topo-gpu": 2})["topo-gpu"]
		if len(pair) != 2 || links(pair[0], pair[1]) != 2 {
			t.Errorf("pair %v: want two GPUs joined by two NVLinks", pair)
		}
		quad := run("quad", "topo-dgx1-hybrid-mesh", map[string]int64{"topo-gpu": 4})["topo-gpu"]
		var indices []int
		for x, a := range quad {
			indices = append(indices, index(a))
			for _, b := range quad[x+1:] {
				if links(a, b) == 0 {
					t.Errorf("quad %v: GPUs %d and %d share no NVLink", quad, index(a), index(b))
				}
			}
		}
		slices.Sort(indices)
		t.Logf("GPUs by index: pair %d,%d; quad %v", index(pair[0]), index(pair[1]), indices)
	})

	t.Run("GPU and NIC on a PCIe box", func(t *testing.T) {
		devs := devicesOf(nodes[1])
		got := run("gpu-nic", "topo-pcie-4gpu", map[string]int64{"topo-gpu": 1, "topo-nic": 1})
		sw := func(id string) string { return *devs[id].Attributes[v1alpha1.AttributePCIeSwitch].StringValue }
		if gpu, nic := got["topo-gpu"][0], got["topo-nic"][0]; sw(gpu) != sw(nic) {
			t.Errorf("GPU %s under switch %s, NIC %s under %s: want one switch", gpu, sw(gpu), nic, sw(nic))
		} else {
			t.Logf("GPU %d and NIC %s under switch %s", *devs[gpu].Attributes[v1alpha1.AttributeIndex].IntValue, nic, sw(gpu))
		}
	})
}
