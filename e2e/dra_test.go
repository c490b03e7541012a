package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/cdispec"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/dra"
	"github.com/resclass/resclass/pkg/dra/dradevice"
	"github.com/resclass/resclass/pkg/draplugin"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/nodeagent"
)

const classDRA = "e2e-dra-gpu"

// TestDRANode runs a node in DRA mode beside a node in device-plugin mode, both
// real kubelets with the node agent on go-nvml's mock DGX A100: the DRA node's
// agent publishes its GPUs as ResourceSlices (and a NodeDevices without
// devices, no device-plugin endpoint), pods with ResourceClaims of the class's
// DeviceClass (kept by the scheduler, pkg/dra) are allocated there by the
// scheduler binary's stock DynamicResources plugin, the kubelet calls the
// agent's DRA plugin and the runtime records the GPUs of the allocation; on
// the device-plugin node the same class, asked as class.resclass.io/<class>,
// is served by the resclass plugin. No GPU is given twice; a failing GPU is
// tainted and shown in the pod's status; the agent's checkpoint survives its
// restart; unprepare follows pod deletion; the agent may write only its own
// node's slices; the node goes back to device-plugin mode.
func TestDRANode(t *testing.T) {
	ctx, cancel := agentTest(t, 4*time.Minute)
	defer cancel()
	schedClass(t, ctx, classDRA, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"), req("memory", v1alpha1.ResourceSelectorOpGtEq, "30G"))
	deviceClass(t, ctx, classDRA)

	const draNode, dpNode = "dra-node", "dp-node"
	dkn, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: draNode, Labels: map[string]string{v1alpha1.LabelDeviceMode: v1alpha1.DeviceModeDRA}})
	if err != nil {
		t.Fatal(err)
	}
	pkn, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: dpNode})
	if err != nil {
		t.Fatal(err)
	}
	draGPUs, draRoot := mockDGX(t)
	dpGPUs, dpRoot := mockDGX(t)
	cdiDir := t.TempDir()
	// The kubelet's --root-dir, where it watches plugins_registry (only its
	// device-plugin directory is the hard-coded /var/lib/kubelet one).
	kubeletDir := filepath.Join(dkn.Dir, "root")
	draCfg := nodeagent.DRAConfig{PluginDataDir: filepath.Join(kubeletDir, "plugins", dradevice.DriverName), RegistrationDir: filepath.Join(kubeletDir, "plugins_registry")}
	startAgent := func(name string, kn *framework.KubeletNode, gpus *nvmlmock.Server, root string) *draTestAgent {
		return startDRATestAgent(t, ctx, name, kn, gpus, root, cdiDir, draCfg)
	}
	draAgent := startAgent(draNode, dkn, draGPUs, draRoot)
	t.Cleanup(func() { draAgent.stop() })
	dpAgent := startAgent(dpNode, pkn, dpGPUs, dpRoot)
	t.Cleanup(func() { dpAgent.stop() })

	// The DRA node's inventory: its eight GPUs in ResourceSlices of driver
	// resclass.io, owned by the Node; no NodeDevices, no extended resource.
	uuids := draGPUs.UUIDs()
	var slices1 []resourceapi.ResourceSlice
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		slices1 = nodeSlices(t, ctx, draNode)
		return len(dradevice.IDs(slices1)) == len(uuids), nil
	})
	if err != nil {
		t.Fatalf("the DRA node's ResourceSlices never listed its %d GPUs: %v (have %v)", len(uuids), err, dradevice.IDs(slices1))
	}
	if got := slices.Sorted(maps.Keys(dradevice.IDs(slices1))); !slices.Equal(got, slices.Sorted(slices.Values(uuids))) {
		t.Errorf("ResourceSlices list %v, want %v", got, uuids)
	}
	for _, s := range slices1 {
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "Node" || s.OwnerReferences[0].Name != draNode {
			t.Errorf("ResourceSlice %s owned by %+v, want the Node", s.Name, s.OwnerReferences)
		}
	}
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, draNode, metav1.GetOptions{})
		return err == nil && len(nd.Status.Conditions) > 0 && len(nd.Status.Devices) == 0, nil
	})
	if err != nil {
		t.Errorf("the DRA node's NodeDevices never had its conditions and no device: %v", err)
	}
	waitAllocatable(t, ctx, dpNode, corev1.ResourceName(v1alpha1.ResourceNamePrefix+classDRA), 8)
	if n, _ := cluster.Client.CoreV1().Nodes().Get(ctx, draNode, metav1.GetOptions{}); n != nil {
		if q, ok := n.Status.Allocatable[corev1.ResourceName(v1alpha1.ResourceNamePrefix+classDRA)]; ok && !q.IsZero() {
			t.Errorf("the DRA node advertises %s=%s through a device plugin", classDRA, q.String())
		}
	}

	// Written only on change: polls every 200ms leave the slices alone.
	versions := resourceVersions(slices1)
	time.Sleep(2 * time.Second) // several poll and resync periods, to observe that nothing is written
	if got := resourceVersions(nodeSlices(t, ctx, draNode)); !maps.Equal(got, versions) {
		t.Errorf("ResourceSlices rewritten without a change: %v, then %v", versions, got)
	}

	// Pods asking for the class, all by the default scheduler (the resclass
	// scheduler binary's default profile, whose DynamicResources plugin is
	// upstream's): three on the DRA node in the ResourceClaim form (a claim
	// of two devices of the class's DeviceClass: the binary runs with
	// DRAExtendedResource off, docs/dra.md), one on the device-plugin node as
	// class.resclass.io/<class>: 2.
	ns := newNamespace(t, ctx, nil)
	for _, name := range []string{"dra-a", "dra-b", "dra-c"} {
		draClaimPod(t, ctx, ns, name, draNode, 2)
	}
	dpPod := schedPod(ns, "dp-a", "", map[string]int64{classDRA: 2}, nil)
	dpPod.Spec.SchedulerName = corev1.DefaultSchedulerName
	dpPod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: dpNode}
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, dpPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	given := map[string]string{}  // GPU -> pod
	claims := map[string]string{} // pod -> claim UID
	for _, pod := range []string{"dra-a", "dra-b", "dra-c"} {
		rec := waitRecord(t, ctx, dkn, ns, pod, "main")
		claim := podClaim(t, ctx, ns, pod)
		claims[pod] = string(claim.UID)
		allocated := allocatedIDs(t, claim, slices1)
		if len(allocated) != 2 {
			t.Fatalf("%s: claim %s allocated %v", pod, claim.Name, allocated)
		}
		// The runtime got the claim's CDI device and the GPUs' own CDI names.
		var cdi []string
		for _, d := range rec.CDIDevices {
			cdi = append(cdi, d.Name)
		}
		want := []string{cdispec.DeviceName(allocated[0]), cdispec.DeviceName(allocated[1])}
		for _, w := range want {
			if !slices.Contains(cdi, w) {
				t.Errorf("%s: CDI devices %v lack %s", pod, cdi, w)
			}
		}
		if !slices.ContainsFunc(cdi, func(n string) bool { return strings.HasPrefix(n, draplugin.CDIKind+"="+string(claim.UID)+"-") }) {
			t.Errorf("%s: CDI devices %v lack the claim's %s device", pod, cdi, draplugin.CDIKind)
		}
		// What the claim's CDI device puts into the container: the same
		// variables as the device-plugin path.
		env := claimEnv(t, cdiDir, string(claim.UID))
		if got := strings.Split(env["NVIDIA_VISIBLE_DEVICES"], ","); !sameSet(got, allocated) {
			t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%v, allocated %v", pod, got, allocated)
		}
		if got := strings.Split(env[handoff.ClassEnv(classDRA)], ","); !sameSet(got, allocated) {
			t.Errorf("%s: %s=%v, allocated %v", pod, handoff.ClassEnv(classDRA), got, allocated)
		}
		for _, id := range allocated {
			if other, dup := given[id]; dup {
				t.Errorf("GPU %s given to %s and %s", id, other, pod)
			}
			given[id] = pod
		}
	}
	// The agent's holder series name the pod of each prepared claim.
	wantHolders := func(pods ...string) map[string]bool {
		want := map[string]bool{}
		for _, pod := range pods {
			for _, id := range allocatedIDs(t, podClaim(t, ctx, ns, pod), slices1) {
				want[holderSeries(classDRA, id, ns, pod)] = true
			}
		}
		return want
	}
	waitHolders := func(what string, agent *nodeagent.Agent, want map[string]bool) {
		t.Helper()
		var got map[string]bool
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			got = agentHolders(t, agent)
			return maps.Equal(got, want), nil
		}); err != nil {
			t.Errorf("%s: the DRA node's holder series %v, want %v", what, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
		}
	}
	waitHolders("three claims prepared", draAgent.agent, wantHolders("dra-a", "dra-b", "dra-c"))
	rec := waitRecord(t, ctx, pkn, ns, "dp-a", "main")
	if got := strings.Split(rec.Env["NVIDIA_VISIBLE_DEVICES"], ","); len(got) != 2 || !strings.HasPrefix(got[0], "GPU-") {
		t.Errorf("dp-a on the device-plugin node: NVIDIA_VISIBLE_DEVICES=%v", got)
	}
	if got := rec.Env[handoff.ClassEnv(classDRA)]; got != rec.Env["NVIDIA_VISIBLE_DEVICES"] {
		t.Errorf("dp-a: %s=%q, NVIDIA_VISIBLE_DEVICES=%q", handoff.ClassEnv(classDRA), got, rec.Env["NVIDIA_VISIBLE_DEVICES"])
	}
	if p, _ := cluster.Client.CoreV1().Pods(ns).Get(ctx, "dp-a", metav1.GetOptions{}); p == nil || p.Annotations["resclass.io/assignment"] == "" {
		t.Error("dp-a was not placed by the resclass plugin (no assignment)")
	}

	// The ResourceClaim form: a claim of one GPU of the class's DeviceClass,
	// used by the container by name. Its GPU fails: the slice device is
	// tainted (no new claim gets it) and the kubelet, through the plugin's
	// health stream, shows it in the pod's status (the kubelet reports health
	// for containers' resources.claims only, not the extended-resource form).
	claimObj := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "one-gpu", Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: classDRA}},
		}}},
	}
	if _, err := cluster.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claimObj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claimPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "dra-claim", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeSelector:   map[string]string{corev1.LabelHostname: draNode},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptrTo("one-gpu")}},
			Containers: []corev1.Container{{Name: "main", Image: "registry.example/cuda:12", Resources: corev1.ResourceRequirements{
				Claims: []corev1.ResourceClaim{{Name: "gpu"}},
			}}},
		},
	}
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, claimPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec = waitRecord(t, ctx, dkn, ns, "dra-claim", "main")
	claimObj, err = cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, "one-gpu", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sickIDs := allocatedIDs(t, claimObj, slices1)
	if len(sickIDs) != 1 {
		t.Fatalf("claim one-gpu allocated %v", sickIDs)
	}
	sick := sickIDs[0]
	if other, dup := given[sick]; dup {
		t.Errorf("GPU %s given to %s and dra-claim", sick, other)
	}
	if !slices.ContainsFunc(rec.CDIDevices, func(d *runtimeapi.CDIDevice) bool { return d.Name == cdispec.DeviceName(sick) }) {
		t.Errorf("dra-claim: CDI devices %v lack %s", rec.CDIDevices, cdispec.DeviceName(sick))
	}
	if env := claimEnv(t, cdiDir, string(claimObj.UID)); env[handoff.ClassEnv(classDRA)] != sick {
		t.Errorf("dra-claim: %s=%q, want %s", handoff.ClassEnv(classDRA), env[handoff.ClassEnv(classDRA)], sick)
	}
	draGPUs.InjectXID(sick, 79)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, s := range nodeSlices(t, ctx, draNode) {
			for _, d := range s.Spec.Devices {
				if id, _ := dradevice.ID(&d); id == sick && len(d.Taints) == 1 && d.Taints[0].Key == dradevice.TaintUnhealthy && d.Taints[0].Effect == resourceapi.DeviceTaintEffectNoSchedule {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("the failed GPU %s was never tainted in its ResourceSlice: %v", sick, err)
	}
	// The GPU keeps failing (each XID restarts the agent's 2s recovery
	// wait) until the kubelet's status sync has shown it; the kubelet names
	// the device by its first CDI device, the claim's.
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		draGPUs.InjectXID(sick, 79)
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "dra-claim", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cs := range p.Status.ContainerStatuses {
			for _, rs := range cs.AllocatedResourcesStatus {
				for _, h := range rs.Resources {
					if rs.Name == "claim:gpu" && h.Health == corev1.ResourceHealthStatusUnhealthy && strings.HasPrefix(string(h.ResourceID), draplugin.CDIKind+"="+string(claimObj.UID)) {
						return true, nil
					}
				}
			}
		}
		return false, nil
	})
	if err != nil {
		p, _ := cluster.Client.CoreV1().Pods(ns).Get(ctx, "dra-claim", metav1.GetOptions{})
		t.Errorf("dra-claim's status never showed its GPU %s unhealthy: %v (container statuses %+v)", sick, err, p.Status.ContainerStatuses)
	}
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, "dra-claim", metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(filepath.Join(cdiDir, draplugin.CDIVendor+"-"+draplugin.CDIClass+"_"+string(claimObj.UID)+".json"))
		return os.IsNotExist(err), nil
	})
	if err != nil {
		t.Errorf("dra-claim's claim was never unprepared: %v", err)
	}

	// The agent restarts: its checkpoint holds the three claims.
	draAgent.stop()
	draAgent = startAgent(draNode, dkn, draGPUs, draRoot)
	cp, err := draplugin.LoadCheckpoint(filepath.Join(draCfg.PluginDataDir, draplugin.CheckpointFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(cp.Claims) != 3 {
		t.Errorf("checkpoint after the restart holds %d claims, want 3", len(cp.Claims))
	}
	waitHolders("after the agent's restart", draAgent.agent, wantHolders("dra-a", "dra-b", "dra-c"))
	// A fourth pod takes the last two GPUs; a fifth finds none and waits.
	for _, name := range []string{"dra-d", "dra-e"} {
		draClaimPod(t, ctx, ns, name, draNode, 2)
	}
	waitRecord(t, ctx, dkn, ns, "dra-d", "main")
	for _, id := range allocatedIDs(t, podClaim(t, ctx, ns, "dra-d"), slices1) {
		if other, dup := given[id]; dup {
			t.Errorf("GPU %s given to %s and dra-d", id, other)
		}
		given[id] = "dra-d"
	}
	waitUnschedulable(t, ctx, ns, "dra-e")

	// Deleting a pod unprepares its claim: the spec goes, the checkpoint
	// forgets it, and dra-e gets the GPUs.
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, "dra-a", metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Client.ResourceV1().ResourceClaims(ns).Delete(ctx, "dra-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(filepath.Join(cdiDir, draplugin.CDIVendor+"-"+draplugin.CDIClass+"_"+claims["dra-a"]+".json"))
		return os.IsNotExist(err), nil
	})
	if err != nil {
		t.Errorf("dra-a's claim was never unprepared: %v", err)
	}
	waitRecord(t, ctx, dkn, ns, "dra-e", "main")
	waitHolders("dra-a's claim unprepared, dra-e's prepared", draAgent.agent, wantHolders("dra-b", "dra-c", "dra-d", "dra-e"))
	// Counted: five claims prepared (three before the restart, which the
	// restarted agent's counter does not hold), one unprepared.
	if got := draClaims(t, draAgent.agent, "prepare", "prepared"); got < 2 {
		t.Errorf("the restarted agent counted %v prepared claims, want at least 2 (dra-d, dra-e)", got)
	}
	if got := draClaims(t, draAgent.agent, "unprepare", "unprepared"); got < 1 {
		t.Errorf("the agent counted %v unprepared claims, want at least 1 (dra-a)", got)
	}

	// The agent may write only its own node's slices of its driver.
	_, akc := agentClients(t, draNode)
	foreign := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"},
		Spec:       resourceapi.ResourceSliceSpec{Driver: dradevice.DriverName, NodeName: ptrTo(dpNode), Pool: resourceapi.ResourcePool{Name: dpNode, ResourceSliceCount: 1}},
	}
	if _, err := akc.ResourceV1().ResourceSlices().Create(ctx, foreign, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "its own node") {
		t.Errorf("the DRA node's agent creating a slice of %s: %v, want Forbidden", dpNode, err)
	}
	otherDriver := foreign.DeepCopy()
	otherDriver.Spec.Driver, otherDriver.Spec.NodeName, otherDriver.Spec.Pool.Name = "gpu.nvidia.com", ptrTo(draNode), draNode
	if _, err := akc.ResourceV1().ResourceSlices().Create(ctx, otherDriver, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent creating a slice of another driver: %v, want Forbidden", err)
	}

	// Back to device-plugin mode, drained first: the agent sees the label,
	// records it and stops; started again, it deletes its slices, publishes
	// NodeDevices and serves the class through a device plugin.
	for _, p := range []string{"dra-b", "dra-c", "dra-d", "dra-e"} {
		if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, p, metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))}); err != nil {
			t.Fatal(err)
		}
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		cp, err := draplugin.LoadCheckpoint(filepath.Join(draCfg.PluginDataDir, draplugin.CheckpointFile))
		return err == nil && len(cp.Claims) == 0, nil
	})
	if err != nil {
		t.Fatalf("the drained node's claims were never all unprepared: %v", err)
	}
	patch := []byte(`{"metadata":{"labels":{"` + v1alpha1.LabelDeviceMode + `":"` + v1alpha1.DeviceModeDevicePlugin + `"}}}`)
	if _, err := cluster.Client.CoreV1().Nodes().Patch(ctx, draNode, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-draAgent.done:
		if !errors.Is(draAgent.err, nodeagent.ErrModeChanged) {
			t.Errorf("the agent stopped with %v, want %v", draAgent.err, nodeagent.ErrModeChanged)
		}
	case <-ctx.Done():
		t.Fatal("the agent went on serving DRA after the mode label changed")
	}
	waitEventOn(t, ctx, metav1.NamespaceAll, "Node", draNode, "DeviceModeChanged", "device-plugin")
	draAgent = startAgent(draNode, dkn, draGPUs, draRoot)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		return len(nodeSlices(t, ctx, draNode)) == 0, nil
	})
	if err != nil {
		t.Errorf("the ResourceSlices of a node back in device-plugin mode were not deleted: %v", err)
	}
	waitAllocatable(t, ctx, draNode, corev1.ResourceName(v1alpha1.ResourceNamePrefix+classDRA), 8)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, draNode, metav1.GetOptions{})
		return err == nil && len(nd.Status.Devices) == len(uuids), nil
	})
	if err != nil {
		t.Errorf("the node back in device-plugin mode does not publish its GPUs in NodeDevices: %v", err)
	}
}

// draTestAgent is a running node agent of a DRA test: stop ends it, and done
// is closed, with err set, when its Run returns on its own.
type draTestAgent struct {
	agent *nodeagent.Agent
	stop  func()
	done  chan struct{}
	err   error
}

// startDRATestAgent runs node name's agent on go-nvml's mock gpus (host root
// root), with the envvar and cdi-cri strategies, CDI specs in cdiDir and, in
// DRA mode, the kubelet plugin's sockets as draCfg says.
func startDRATestAgent(t *testing.T, ctx context.Context, name string, kn *framework.KubeletNode, gpus *nvmlmock.Server, root, cdiDir string, draCfg nodeagent.DRAConfig) *draTestAgent {
	t.Helper()
	arc, akc := agentClients(t, name)
	cfg := nodeagent.Config{
		NodeName: name, HostRoot: root,
		PollInterval: 200 * time.Millisecond, ResyncInterval: 2 * time.Second,
		PluginDir: kn.PluginDir(), WaitForPod: 2 * time.Second,
		DeviceListStrategies: handoff.Strategies{handoff.StrategyEnvVar, handoff.StrategyCDICRI}, CDISpecDir: cdiDir,
		DRA: draCfg,
	}
	cfg.Kinds = kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{
		Binding: gpus,
		Health:  nvml.HealthOptions{RecoveryAfter: 2 * time.Second, WaitTimeout: 100 * time.Millisecond},
	}})
	r := &draTestAgent{agent: nodeagent.New(cfg, arc, akc), done: make(chan struct{})}
	actx, cancel := context.WithCancel(ctx)
	go func() {
		defer close(r.done)
		r.err = r.agent.Run(actx)
	}()
	r.stop = func() {
		cancel()
		<-r.done
		if r.err != nil && !errors.Is(r.err, nodeagent.ErrModeChanged) {
			t.Errorf("agent on %s: %v", name, r.err)
		}
	}
	return r
}

// deviceClass waits for the DeviceClass of ResourceClass class, which the
// resclass scheduler's class-status leader keeps (pkg/dra), and checks that it
// is pkg/dra's translation of the class.
func deviceClass(t testing.TB, ctx context.Context, class string) {
	t.Helper()
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	obj, err := rc.ResclassV1alpha1().ResourceClasses().Get(ctx, class, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := dra.DeviceClass(obj)
	if err != nil {
		t.Fatal(err)
	}
	var got *resourceapi.DeviceClass
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err = cluster.Client.ResourceV1().DeviceClasses().Get(ctx, class, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the scheduler never created the DeviceClass of %s: %v", class, err)
	}
	if got.Spec.ExtendedResourceName == nil || *got.Spec.ExtendedResourceName != *want.Spec.ExtendedResourceName ||
		len(got.Spec.Selectors) != 1 || got.Spec.Selectors[0].CEL == nil || got.Spec.Selectors[0].CEL.Expression != want.Spec.Selectors[0].CEL.Expression {
		t.Fatalf("DeviceClass %s is %+v, want pkg/dra's translation %+v", class, got.Spec, want.Spec)
	}
}

func nodeSlices(t *testing.T, ctx context.Context, node string) []resourceapi.ResourceSlice {
	t.Helper()
	list, err := cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, node).String()})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func resourceVersions(list []resourceapi.ResourceSlice) map[string]string {
	out := map[string]string{}
	for _, s := range list {
		out[s.Name] = s.ResourceVersion
	}
	return out
}

// draClaimPod creates the ResourceClaim name, of count devices of the
// class's DeviceClass, and the pod name using it, pinned to node.
func draClaimPod(t *testing.T, ctx context.Context, ns, name, node string, count int64) {
	t.Helper()
	claimPod(t, ctx, ns, name, node, classDRA, count)
}

// claimPod creates the ResourceClaim name, of count devices of class's
// DeviceClass, and the pod name using it, pinned to node, for the default
// scheduler.
func claimPod(t *testing.T, ctx context.Context, ns, name, node, class string, count int64) {
	t.Helper()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name:    "gpus",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count},
		}}}},
	}
	if _, err := cluster.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeSelector:   map[string]string{corev1.LabelHostname: node},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptrTo(name)}},
			Containers: []corev1.Container{{Name: "main", Image: "registry.example/train:1", Resources: corev1.ResourceRequirements{
				Claims: []corev1.ResourceClaim{{Name: "gpus"}},
			}}},
		},
	}
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// podClaim is the pod's ResourceClaim (draClaimPod names it after the pod).
func podClaim(t *testing.T, ctx context.Context, ns, pod string) *resourceapi.ResourceClaim {
	t.Helper()
	c, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// allocatedIDs are the resclass ids of the claim's devices.
func allocatedIDs(t *testing.T, c *resourceapi.ResourceClaim, list []resourceapi.ResourceSlice) []string {
	t.Helper()
	byName := map[string]string{}
	for id, name := range dradevice.IDs(list) {
		byName[name] = id
	}
	if c.Status.Allocation == nil {
		t.Fatalf("claim %s is not allocated", c.Name)
	}
	var out []string
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == dradevice.DriverName {
			out = append(out, byName[r.Device])
		}
	}
	return out
}

// claimEnv is the environment the claim's CDI spec gives a container.
func claimEnv(t *testing.T, dir, uid string) map[string]string {
	t.Helper()
	blob, err := os.ReadFile(filepath.Join(dir, draplugin.CDIVendor+"-"+draplugin.CDIClass+"_"+uid+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(blob, &s); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range s.Devices {
		for _, kv := range d.ContainerEdits.Env {
			k, v, _ := strings.Cut(kv, "=")
			out[k] = v
		}
	}
	return out
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

func waitAllocatable(t *testing.T, ctx context.Context, node string, res corev1.ResourceName, want int64) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		q := n.Status.Allocatable[res]
		return q.Value() == want, nil
	})
	if err != nil {
		t.Fatalf("%s: allocatable %s never became %d: %v", node, res, want, err)
	}
}

func waitUnschedulable(t *testing.T, ctx context.Context, ns, pod string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return p.Spec.NodeName == "", nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%s never reported Unschedulable: %v", pod, err)
	}
}

// draClaims is the agent's resclass_node_agent_dra_claims_total for operation
// and outcome.
func draClaims(t *testing.T, agent *nodeagent.Agent, operation, outcome string) float64 {
	t.Helper()
	families, err := agent.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "resclass_node_agent_dra_claims_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["operation"] == operation && labels["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
