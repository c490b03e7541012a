package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/mig"
)

// The demo's classes of MIG slices made on demand.
const (
	migClass20 = "mig.20g"
	migClass10 = "mig.10g"
)

// migOnDemand shows MIG slices made for pods (docs/mig.md): one free GPU of
// the agent node in MIG mode, marked dynamic by the operator; two pods of
// classes with createMIG; the slices the scheduler chose, made by the agent
// and handed to the containers; one pod deleted and its slice destroyed.
func migOnDemand(ctx context.Context, p *printer, c *framework.Cluster, kn *framework.KubeletNode, dgx *nvmlmock.Server) error {
	rc, err := c.Resclass()
	if err != nil {
		return err
	}
	gpu, err := freeGPU(ctx, c, dgx.UUIDs())
	if err != nil {
		return err
	}
	// What nvidia-smi -mig 1 does on an idle GPU, in the NVML mock.
	if err := dgx.EnableMIG(gpu, mig.A100_40GB); err != nil {
		return err
	}
	label := v1alpha1.LabelGPUMIGDevicePrefix + gpu
	p.line("  The operator puts one free GPU of %s in MIG mode (nvidia-smi -mig 1: resclass", agentNode)
	p.line("  never changes MIG mode) and marks it for MIG slices made on demand:")
	if err := labelAgentNode(ctx, p, c, label, v1alpha1.MIGLabelDynamic); err != nil {
		return err
	}
	instances := func() (*v1alpha1.DeviceMIG, error) {
		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, agentNode, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		for _, d := range nd.Status.Devices {
			if d.ID == gpu {
				return d.MIG, nil
			}
		}
		return nil, nil
	}
	var published *v1alpha1.DeviceMIG
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		m, err := instances()
		published = m
		return m != nil && m.Mode == v1alpha1.MIGDynamic, err
	}); err != nil {
		return fmt.Errorf("the agent never published %s for dynamic MIG: %w", gpu, err)
	}
	var profiles []string
	for _, pr := range published.Profiles {
		profiles = append(profiles, fmt.Sprintf("%s@%v", pr.Name, pr.Placements))
	}
	p.line("  The agent publishes the GPU's MIG geometry in NodeDevices: mode %s, profiles and", published.Mode)
	p.line("  their placements %s", strings.Join(profiles, " "))

	p.line("  Two classes opt into slices made for the pod (createMIG: true), by memory:")
	for _, cl := range []struct{ name, memory string }{{migClass20, "19G"}, {migClass10, "9G"}} {
		p.line("    %s: {createMIG: true, resourceSelector: [{matchExpressions: [{key: kind, operator: In, values: [nvidia-mig]}, {key: memory, operator: GtEq, values: [%s]}]}]}", cl.name, cl.memory)
		_, err := rc.ResclassV1alpha1().ResourceClasses().Create(ctx, &v1alpha1.ResourceClass{
			ObjectMeta: metav1.ObjectMeta{Name: cl.name},
			Spec: v1alpha1.ResourceClassSpec{CreateMIG: true, ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
				{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{v1alpha1.DeviceKindNvidiaMIG}},
				{Key: "memory", Operator: v1alpha1.ResourceSelectorOpGtEq, Values: []string{cl.memory}},
			}}}},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
	}

	p.line("  Two pods, one of each. The scheduler picks the smallest profile that serves each")
	p.line("  class, at the placement that keeps the largest profile creatable; the agent makes")
	p.line("  the slice when the kubelet admits the pod, and the container gets that MIG device:")
	for _, pod := range []struct{ name, class string }{{"infer-20g", migClass20}, {"infer-10g", migClass10}} {
		rec, a, err := runPod(ctx, c, kn, pod.name, "registry.example/infer:1", pod.class, 1)
		if err != nil {
			return err
		}
		ids := a.Devices("main", pod.class)
		if len(ids) != 1 || len(rec.CDIDevices) != 1 {
			return fmt.Errorf("demo/%s: assigned %v, CDI devices %v; want one slice", pod.name, ids, rec.CDIDevices)
		}
		_, profile, start, _ := mig.ParseSliceID(ids[0])
		p.line("    demo/%s: assignment (version %d) %s/mig/%s@%d -> CDI device %s", pod.name, a.Version, short(gpu), profile, start, rec.CDIDevices[0].GetName())
	}
	var m *v1alpha1.DeviceMIG
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		m, err = instances()
		return m != nil && len(m.Instances) == 2, err
	}); err != nil {
		return fmt.Errorf("the two slices were never published: %w", err)
	}
	p.line("  The GPU's instances, as published: %s", describeInstances(m))

	p.line("  demo/infer-20g ends; the agent destroys its slice at its next pass (only slices it")
	p.line("  made, listed in its ownership record on the node):")
	if err := c.Client.CoreV1().Pods("demo").Delete(ctx, "infer-20g", metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return len(dgx.MIGInstances(gpu)) == 1, nil
	}); err != nil {
		return fmt.Errorf("the slice of demo/infer-20g was never destroyed: %v: %w", dgx.MIGInstances(gpu), err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		m, err = instances()
		return m != nil && len(m.Instances) == 1, err
	}); err != nil {
		return err
	}
	p.line("  The GPU's instances, as published: %s", describeInstances(m))
	p.line("  (kubectl resclass mig --node %s shows the same, with what could still be made.)", agentNode)
	return nil
}

// describeInstances lists m's instances, "<profile>@<start>", marked
// (created) when resclass made them.
func describeInstances(m *v1alpha1.DeviceMIG) string {
	if m == nil {
		return "none"
	}
	var out []string
	for _, in := range m.Instances {
		s := fmt.Sprintf("%s@%d", in.Profile, in.Start)
		if in.Created {
			s += " (created)"
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

// freeGPU is a GPU of the agent node that no pod holds and no sharing label
// names, the highest-numbered first.
func freeGPU(ctx context.Context, c *framework.Cluster, uuids []string) (string, error) {
	held := map[string]bool{}
	pods, err := c.Client.CoreV1().Pods("demo").List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	for i := range pods.Items {
		if a, found, err := assignment.FromPod(&pods.Items[i]); err == nil && found && a.Node == agentNode {
			for _, id := range a.DeviceIDs() {
				held[id] = true
			}
		}
	}
	node, err := c.Client.CoreV1().Nodes().Get(ctx, agentNode, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	for _, id := range slices.Backward(uuids) {
		if _, shared := node.Labels[v1alpha1.LabelGPUSharingDevicePrefix+id]; !held[id] && !shared {
			return id, nil
		}
	}
	return "", fmt.Errorf("no free GPU on %s", agentNode)
}
