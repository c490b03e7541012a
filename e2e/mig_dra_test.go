package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/cdispec"
	"github.com/resclass/resclass/pkg/dra/dradevice"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/mig"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// TestMIGOnDemandDRA: MIG slices made on demand on a DRA node (docs/mig.md,
// "DRA nodes"), allocated by the stock scheduler's DynamicResources plugin,
// prepared by the node agent's DRA kubelet plugin on a real kubelet, the
// agent on the NVML mock. GPUs 0 and 1 are A100-40GBs in MIG mode, marked
// dynamic; GPU 1 has an operator's 3g.20gb at 4. It proves:
//
//   - each dynamic GPU publishes a counter set (the memory slices an
//     operator's instance takes at 0) and its potential slices consuming it;
//   - claims of two sizes are allocated the smallest profile their class
//     accepts, never over the operator's instance nor each other, and the
//     agent makes the slice at prepare: the container gets that MIG device;
//   - a pod deleted: its claim unprepared, its slice destroyed; the
//     operator's is never; a slice made survives the agent's restart while
//     its pod runs;
//   - a slice that cannot be made: a MIGSliceFailed Event on the pod, and
//     nothing is left on the GPU.
func TestMIGOnDemandDRA(t *testing.T) {
	ctx, cancel := agentTest(t, 5*time.Minute)
	defer cancel()
	const nodeName = "dra-mig-node"
	const (
		small = "e2e-dra-mig-10g" // at least 9G of a MIG slice: 1g.10gb
		large = "e2e-dra-mig-20g" // at least 19G: 3g.20gb
	)
	dgx, root, uuids := migDGX(t)
	migs := req("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindNvidiaMIG)
	createMIGClass(t, ctx, small, migs, req("memory", v1alpha1.ResourceSelectorOpGtEq, "9G"))
	createMIGClass(t, ctx, large, migs, req("memory", v1alpha1.ResourceSelectorOpGtEq, "19G"))
	deviceClass(t, ctx, small)
	deviceClass(t, ctx, large)

	kn, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: nodeName, Labels: map[string]string{
		v1alpha1.LabelDeviceMode: v1alpha1.DeviceModeDRA,
		v1alpha1.LabelGPUMIG:     v1alpha1.MIGLabelDynamic,
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNodes([]string{nodeName}) })
	cdiDir := t.TempDir()
	kubeletDir := filepath.Join(kn.Dir, "root")
	draCfg := nodeagent.DRAConfig{PluginDataDir: filepath.Join(kubeletDir, "plugins", dradevice.DriverName), RegistrationDir: filepath.Join(kubeletDir, "plugins_registry")}
	agent := startDRATestAgent(t, ctx, nodeName, kn, dgx, root, cdiDir, draCfg)
	t.Cleanup(func() { agent.stop() })

	// 25 potential slices per A100-40GB (7+7+4+3+2+1+1) and the operator's
	// MIG device; GPU 1's counters say slices 4-7 are taken.
	var published []resourceapi.ResourceSlice
	poll(t, ctx, time.Minute, "the potential slices published", func(ctx context.Context) (bool, error) {
		published = nodeSlices(t, ctx, nodeName)
		n := 0
		for id := range dradevice.IDs(published) {
			if _, _, _, ok := mig.ParseSliceID(id); ok {
				n++
			}
		}
		return n == 2*25, nil
	})
	counters := map[string]map[string]int64{}
	for _, s := range published {
		for _, set := range s.Spec.SharedCounters {
			counters[set.Name] = map[string]int64{}
			for name, c := range set.Counters {
				counters[set.Name][name] = c.Value.Value()
			}
		}
	}
	for gpu, taken := range map[string][]string{uuids[0]: nil, uuids[1]: {"slice-4", "slice-5", "slice-6", "slice-7"}} {
		set, ok := counters[dradevice.MIGCounterSet(gpu)]
		if !ok {
			t.Fatalf("no counter set for GPU %s: %v", gpu, counters)
		}
		for i := range mig.Slots {
			name := fmt.Sprintf("slice-%d", i)
			want := int64(1)
			if slices.Contains(taken, name) {
				want = 0
			}
			if set[name] != want {
				t.Errorf("GPU %s: counter %s is %d, want %d", gpu[:8], name, set[name], want)
			}
		}
	}

	ns := newNamespace(t, ctx, nil)
	pods := cluster.Client.CoreV1().Pods(ns)
	// allocated is the id of the one device the pod's claim was
	// allocated, and madeFor the MIG device its container got, checked
	// against the claim's CDI spec.
	allocated := func(pod string) string {
		t.Helper()
		ids := allocatedIDs(t, podClaim(t, ctx, ns, pod), published)
		if len(ids) != 1 {
			t.Fatalf("%s: allocated %v", pod, ids)
		}
		return ids[0]
	}
	madeFor := func(pod string) string {
		t.Helper()
		rec := waitRecord(t, ctx, kn, ns, pod, "main")
		var dev string
		for _, d := range rec.CDIDevices {
			if id, ok := strings.CutPrefix(d.GetName(), cdispec.DeviceName("")); ok {
				dev = id
			}
		}
		if !strings.HasPrefix(dev, "MIG-") {
			t.Fatalf("%s: CDI devices %v, no MIG device", pod, rec.CDIDevices)
		}
		if env := claimEnv(t, cdiDir, string(podClaim(t, ctx, ns, pod).UID)); env["NVIDIA_VISIBLE_DEVICES"] != dev {
			t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%s, want %s", pod, env["NVIDIA_VISIBLE_DEVICES"], dev)
		}
		return dev
	}
	instances := func() []string {
		var out []string
		for i, id := range uuids[:2] {
			for _, in := range dgx.MIGInstances(id) {
				out = append(out, fmt.Sprintf("%d:%s", i, in))
			}
		}
		slices.Sort(out)
		return out
	}
	waitInstances := func(what string, want ...string) {
		t.Helper()
		slices.Sort(want)
		poll(t, ctx, time.Minute, what, func(context.Context) (bool, error) { return slices.Equal(instances(), want), nil })
	}
	// place is how instances() names a slice.
	place := func(gpu, profile string, start int) string {
		return fmt.Sprintf("%d:%s@%d", slices.Index(uuids, gpu), profile, start)
	}

	var operators string // the operator's MIG device
	for _, d := range published {
		for id := range dradevice.IDs([]resourceapi.ResourceSlice{d}) {
			if strings.HasPrefix(id, "MIG-") {
				operators = id
			}
		}
	}
	var large1, small1 string // "<gpu>:<profile>@<start>"
	var madePod string        // the large pod whose slice was made
	t.Run("claims of two sizes get slices made at prepare", func(t *testing.T) {
		// The large class selects the operator's 3g.20gb too: of two
		// claims, one gets it, the other a 3g.20gb made beside it.
		claimPod(t, ctx, ns, "l1", nodeName, large, 1)
		claimPod(t, ctx, ns, "l2", nodeName, large, 1)
		podRunning(t, ctx, ns, "l1")
		podRunning(t, ctx, ns, "l2")
		var devs []string
		for _, pod := range []string{"l1", "l2"} {
			id := allocated(pod)
			d := madeFor(pod)
			devs = append(devs, d)
			if id == operators {
				if d != operators {
					t.Errorf("%s: allocated the operator's %s, given %s", pod, operators, d)
				}
				continue
			}
			gpu, profile, start, ok := mig.ParseSliceID(id)
			if !ok || profile != "3g.20gb" {
				t.Fatalf("%s: allocated %s, want the operator's MIG device or a potential 3g.20gb", pod, id)
			}
			large1, madePod = place(gpu, profile, start), pod
		}
		if large1 == "" || devs[0] == devs[1] {
			t.Fatalf("l1 and l2 given %v (allocated %s and %s): want the operator's and one made", devs, allocated("l1"), allocated("l2"))
		}

		// No existing device left: the small class's claim gets the
		// smallest profile of at least 9G, made.
		claimPod(t, ctx, ns, "s1", nodeName, small, 1)
		podRunning(t, ctx, ns, "s1")
		gpu, profile, start, ok := mig.ParseSliceID(allocated("s1"))
		if !ok || profile != "1g.10gb" {
			t.Fatalf("s1 allocated %s, want a potential 1g.10gb", allocated("s1"))
		}
		small1 = place(gpu, profile, start)
		if d := madeFor("s1"); slices.Contains(devs, d) {
			t.Errorf("s1 given %s, which l1 or l2 has", d)
		}
		// The mock refuses overlapping instances: all made is all apart.
		waitInstances("the two slices and the operator's", "1:3g.20gb@4", large1, small1)
		// The slices' MIG devices are their claims', not devices of their
		// own: the operator's is the only MIG device published.
		for id := range dradevice.IDs(nodeSlices(t, ctx, nodeName)) {
			if strings.HasPrefix(id, "MIG-") && id != operators {
				t.Errorf("MIG device %s published beside the operator's", id)
			}
		}
	})

	t.Run("a slice made survives the agent's restart", func(t *testing.T) {
		agent.stop()
		agent = startDRATestAgent(t, ctx, nodeName, kn, dgx, root, cdiDir, draCfg)
		time.Sleep(2 * time.Second) // several passes of the restarted agent, which must keep what the prepared claims hold
		if got, want := instances(), slices.Sorted(slices.Values([]string{"1:3g.20gb@4", large1, small1})); !slices.Equal(got, want) {
			t.Errorf("after the restart: instances %v, want %v", got, want)
		}
	})

	t.Run("a pod deleted: its slice destroyed, the operator's kept", func(t *testing.T) {
		if err := pods.Delete(ctx, madePod, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitInstances(madePod+"'s slice destroyed", "1:3g.20gb@4", small1)
	})

	t.Run("a slice that cannot be made: an Event on the pod, nothing left", func(t *testing.T) {
		dgx.FailMIGCreate(uuids[0], lib.ERROR_UNKNOWN)
		dgx.FailMIGCreate(uuids[1], lib.ERROR_UNKNOWN)
		// A 1g.10gb has room on GPU 1 whatever the allocator chose above,
		// even before the deleted pod's claim is deallocated.
		claimPod(t, ctx, ns, "f", nodeName, small, 1)
		msg := waitPodEvent(t, ctx, ns, "f", handoff.ReasonMIGSliceFailed, "could not be made")
		t.Logf("f: %s", msg)
		if got, want := instances(), slices.Sorted(slices.Values([]string{"1:3g.20gb@4", small1})); !slices.Equal(got, want) {
			t.Errorf("instances after the failure: %v, want %v", got, want)
		}
	})
}
