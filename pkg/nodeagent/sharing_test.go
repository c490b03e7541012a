package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	resclassfake "github.com/resclass/resclass/pkg/client/clientset/versioned/fake"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	nvmldiscovery "github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/mpsstate"
)

// sharingFixture runs sharingModes passes over GPUs a, b and c (80Gi each),
// with the holders and the Events of a test.
type sharingFixture struct {
	t       *testing.T
	s       *sharingModes
	root    string
	labels  map[string]string
	holders map[string][]handoff.Holder
	events  []string
	// published is what a previous agent published, nil for nothing.
	published map[string]v1alpha1.SharingMode
	clock     time.Time
	// again is what the last pass asked: when to run the next.
	again time.Duration
}

func newSharingFixture(t *testing.T) *sharingFixture {
	root := t.TempDir()
	f := &sharingFixture{t: t, root: root, labels: map[string]string{}, holders: map[string][]handoff.Holder{}}
	f.s = newSharingModes(root, mpsstate.DefaultDir)
	f.clock = time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)
	f.s.now = func() time.Time { return f.clock }
	// Switching at once: TestSharingModeChangeSettles tests settle.
	f.s.settle = 0
	return f
}

// daemon writes the MPS daemon state of a GPU.
func (f *sharingFixture) daemon(id string, phase mpsstate.Phase) {
	if err := mpsstate.Write(f.root+mpsstate.DefaultDir, id, mpsstate.State{Phase: phase, Updated: f.s.now()}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *sharingFixture) pass() map[string]v1alpha1.Device {
	f.t.Helper()
	devices := []v1alpha1.Device{gpu80("a"), gpu80("b"), gpu80("c"), {ID: "0000:3b:00.0", Kind: v1alpha1.DeviceKindNIC, Healthy: true}}
	in := sharingInput{
		node:       &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: f.labels}},
		holders:    func(id string) []handoff.Holder { return f.holders[id] },
		holderKind: "pods",
		event:      func(eventtype, reason, message string) { f.events = append(f.events, eventtype+" "+reason+" "+message) },
	}
	if f.published != nil {
		in.published = func(id string) (v1alpha1.SharingMode, bool) { m, ok := f.published[id]; return m, ok }
	}
	logger, _ := ktesting.NewTestContext(f.t)
	f.again = f.s.apply(logger, devices, in)
	if devices[3].Sharing != nil {
		f.t.Errorf("a NIC got a sharing block: %+v", devices[3].Sharing)
	}
	return byID(devices)
}

func (f *sharingFixture) takeEvents() []string {
	e := f.events
	f.events = nil
	return e
}

func gpu80(id string) v1alpha1.Device {
	return v1alpha1.Device{ID: id, Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeMemory: {QuantityValue: ptr.To(resource.MustParse("80Gi"))},
	}}
}

func TestSharingModeFromLabels(t *testing.T) {
	f := newSharingFixture(t)
	f.labels[v1alpha1.LabelGPUSharing] = "mps"
	f.labels[v1alpha1.LabelGPUSharingDevicePrefix+"b"] = "time-slicing"
	f.labels[v1alpha1.LabelGPUSharingDevicePrefix+"c"] = "MPS" // not a value
	f.daemon("a", mpsstate.Running)
	got := f.pass()

	a := got["a"]
	if a.Sharing == nil || a.Sharing.Mode != v1alpha1.SharingMPS || a.Sharing.RequestedMode != "" || !a.Healthy || a.Sharing.Message != "" {
		t.Fatalf("a: %+v %+v", a, a.Sharing)
	}
	if m, c := a.Sharing.Capacity[v1alpha1.CapacityMemory], a.Sharing.Capacity[v1alpha1.CapacityCompute]; m.String() != "80Gi" || c.Value() != 100 {
		t.Errorf("a: capacity %v", a.Sharing.Capacity)
	}
	if e := fmt.Sprint(a.Sharing.Enforcement); e != "[{memory MPSClientLimit Soft} {compute MPSClientLimit Soft}]" {
		t.Errorf("a: enforcement %s", e)
	}
	b := got["b"]
	if b.Sharing.Mode != v1alpha1.SharingTimeSlicing || fmt.Sprint(b.Sharing.Enforcement) != "[{memory SchedulerAccounting Accounting} {compute TimeSlicing Accounting}]" {
		t.Errorf("b: the GPU's label over the node's: %+v", b.Sharing)
	}
	c := got["c"]
	if c.Sharing.Mode != v1alpha1.SharingExclusive || len(c.Sharing.Capacity) != 0 || !strings.Contains(c.Sharing.Message, `gpu-sharing.node.resclass.io/c="MPS" names no sharing mode`) {
		t.Errorf("c: a value that names no mode: %+v", c.Sharing)
	}
	if ev := f.takeEvents(); len(ev) != 0 {
		t.Errorf("first pass, nothing changed: events %v", ev)
	}
	labels := kinds.Builtin.NodeLabels([]v1alpha1.Device{a, b, c})
	if labels[nvidiagpu.LabelMPS] != "true" {
		t.Errorf("node labels %v, want %s", labels, nvidiagpu.LabelMPS)
	}

	// The daemon of a stops: a takes no new share.
	f.daemon("a", mpsstate.Failed)
	a = f.pass()["a"]
	if a.Healthy || a.Reason != reasonMPSNotRunning || !strings.Contains(a.Sharing.Message, "the MPS control daemon is failed") {
		t.Errorf("a with its daemon failed: healthy %v %q, %q", a.Healthy, a.Reason, a.Sharing.Message)
	}
	// Without labels, every GPU is exclusive, and the MPS label goes.
	clear(f.labels)
	got = f.pass()
	for id, d := range got {
		if d.Kind == v1alpha1.DeviceKindNvidiaGPU && (d.Sharing == nil || d.Sharing.Mode != v1alpha1.SharingExclusive || !d.Healthy) {
			t.Errorf("%s without labels: %+v", id, d.Sharing)
		}
	}
	if labels := kinds.Builtin.NodeLabels([]v1alpha1.Device{got["a"], got["b"]}); labels[nvidiagpu.LabelMPS] != "" {
		t.Errorf("no GPU in MPS mode: labels %v", labels)
	}
	if ev := f.takeEvents(); len(ev) != 2 || !strings.Contains(ev[0], reasonSharingChanged) {
		t.Errorf("events %v, want a and b changed", ev)
	}
}

func TestSharingModeChangeWaitsForHolders(t *testing.T) {
	f := newSharingFixture(t)
	f.pass() // exclusive
	f.holders["a"] = []handoff.Holder{{Namespace: "ml", Name: "train"}}
	f.labels[v1alpha1.LabelGPUSharing] = "time-slicing"
	for range 2 {
		a := f.pass()["a"]
		if a.Sharing.Mode != v1alpha1.SharingExclusive || a.Sharing.RequestedMode != v1alpha1.SharingTimeSlicing || !strings.Contains(a.Sharing.Message, "ml/train") {
			t.Fatalf("a held: %+v", a.Sharing)
		}
	}
	if ev := f.takeEvents(); len(ev) != 3 || !strings.Contains(ev[0], reasonSharingWaiting) || !strings.Contains(ev[0], "GPU a") || !strings.Contains(ev[0], "ml/train") {
		t.Errorf("events %v: want one wait for a (once, over two passes) and b and c changed", ev)
	}
	// Many holders: the first few are named.
	for i := range 5 {
		f.holders["b"] = append(f.holders["b"], handoff.Holder{Namespace: "ml", Name: fmt.Sprintf("p%d", i), Share: true})
	}
	f.labels[v1alpha1.LabelGPUSharing] = "mps"
	got := f.pass()
	if b := got["b"]; b.Sharing.Mode != v1alpha1.SharingTimeSlicing || !strings.HasSuffix(b.Sharing.Message, "ml/p0, ml/p1, ml/p2 and 2 more") {
		t.Errorf("b held by five: %+v", b.Sharing)
	}
	if ev := f.takeEvents(); len(ev) != 3 {
		t.Errorf("a new mode asked for is a new wait: events %v", ev)
	}
	// The last holders end: each GPU switches, once.
	clear(f.holders)
	f.daemon("a", mpsstate.Running)
	f.daemon("b", mpsstate.Running)
	got = f.pass()
	if a := got["a"]; a.Sharing.Mode != v1alpha1.SharingMPS || a.Sharing.RequestedMode != "" || a.Sharing.Message != "" {
		t.Errorf("a free: %+v", a.Sharing)
	}
	ev := f.takeEvents()
	if len(ev) != 2 || !strings.Contains(ev[0], reasonSharingChanged+" GPU a: sharing mode MPS (was Exclusive)") {
		t.Errorf("events %v", ev)
	}
	f.pass()
	if ev := f.takeEvents(); len(ev) != 0 {
		t.Errorf("nothing changed: events %v", ev)
	}
}

func TestSharingModeSurvivesRestart(t *testing.T) {
	// What the agent published before is the mode in force.
	f := newSharingFixture(t)
	f.published = map[string]v1alpha1.SharingMode{"a": v1alpha1.SharingMPS, "b": v1alpha1.SharingExclusive}
	f.holders["a"] = []handoff.Holder{{Namespace: "ml", Name: "s", Share: true}}
	f.labels[v1alpha1.LabelGPUSharing] = "time-slicing"
	f.daemon("a", mpsstate.Running)
	got := f.pass()
	if a := got["a"]; a.Sharing.Mode != v1alpha1.SharingMPS || a.Sharing.RequestedMode != v1alpha1.SharingTimeSlicing {
		t.Errorf("a, published MPS, held: %+v", a.Sharing)
	}
	if b := got["b"]; b.Sharing.Mode != v1alpha1.SharingTimeSlicing {
		t.Errorf("b, published exclusive, free: %+v", b.Sharing)
	}
	if ev := f.takeEvents(); len(ev) != 2 || !strings.Contains(ev[1], "GPU b: sharing mode TimeSlicing (was Exclusive)") {
		t.Errorf("events %v", ev)
	}

	// Nothing published: derived from what pods hold.
	for _, c := range []struct {
		name    string
		label   string
		holders []handoff.Holder
		state   bool
		want    v1alpha1.SharingMode
	}{
		{"held whole", "mps", []handoff.Holder{{Name: "w"}}, false, v1alpha1.SharingExclusive},
		{"held in shares, a sharing mode asked", "mps", []handoff.Holder{{Name: "s", Share: true}}, false, v1alpha1.SharingMPS},
		{"held in shares, exclusive asked, a daemon state", "exclusive", []handoff.Holder{{Name: "s", Share: true}}, true, v1alpha1.SharingMPS},
		{"held in shares, exclusive asked, no daemon", "exclusive", []handoff.Holder{{Name: "s", Share: true}}, false, v1alpha1.SharingTimeSlicing},
		{"free", "time-slicing", nil, false, v1alpha1.SharingTimeSlicing},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newSharingFixture(t)
			f.labels[v1alpha1.LabelGPUSharing] = c.label
			f.holders["a"] = c.holders
			if c.state {
				f.daemon("a", mpsstate.Stopped)
			}
			if a := f.pass()["a"]; a.Sharing.Mode != c.want {
				t.Errorf("mode %s, want %s (%+v)", a.Sharing.Mode, c.want, a.Sharing)
			}
			for _, e := range f.takeEvents() {
				if strings.Contains(e, "GPU a: sharing mode") && strings.Contains(e, reasonSharingChanged) {
					t.Errorf("a restart changed a's mode: %s", e)
				}
			}
		})
	}
}

func TestSharingMessageBounded(t *testing.T) {
	long := strings.Repeat("é", maxSharingMessage)
	if got := boundMessage(long); len(got) > maxSharingMessage || !strings.HasSuffix(got, "…") || !strings.HasPrefix(got, "é") {
		t.Errorf("bounded to %d bytes: %q…", len(got), got[:8])
	}
}

// The agent applies a label change live: no restart, the NodeDevices and the
// Node's MPS label follow.
func TestAgentAppliesSharingLabelsLive(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dgx, root := nvmlmock.New(), t.TempDir()
	if err := dgx.WriteSysfs(root); err != nil {
		t.Fatal(err)
	}
	kube := kubefake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "shared", Labels: map[string]string{v1alpha1.LabelGPUSharing: "mps"}}})
	// The fake clientsets have no schema of the resclass types to apply:
	// the status applied is kept here.
	rc := resclassfake.NewSimpleClientset()
	var (
		mu     sync.Mutex
		status *v1alpha1.NodeDevicesStatus
	)
	rc.PrependReactor("patch", "nodedevices", func(action clienttesting.Action) (bool, runtime.Object, error) {
		patch := action.(clienttesting.PatchAction)
		var applied v1alpha1.NodeDevices
		if err := json.Unmarshal(patch.GetPatch(), &applied); err != nil {
			return true, nil, err
		}
		if patch.GetSubresource() == "status" {
			mu.Lock()
			status = &applied.Status
			mu.Unlock()
		}
		applied.Name, applied.UID = patch.GetName(), "nd-uid"
		return true, &applied, nil
	})
	published := func() []v1alpha1.Device {
		mu.Lock()
		defer mu.Unlock()
		if status == nil {
			return nil
		}
		return status.Devices
	}
	agent := New(Config{
		NodeName: "shared", HostRoot: root,
		Kinds:        kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{Binding: dgx, Health: nvmldiscovery.HealthOptions{WaitTimeout: 50 * time.Millisecond}}}),
		PollInterval: 20 * time.Millisecond, ResyncInterval: time.Minute,
	}, rc, kube)
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()

	eventually := func(what string, cond func([]v1alpha1.Device, *corev1.Node) bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			n, err := kube.CoreV1().Nodes().Get(ctx, "shared", metav1.GetOptions{})
			return err == nil && cond(published(), n), nil
		}); err != nil {
			n, _ := kube.CoreV1().Nodes().Get(ctx, "shared", metav1.GetOptions{})
			t.Fatalf("%s: %v\nnode labels %v\ndevices %+v", what, err, n.GetLabels(), published())
		}
	}
	gpus := func(devices []v1alpha1.Device, mode v1alpha1.SharingMode) bool {
		n := 0
		for _, d := range devices {
			if d.Kind != v1alpha1.DeviceKindNvidiaGPU {
				continue
			}
			if d.Sharing == nil || d.Sharing.Mode != mode {
				return false
			}
			n++
		}
		return n > 0
	}
	eventually("GPUs in MPS mode, the node labelled", func(devices []v1alpha1.Device, n *corev1.Node) bool {
		return gpus(devices, v1alpha1.SharingMPS) && n.Labels[nvidiagpu.LabelMPS] == "true"
	})
	for _, d := range published() {
		if d.Kind == v1alpha1.DeviceKindNvidiaGPU && (d.Healthy || d.Reason != reasonMPSNotRunning) {
			t.Errorf("%s: no MPS daemon state, yet healthy %v %q", d.ID, d.Healthy, d.Reason)
		}
	}

	node, err := kube.CoreV1().Nodes().Get(ctx, "shared", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Labels[v1alpha1.LabelGPUSharing] = "exclusive"
	if _, err := kube.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("GPUs exclusive, the MPS label gone", func(devices []v1alpha1.Device, n *corev1.Node) bool {
		_, mps := n.Labels[nvidiagpu.LabelMPS]
		return gpus(devices, v1alpha1.SharingExclusive) && !mps
	})
	select {
	case err := <-done:
		t.Fatalf("the agent stopped on a sharing label change: %v", err)
	default:
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestShareText(t *testing.T) {
	if got := shareText(map[string]int64{"compute": 50, "memory": 20 << 30}); got != "compute 50%, memory 20Gi" {
		t.Errorf("shareText = %q", got)
	}
	if got := shareText(nil); got != "" {
		t.Errorf("no share: %q", got)
	}
}

// TestSharingModeChangeSettles: a GPU nobody holds is first published asking
// for its new mode, so that the scheduler stops placing pods on it for the
// old one, and switches only once settle has passed; the pass asks to run
// again then. A GPU whose holders kept it waiting longer than settle
// switches as soon as they end.
func TestSharingModeChangeSettles(t *testing.T) {
	f := newSharingFixture(t)
	f.s.settle = 2 * time.Second
	f.pass() // exclusive, as nothing asked otherwise: no change to settle
	if ev := f.takeEvents(); len(ev) != 0 || f.again != 0 {
		t.Fatalf("first pass: events %v, again %v", ev, f.again)
	}
	f.holders["b"] = []handoff.Holder{{Namespace: "ml", Name: "train"}}
	f.labels[v1alpha1.LabelGPUSharing] = "time-slicing"
	got := f.pass()
	if a := got["a"]; a.Sharing.Mode != v1alpha1.SharingExclusive || a.Sharing.RequestedMode != v1alpha1.SharingTimeSlicing || !strings.Contains(a.Sharing.Message, "sharing mode TimeSlicing in 2s") {
		t.Errorf("a, free, asked for time-slicing: %+v", a.Sharing)
	}
	if f.again != 2*time.Second {
		t.Errorf("the pass asks to run again in %v, want 2s", f.again)
	}
	f.clock = f.clock.Add(time.Second)
	if a := f.pass()["a"]; a.Sharing.Mode != v1alpha1.SharingExclusive || f.again != time.Second {
		t.Errorf("a second later: %+v, again %v", a.Sharing, f.again)
	}
	f.clock = f.clock.Add(time.Second)
	got = f.pass()
	if a := got["a"]; a.Sharing.Mode != v1alpha1.SharingTimeSlicing || a.Sharing.RequestedMode != "" {
		t.Errorf("a after settle: %+v", a.Sharing)
	}
	if b := got["b"]; b.Sharing.Mode != v1alpha1.SharingExclusive || b.Sharing.RequestedMode != v1alpha1.SharingTimeSlicing {
		t.Errorf("b, held: %+v", b.Sharing)
	}
	f.takeEvents()
	// b's holder ends after settle: b switches at once.
	delete(f.holders, "b")
	if b := f.pass()["b"]; b.Sharing.Mode != v1alpha1.SharingTimeSlicing || f.again != 0 {
		t.Errorf("b once its holder ended: %+v, again %v", b.Sharing, f.again)
	}
	if ev := f.takeEvents(); len(ev) != 1 || !strings.Contains(ev[0], reasonSharingChanged+" GPU b") {
		t.Errorf("events %v", ev)
	}
}
