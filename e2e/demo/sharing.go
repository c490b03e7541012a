package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/handoff"
)

// shareClass is the demo's share class: 10Gi and a quarter of one GPU a unit.
const shareClass = "gpu.share.10g"

// sharedGPU shows one GPU of the agent node shared by two pods of different
// sizes (docs/sharing.md): the operator's label, the share class, what the
// agent publishes, where the scheduler puts the pods and what each container
// gets. The GPU is time-sliced: the demo runs no MPS control daemon, and says
// what MPS would add.
func sharedGPU(ctx context.Context, p *printer, c *framework.Cluster, kn *framework.KubeletNode, uuids []string) error {
	rc, err := c.Resclass()
	if err != nil {
		return err
	}
	// A GPU no pod holds: a mode change would otherwise wait for its pod.
	gpu, err := freeGPU(ctx, c, uuids)
	if err != nil {
		return err
	}
	label := v1alpha1.LabelGPUSharingDevicePrefix + gpu
	p.line("  The operator time-slices one free GPU of %s; sharing is chosen per GPU, by", agentNode)
	p.line("  Node labels that tenants cannot write:")
	if err := labelAgentNode(ctx, p, c, label, v1alpha1.SharingLabelTimeSlicing); err != nil {
		return err
	}
	var published *v1alpha1.DeviceSharing
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, agentNode, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, d := range nd.Status.Devices {
			if d.ID == gpu && d.Sharing != nil && d.Sharing.Mode == v1alpha1.SharingTimeSlicing {
				published = d.Sharing
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("the agent never published %s time-sliced: %w", gpu, err)
	}
	p.line("  The agent publishes it in NodeDevices (kubectl get nodedevices %s -o yaml):", agentNode)
	p.line("    - id: %s", gpu)
	p.line("      sharing:")
	p.line("        mode: %s", published.Mode)
	var capacity []string
	for _, name := range []string{v1alpha1.CapacityMemory, v1alpha1.CapacityCompute} {
		q := published.Capacity[name]
		capacity = append(capacity, name+": "+q.String())
	}
	p.line("        capacity: {%s}", strings.Join(capacity, ", "))
	for _, e := range published.Enforcement {
		p.line("        enforcement: %s by %s (%s)", e.Capacity, e.Mechanism, e.Strength)
	}

	memory, compute := resource.MustParse("10Gi"), int32(25)
	p.line("  A share class: one unit is 10Gi and 25%% of the compute of one GPU:")
	p.line("    spec: {resourceSelector: [{matchExpressions: [{key: kind, operator: In, values: [nvidia-gpu]}]}],")
	p.line("           share: {memory: 10Gi, compute: 25}}")
	_, err = rc.ResclassV1alpha1().ResourceClasses().Create(ctx, &v1alpha1.ResourceClass{
		ObjectMeta: metav1.ObjectMeta{Name: shareClass},
		Spec: v1alpha1.ResourceClassSpec{
			ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: []v1alpha1.ResourceSelectorRequirement{{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{v1alpha1.DeviceKindNvidiaGPU}}}}},
			Share:            &v1alpha1.ResourceShare{Memory: &memory, Compute: &compute},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}

	p.line("  Two pods ask for 1 and 2 units (class.resclass.io/%s: 1 and 2). The scheduler", shareClass)
	p.line("  puts both on the shared GPU, one share each, and each container gets its own share:")
	for _, pod := range []struct {
		name  string
		units int64
	}{{"notebook-1", 1}, {"notebook-2", 2}} {
		rec, a, err := runPod(ctx, c, kn, pod.name, "registry.example/notebook:1", shareClass, pod.units)
		if err != nil {
			return err
		}
		if ids := a.Devices("main", shareClass); !slices.Equal(ids, []string{gpu}) {
			return fmt.Errorf("demo/%s got %v, want the shared GPU %s", pod.name, ids, gpu)
		}
		share := a.Containers[0].Shares[shareClass]
		p.line("    demo/%s: assignment shares %s: memory %s, compute %d%%", pod.name, short(gpu),
			resource.NewQuantity(share[v1alpha1.CapacityMemory], resource.BinarySI), share[v1alpha1.CapacityCompute])
		p.line("      container env %s=%s %s=%s", handoff.EnvShareMemory, rec.Env[handoff.EnvShareMemory], handoff.EnvShareCompute, rec.Env[handoff.EnvShareCompute])
	}
	p.line("  Time-slicing limits nothing on the GPU: the shares are the scheduler's accounting.")
	p.line("  In MPS mode (%s=%s, with the resclass-mps-control DaemonSet) each", v1alpha1.LabelGPUSharing, v1alpha1.SharingLabelMPS)
	p.line("  container also gets its limits as MPS client limits (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,")
	p.line("  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); docs/sharing.md says what each mode enforces.")
	return classStatus(ctx, p, c, shareClass, 3)
}

// labelAgentNode sets a label on the agent node, as the operator's kubectl
// label it prints.
func labelAgentNode(ctx context.Context, p *printer, c *framework.Cluster, key, value string) error {
	return labelNode(ctx, p, c, agentNode, key, value)
}

// labelNode sets the label key=value on node, as the kubectl line it
// prints does.
func labelNode(ctx context.Context, p *printer, c *framework.Cluster, node, key, value string) error {
	p.line("    $ kubectl label node %s %s=%s", node, key, value)
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{key: value}}})
	_, err := c.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{})
	return err
}
