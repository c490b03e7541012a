package draplugin

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/mig"
)

// sliceMaker stands for the node agent's (pkg/nodeagent, tested on the
// NVML mock there): it makes a MIG device per owner and slice, and asks the
// plugin who holds a slice, as the agent's does, when released.
type sliceMaker struct {
	p        *Plugin
	made     map[string]types.UID // slice -> owner
	released []types.UID
	fail     error
	// unheld lists the slices asked for while the plugin did not count
	// their claim among the holders.
	unheld []string
}

func (m *sliceMaker) Ensure(_ context.Context, owner types.UID, id string) (*v1alpha1.Device, error) {
	if !slices.Contains(m.p.HeldBy(id), owner) {
		m.unheld = append(m.unheld, id)
	}
	if m.fail != nil {
		return nil, m.fail
	}
	if o, ok := m.made[id]; ok && o != owner && slices.Contains(m.p.HeldBy(id), o) {
		return nil, mig.ErrPlacementTaken
	}
	m.made[id] = owner
	gpu, profile, _, _ := mig.ParseSliceID(id)
	return &v1alpha1.Device{ID: "MIG-" + profile + "-" + string(owner), Kind: v1alpha1.DeviceKindNvidiaMIG, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeParent: v1alpha1.StringAttribute(gpu),
	}}, nil
}

func (m *sliceMaker) Release(_ context.Context, owner types.UID) {
	m.released = append(m.released, owner)
	for id, o := range m.made {
		if o == owner && !slices.Contains(m.p.HeldBy(id), owner) {
			delete(m.made, id)
		}
	}
}

// TestPrepareMakesSlices: a claim allocated a potential slice gets the MIG
// device made for it, under its own name; the claim holds the slice until
// it is unprepared, which releases it; a slice that cannot be made fails
// the prepare with MIGSliceFailed and releases what was made.
func TestPrepareMakesSlices(t *testing.T) {
	f := newFixture(t)
	maker := &sliceMaker{made: map[string]types.UID{}}
	f.cfg.Slices = maker
	f.restart()
	maker.p = f.p
	slice := mig.SliceID("GPU-a", "3g.20gb", 4)
	pot := v1alpha1.Device{ID: slice, Kind: v1alpha1.DeviceKindNvidiaMIG, Healthy: true}
	f.p.SetDevices([]v1alpha1.Device{gpu("GPU-a", 0), gpu("GPU-b", 1), pot}, map[string]string{"gpu-1": "GPU-b", "slice-a": slice})

	res := f.prepare(claim("u1", "mig", "slice-a"))["u1"]
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if maker.made[slice] != "u1" {
		t.Fatalf("made %v, want the slice for u1", maker.made)
	}
	if want := []string{CDIKind + "=u1-gpus", "resclass.io/gpu=MIG-3g.20gb-u1"}; !slices.Equal(res.Devices[0].CDIDeviceIDs, want) {
		t.Errorf("CDI ids %v, want %v", res.Devices[0].CDIDeviceIDs, want)
	}
	if env := f.spec("u1").Devices[0].ContainerEdits.Env; !slices.Contains(env, "NVIDIA_VISIBLE_DEVICES=MIG-3g.20gb-u1") {
		t.Errorf("env %v: the container must get the MIG device made", env)
	}
	if got := f.p.HeldBy(slice); !slices.Equal(got, []types.UID{"u1"}) {
		t.Errorf("held by %v", got)
	}
	// While it was made the claim held it already: the agent's
	// reconciliation runs beside a prepare.
	if len(maker.unheld) > 0 {
		t.Errorf("slices made while their claim did not hold them: %v", maker.unheld)
	}
	// Another claim allocated the same place while u1 holds it: refused.
	if res := f.prepare(claim("u2", "mig", "slice-a"))["u2"]; res.Err == nil || !strings.Contains(res.Err.Error(), "already prepared") {
		t.Errorf("a second claim of the slice: %v", res.Err)
	}
	// Repeated after a restart: the same slice, the same answer.
	f.restart()
	f.p.SetDevices([]v1alpha1.Device{gpu("GPU-a", 0), pot}, map[string]string{"slice-a": slice})
	maker.p = f.p
	if again := f.prepare(claim("u1", "mig", "slice-a"))["u1"]; again.Err != nil || !slices.Equal(again.Devices[0].CDIDeviceIDs, res.Devices[0].CDIDeviceIDs) {
		t.Errorf("prepared again: %+v", again)
	}
	if _, err := f.p.UnprepareResourceClaims(f.ctx, []kubeletplugin.NamespacedObject{{UID: "u1"}}); err != nil {
		t.Fatal(err)
	}
	if _, held := maker.made[slice]; held || !slices.Contains(maker.released, "u1") {
		t.Errorf("after unprepare: made %v, released %v", maker.made, maker.released)
	}

	for len(f.recorder.Events) > 0 {
		<-f.recorder.Events
	}
	maker.fail = errors.New("NVML: insufficient resources")
	if res := f.prepare(claim("u3", "mig", "slice-a"))["u3"]; res.Err == nil || !strings.Contains(res.Err.Error(), "insufficient resources") {
		t.Fatalf("a slice that cannot be made: %v", res.Err)
	}
	if ev := <-f.recorder.Events; !strings.Contains(ev, "MIGSliceFailed") || !strings.Contains(ev, "could not be made") {
		t.Errorf("event %q", ev)
	}
	if !slices.Contains(maker.released, "u3") {
		t.Errorf("the failed claim's slices not released: %v", maker.released)
	}
	if _, ok := f.p.Prepared()["u3"]; ok {
		t.Error("a claim whose slice was not made is prepared")
	}
}

// TestPrepareRefusesSlicesWithoutMaker: an agent that makes no slices
// refuses a claim allocated one.
func TestPrepareRefusesSlicesWithoutMaker(t *testing.T) {
	f := newFixture(t)
	slice := mig.SliceID("GPU-a", "1g.5gb", 0)
	f.p.SetDevices([]v1alpha1.Device{{ID: slice, Kind: v1alpha1.DeviceKindNvidiaMIG, Healthy: true}}, map[string]string{"slice-a": slice})
	if res := f.prepare(claim("u1", "mig", "slice-a"))["u1"]; res.Err == nil || !strings.Contains(res.Err.Error(), "makes no MIG slices") {
		t.Errorf("prepared without a slice maker: %v", res.Err)
	}
}
