package draplugin

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/internal/sealed"
)

const (
	testDriver = "test.resclass.io"
	testNode   = "node-1"
)

func gpu(uuid string, minor int64) v1alpha1.Device {
	return v1alpha1.Device{ID: uuid, Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeMinor: {IntValue: &minor},
	}}
}

type fixture struct {
	t        *testing.T
	ctx      context.Context
	cfg      Config
	p        *Plugin
	recorder *record.FakeRecorder
}

// newFixture is a plugin over four GPUs (DRA names gpu-0..gpu-3) whose host
// root has /dev/nvidia0 and /dev/nvidiactl.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"nvidia0", "nvidiactl"} {
		if err := os.WriteFile(filepath.Join(root, "dev", n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, ctx := ktesting.NewTestContext(t)
	f := &fixture{t: t, ctx: ctx, recorder: record.NewFakeRecorder(100)}
	f.cfg = Config{
		NodeName: testNode, DriverName: testDriver, HostRoot: root,
		DeviceListStrategies: handoff.Strategies{handoff.StrategyEnvVar, handoff.StrategyCDICRI},
		CDIDir:               t.TempDir(), PluginDataDir: t.TempDir(),
		ClassOf:  func(dc string) string { return strings.TrimPrefix(dc, "rc-") },
		Recorder: f.recorder,
	}
	f.restart()
	return f
}

// restart makes a new plugin on the same directories, as after an agent
// restart.
func (f *fixture) restart() {
	f.t.Helper()
	p, err := New(f.cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	p.SetDevices([]v1alpha1.Device{gpu("GPU-a", 0), gpu("GPU-b", 1), gpu("GPU-c", 2), gpu("GPU-d", 3)},
		map[string]string{"gpu-0": "GPU-a", "gpu-1": "GPU-b", "gpu-2": "GPU-c", "gpu-3": "GPU-d"})
	f.p = p
}

// claim is allocated devices for request "gpus" of DeviceClass rc-<class>.
func claim(uid, class string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claim-" + uid, UID: types.UID(uid)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "rc-" + class}},
		}}},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-" + uid, UID: types.UID("pod-" + uid)}},
		},
	}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{Request: "gpus", Driver: testDriver, Pool: testNode, Device: d})
	}
	return c
}

func (f *fixture) prepare(claims ...*resourceapi.ResourceClaim) map[types.UID]kubeletplugin.PrepareResult {
	f.t.Helper()
	out, err := f.p.PrepareResourceClaims(f.ctx, claims)
	if err != nil {
		f.t.Fatal(err)
	}
	if len(out) != len(claims) {
		f.t.Fatalf("%d results for %d claims", len(out), len(claims))
	}
	return out
}

// spec reads the claim's CDI spec.
func (f *fixture) spec(uid string) *specs.Spec {
	f.t.Helper()
	blob, err := os.ReadFile(filepath.Join(f.cfg.CDIDir, specFile(types.UID(uid))))
	if err != nil {
		f.t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(blob, &s); err != nil {
		f.t.Fatal(err)
	}
	return &s
}

func TestPrepareGivesWhatTheDevicePluginPathGives(t *testing.T) {
	f := newFixture(t)
	res := f.prepare(claim("u1", "nvidia.high.mem", "gpu-2", "gpu-0"))["u1"]
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if len(res.Devices) != 2 || res.Devices[0].DeviceName != "gpu-2" || res.Devices[1].DeviceName != "gpu-0" || res.Devices[0].PoolName != testNode {
		t.Fatalf("devices %+v", res.Devices)
	}
	// The request's first device carries the claim's CDI device and the
	// GPUs' own CDI names, as the device-plugin path's CdiDevices.
	want := []string{CDIKind + "=u1-gpus", "resclass.io/gpu=GPU-c", "resclass.io/gpu=GPU-a"}
	if !slices.Equal(res.Devices[0].CDIDeviceIDs, want) || len(res.Devices[1].CDIDeviceIDs) != 0 {
		t.Errorf("CDI ids %v and %v, want %v and none", res.Devices[0].CDIDeviceIDs, res.Devices[1].CDIDeviceIDs, want)
	}
	s := f.spec("u1")
	if s.Kind != CDIKind || len(s.Devices) != 1 || s.Devices[0].Name != "u1-gpus" {
		t.Fatalf("spec %+v", s)
	}
	env := s.Devices[0].ContainerEdits.Env
	for _, kv := range []string{"RESCLASS_DEVICES_NVIDIA_HIGH_MEM=GPU-c,GPU-a", "NVIDIA_VISIBLE_DEVICES=GPU-c,GPU-a"} {
		if !slices.Contains(env, kv) {
			t.Errorf("env %v lacks %s", env, kv)
		}
	}
	var nodes []string
	for _, n := range s.Devices[0].ContainerEdits.DeviceNodes {
		nodes = append(nodes, n.Path)
	}
	// GPU-c's /dev/nvidia2 is not on this host: left out, as on the
	// device-plugin path.
	if !slices.Equal(nodes, []string{"/dev/nvidia0", "/dev/nvidiactl"}) {
		t.Errorf("device nodes %v", nodes)
	}
}

func TestPrepareIsIdempotentAndSurvivesRestart(t *testing.T) {
	f := newFixture(t)
	first := f.prepare(claim("u1", "any", "gpu-1"))["u1"]
	if first.Err != nil {
		t.Fatal(first.Err)
	}
	again := f.prepare(claim("u1", "any", "gpu-1"))["u1"]
	if again.Err != nil || !slices.Equal(again.Devices[0].CDIDeviceIDs, first.Devices[0].CDIDeviceIDs) {
		t.Fatalf("prepared again: %+v, first %+v", again, first)
	}
	f.restart()
	if got := f.p.Prepared(); len(got) != 1 || got["u1"].Devices[0].ID != "GPU-b" {
		t.Fatalf("after restart the checkpoint holds %+v", got)
	}
	// The restarted agent still refuses gpu-1 to another claim.
	if res := f.prepare(claim("u2", "any", "gpu-1", "gpu-3"))["u2"]; res.Err == nil || !strings.Contains(res.Err.Error(), "already prepared for ResourceClaim ns/claim-u1") {
		t.Fatalf("second claim of gpu-1: %v", res.Err)
	}
	if ev := <-f.recorder.Events; !strings.Contains(ev, ReasonPrepareFailed) {
		t.Errorf("event %q", ev)
	}
	if ev := <-f.recorder.Events; !strings.Contains(ev, "ResourceClaim claim-u2") {
		t.Errorf("pod event %q", ev)
	}
	// Unprepare frees it (twice: the kubelet repeats itself), and removes the spec.
	for range 2 {
		out, err := f.p.UnprepareResourceClaims(f.ctx, []kubeletplugin.NamespacedObject{{UID: "u1"}})
		if err != nil || out["u1"] != nil {
			t.Fatalf("unprepare: %v %v", out, err)
		}
	}
	if _, err := os.Stat(filepath.Join(f.cfg.CDIDir, specFile("u1"))); !os.IsNotExist(err) {
		t.Errorf("the CDI spec of an unprepared claim is still there: %v", err)
	}
	f.restart()
	if res := f.prepare(claim("u2", "any", "gpu-1", "gpu-3"))["u2"]; res.Err != nil {
		t.Fatalf("gpu-1 after unprepare: %v", res.Err)
	}
}

func TestPrepareRefusesWhatIsNotHere(t *testing.T) {
	f := newFixture(t)
	notAllocated := claim("u1", "any")
	notAllocated.Status.Allocation = nil
	otherPool := claim("u2", "any", "gpu-0")
	otherPool.Status.Allocation.Devices.Results[0].Pool = "node-2"
	unknown := claim("u3", "any", "gpu-9")
	otherDriver := claim("u4", "any", "gpu-0")
	otherDriver.Status.Allocation.Devices.Results[0].Driver = "gpu.nvidia.com"
	out := f.prepare(notAllocated, otherPool, unknown, otherDriver)
	for uid, want := range map[types.UID]string{"u1": "not allocated", "u2": "not this node's", "u3": "not on node", "u4": "no device of driver"} {
		if err := out[uid].Err; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", uid, err, want)
		}
	}
	if n := len(f.p.Prepared()); n != 0 {
		t.Errorf("%d claims prepared", n)
	}
}

func TestCheckpointRoundTripAndRefusals(t *testing.T) {
	cp := &Checkpoint{Claims: map[types.UID]PreparedClaim{"u1": {Namespace: "ns", Name: "c", Devices: []PreparedDevice{{Request: "r", Pool: "p", Device: "d", ID: "GPU-a", CDIDeviceIDs: []string{"resclass.io/claim=u1-r"}}}}}}
	blob, err := cp.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseCheckpoint(blob)
	if err != nil || got.Claims["u1"].Devices[0].ID != "GPU-a" {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	tampered := strings.Replace(string(blob), "GPU-a", "GPU-b", 1)
	for name, in := range map[string]string{
		"tampered":     tampered,
		"version":      strings.Replace(string(blob), checkpointVersion, "v0", 1),
		"unknown":      `{"version":"` + checkpointVersion + `","checksum":"","data":{},"extra":1}`,
		"trailing":     string(blob) + "{}",
		"huge":         strings.Repeat(" ", maxCheckpointBytes+1),
		"empty":        "",
		"two claims":   string(mustMarshal(t, twoClaimsOneDevice())),
		"empty device": string(mustMarshal(t, &Checkpoint{Claims: map[types.UID]PreparedClaim{"u": {Namespace: "ns", Name: "c", Devices: []PreparedDevice{{Request: "r", Pool: "p", ID: "x"}}}}})),
	} {
		if _, err := ParseCheckpoint([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func twoClaimsOneDevice() *Checkpoint {
	d := []PreparedDevice{{Request: "r", Pool: "p", Device: "d", ID: "x"}}
	return &Checkpoint{Claims: map[types.UID]PreparedClaim{"u1": {Namespace: "ns", Name: "a", Devices: d}, "u2": {Namespace: "ns", Name: "b", Devices: d}}}
}

func mustMarshal(t *testing.T, c *Checkpoint) []byte {
	t.Helper()
	b, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A checkpoint that cannot be believed is set aside, reported, and the
// plugin starts empty: never a crash loop. At most sealed.MaxSetAside are kept.
func TestNewSetsABadCheckpointAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, CheckpointFile)
	for i := range sealed.MaxSetAside + 2 {
		bad := []byte("{not json")
		if i%2 == 1 { // a torn file: the checksum does not match its data
			bad = []byte(`{"version":"` + checkpointVersion + `","checksum":"00","data":{"claims":{}}}`)
		}
		if err := os.WriteFile(path, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		recorder := record.NewFakeRecorder(4)
		p, err := New(Config{NodeName: testNode, DriverName: testDriver, PluginDataDir: dir, CDIDir: t.TempDir(), Recorder: recorder})
		if err != nil {
			t.Fatalf("start %d: New with a broken checkpoint: %v, want it set aside", i, err)
		}
		if n := len(p.Prepared()); n != 0 {
			t.Errorf("start %d: %d claims prepared, want none", i, n)
		}
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("start %d: the broken checkpoint is still in place (%v)", i, err)
		}
		select {
		case e := <-recorder.Events:
			if !strings.Contains(e, "Warning "+ReasonCheckpointSetAside) || !strings.Contains(e, CheckpointFile+sealed.SetAsideSuffix) {
				t.Errorf("start %d: Event %q, want %s naming the file set aside", i, e, ReasonCheckpointSetAside)
			}
		default:
			t.Errorf("start %d: no Event", i)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var aside []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), CheckpointFile+sealed.SetAsideSuffix) {
			aside = append(aside, e.Name())
		}
	}
	if len(aside) != sealed.MaxSetAside {
		t.Errorf("set aside: %v, want the newest %d", aside, sealed.MaxSetAside)
	}
	// The plugin writes a good checkpoint again, which the next start reads.
	good := &Checkpoint{Claims: map[types.UID]PreparedClaim{"uid-1": {Namespace: "ns", Name: "claim", Devices: []PreparedDevice{{Request: "gpu", Pool: testNode, Device: "gpu-0", ID: "GPU-0"}}}}}
	if err := good.Save(path); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{NodeName: testNode, DriverName: testDriver, PluginDataDir: dir, CDIDir: t.TempDir()})
	if err != nil || len(p.Prepared()) != 1 {
		t.Fatalf("New with a good checkpoint: %v, %v", p, err)
	}
}

// TestHealthStream: the kubelet's health list names every published device
// by pool and DRA name, says which is unhealthy and why, and changes (waking
// the streams) only when health does.
func TestHealthStream(t *testing.T) {
	f := newFixture(t)
	resp, changed := f.p.health.snapshot(testNode)
	if len(resp.Devices) != 4 || resp.Devices[0].Device.PoolName != testNode || resp.Devices[0].Device.DeviceName != "gpu-0" || resp.Devices[0].Health != drahealthv1alpha1.HealthStatus_HEALTHY {
		t.Fatalf("health %v", resp.Devices)
	}
	devices := []v1alpha1.Device{gpu("GPU-a", 0), gpu("GPU-b", 1), gpu("GPU-c", 2), gpu("GPU-d", 3)}
	names := map[string]string{"gpu-0": "GPU-a", "gpu-1": "GPU-b", "gpu-2": "GPU-c", "gpu-3": "GPU-d"}
	f.p.SetDevices(devices, names) // the same: no change
	select {
	case <-changed:
		t.Fatal("the stream woke without a change")
	default:
	}
	devices[1].Healthy, devices[1].Reason = false, "XID 79"
	f.p.SetDevices(devices, names)
	select {
	case <-changed:
	default:
		t.Fatal("the stream did not wake on a health change")
	}
	resp, _ = f.p.health.snapshot(testNode)
	if d := resp.Devices[1]; d.Device.DeviceName != "gpu-1" || d.Health != drahealthv1alpha1.HealthStatus_UNHEALTHY || d.Message != "XID 79" {
		t.Errorf("gpu-1: %v", d)
	}
}

// holderSeries are the device_holder series reg exports, one line each:
// class device kind namespace pod.
func holderSeries(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range families {
		if mf.GetName() != "resclass_node_agent_device_holder" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out = append(out, strings.Join([]string{labels["class"], labels["device"], labels["kind"], labels["namespace"], labels["pod"]}, " "))
		}
	}
	slices.Sort(out)
	return out
}

// TestDeviceHolderSeries: on a DRA node the holders are the pods each
// prepared claim is reserved for, with the class its DeviceClass stands for;
// a shared claim's new consumer is recorded at its repeated prepare, the
// series survive a restart (the checkpoint) and go at unprepare.
func TestDeviceHolderSeries(t *testing.T) {
	f := newFixture(t)
	reg := prometheus.NewRegistry()
	detach := handoff.NewMetrics(reg).AttachHolders(f.p)
	f.prepare(claim("u1", "train", "gpu-0", "gpu-2"), claim("u2", "infer", "gpu-1"))
	want := []string{
		"infer GPU-b nvidia-gpu ns pod-u2",
		"train GPU-a nvidia-gpu ns pod-u1",
		"train GPU-c nvidia-gpu ns pod-u1",
	}
	if got := holderSeries(t, reg); !slices.Equal(got, want) {
		t.Fatalf("series:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// A second pod shares claim u2: the kubelet prepares it again for it.
	shared := claim("u2", "infer", "gpu-1")
	shared.Status.ReservedFor = append(shared.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "pod-x", UID: "pod-x"})
	if res := f.prepare(shared)["u2"]; res.Err != nil {
		t.Fatal(res.Err)
	}
	detach()
	if got := holderSeries(t, reg); len(got) != 0 {
		t.Fatalf("detached, still %v", got)
	}
	// Restarted, the plugin has its checkpoint before the agent's inventory:
	// no series until it knows the devices' kinds.
	fresh, err := New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if h := fresh.Holdings(); len(h) != 0 {
		t.Errorf("before its first inventory the plugin exports %v", h)
	}
	f.restart()
	reg = prometheus.NewRegistry()
	handoff.NewMetrics(reg).AttachHolders(f.p)
	want = []string{
		"infer GPU-b nvidia-gpu ns pod-u2",
		"infer GPU-b nvidia-gpu ns pod-x",
		"train GPU-a nvidia-gpu ns pod-u1",
		"train GPU-c nvidia-gpu ns pod-u1",
	}
	if got := holderSeries(t, reg); !slices.Equal(got, want) {
		t.Fatalf("after a restart, series:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := f.p.UnprepareResourceClaims(f.ctx, []kubeletplugin.NamespacedObject{{UID: "u1"}}); err != nil {
		t.Fatal(err)
	}
	if got := holderSeries(t, reg); !slices.Equal(got, want[:2]) {
		t.Fatalf("after unprepare of u1: %v", got)
	}
}
