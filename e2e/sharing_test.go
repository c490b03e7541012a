package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/cdispec"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/mpsstate"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// TestGPUSharing: GPUs shared by pods of different sizes (docs/sharing.md),
// on a real kubelet with the node agent on the NVML mock and the resclass
// scheduler. The node's GPUs are time-sliced by the node's label, GPU 0 is in
// MPS mode and GPUs 4–7 exclusive by per-GPU labels. It proves:
//
//   - the kubelet sees share slots per share class and whole GPUs for the
//     whole class, and a whole class never gets a shared GPU nor a share
//     class an exclusive one;
//   - shares of different sizes bin-pack onto one GPU, each container with
//     its own limits in what the runtime got (MPS client limits on GPU 0),
//     never another's;
//   - a request larger than any GPU stays Pending with the reason;
//   - a restarted scheduler rebuilds the shares held from the pods'
//     assignments: a full GPU stays full;
//   - a higher-priority share preempts a lower-priority one;
//   - an MPS daemon that stops running takes the GPU from new shares, not
//     from the running ones, until it runs again;
//   - a mode change waits for the pod holding the GPU, and happens when it
//     ends;
//   - the classes' status counts units.
func TestGPUSharing(t *testing.T) {
	ctx, cancel := agentTest(t, 5*time.Minute)
	defer cancel()
	const nodeName = "share-node"
	const (
		small = "e2e-share-10g" // 10Gi and 25% of a time-sliced or MPS GPU
		big   = "e2e-share-20g" // 20Gi and 50%
		mps   = "e2e-share-mps" // 10Gi and 25% of GPU 0, the MPS one
		whole = "e2e-share-whole"
	)
	dgx, root := mockDGX(t)
	uuids := dgx.UUIDs()
	gpu := req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu")
	shareClass(t, ctx, small, "10Gi", 25, gpu, req("id", v1alpha1.ResourceSelectorOpNotIn, uuids[0]))
	shareClass(t, ctx, big, "20Gi", 50, gpu, req("id", v1alpha1.ResourceSelectorOpNotIn, uuids[0]))
	shareClass(t, ctx, mps, "10Gi", 25, gpu, req("id", v1alpha1.ResourceSelectorOpIn, uuids[0]))
	schedClass(t, ctx, whole, gpu)

	kn, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: nodeName})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNodes([]string{nodeName}) })
	labels := map[string]string{v1alpha1.LabelGPUSharing: v1alpha1.SharingLabelTimeSlicing, v1alpha1.LabelGPUSharingDevicePrefix + uuids[0]: v1alpha1.SharingLabelMPS}
	for _, id := range uuids[4:] {
		labels[v1alpha1.LabelGPUSharingDevicePrefix+id] = v1alpha1.SharingLabelExclusive
	}
	labelNode(t, ctx, nodeName, labels)
	// GPU 0's MPS control daemon runs, as the MPS DaemonSet reports it.
	writeMPSState(t, root, uuids[0], mpsstate.Running)

	arc, akc := agentClients(t, nodeName)
	actx, stopAgent := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		cfg := mockGPUAgent(kn, dgx, root, t.TempDir())
		if err := nodeagent.New(cfg, arc, akc).Run(actx); err != nil {
			t.Errorf("agent: %v", err)
		}
	}()
	t.Cleanup(func() { stopAgent(); <-done })

	// The GPUs' memory, as published: the units per GPU follow from it.
	memory := gpuShareMemory(t, ctx, nodeName, uuids[0])
	// Units of 10Gi and 25% on one GPU: 4 on the mock's 40Gi A100s.
	const per10 = 4
	if memory != 40<<30 {
		t.Fatalf("the mock's GPUs publish %d bytes of memory to share; the test counts units of 40Gi GPUs", memory)
	}
	waitClassAllocatable(t, ctx, "whole GPUs 4–7", nodeName, whole, 4)
	waitClassAllocatable(t, ctx, "slots of 10Gi shares on GPUs 1–3", nodeName, small, 3*per10)
	waitClassAllocatable(t, ctx, "slots of the MPS class on GPU 0", nodeName, mps, per10)

	// Created long before a pod names it: the apiserver's Priority admission
	// reads PriorityClasses from an informer, which a class created just
	// before the pod may not have reached yet.
	priorityLevel(t, ctx, "e2e-share-high", 1000, corev1.PreemptLowerPriority)
	ns := newNamespace(t, ctx, nil)
	pods := cluster.Client.CoreV1().Pods(ns)
	create := func(p *corev1.Pod) {
		t.Helper()
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	shareOf := func(name, class string) (string, map[string]int64) {
		t.Helper()
		_, a := boundAssignment(t, ctx, ns, name)
		ids := a.Devices("c", class)
		if len(ids) != 1 || len(a.Containers) != 1 {
			t.Fatalf("%s: assignment %+v, want one device of %s", name, a, class)
		}
		return ids[0], a.Containers[0].Shares[class]
	}

	t.Run("whole and shares apart, shares bin-packed with their own limits", func(t *testing.T) {
		create(gpuPodOn(ns, "w", resclassScheduler, nodeName, whole, 1))
		create(gpuPodOn(ns, "a", resclassScheduler, nodeName, small, 1))
		create(gpuPodOn(ns, "b", resclassScheduler, nodeName, big, 1))
		wdev := func() string { _, a := boundAssignment(t, ctx, ns, "w"); return a.Devices("c", whole)[0] }()
		if !slices.Contains(uuids[4:], wdev) {
			t.Errorf("the whole pod got %s, not one of the exclusive GPUs 4–7", wdev)
		}
		adev, ashare := shareOf("a", small)
		bdev, bshare := shareOf("b", big)
		if !slices.Contains(uuids[1:4], adev) || !slices.Contains(uuids[1:4], bdev) {
			t.Errorf("shares on %s and %s, want time-sliced GPUs 1–3", adev, bdev)
		}
		if adev != bdev {
			t.Errorf("a on %s and b on %s: bin-packing puts the second share on the GPU the first started", adev, bdev)
		}
		if ashare[v1alpha1.CapacityMemory] != 10<<30 || ashare[v1alpha1.CapacityCompute] != 25 || bshare[v1alpha1.CapacityMemory] != 20<<30 || bshare[v1alpha1.CapacityCompute] != 50 {
			t.Errorf("shares a %v, b %v", ashare, bshare)
		}
		for name, want := range map[string]map[string]int64{"a": ashare, "b": bshare} {
			podRunning(t, ctx, ns, name)
			r := waitRecord(t, ctx, kn, ns, name, "c")
			if r.Env[handoff.EnvShareMemory] != strconv.FormatInt(want[v1alpha1.CapacityMemory], 10) || r.Env[handoff.EnvShareCompute] != strconv.FormatInt(want[v1alpha1.CapacityCompute], 10) {
				t.Errorf("%s's container: share env %s=%q %s=%q, want its own %v", name, handoff.EnvShareMemory, r.Env[handoff.EnvShareMemory], handoff.EnvShareCompute, r.Env[handoff.EnvShareCompute], want)
			}
			if r.Env[nvidiagpu.EnvMPSMemLimit] != "" {
				t.Errorf("%s on a time-sliced GPU got MPS limits %q", name, r.Env[nvidiagpu.EnvMPSMemLimit])
			}
			if len(r.CDIDevices) != 1 || r.CDIDevices[0].GetName() != cdispec.DeviceName(adev) {
				t.Errorf("%s's container got CDI devices %v, want the GPU %s", name, r.CDIDevices, adev)
			}
		}
	})

	t.Run("two MPS clients of one GPU, each with its own limits", func(t *testing.T) {
		create(gpuPodOn(ns, "m1", resclassScheduler, nodeName, mps, 1))
		create(gpuPodOn(ns, "m2", resclassScheduler, nodeName, mps, per10-1))
		for name, units := range map[string]int64{"m1": 1, "m2": per10 - 1} {
			dev, _ := shareOf(name, mps)
			if dev != uuids[0] {
				t.Errorf("%s on %s, want the MPS GPU %s", name, dev, uuids[0])
			}
			podRunning(t, ctx, ns, name)
			r := waitRecord(t, ctx, kn, ns, name, "c")
			wantMem := fmt.Sprintf("0=%dM", units*10<<10)
			wantThreads := strconv.FormatInt(units*25, 10)
			if r.Env[nvidiagpu.EnvMPSMemLimit] != wantMem || r.Env[nvidiagpu.EnvMPSThreads] != wantThreads {
				t.Errorf("%s (%d units): %s=%q %s=%q, want %s and %s", name, units, nvidiagpu.EnvMPSMemLimit, r.Env[nvidiagpu.EnvMPSMemLimit], nvidiagpu.EnvMPSThreads, r.Env[nvidiagpu.EnvMPSThreads], wantMem, wantThreads)
			}
			pipe := r.Env[nvidiagpu.EnvMPSPipeDirectory]
			if !strings.Contains(pipe, uuids[0]) || !hasMount(r.Mounts, pipe) || !hasMount(r.Mounts, "/dev/shm") {
				t.Errorf("%s: pipe directory %q, mounts %v: want GPU 0's pipe and /dev/shm mounted", name, pipe, r.Mounts)
			}
		}
	})

	t.Run("a share larger than any GPU stays Pending with the reason", func(t *testing.T) {
		create(gpuPodOn(ns, "huge", resclassScheduler, nodeName, small, per10+1))
		msg := waitPodEvent(t, ctx, ns, "huge", "FailedScheduling", "more than one GPU of the class has")
		t.Logf("huge: %s", msg)
	})

	t.Run("a restarted scheduler keeps the full MPS GPU full", func(t *testing.T) {
		if err := cluster.RestartScheduler(ctx); err != nil {
			t.Fatal(err)
		}
		create(gpuPodOn(ns, "m3", resclassScheduler, nodeName, mps, 1))
		waitPodEvent(t, ctx, ns, "m3", "FailedScheduling", "Insufficient free share capacity of class "+mps)
		if err := pods.Delete(ctx, "m3", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a higher-priority share preempts a lower-priority one", func(t *testing.T) {
		create(prioritized(ns, "hi", nodeName, mps, "e2e-share-high", 1, nil))
		podRunning(t, ctx, ns, "hi")
		gone := 0
		for _, name := range []string{"m1", "m2"} {
			if _, err := pods.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				gone++
			}
		}
		if gone == 0 {
			t.Errorf("hi runs on the full MPS GPU and neither m1 nor m2 was preempted")
		}
		r := waitRecord(t, ctx, kn, ns, "hi", "c")
		if r.Env[nvidiagpu.EnvMPSMemLimit] != fmt.Sprintf("0=%dM", 10<<10) {
			t.Errorf("hi: %s=%q, want its own 10Gi", nvidiagpu.EnvMPSMemLimit, r.Env[nvidiagpu.EnvMPSMemLimit])
		}
	})

	t.Run("an MPS daemon that stops takes the GPU from new shares only", func(t *testing.T) {
		writeMPSState(t, root, uuids[0], mpsstate.Failed)
		waitDevice(t, ctx, nodeName, uuids[0], "GPU 0 unhealthy while its MPS daemon fails", func(d *v1alpha1.Device) bool { return !d.Healthy })
		if err := pods.Delete(ctx, "hi", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		create(gpuPodOn(ns, "m4", resclassScheduler, nodeName, mps, 1))
		waitPodEvent(t, ctx, ns, "m4", "FailedScheduling")
		for _, p := range listPods(t, ctx, ns) {
			if p.Status.Phase == corev1.PodFailed {
				t.Errorf("%s failed while the daemon was down: %s", p.Name, p.Status.Message)
			}
		}
		writeMPSState(t, root, uuids[0], mpsstate.Running)
		podRunning(t, ctx, ns, "m4")
	})

	t.Run("a mode change waits for the pod that holds the GPU", func(t *testing.T) {
		_, a := boundAssignment(t, ctx, ns, "w")
		held := a.Devices("c", whole)[0]
		labelNode(t, ctx, nodeName, map[string]string{v1alpha1.LabelGPUSharingDevicePrefix + held: v1alpha1.SharingLabelTimeSlicing})
		waitDevice(t, ctx, nodeName, held, "the change to TimeSlicing waiting for w", func(d *v1alpha1.Device) bool {
			return d.Sharing != nil && d.Sharing.Mode == v1alpha1.SharingExclusive && d.Sharing.RequestedMode == v1alpha1.SharingTimeSlicing && strings.Contains(d.Sharing.Message, "w")
		})
		podRunning(t, ctx, ns, "w") // not taken from it
		if err := pods.Delete(ctx, "w", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitDevice(t, ctx, nodeName, held, "the GPU time-sliced once w ended", func(d *v1alpha1.Device) bool {
			return d.Sharing != nil && d.Sharing.Mode == v1alpha1.SharingTimeSlicing && d.Sharing.RequestedMode == ""
		})
		waitClassAllocatable(t, ctx, "one whole GPU fewer", nodeName, whole, 3)
		waitClassAllocatable(t, ctx, "its slots added to the 10Gi class", nodeName, small, 4*per10)
	})

	t.Run("the classes' status counts units", func(t *testing.T) {
		rc, err := cluster.Resclass()
		if err != nil {
			t.Fatal(err)
		}
		// Four time-sliced GPUs of 4 units; a (10Gi, 25%) and b (20Gi,
		// 50%) leave one unit on theirs.
		var st v1alpha1.ResourceClassStatus
		poll(t, ctx, time.Minute, "the status of "+small+" in units", func(ctx context.Context) (bool, error) {
			c, err := rc.ResclassV1alpha1().ResourceClasses().Get(ctx, small, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			st = c.Status
			return st.Allocatable.Value() == 4*per10 && st.Available.Value() == 4*per10-3 && st.Requested.Value() == 3, nil
		})
		t.Logf("%s: allocatable %s, requested %s, available %s", small, &st.Allocatable, &st.Requested, &st.Available)
	})
}

// shareClass creates a share class of unit memory and compute (percent),
// removed after the test.
func shareClass(t *testing.T, ctx context.Context, name, memory string, compute int32, exprs ...v1alpha1.ResourceSelectorRequirement) {
	t.Helper()
	m := resource.MustParse(memory)
	createClassSpec(t, ctx, name, v1alpha1.ResourceClassSpec{
		ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: exprs}},
		Share:            &v1alpha1.ResourceShare{Memory: &m, Compute: &compute},
	})
}

// labelNode sets labels on node as an operator does (kubectl label).
func labelNode(t *testing.T, ctx context.Context, node string, labels map[string]string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if _, err := cluster.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// writeMPSState writes GPU uuid's MPS daemon state below the agent's host
// root, as the MPS DaemonSet does.
func writeMPSState(t *testing.T, root, uuid string, phase mpsstate.Phase) {
	t.Helper()
	if err := mpsstate.Write(filepath.Join(root, mpsstate.DefaultDir), uuid, mpsstate.State{Phase: phase, Message: "written by the test", Updated: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

// waitDevice waits until node's NodeDevices publishes device id as ok says.
func waitDevice(t *testing.T, ctx context.Context, node, id, what string, ok func(*v1alpha1.Device) bool) {
	t.Helper()
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, time.Minute, what, func(ctx context.Context) (bool, error) {
		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		for i := range nd.Status.Devices {
			if nd.Status.Devices[i].ID == id {
				return ok(&nd.Status.Devices[i]), nil
			}
		}
		return false, nil
	})
}

// gpuShareMemory is the memory capacity node publishes for GPU id's shares.
func gpuShareMemory(t *testing.T, ctx context.Context, node, id string) int64 {
	t.Helper()
	var memory int64
	waitDevice(t, ctx, node, id, "GPU "+id+" publishing its share capacity", func(d *v1alpha1.Device) bool {
		if d.Sharing == nil {
			return false
		}
		q, ok := d.Sharing.Capacity[v1alpha1.CapacityMemory]
		memory = q.Value()
		return ok
	})
	return memory
}

func hasMount(mounts []*runtimeapi.Mount, path string) bool {
	return slices.ContainsFunc(mounts, func(m *runtimeapi.Mount) bool { return m.GetContainerPath() == path })
}

func listPods(t *testing.T, ctx context.Context, ns string) []corev1.Pod {
	t.Helper()
	list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}
