package e2e

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// widgets is a test-only kind read through a source with a lifecycle (as
// NVML is): it does not open at first, reports health events, and can go
// away. Its parts share their widget's health.
type widgets struct{ s *widgetState }

type widgetState struct {
	mu       sync.Mutex
	refusals int  // Open fails this many more times
	gone     bool // Describe fails: the source went away
	opens    int
	closes   int
	watching int // watchers running
	events   chan devicekind.HealthEvent
}

const widgetCondition = "WidgetsOpened"

func (widgets) Names() []string { return []string{"test-widget", "test-widget-part"} }
func (widgets) Attributes() map[string]v1alpha1.AttributeType {
	return map[string]v1alpha1.AttributeType{v1alpha1.AttributeParent: v1alpha1.AttributeTypeString}
}
func (widgets) Allocation(*v1alpha1.Device) devicekind.Allocation { return devicekind.Exclusive }
func (widgets) LabelKeys() []string                               { return nil }
func (widgets) Labels([]*v1alpha1.Device) map[string]string       { return nil }
func (widgets) Summarize(s v1alpha1.DeviceSummary, _ *v1alpha1.Device) v1alpha1.DeviceSummary {
	return s
}
func (widgets) ContainerEdits(*devicekind.Handoff, []*v1alpha1.Device, []*v1alpha1.Device, *devicekind.ContainerEdits) error {
	return nil
}
func (widgets) SourceName() string { return "widgets" }

func (w widgets) Open(devicekind.DiscoverOptions) (devicekind.Source, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if w.s.refusals > 0 {
		w.s.refusals--
		return nil, errors.New("no widget driver yet")
	}
	w.s.opens++
	w.s.gone = false
	return widgetSource(w), nil
}

func (widgets) NotOpen(err error) metav1.Condition {
	return metav1.Condition{Type: widgetCondition, Status: metav1.ConditionFalse, Reason: "NotOpen", Message: err.Error()}
}

func (widgets) InheritedHealth(d *v1alpha1.Device, unhealthy func(string) (string, bool)) (string, bool) {
	if p := d.Attributes[v1alpha1.AttributeParent].StringValue; p != nil && d.Kind == "test-widget-part" {
		if reason, sick := unhealthy(*p); sick {
			return "widget " + *p + ": " + reason, true
		}
	}
	return "", false
}

type widgetSource widgets

func (w widgetSource) Describe() ([]v1alpha1.Device, metav1.Condition, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if w.s.gone {
		return nil, metav1.Condition{}, errors.New("the widgets went away")
	}
	return []v1alpha1.Device{
			{ID: "widget-0", Kind: "test-widget", Healthy: true},
			{ID: "widget-0-part", Kind: "test-widget-part", Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{v1alpha1.AttributeParent: v1alpha1.StringAttribute("widget-0")}},
			{ID: "widget-1", Kind: "test-widget", Healthy: true},
		},
		metav1.Condition{Type: widgetCondition, Status: metav1.ConditionTrue, Reason: "Opened", Message: "2 widgets"}, nil
}

func (w widgetSource) WatchHealth(ctx context.Context, report func(devicekind.HealthEvent)) error {
	w.s.mu.Lock()
	w.s.watching++
	w.s.mu.Unlock()
	defer func() {
		w.s.mu.Lock()
		w.s.watching--
		w.s.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-w.s.events:
			report(e)
		}
	}
}

func (w widgetSource) Close() {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	w.s.closes++
}

// TestOpenerSeam runs the node agent, on the real apiserver with the agent's
// identity, with a kind that no package of resclass knows and whose source has
// a lifecycle of its own, as NVML's has (devicekind.Opener): the agent
// retries it until it opens, publishes its devices and condition, applies its
// health events (and the parts' inherited health), opens it again when it
// goes away (forgetting what its watcher said), and closes it when it stops.
// TestNodeAgentRobustness follows the NVML kind the same way.
func TestOpenerSeam(t *testing.T) {
	ctx, cancel := agentTest(t, 2*time.Minute)
	defer cancel()
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	const node = "widget-node"
	arc, akc := robustNode(t, ctx, node)
	state := &widgetState{refusals: 2, events: make(chan devicekind.HealthEvent)}
	agent := nodeagent.New(nodeagent.Config{
		NodeName: node, HostRoot: t.TempDir(),
		Kinds:        devicekind.NewRegistry(widgets{state}),
		PollInterval: 200 * time.Millisecond, ResyncInterval: time.Second, OpenRetryMax: 200 * time.Millisecond,
	}, arc, akc)
	stop, _ := runAgent(t, ctx, agent)

	cond := func(nd *v1alpha1.NodeDevices) *metav1.Condition {
		return meta.FindStatusCondition(nd.Status.Conditions, widgetCondition)
	}
	device := func(nd *v1alpha1.NodeDevices, id string) *v1alpha1.Device {
		for i := range nd.Status.Devices {
			if nd.Status.Devices[i].ID == id {
				return &nd.Status.Devices[i]
			}
		}
		return nil
	}
	locked := func(f func()) {
		state.mu.Lock()
		defer state.mu.Unlock()
		f()
	}

	// Not open at first, then opened after two refusals.
	nd := waitNodeDevices(t, ctx, rc, node, func(nd *v1alpha1.NodeDevices) bool {
		c := cond(nd)
		return c != nil && c.Status == metav1.ConditionTrue && len(nd.Status.Devices) == 3
	})
	if c := cond(nd); c.Message != "2 widgets" {
		t.Errorf("condition %+v", c)
	}
	locked(func() {
		if state.opens != 1 || state.refusals != 0 {
			t.Errorf("opened %d times with %d refusals left, want once after both", state.opens, state.refusals)
		}
	})

	// A health event marks the widget and its part.
	state.events <- devicekind.HealthEvent{ID: "widget-0", Reason: "overheated"}
	nd = waitNodeDevices(t, ctx, rc, node, func(nd *v1alpha1.NodeDevices) bool {
		d := device(nd, "widget-0")
		return d != nil && !d.Healthy
	})
	if d := device(nd, "widget-0"); d.Reason != "overheated" {
		t.Errorf("widget-0: %+v", d)
	}
	if d := device(nd, "widget-0-part"); d == nil || d.Healthy || d.Reason != "widget widget-0: overheated" {
		t.Errorf("widget-0-part does not share its widget's health: %+v", d)
	}
	if d := device(nd, "widget-1"); d == nil || !d.Healthy {
		t.Errorf("widget-1: %+v", d)
	}

	// Gone at a resync: closed, its watcher stopped and its health
	// forgotten, opened again after one more refusal.
	locked(func() { state.gone, state.refusals = true, 1 })
	waitNodeDevices(t, ctx, rc, node, func(nd *v1alpha1.NodeDevices) bool {
		var opens int
		locked(func() { opens = state.opens })
		d, p := device(nd, "widget-0"), device(nd, "widget-0-part")
		return opens == 2 && d != nil && d.Healthy && p != nil && p.Healthy
	})
	locked(func() {
		if state.closes != 1 || state.watching != 1 {
			t.Errorf("after going away: %d closes, %d watchers running; want 1 and 1", state.closes, state.watching)
		}
	})

	if err := stop(); err != nil {
		t.Fatal(err)
	}
	locked(func() {
		if state.closes != 2 || state.watching != 0 {
			t.Errorf("after the agent stopped: %d closes, %d watchers running; want 2 and 0", state.closes, state.watching)
		}
	})
}
