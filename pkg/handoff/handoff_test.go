package handoff

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/checkpoint"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/devicekind/hugepages"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nic"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
)

const node = "gpu-node-1"

func gpu(id string, minor int64) v1alpha1.Device {
	return v1alpha1.Device{ID: id, Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeMinor: v1alpha1.IntAttribute(minor),
	}}
}

func inventory() []v1alpha1.Device {
	pool := v1alpha1.Device{ID: "hugepages-1Gi-numa0", Kind: v1alpha1.DeviceKindHugePages, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeSize:     {QuantityValue: ptr(resource.MustParse("1Gi"))},
		v1alpha1.AttributeNUMANode: v1alpha1.IntAttribute(0),
	}}
	nic := v1alpha1.Device{ID: "0000:3b:00.0", Kind: v1alpha1.DeviceKindNIC, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeInterface: v1alpha1.StringAttribute("ens1f0"),
		v1alpha1.AttributeDriver:    v1alpha1.StringAttribute("mlx5_core"),
	}}
	return []v1alpha1.Device{gpu("GPU-0", 0), gpu("GPU-1", 1), gpu("GPU-2", 2), gpu("GPU-3", 3), pool, nic}
}

func ptr[T any](v T) *T { return &v }

type fixture struct {
	t        testing.TB
	ctx      context.Context
	kube     *fake.Clientset
	alloc    *Allocator
	recorder *record.FakeRecorder
	metrics  *Metrics
	registry *prometheus.Registry
}

func newFixture(t testing.TB, pods ...*corev1.Pod) *fixture {
	t.Helper()
	return newFixtureWaiting(t, 300*time.Millisecond, pods...)
}

func newFixtureWaiting(t testing.TB, wait time.Duration, pods ...*corev1.Pod) *fixture {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	f := &fixture{t: t, ctx: ctx, recorder: record.NewFakeRecorder(100), registry: prometheus.NewRegistry()}
	f.metrics = NewMetrics(f.registry)
	f.kube = fake.NewClientset()
	for _, p := range pods {
		if _, err := f.kube.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	factory := NodePods(f.kube, node)
	f.alloc = New(Config{Node: node, HostRoot: t.TempDir(), PoolSlots: 4, WaitForPod: wait, Recorder: f.recorder, Metrics: f.metrics}, factory.Core().V1().Pods().Informer())
	factory.Start(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() }) // the informer stops with ctx
	f.alloc.SetDevices(inventory())
	go func() { _ = f.alloc.Run(ctx, "") }()
	for !f.alloc.HasSynced() {
		time.Sleep(5 * time.Millisecond)
	}
	return f
}

// podSpec is a pod bound to node whose containers (name -> class -> ids) were
// assigned those devices; init containers are named init-*.
var podAge int

func pod(name string, containers map[string]map[string][]string) *corev1.Pod {
	podAge++
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "ml", UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, podAge, 0, 0, time.UTC)),
		},
		Spec:   corev1.PodSpec{NodeName: node, SchedulerName: "resclass-scheduler"},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	a := &assignment.Assignment{Node: node}
	names := make([]string, 0, len(containers))
	for n := range containers {
		names = append(names, n)
	}
	slices.Sort(names) // init-* first
	for _, n := range names {
		limits := corev1.ResourceList{}
		for class, ids := range containers[n] {
			limits[corev1.ResourceName(v1alpha1.ResourceNamePrefix+class)] = *resource.NewQuantity(int64(len(ids)), resource.DecimalSI)
		}
		c := corev1.Container{Name: n, Resources: corev1.ResourceRequirements{Limits: limits}}
		init := strings.HasPrefix(n, "init-")
		if init {
			p.Spec.InitContainers = append(p.Spec.InitContainers, c)
		} else {
			p.Spec.Containers = append(p.Spec.Containers, c)
		}
		if containers[n] != nil {
			a.Containers = append(a.Containers, assignment.Container{Name: n, Init: init, Classes: containers[n]})
		}
	}
	if len(a.Containers) > 0 {
		s, err := assignment.Encode(a)
		if err != nil {
			panic(err)
		}
		p.Annotations = map[string]string{assignment.AnnotationKey: s}
	}
	return p
}

const highMem = v1alpha1.ResourceNamePrefix + "nvidia.high.mem"

func (f *fixture) allocate(resource string, ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	return f.alloc.Allocate(f.ctx, resource, ids)
}

func (f *fixture) preferred(resource string, size int, available []string, must ...string) []string {
	return f.alloc.Preferred(f.ctx, resource, &pluginapi.ContainerPreferredAllocationRequest{
		AvailableDeviceIDs: available, MustIncludeDeviceIDs: must, AllocationSize: int32(size),
	})
}

func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestAllocateGivesTheScheduledPodItsDevices(t *testing.T) {
	a := pod("a", map[string]map[string][]string{"train": {"nvidia.high.mem": {"GPU-0", "GPU-1"}}})
	b := pod("b", map[string]map[string][]string{"train": {"nvidia.high.mem": {"GPU-3", "GPU-2"}}})
	f := newFixture(t, a, b)
	all := []string{"GPU-0", "GPU-1", "GPU-2", "GPU-3"}

	// The kubelet admits a first: the preference is a's devices.
	if got := f.preferred(highMem, 2, all); !slices.Equal(got, []string{"GPU-0", "GPU-1"}) {
		t.Fatalf("preferred for the first pod: %v", got)
	}
	resp, err := f.allocate(highMem, "GPU-1", "GPU-0") // any order
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Envs["RESCLASS_DEVICES_NVIDIA_HIGH_MEM"]; got != "GPU-0,GPU-1" {
		t.Errorf("class env %q", got)
	}
	// The default strategy, cdi-cri: the CDI names in the CRI field, and no
	// NVIDIA_VISIBLE_DEVICES or device nodes (the spec has them; a hardened
	// runtime would ignore the variable).
	var names []string
	for _, d := range resp.CdiDevices {
		names = append(names, d.Name)
	}
	if !slices.Equal(names, []string{"resclass.io/gpu=GPU-0", "resclass.io/gpu=GPU-1"}) || len(resp.Annotations) != 0 {
		t.Errorf("default strategy: CDI devices %v, annotations %v; want the two GPUs' CDI names", resp.CdiDevices, resp.Annotations)
	}
	if _, ok := resp.Envs[nvidiagpu.EnvVisibleDevices]; ok || len(resp.Devices) != 0 {
		t.Errorf("default strategy: env %v, device nodes %v; want neither NVIDIA_VISIBLE_DEVICES nor device nodes", resp.Envs, resp.Devices)
	}

	// Then b: a's devices are no longer available, and a is allocated.
	if got := f.preferred(highMem, 2, []string{"GPU-2", "GPU-3"}); !slices.Equal(got, []string{"GPU-3", "GPU-2"}) {
		t.Fatalf("preferred for the second pod: %v", got)
	}
	if _, err := f.allocate(highMem, "GPU-2", "GPU-3"); err != nil {
		t.Fatal(err)
	}
	recs := f.alloc.Allocations()
	if len(recs) != 2 || recs[0].Name != "a" || recs[1].Name != "b" || recs[1].Refused {
		t.Errorf("allocations %+v", recs)
	}
	if n := testutil.ToFloat64(f.metrics.outcomes.WithLabelValues("nvidia.high.mem", "allocated")); n != 2 {
		t.Errorf("allocated count %v", n)
	}
	if ev := f.events(); len(ev) != 0 {
		t.Errorf("events on a clean hand-off: %v", ev)
	}
}

func TestAllocateRefusesWhatTheSchedulerDidNotAssign(t *testing.T) {
	a := pod("a", map[string]map[string][]string{"train": {"nvidia.high.mem": {"GPU-0", "GPU-1"}}})
	f := newFixture(t, a)
	// The kubelet ignored the preference.
	_, err := f.allocate(highMem, "GPU-1", "GPU-2")
	if err == nil || !strings.Contains(err.Error(), "the resclass scheduler assigned [GPU-0 GPU-1]") {
		t.Fatalf("error %v", err)
	}
	ev := f.events()
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+ReasonMismatch) || !strings.Contains(ev[0], `container "train"`) {
		t.Errorf("events %v", ev)
	}
	if n := testutil.ToFloat64(f.metrics.outcomes.WithLabelValues("nvidia.high.mem", "mismatch")); n != 1 {
		t.Errorf("mismatch count %v", n)
	}
	// The refusal did not count as an allocation: the right ids still work.
	if _, err := f.allocate(highMem, "GPU-0", "GPU-1"); err != nil {
		t.Errorf("the assigned devices after a refusal: %v", err)
	}
	recs := f.alloc.Allocations()
	if len(recs) != 2 || !slices.ContainsFunc(recs, func(r Record) bool { return r.Refused }) {
		t.Errorf("allocations %+v", recs)
	}
}

func TestPodWithoutAssignmentIsRefused(t *testing.T) {
	other := pod("other-scheduler", map[string]map[string][]string{"main": nil})
	other.Spec.Containers[0].Resources.Limits = corev1.ResourceList{highMem: resource.MustParse("1")}
	other.Spec.SchedulerName = "default-scheduler"
	held := pod("held", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-0"}}})
	f := newFixture(t, other, held)
	if _, err := f.allocate(highMem, "GPU-0"); err != nil {
		t.Fatal(err)
	}
	// No preference is given for the unassigned pod...
	if got := f.preferred(highMem, 1, []string{"GPU-1", "GPU-2"}); got != nil {
		t.Errorf("preferred %v for a pod without assignment", got)
	}
	// ...and whatever the kubelet picks is refused, never a held device.
	for _, ids := range [][]string{{"GPU-1"}, {"GPU-0"}} {
		_, err := f.allocate(highMem, ids...)
		if err == nil || !strings.Contains(err.Error(), "must be placed by it") {
			t.Errorf("allocate %v: %v", ids, err)
		}
	}
	ev := f.events()
	if len(ev) != 2 || !strings.Contains(ev[0], ReasonNoAssignment) {
		t.Errorf("events %v", ev)
	}
}

func TestAllocateWaitsForThePodToReachTheCache(t *testing.T) {
	f := newFixture(t)
	late := pod("late", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-2"}}})
	go func() {
		time.Sleep(50 * time.Millisecond)
		_, _ = f.kube.CoreV1().Pods("ml").Create(context.Background(), late, metav1.CreateOptions{})
	}()
	resp, err := f.allocate(highMem, "GPU-2")
	if err != nil || resp.Envs["RESCLASS_DEVICES_NVIDIA_HIGH_MEM"] != "GPU-2" {
		t.Fatalf("%v, %v", resp, err)
	}
}

func TestInitContainerDevicesAreReused(t *testing.T) {
	// The kubelet gives the app container the init container's devices.
	p := pod("p", map[string]map[string][]string{
		"init-setup": {"nvidia.high.mem": {"GPU-0"}},
		"main":       {"nvidia.high.mem": {"GPU-0"}},
	})
	f := newFixture(t, p)
	for range 2 {
		if _, err := f.allocate(highMem, "GPU-0"); err != nil {
			t.Fatal(err)
		}
	}
	recs := f.alloc.Allocations()
	if len(recs) != 2 || recs[0].Container != "init-setup" || recs[1].Container != "main" {
		t.Errorf("allocations %+v", recs)
	}
	// A third call has no container left.
	if _, err := f.allocate(highMem, "GPU-0"); err == nil {
		t.Error("third Allocate of one device in a two-container pod succeeded")
	}
}

func TestSeveralClassesInOneContainerAgree(t *testing.T) {
	p := pod("p", map[string]map[string][]string{"main": {
		"nvidia.high.mem": {"GPU-1"},
		"nvidia.any":      {"GPU-3"},
		"fast.nic":        {"0000:3b:00.0"},
	}})
	f := newFixture(t, p)
	// envvar: the one strategy whose variable the kubelet merges.
	f.alloc.cfg.DeviceListStrategies = Strategies{StrategyEnvVar}
	f.alloc.handoff = f.alloc.kindsHandoff()
	high, err := f.allocate(highMem, "GPU-1")
	if err != nil {
		t.Fatal(err)
	}
	anyGPU, err := f.allocate(v1alpha1.ResourceNamePrefix+"nvidia.any", "GPU-3")
	if err != nil {
		t.Fatal(err)
	}
	nicResp, err := f.allocate(v1alpha1.ResourceNamePrefix+"fast.nic", "0000:3b:00.0")
	if err != nil {
		t.Fatal(err)
	}
	// Whatever order the kubelet merges them in, the container sees both GPUs.
	for _, r := range []*pluginapi.ContainerAllocateResponse{high, anyGPU} {
		if got := r.Envs[nvidiagpu.EnvVisibleDevices]; got != "GPU-3,GPU-1" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want both GPUs in class order", got)
		}
	}
	if high.Envs["RESCLASS_DEVICES_NVIDIA_ANY"] != "" || anyGPU.Envs["RESCLASS_DEVICES_NVIDIA_ANY"] != "GPU-3" {
		t.Errorf("per-class variables: %v / %v", high.Envs, anyGPU.Envs)
	}
	if nicResp.Envs[nic.EnvPCIAddresses] != "0000:3b:00.0" || nicResp.Envs[nic.EnvInterfaces] != "ens1f0" || len(nicResp.Devices) != 0 {
		t.Errorf("NIC response %v (no VFIO devices for mlx5_core)", nicResp)
	}
}

func TestHugepagePoolSlots(t *testing.T) {
	pool := "hugepages-1Gi-numa0"
	a := pod("a", map[string]map[string][]string{"fwd": {"hugepages-1gig": {pool}}})
	b := pod("b", map[string]map[string][]string{"fwd": {"hugepages-1gig": {pool}}})
	f := newFixture(t, a, b)
	res := v1alpha1.ResourceNamePrefix + "hugepages-1gig"
	slots := KubeletIDs(kinds.Builtin, &inventory()[4], 4, 0)
	if len(slots) != 4 || slots[3] != pool+"/3" || DeviceID(slots[3]) != pool {
		t.Fatalf("slots %v", slots)
	}
	got := f.preferred(res, 1, slots[1:])
	if !slices.Equal(got, []string{pool + "/1"}) {
		t.Fatalf("preferred %v", got)
	}
	for _, slot := range []string{pool + "/1", pool + "/2"} {
		resp, err := f.allocate(res, slot)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{hugepages.EnvPool: pool, hugepages.EnvSize: "1Gi", hugepages.EnvNUMANode: "0", "RESCLASS_DEVICES_HUGEPAGES_1GIG": pool}
		for k, v := range want {
			if resp.Envs[k] != v {
				t.Errorf("%s=%q, want %q", k, resp.Envs[k], v)
			}
		}
		if len(resp.Devices) != 0 || len(resp.Mounts) != 0 || len(resp.CdiDevices) != 0 {
			t.Errorf("a pool hands out no memory: %v", resp)
		}
	}
	recs := f.alloc.Allocations()
	if len(recs) != 2 || recs[0].Name != "a" || recs[1].Name != "b" {
		t.Errorf("allocations %+v", recs)
	}
}

func TestAllocateRejectsMalformedRequests(t *testing.T) {
	f := newFixture(t, pod("a", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-0"}}}))
	for name, ids := range map[string][]string{
		"none":      nil,
		"duplicate": {"GPU-0", "GPU-0"},
		"unknown":   {"GPU-9"},
	} {
		if _, err := f.allocate(highMem, ids...); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if n := testutil.ToFloat64(f.metrics.outcomes.WithLabelValues("nvidia.high.mem", "invalid")); n != 3 {
		t.Errorf("invalid count %v", n)
	}
}

func TestDeletedPodReleasesItsRecords(t *testing.T) {
	f := newFixture(t, pod("a", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-0"}}}))
	if _, err := f.allocate(highMem, "GPU-0"); err != nil {
		t.Fatal(err)
	}
	if err := f.kube.CoreV1().Pods("ml").Delete(f.ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(f.alloc.Allocations()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("records of a deleted pod kept: %+v", f.alloc.Allocations())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestKubeletCheckpointCountsAsAllocated(t *testing.T) {
	a := pod("a", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-0"}}})
	b := pod("b", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-0"}}})
	f := newFixture(t, a, b)
	// The kubelet's checkpoint says a's container holds GPU-0 (and names a pod
	// that no longer exists, which must be ignored).
	per := checkpoint.NewDevicesPerNUMA()
	per[0] = []string{"GPU-0"}
	cp := checkpoint.New([]checkpoint.PodDevicesEntry{
		{PodUID: "uid-a", ContainerName: "main", ResourceName: highMem, DeviceIDs: per},
		{PodUID: "gone", ContainerName: "main", ResourceName: highMem, DeviceIDs: per},
		{PodUID: "uid-a", ContainerName: "main", ResourceName: "nvidia.com/gpu", DeviceIDs: per},
	}, nil)
	blob, err := cp.MarshalCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), CheckpointFile)
	if err := os.WriteFile(path, blob, 0o600); err != nil {
		t.Fatal(err)
	}
	n, err := f.alloc.loadCheckpoint(path)
	if err != nil || n != 1 {
		t.Fatalf("loaded %d, %v", n, err)
	}
	// So the next Allocate of GPU-0 is b's, not a's again.
	if _, err := f.allocate(highMem, "GPU-0"); err != nil {
		t.Fatal(err)
	}
	recs := f.alloc.Allocations()
	if len(recs) != 2 || recs[1].Name != "b" {
		t.Errorf("allocations %+v", recs)
	}
	if err := os.WriteFile(path, append(blob[:len(blob)-3], '}'), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.alloc.loadCheckpoint(path); err == nil {
		t.Error("a corrupt checkpoint was accepted")
	}
}

func TestClassEnv(t *testing.T) {
	for class, want := range map[string]string{
		"nvidia.high.mem": "RESCLASS_DEVICES_NVIDIA_HIGH_MEM",
		"fast-nic":        "RESCLASS_DEVICES_FAST_NIC",
		"a100x8":          "RESCLASS_DEVICES_A100X8",
	} {
		if got := ClassEnv(class); got != want {
			t.Errorf("ClassEnv(%q) = %q, want %q", class, got, want)
		}
	}
}
