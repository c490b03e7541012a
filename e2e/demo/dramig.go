package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/cdispec"
	"github.com/resclass/resclass/pkg/dra/dradevice"
	"github.com/resclass/resclass/pkg/mig"
)

// draMIG shows MIG slices made on demand on the DRA node (docs/mig.md, "DRA
// nodes"): a free GPU there in MIG mode and marked dynamic, its potential
// slices published as partitionable devices, a pod of section 12's class
// migClass10 in the extended-resource form for the stock profile, the
// slice made when the kubelet prepares its claim, and destroyed when the
// pod ends.
func draMIG(ctx context.Context, p *printer, c *framework.Cluster, d *draSetup) error {
	list, err := draNodeSlices(ctx, c)
	if err != nil {
		return err
	}
	// A GPU no claim of the section above was allocated.
	names := dradevice.IDs(list)
	claims, err := c.Client.ResourceV1().ResourceClaims("demo").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	taken := map[string]bool{}
	for _, cl := range claims.Items {
		if cl.Status.Allocation != nil {
			for _, r := range cl.Status.Allocation.Devices.Results {
				taken[r.Device] = true
			}
		}
	}
	var gpu string
	for _, id := range slices.Backward(d.dgx.UUIDs()) {
		if !taken[names[id]] {
			gpu = id
			break
		}
	}
	if gpu == "" {
		return fmt.Errorf("no free GPU on %s", draNode)
	}
	if err := d.dgx.EnableMIG(gpu, mig.A100_40GB); err != nil {
		return err
	}
	p.line("  MIG slices made on demand work the same on a DRA node. The operator puts a free GPU")
	p.line("  of %s in MIG mode and marks it dynamic:", draNode)
	if err := labelNode(ctx, p, c, draNode, v1alpha1.LabelGPUMIGDevicePrefix+gpu, v1alpha1.MIGLabelDynamic); err != nil {
		return err
	}
	var counters *resourceapi.CounterSet
	var potentials []resourceapi.Device
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		list, err = draNodeSlices(ctx, c)
		if err != nil {
			return false, err
		}
		counters, potentials = nil, nil
		for _, s := range list {
			for i := range s.Spec.SharedCounters {
				if s.Spec.SharedCounters[i].Name == dradevice.MIGCounterSet(gpu) {
					counters = &s.Spec.SharedCounters[i]
				}
			}
			for _, dev := range s.Spec.Devices {
				if id, _ := dradevice.ID(&dev); strings.HasPrefix(id, gpu+"/mig/") {
					potentials = append(potentials, dev)
				}
			}
		}
		return counters != nil && len(potentials) > 0, nil
	}); err != nil {
		return fmt.Errorf("the potential slices of %s were never published: %w", gpu, err)
	}
	p.line("  The agent publishes, in ResourceSlices of their own, the GPU's counter set %s", counters.Name)
	p.line("  (one counter per memory slice, slice-0 to slice-7, and one per profile with an instance")
	p.line("  limit: %d counters) and its %d potential slices, one device per profile and placement,", len(counters.Counters), len(potentials))
	first := potentials[0]
	id, _ := dradevice.ID(&first)
	var consumed []string
	for _, cc := range first.ConsumesCounters {
		consumed = append(consumed, slices.Sorted(maps.Keys(cc.Counters))...)
	}
	p.line("  smallest first: the first is %s (%s), consuming %s.", first.Name, id, strings.Join(consumed, ", "))
	p.line("  Only classes with createMIG select them (their DeviceClasses; the others' exclude")
	p.line("  mig.resclass.io/potential).")

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "infer-dra-10g", Namespace: "demo"},
		Spec: corev1.PodSpec{SchedulerName: framework.DRASchedulerName, RestartPolicy: corev1.RestartPolicyNever,
			NodeSelector: map[string]string{corev1.LabelHostname: draNode},
			Containers: []corev1.Container{{
				Name: "infer", Image: "registry.example/infer:1",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNamePrefix + migClass10: resource.MustParse("1")}},
			}}},
	}
	if _, err := c.Client.CoreV1().Pods("demo").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	p.line("  demo/infer-dra-10g asks for class.resclass.io/%s: 1 (section 12's class) with", migClass10)
	p.line("  schedulerName: %s. The stock allocator takes the first potential slice that", framework.DRASchedulerName)
	p.line("  fits; the agent's DRA plugin makes it when the kubelet prepares the claim:")
	rec, err := d.kn.WaitForRecord(ctx, "demo", pod.Name, "infer")
	if err != nil {
		return err
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pod, err = c.Client.CoreV1().Pods("demo").Get(ctx, pod.Name, metav1.GetOptions{})
		return err == nil && pod.Status.Phase == corev1.PodRunning && pod.Status.ExtendedResourceClaimStatus != nil, nil
	}); err != nil {
		return fmt.Errorf("demo/infer-dra-10g never Running: %w", err)
	}
	claim, err := c.Client.ResourceV1().ResourceClaims("demo").Get(ctx, pod.Status.ExtendedResourceClaimStatus.ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if claim.Status.Allocation == nil {
		return fmt.Errorf("claim demo/%s is not allocated", claim.Name)
	}
	allocated := allocatedIDs(claim, list)
	if len(allocated) != 1 {
		return fmt.Errorf("claim demo/%s was allocated %v, want one device", claim.Name, allocated)
	}
	_, profile, start, ok := mig.ParseSliceID(allocated[0])
	if !ok {
		return fmt.Errorf("claim demo/%s was allocated %s, not a potential slice", claim.Name, allocated[0])
	}
	var made string
	for _, dev := range rec.CDIDevices {
		if m, found := strings.CutPrefix(dev.GetName(), cdispec.DeviceName("")); found && strings.HasPrefix(m, "MIG-") {
			made = dev.GetName()
		}
	}
	if made == "" {
		return fmt.Errorf("demo/infer-dra-10g got CDI devices %v, no MIG device", rec.CDIDevices)
	}
	p.line("    claim %s: %s/mig/%s@%d -> CDI device %s", claim.Name, short(gpu), profile, start, made)
	p.line("    the GPU's instances, in NVML: %s", strings.Join(d.dgx.MIGInstances(gpu), ", "))

	p.line("  demo/infer-dra-10g ends; the kubelet unprepares its claim and the agent destroys the slice:")
	if err := c.Client.CoreV1().Pods("demo").Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return len(d.dgx.MIGInstances(gpu)) == 0, nil
	}); err != nil {
		return fmt.Errorf("the slice of demo/infer-dra-10g was never destroyed: %v: %w", d.dgx.MIGInstances(gpu), err)
	}
	p.line("    the GPU's instances, in NVML: none")
	return nil
}
