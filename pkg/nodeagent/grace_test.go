package nodeagent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
)

// flakySource describes what it is told to, or fails.
type flakySource struct {
	devices []v1alpha1.Device
	err     error
}

func (s *flakySource) Describe() ([]v1alpha1.Device, metav1.Condition, error) {
	if s.err != nil {
		return nil, metav1.Condition{}, s.err
	}
	return cloneDevices(s.devices), metav1.Condition{Type: "FlakyAvailable", Status: metav1.ConditionTrue, Reason: "Discovered"}, nil
}
func (*flakySource) WatchHealth(context.Context, func(devicekind.HealthEvent)) error { return nil }
func (*flakySource) Close()                                                          {}

// flakyOpener opens src, or fails with openErr.
type flakyOpener struct {
	src     *flakySource
	openErr error
}

func (*flakyOpener) SourceName() string { return "flaky" }
func (o *flakyOpener) Open(devicekind.DiscoverOptions) (devicekind.Source, error) {
	if o.openErr != nil {
		return nil, o.openErr
	}
	return o.src, nil
}
func (*flakyOpener) NotOpen(err error) metav1.Condition {
	return metav1.Condition{Type: "FlakyAvailable", Status: metav1.ConditionFalse, Reason: "Failed", Message: err.Error()}
}

func gpu(id string) v1alpha1.Device {
	return v1alpha1.Device{ID: id, Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true}
}

func byID(devices []v1alpha1.Device) map[string]v1alpha1.Device {
	m := map[string]v1alpha1.Device{}
	for _, d := range devices {
		m[d.ID] = d
	}
	return m
}

// A transient error used to publish the source with no device for a pass:
// its endpoints stopped and its CDI names went. Now the devices are kept
// with their last health through failed passes, unhealthy when the source
// answers without them, and go only once the grace has passed.
func TestDevicesKeptThroughFailedAndPartialPasses(t *testing.T) {
	const grace = 5 * time.Minute
	src := &flakySource{devices: []v1alpha1.Device{gpu("GPU-a"), gpu("GPU-b"), gpu("GPU-c")}}
	kind := &flakyOpener{src: src}
	s := &sources{}
	o := &opened{kind: kind, err: errNotOpened, health: watchedHealth{unhealthy: map[string]string{}}, stopWatch: func() {}}
	s.opened = []*opened{o}
	t0 := time.Unix(1e9, 0)

	if !s.open(o) {
		t.Fatal("not opened")
	}
	if res := o.describe(t0, grace); res.kept != 0 || len(o.devices) != 3 {
		t.Fatalf("first pass: %+v, %d devices", res, len(o.devices))
	}
	// The watcher had found GPU-c unhealthy.
	o.health.set(devicekind.HealthEvent{ID: "GPU-c", Reason: "XID 79"})

	// NVML fails: the source closes, its devices stay with their health.
	src.err = errors.New("NVML device count: Unknown Error")
	res := o.describe(t0.Add(time.Minute), grace)
	got := byID(o.devices)
	if res.kept != 3 || len(got) != 3 || !got["GPU-a"].Healthy || got["GPU-c"].Healthy || got["GPU-c"].Reason != "XID 79" {
		t.Fatalf("failed pass kept %+v: %+v", res, o.devices)
	}
	if o.cond.Status != metav1.ConditionFalse || !strings.Contains(o.cond.Message, "Unknown Error; keeping the 3 devices last described (1 unhealthy) until 2001-09-09T01:51:40Z at the latest (grace 5m0s)") {
		t.Fatalf("condition %+v", o.cond)
	}
	if !res.until.Equal(t0.Add(grace)) {
		t.Fatalf("until %v, want %v", res.until, t0.Add(grace))
	}
	// The watcher stops with the source and forgets; the kept GPU does not.
	o.health.reset()
	// NVML does not open again for a while.
	kind.openErr = errors.New("NVML device count: Unknown Error")
	s.open(o)
	res = o.describe(t0.Add(2*time.Minute), grace)
	if got := byID(o.devices); res.kept != 3 || got["GPU-c"].Healthy || !got["GPU-b"].Healthy {
		t.Fatalf("second failed pass kept %+v: %+v", res, o.devices)
	}

	// NVML answers again, without GPU-b: it is in doubt, kept unhealthy.
	kind.openErr, src.err = nil, nil
	src.devices = []v1alpha1.Device{gpu("GPU-a"), gpu("GPU-c")}
	if !s.open(o) {
		t.Fatal("not opened again")
	}
	res = o.describe(t0.Add(3*time.Minute), grace)
	got = byID(o.devices)
	if res.kept != 1 || len(got) != 3 || got["GPU-b"].Healthy || !strings.HasPrefix(got["GPU-b"].Reason, "not described by flaky since 2001-09-09T01:46:40Z") {
		t.Fatalf("partial pass kept %+v: %+v", res, o.devices)
	}
	if !got["GPU-a"].Healthy || !got["GPU-c"].Healthy || o.cond.Status != metav1.ConditionTrue {
		t.Fatalf("described devices must be as described: %+v, %+v", o.devices, o.cond)
	}
	// Its grace, counted from when it was last described, ends.
	res = o.describe(t0.Add(grace), grace)
	if len(res.dropped) != 1 || res.dropped[0] != "GPU-b" || res.kept != 0 || len(o.devices) != 2 {
		t.Fatalf("after the grace: %+v, %+v", res, o.devices)
	}
	if !strings.Contains(o.cond.Message, "removed 1 devices not described for 5m0s: GPU-b") {
		t.Fatalf("condition %+v", o.cond)
	}
	// Gone for good: not kept again.
	res = o.describe(t0.Add(grace+time.Minute), grace)
	if res.kept != 0 || len(res.dropped) != 0 || len(o.devices) != 2 {
		t.Fatalf("after removal: %+v, %+v", res, o.devices)
	}
}

func TestNoGraceRemovesAtOnce(t *testing.T) {
	src := &flakySource{devices: []v1alpha1.Device{gpu("GPU-a")}}
	o := &opened{kind: &flakyOpener{src: src}, err: errNotOpened, health: watchedHealth{unhealthy: map[string]string{}}, stopWatch: func() {}}
	s := &sources{opened: []*opened{o}}
	s.open(o)
	o.describe(time.Unix(1e9, 0), -1)
	src.err = errors.New("gone")
	res := o.describe(time.Unix(1e9, 0), -1)
	if res.kept != 0 || len(o.devices) != 0 || len(res.dropped) != 1 {
		t.Fatalf("%+v, %+v", res, o.devices)
	}
}
