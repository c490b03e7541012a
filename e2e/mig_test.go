package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/cdispec"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/mig"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// TestMIGOnDemand: MIG slices made for pods (docs/mig.md), on a real kubelet
// with the node agent on the NVML mock and the resclass scheduler. GPUs 0
// and 1 are A100-40GBs in MIG mode, marked dynamic by the node's label; GPU
// 1 has a 3g.20gb an operator made. It proves:
//
//   - pods of two sizes get the smallest profile that serves their class, on
//     the fuller GPU, made by the agent before the container starts, and
//     handed off as that MIG device (its CDI name);
//   - a pod of a whole-GPU class gets a GPU not in MIG mode on the same node;
//   - the slices made are published as the GPU's instances, marked created,
//     and not as devices of their own; the operator's instance is left as
//     it is;
//   - a pod deleted: its slice is destroyed; the operator's is never;
//   - a pod deleted while the agent is down: the restarted agent destroys
//     its slice;
//   - a slice that cannot be made: the pod fails admission with a Warning
//     Event saying why, and nothing is left on the GPU.
func TestMIGOnDemand(t *testing.T) {
	ctx, cancel := agentTest(t, 5*time.Minute)
	defer cancel()
	const nodeName = "mig-node"
	const (
		small = "e2e-mig-10g"   // at least 9G of a MIG slice: 1g.10gb
		large = "e2e-mig-20g"   // at least 19G: 3g.20gb
		whole = "e2e-mig-whole" // a whole GPU
	)
	dgx, root, uuids := migDGX(t)
	migs := req("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindNvidiaMIG)
	createMIGClass(t, ctx, small, migs, req("memory", v1alpha1.ResourceSelectorOpGtEq, "9G"))
	createMIGClass(t, ctx, large, migs, req("memory", v1alpha1.ResourceSelectorOpGtEq, "19G"))
	schedClass(t, ctx, whole, req("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindNvidiaGPU))

	kn, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: nodeName})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNodes([]string{nodeName}) })
	labelNode(t, ctx, nodeName, map[string]string{v1alpha1.LabelGPUMIG: v1alpha1.MIGLabelDynamic})

	arc, akc := agentClients(t, nodeName)
	cfg := mockGPUAgent(kn, dgx, root, t.TempDir())
	start := func() (stop func()) {
		stopAgent, _ := runAgent(t, ctx, nodeagent.New(cfg, arc, akc))
		return func() {
			if err := stopAgent(); err != nil {
				t.Errorf("agent: %v", err)
			}
		}
	}
	stop := start()
	// 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb and 7g.40gb at each placement on
	// both GPUs (11 each), and the operator's 3g.20gb, an existing MIG
	// device of 19968Mi.
	waitClassAllocatable(t, ctx, "the slices the small class may make", nodeName, small, 2*11+1)
	// The kubelet counts the GPUs in MIG mode too; the scheduler never
	// gives them whole.
	waitClassAllocatable(t, ctx, "the GPUs", nodeName, whole, 8)

	ns := newNamespace(t, ctx, nil)
	pods := cluster.Client.CoreV1().Pods(ns)
	create := func(p *corev1.Pod) {
		t.Helper()
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deviceOf := func(name, class string) string {
		t.Helper()
		_, a := boundAssignment(t, ctx, ns, name)
		ids := a.Devices("c", class)
		if len(ids) != 1 {
			t.Fatalf("%s: assignment %+v, want one device of %s", name, a, class)
		}
		return ids[0]
	}
	// madeFor is the MIG device the container got, checked against what the
	// mock has.
	madeFor := func(name string) string {
		t.Helper()
		podRunning(t, ctx, ns, name)
		r := waitRecord(t, ctx, kn, ns, name, "c")
		if len(r.CDIDevices) != 1 {
			t.Fatalf("%s: CDI devices %v, want its MIG device", name, r.CDIDevices)
		}
		dev, _ := strings.CutPrefix(r.CDIDevices[0].GetName(), cdispec.DeviceName(""))
		if !strings.HasPrefix(dev, "MIG-") {
			t.Fatalf("%s got %s, not a MIG device", name, dev)
		}
		return dev
	}
	instances := func(gpu int) []string {
		got := dgx.MIGInstances(uuids[gpu])
		slices.Sort(got)
		return got
	}
	waitInstances := func(what string, gpu int, want ...string) {
		t.Helper()
		slices.Sort(want)
		poll(t, ctx, time.Minute, what, func(context.Context) (bool, error) { return slices.Equal(instances(gpu), want), nil })
	}

	t.Run("the class's status counts slices of its smallest profile", func(t *testing.T) {
		// The small class's smallest profile is the 1g.10gb: 4 on an empty
		// A100-40GB, 2 where the operator's 3g.20gb takes slices 4-7; and
		// the operator's 3g.20gb itself, an existing MIG device of 19968Mi.
		rcs, err := cluster.Resclass()
		if err != nil {
			t.Fatal(err)
		}
		poll(t, ctx, time.Minute, "the small class's status", func(ctx context.Context) (bool, error) {
			rc, err := rcs.ResclassV1alpha1().ResourceClasses().Get(ctx, small, metav1.GetOptions{})
			return err == nil && rc.Status.Allocatable.Value() == 4+4+1 && rc.Status.Available.Value() == 4+2+1, err
		})
	})

	t.Run("slices made for pods of two sizes, beside a whole GPU", func(t *testing.T) {
		create(gpuPodOn(ns, "s1", resclassScheduler, nodeName, small, 1))
		create(gpuPodOn(ns, "s2", resclassScheduler, nodeName, large, 1))
		create(gpuPodOn(ns, "w", resclassScheduler, nodeName, whole, 1))
		// GPU 1, with the operator's 3g.20gb at 4, is the fuller: the
		// 1g.10gb goes there, at 0 (0 and 2 leave the same); the 3g.20gb
		// no longer fits there, and goes to GPU 0 at 4, which keeps the
		// 4g.20gb creatable.
		if got, want := deviceOf("s1", small), mig.SliceID(uuids[1], "1g.10gb", 0); got != want {
			t.Errorf("s1 assigned %s, want %s", got, want)
		}
		if got, want := deviceOf("s2", large), mig.SliceID(uuids[0], "3g.20gb", 4); got != want {
			t.Errorf("s2 assigned %s, want %s", got, want)
		}
		if got := deviceOf("w", whole); !slices.Contains(uuids[2:], got) {
			t.Errorf("w assigned %s, want a GPU not in MIG mode", got)
		}
		d1, d2 := madeFor("s1"), madeFor("s2")
		if d1 == d2 {
			t.Errorf("s1 and s2 got one MIG device, %s", d1)
		}
		if got := instances(1); !slices.Equal(got, []string{"1g.10gb@0", "3g.20gb@4"}) {
			t.Errorf("GPU 1's instances %v", got)
		}
		if got := instances(0); !slices.Equal(got, []string{"3g.20gb@4"}) {
			t.Errorf("GPU 0's instances %v", got)
		}
		// Published: the instances, created or not; the slices' MIG devices
		// are their pods', not devices of their own.
		poll(t, ctx, time.Minute, "the slices published as created instances", func(ctx context.Context) (bool, error) {
			nd, err := arc.ResclassV1alpha1().NodeDevices().Get(ctx, nodeName, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			var created, devices []string
			for _, d := range nd.Status.Devices {
				devices = append(devices, d.ID)
				if d.MIG != nil {
					for _, in := range d.MIG.Instances {
						created = append(created, fmt.Sprintf("%s:%s@%d:%v", d.ID[:8], in.Profile, in.Start, in.Created))
					}
				}
			}
			slices.Sort(created)
			want := []string{uuids[0][:8] + ":3g.20gb@4:true", uuids[1][:8] + ":1g.10gb@0:true", uuids[1][:8] + ":3g.20gb@4:false"}
			slices.Sort(want)
			return slices.Equal(created, want) && !slices.Contains(devices, d1) && !slices.Contains(devices, d2), nil
		})
	})

	t.Run("a pod deleted: its slice destroyed, the operator's kept", func(t *testing.T) {
		if err := pods.Delete(ctx, "s1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitInstances("s1's slice destroyed", 1, "3g.20gb@4")
	})

	t.Run("a pod deleted while the agent is down: destroyed at its restart", func(t *testing.T) {
		stop()
		if err := pods.Delete(ctx, "s2", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(t, ctx, time.Minute, "s2 gone", func(ctx context.Context) (bool, error) {
			_, err := pods.Get(ctx, "s2", metav1.GetOptions{})
			return err != nil, nil
		})
		if got := instances(0); !slices.Equal(got, []string{"3g.20gb@4"}) {
			t.Fatalf("GPU 0's instances with the agent down: %v", got)
		}
		stop = start()
		waitInstances("s2's slice destroyed by the restarted agent", 0)
		waitInstances("the operator's slice kept", 1, "3g.20gb@4")
	})

	t.Run("a slice that cannot be made fails the pod's admission, leaving nothing", func(t *testing.T) {
		waitClassAllocatable(t, ctx, "the restarted agent's slices", nodeName, small, 2*11+1)
		dgx.FailMIGCreate(uuids[0], lib.ERROR_UNKNOWN)
		dgx.FailMIGCreate(uuids[1], lib.ERROR_UNKNOWN)
		create(gpuPodOn(ns, "f", resclassScheduler, nodeName, large, 1))
		msg := waitPodEvent(t, ctx, ns, "f", handoff.ReasonMIGSliceFailed, "could not be made")
		t.Logf("f: %s", msg)
		poll(t, ctx, time.Minute, "f failed admission", func(ctx context.Context) (bool, error) {
			p, err := pods.Get(ctx, "f", metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodFailed, err
		})
		if got := append(instances(0), instances(1)...); !slices.Equal(got, []string{"3g.20gb@4"}) {
			t.Errorf("instances after the failure: %v", got)
		}
	})
}

// migDGX is the DGX A100 mock and its sysfs root, GPUs 0 and 1
// A100-40GBs in MIG mode, GPU 1 with an operator's 3g.20gb at 4, and its
// GPUs' UUIDs.
func migDGX(t *testing.T) (*nvmlmock.Server, string, []string) {
	t.Helper()
	dgx, root := mockDGX(t)
	uuids := dgx.UUIDs()
	for _, id := range uuids[:2] {
		if err := dgx.EnableMIG(id, mig.A100_40GB); err != nil {
			t.Fatal(err)
		}
	}
	operatorSlice(t, dgx.Devices[1].(*dgxa100.Device))
	return dgx, root, uuids
}

// createMIGClass creates a class with createMIG that selects by exprs.
func createMIGClass(t *testing.T, ctx context.Context, name string, exprs ...v1alpha1.ResourceSelectorRequirement) {
	t.Helper()
	createClassSpec(t, ctx, name, v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: exprs}}, CreateMIG: true})
}

// operatorSlice makes a 3g.20gb at 4 on gpu, with its compute instance, as
// an operator with nvidia-smi would.
func operatorSlice(t *testing.T, gpu *dgxa100.Device) {
	t.Helper()
	info, ret := gpu.GetGpuInstanceProfileInfo(lib.GPU_INSTANCE_PROFILE_3_SLICE)
	if ret != lib.SUCCESS {
		t.Fatal(ret)
	}
	gi, ret := gpu.CreateGpuInstanceWithPlacement(&info, &lib.GpuInstancePlacement{Start: 4, Size: 4})
	if ret != lib.SUCCESS {
		t.Fatal(ret)
	}
	ci, ret := gi.GetComputeInstanceProfileInfo(lib.COMPUTE_INSTANCE_PROFILE_3_SLICE, lib.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != lib.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := gi.CreateComputeInstance(&ci); ret != lib.SUCCESS {
		t.Fatal(ret)
	}
}
