package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/e2e/framework/cri"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/dra/dradevice"
	"github.com/resclass/resclass/pkg/draplugin"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// TestDRAExtendedResourceForm serves one class, asked for the same way
// (limits: class.resclass.io/<class>: N), on both kinds of node of a mixed
// cluster, by the two schedulers an operator runs (docs/dra.md, "Which
// scheduler serves which pods"):
//
//   - a DRA-mode node (real kubelet, agent on go-nvml's mock DGX A100), served
//     by the stock profile of deploy/scheduler/dra/config.yaml (upstream
//     plugins, DRAExtendedResource on): DynamicResources makes the pod's claim
//     from the class's DeviceClass, the kubelet calls the agent's DRA plugin,
//     and the runtime gets the claim's CDI devices;
//   - a device-plugin-mode node beside it, served by the resclass scheduler.
//
// Both nodes carry the pods' node selector and the device-plugin node has free
// GPUs and advertises the class, yet the stock profile never places a pod there:
// once the DRA node is full, its next pod waits. A container asking for two
// classes sees the GPUs of both in NVIDIA_VISIBLE_DEVICES once the runtime has
// applied the CDI devices in the order the kubelet sent them. No GPU is given
// twice. The resclass scheduler never places a class request on the DRA node.
func TestDRAExtendedResourceForm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	diagnoseOnFailure(t, cluster)
	if err := cluster.StartDRAScheduler(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.ApplyManifest(ctx, "../deploy/node-agent/rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	const big, anyGPU = "e2e-dra-ext-big", "e2e-dra-ext-any"
	schedClass(t, ctx, big, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"), req("memory", v1alpha1.ResourceSelectorOpGtEq, "30G"))
	schedClass(t, ctx, anyGPU, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"))
	deviceClass(t, ctx, big)
	deviceClass(t, ctx, anyGPU)

	const draNode, dpNode, pool = "dra-ext-node", "dp-ext-node", "dra-ext"
	dkn, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: draNode, Labels: map[string]string{v1alpha1.LabelDeviceMode: v1alpha1.DeviceModeDRA, "pool": pool}})
	if err != nil {
		t.Fatal(err)
	}
	pkn, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: dpNode, Labels: map[string]string{"pool": pool}})
	if err != nil {
		t.Fatal(err)
	}
	draGPUs, draRoot := mockDGX(t)
	dpGPUs, dpRoot := mockDGX(t)
	cdiDir := t.TempDir()
	kubeletDir := filepath.Join(dkn.Dir, "root")
	draCfg := nodeagent.DRAConfig{PluginDataDir: filepath.Join(kubeletDir, "plugins", dradevice.DriverName), RegistrationDir: filepath.Join(kubeletDir, "plugins_registry")}
	draAgent := startDRATestAgent(t, ctx, draNode, dkn, draGPUs, draRoot, cdiDir, draCfg)
	t.Cleanup(func() { draAgent.stop() })
	dpAgent := startDRATestAgent(t, ctx, dpNode, pkn, dpGPUs, dpRoot, t.TempDir(), nodeagent.DRAConfig{})
	t.Cleanup(func() { dpAgent.stop() })

	var slices1 []resourceapi.ResourceSlice
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		slices1 = nodeSlices(t, ctx, draNode)
		return len(dradevice.IDs(slices1)) == len(draGPUs.UUIDs()), nil
	})
	if err != nil {
		t.Fatalf("the DRA node's ResourceSlices never listed its GPUs: %v", err)
	}
	waitAllocatable(t, ctx, dpNode, corev1.ResourceName(v1alpha1.ResourceNamePrefix+big), 8)

	// The same pod spec, but for the scheduler's name, on both paths.
	ns := newNamespace(t, ctx, nil)
	create := func(name, scheduler string, classes map[string]int64) {
		t.Helper()
		p := schedPod(ns, name, pool, classes, nil)
		p.Spec.SchedulerName = scheduler
		if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"ext-a", "ext-b", "ext-c"} {
		create(name, framework.DRASchedulerName, map[string]int64{big: 2})
	}
	create("ext-two", framework.DRASchedulerName, map[string]int64{big: 1, anyGPU: 1})
	for _, name := range []string{"dp-x", "dp-y"} {
		create(name, resclassScheduler, map[string]int64{big: 2})
	}

	given := map[string]string{} // GPU -> pod, on the DRA node
	for _, name := range []string{"ext-a", "ext-b", "ext-c", "ext-two"} {
		rec := waitRecord(t, ctx, dkn, ns, name, "main")
		pod, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Spec.NodeName != draNode || pod.Annotations["resclass.io/assignment"] != "" {
			t.Errorf("%s: on %q with assignment %q, want the DRA node and none", name, pod.Spec.NodeName, pod.Annotations["resclass.io/assignment"])
		}
		st := pod.Status.ExtendedResourceClaimStatus
		if st == nil {
			t.Fatalf("%s: no extendedResourceClaimStatus: the stock scheduler did not serve the class through DRA", name)
		}
		claim, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, st.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		allocated := allocatedIDs(t, claim, slices1)
		if len(allocated) != 2 {
			t.Fatalf("%s: claim %s allocated %v, want 2 GPUs", name, claim.Name, allocated)
		}
		for _, id := range allocated {
			if other, dup := given[id]; dup {
				t.Errorf("GPU %s given to %s and %s", id, other, name)
			}
			given[id] = name
		}
		// What the runtime applies: the claim's CDI devices, in the order
		// the kubelet sent them, resolved by the CDI library as containerd
		// and CRI-O do.
		env := injectClaimEnv(t, cdiDir, rec)
		t.Logf("%s: claim %s allocated %v; CDI devices %d; NVIDIA_VISIBLE_DEVICES=%s", name, claim.Name, allocated, len(rec.CDIDevices), env["NVIDIA_VISIBLE_DEVICES"])
		if got := strings.Split(env["NVIDIA_VISIBLE_DEVICES"], ","); !sameSet(got, allocated) {
			t.Errorf("%s: the container would see NVIDIA_VISIBLE_DEVICES=%v, allocated %v", name, got, allocated)
		}
		// Per class, the GPUs of that class's request.
		for _, m := range st.RequestMappings {
			class := strings.TrimPrefix(m.ResourceName, v1alpha1.ResourceNamePrefix)
			var want []string
			for _, r := range claim.Status.Allocation.Devices.Results {
				if r.Request == m.RequestName {
					want = append(want, byDRAName(slices1)[r.Device])
				}
			}
			if got := strings.Split(env[handoff.ClassEnv(class)], ","); !sameSet(got, want) {
				t.Errorf("%s: %s=%v, the request %s of %s has %v", name, handoff.ClassEnv(class), got, m.RequestName, class, want)
			}
		}
	}
	for _, name := range []string{"dp-x", "dp-y"} {
		rec := waitRecord(t, ctx, pkn, ns, name, "main")
		if got := strings.Split(rec.Env["NVIDIA_VISIBLE_DEVICES"], ","); len(got) != 2 || !strings.HasPrefix(got[0], "GPU-") {
			t.Errorf("%s on the device-plugin node: NVIDIA_VISIBLE_DEVICES=%v", name, got)
		}
		if p, _ := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); p == nil || p.Annotations["resclass.io/assignment"] == "" || p.Spec.NodeName != dpNode {
			t.Errorf("%s was not placed on %s by the resclass plugin", name, dpNode)
		}
	}
	// The device-plugin node has four GPUs left: six wait, as the resclass
	// scheduler (DRAExtendedResource off) refuses the DRA node to a class
	// request, where nothing would allocate it.
	create("dp-z", resclassScheduler, map[string]int64{big: 6})
	waitUnschedulable(t, ctx, ns, "dp-z")
	t.Log("dp-z (6 GPUs, resclass scheduler) waits: the device-plugin node has 4 left and the DRA node is refused")
	// The DRA node is full; the device-plugin node has four free GPUs and
	// advertises the class, but the stock profile may not place pods there.
	create("ext-e", framework.DRASchedulerName, map[string]int64{big: 1})
	waitUnschedulable(t, ctx, ns, "ext-e")
	t.Log("ext-e (stock profile) waits: the DRA node is full, the device-plugin node is not its to use")
	if got := draClaims(t, draAgent.agent, "prepare", "prepared"); got != 4 {
		t.Errorf("the DRA node's agent counted %v prepared claims, want 4", got)
	}
	// A pod gone, its claim is unprepared and the waiting pod gets its GPUs.
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, "ext-a", metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))}); err != nil {
		t.Fatal(err)
	}
	waitRecord(t, ctx, dkn, ns, "ext-e", "main")
}

// byDRAName maps the slices' DRA device names to resclass ids.
func byDRAName(list []resourceapi.ResourceSlice) map[string]string {
	out := map[string]string{}
	for id, name := range dradevice.IDs(list) {
		out[name] = id
	}
	return out
}

// injectClaimEnv is the environment the container of rec ends up with from the
// agent's claim CDI devices, applied in the order of the record by the CDI
// library (a later device's variable replaces an earlier one's, as in every
// CDI runtime).
func injectClaimEnv(t *testing.T, dir string, rec cri.Record) map[string]string {
	t.Helper()
	var names []string
	for _, d := range rec.CDIDevices {
		if strings.HasPrefix(d.Name, draplugin.CDIKind+"=") {
			names = append(names, d.Name)
		}
	}
	if len(names) == 0 {
		t.Fatalf("the runtime got no %s CDI device: %v", draplugin.CDIKind, rec.CDIDevices)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}}
	if unresolved, err := cache.InjectDevices(spec, names...); err != nil {
		t.Fatalf("the runtime would refuse the container: %v (unresolved %v; spec errors %v)", err, unresolved, cache.GetErrors())
	}
	out := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}
