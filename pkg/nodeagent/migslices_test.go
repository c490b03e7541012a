package nodeagent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/internal/sealed"
	"github.com/resclass/resclass/pkg/mig"
)

// migFixture is migSlices on the NVML mock, GPU 0 an A100-40GB in MIG mode
// marked dynamic, and pods holding slices as holds says.
type migFixture struct {
	m     *migSlices
	dgx   *nvmlmock.Server
	gpu   string
	holds map[string][]types.UID // slice id -> pods
	dir   string
	src   devicekind.Source
}

func newMIGFixture(t *testing.T) *migFixture {
	t.Helper()
	dgx, root := nvmlmock.New(), t.TempDir()
	if err := dgx.WriteSysfs(root); err != nil {
		t.Fatal(err)
	}
	gpu := dgx.Devices[0].(*dgxa100.Device).UUID
	if err := dgx.EnableMIG(gpu, mig.A100_40GB); err != nil {
		t.Fatal(err)
	}
	src, err := (&nvmlsource.NVML{Binding: dgx}).Open(devicekind.DiscoverOptions{HostRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	devices, _, err := src.Describe()
	if err != nil {
		t.Fatal(err)
	}
	applyMIGModes(map[string]string{v1alpha1.LabelGPUMIGDevicePrefix + gpu: v1alpha1.MIGLabelDynamic}, devices)
	f := &migFixture{dgx: dgx, gpu: gpu, holds: map[string][]types.UID{}, dir: t.TempDir(), src: src}
	f.m, err = newMIGSlices(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	f.m.heldBy = func(id string) []types.UID { return f.holds[id] }
	f.m.synced = func() bool { return true }
	f.m.setSources(src.(nvidiagpu.Slicer), devices)
	return f
}

// TestMIGSlicesMadeAndDestroyed: a slice is made once per pod and
// recorded; a place another pod still holds is refused; a slice whose pod
// is gone is destroyed, by reconcile or to make room; the record survives a
// restart.
func TestMIGSlicesMadeAndDestroyed(t *testing.T) {
	f := newMIGFixture(t)
	f.m.metrics = newMetrics()
	ctx := context.Background()
	slice := mig.SliceID(f.gpu, "3g.20gb", 4)
	d, err := f.m.Ensure(ctx, "pod-a", slice)
	if err != nil {
		t.Fatal(err)
	}
	f.holds[slice] = []types.UID{"pod-a"}
	again, err := f.m.Ensure(ctx, "pod-a", slice)
	if err != nil || again.ID != d.ID {
		t.Fatalf("asked again: %v, %v", again, err)
	}
	if got := f.dgx.MIGInstances(f.gpu); !slices.Equal(got, []string{"3g.20gb@4"}) {
		t.Errorf("instances %v", got)
	}
	// Another pod, the same place, pod-a holding it: refused.
	if _, err := f.m.Ensure(ctx, "pod-b", slice); !errors.Is(err, mig.ErrPlacementTaken) {
		t.Errorf("a place another pod holds: %v", err)
	}
	// A restarted agent reads the record back and keeps what pod-a holds.
	restarted, err := newMIGSlices(f.dir)
	if err != nil || len(restarted.record.Instances) != 1 || restarted.record.Instances[0].Device != d.ID {
		t.Fatalf("record read back: %+v, %v", restarted.record, err)
	}
	if f.m.reconcile(klog.Background()) {
		t.Error("reconcile changed what a live pod holds")
	}
	// pod-a gone: pod-b gets the place, pod-a's slice destroyed first.
	f.holds[slice] = nil
	if _, err := f.m.Ensure(ctx, "pod-b", slice); err != nil {
		t.Fatal(err)
	}
	if n := len(f.m.record.Instances); n != 1 || f.m.record.Instances[0].Pod != "pod-b" {
		t.Errorf("record %+v", f.m.record)
	}
	// pod-b gone too: reconcile destroys its slice.
	if !f.m.reconcile(klog.Background()) {
		t.Error("reconcile destroyed nothing")
	}
	if got := f.dgx.MIGInstances(f.gpu); len(got) != 0 || len(f.m.record.Instances) != 0 {
		t.Errorf("instances %v, record %+v", got, f.m.record)
	}
	counted := f.m.metrics.migSlices.WithLabelValues
	if made, failed, destroyed, owned := testutil.ToFloat64(counted("made")), testutil.ToFloat64(counted("failed")), testutil.ToFloat64(counted("destroyed")), testutil.ToFloat64(f.m.metrics.migOwned); made != 2 || failed != 1 || destroyed != 2 || owned != 0 {
		t.Errorf("metrics: made %v, failed %v, destroyed %v, owned %v; want 2, 1, 2, 0", made, failed, destroyed, owned)
	}
}

// TestMIGSlicesLeaveOthersAlone: an instance the agent did not make is
// never destroyed; one of the record gone behind the agent's back is
// forgotten; nothing is decided before the pods are known.
func TestMIGSlicesLeaveOthersAlone(t *testing.T) {
	f := newMIGFixture(t)
	ctx := context.Background()
	if _, err := f.m.Ensure(ctx, "pod-a", mig.SliceID(f.gpu, "1g.5gb", 0)); err != nil {
		t.Fatal(err)
	}
	// Someone else's 3g.20gb at 4, made with the mock as nvidia-smi would.
	dev := f.dgx.Devices[0].(*dgxa100.Device)
	info, _ := dev.GetGpuInstanceProfileInfo(lib.GPU_INSTANCE_PROFILE_3_SLICE)
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &lib.GpuInstancePlacement{Start: 4, Size: 4}); ret != lib.SUCCESS {
		t.Fatal(ret)
	}
	f.m.synced = func() bool { return false }
	if f.m.reconcile(klog.Background()) || len(f.m.record.Instances) != 1 {
		t.Fatal("reconciled before the pods were known")
	}
	f.m.synced = func() bool { return true }
	if !f.m.reconcile(klog.Background()) {
		t.Fatal("pod-a's slice not destroyed")
	}
	if got := f.dgx.MIGInstances(f.gpu); !slices.Equal(got, []string{"3g.20gb@4"}) {
		t.Errorf("instances %v: the other's must stay", got)
	}
	// Made, then destroyed behind the agent's back: forgotten.
	if _, err := f.m.Ensure(ctx, "pod-c", mig.SliceID(f.gpu, "1g.5gb", 0)); err != nil {
		t.Fatal(err)
	}
	f.holds[mig.SliceID(f.gpu, "1g.5gb", 0)] = []types.UID{"pod-c"}
	o := f.m.record.Instances[0]
	if err := f.m.source().DestroySlice(o.GPU, o.GPUInstance); err != nil {
		t.Fatal(err)
	}
	if !f.m.reconcile(klog.Background()) || len(f.m.record.Instances) != 0 {
		t.Errorf("a slice gone behind the agent's back: record %+v", f.m.record)
	}
}

// TestMIGSlicesRefused: slices only on GPUs marked dynamic, with NVML open;
// a record that cannot be believed is set aside, and nothing it lists is
// destroyed.
func TestMIGSlicesRefused(t *testing.T) {
	f := newMIGFixture(t)
	ctx := context.Background()
	other := f.dgx.Devices[1].(*dgxa100.Device).UUID
	for slice, want := range map[string]string{
		mig.SliceID(other, "1g.5gb", 0):   "is not marked for dynamic MIG",
		mig.SliceID("GPU-x", "1g.5gb", 0): "no GPU GPU-x",
		"GPU-x":                           "is not a MIG slice",
	} {
		if _, err := f.m.Ensure(ctx, "p", slice); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", slice, err, want)
		}
	}
	f.m.slicer.Store(nil)
	if _, err := f.m.Ensure(ctx, "p", mig.SliceID(f.gpu, "1g.5gb", 0)); err == nil || !strings.Contains(err.Error(), "NVML is not open") {
		t.Errorf("NVML closed: %v", err)
	}

	path := filepath.Join(f.dir, MIGRecordFile)
	if err := os.WriteFile(path, []byte(`{"version":"resclass.io/mig-owned/v1","sha256":"00","data":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := newMIGSlices(f.dir)
	if err == nil || !strings.Contains(err.Error(), "set aside") || len(m.record.Instances) != 0 {
		t.Fatalf("a forged record: %v, %+v", err, m.record)
	}
	if aside, _ := filepath.Glob(path + sealed.SetAsideSuffix + "*"); len(aside) != 1 {
		t.Errorf("set aside as %v, want one file", aside)
	}
}

// TestMIGSlicesReleased: on a DRA node the claim is the holder; its
// unprepare releases the slices made for it, and only those no claim
// holds.
func TestMIGSlicesReleased(t *testing.T) {
	f := newMIGFixture(t)
	ctx := context.Background()
	a, b := mig.SliceID(f.gpu, "1g.5gb", 0), mig.SliceID(f.gpu, "3g.20gb", 4)
	for slice, claim := range map[string]types.UID{a: "claim-a", b: "claim-b"} {
		if _, err := f.m.Ensure(ctx, claim, slice); err != nil {
			t.Fatal(err)
		}
		f.holds[slice] = []types.UID{claim}
	}
	// Still prepared: kept.
	f.m.Release(ctx, "claim-a")
	if got := f.dgx.MIGInstances(f.gpu); len(got) != 2 {
		t.Fatalf("a held slice released: instances %v", got)
	}
	f.holds[a] = nil
	f.m.Release(ctx, "claim-a")
	if got := f.dgx.MIGInstances(f.gpu); !slices.Equal(got, []string{"3g.20gb@4"}) {
		t.Errorf("after claim-a's release: instances %v, want claim-b's only", got)
	}
	if len(f.m.record.Instances) != 1 || f.m.record.Instances[0].Pod != "claim-b" {
		t.Errorf("record %+v", f.m.record)
	}
	// An owner with no slice: nothing happens.
	f.m.Release(ctx, "claim-z")
	if got := f.dgx.MIGInstances(f.gpu); len(got) != 1 {
		t.Errorf("instances %v", got)
	}
}

// TestMIGSlicesDestroyedStayHidden: the MIG device of a slice destroyed is
// hidden while a description made before still lists it, so that it is
// never published as a free device.
func TestMIGSlicesDestroyedStayHidden(t *testing.T) {
	f := newMIGFixture(t)
	ctx := context.Background()
	d, err := f.m.Ensure(ctx, "claim-a", mig.SliceID(f.gpu, "1g.5gb", 0))
	if err != nil {
		t.Fatal(err)
	}
	stale := []v1alpha1.Device{*d}
	if owned := f.m.mark(stale); !owned[d.ID] {
		t.Fatal("the slice's device is not hidden")
	}
	changes := 0
	f.m.changed = func() { changes++ }
	f.m.Release(ctx, "claim-a")
	if changes != 1 {
		t.Errorf("a destroyed slice asked for %d descriptions again, want 1", changes)
	}
	if owned := f.m.mark(stale); !owned[d.ID] {
		t.Error("a destroyed slice's device, still described, is published")
	}
	f.m.mark(nil) // described again: gone
	if owned := f.m.mark(stale); owned[d.ID] {
		t.Error("a device listed again after it was gone is still hidden")
	}
}

// TestMIGSliceHalfMade: while a slice is half made (its GPU instance exists,
// its compute instance not yet), a description of the GPUs waits, and then
// sees the slice whole; a pod deleted meanwhile leaves a slice nobody
// holds, which the next pass destroys.
func TestMIGSliceHalfMade(t *testing.T) {
	f := newMIGFixture(t)
	slice := mig.SliceID(f.gpu, "3g.20gb", 4)
	f.holds[slice] = []types.UID{"pod-a"}
	type described struct {
		devices []v1alpha1.Device
		err     error
	}
	done := make(chan described, 1)
	waited := false
	f.dgx.OnMIGCreate(f.gpu, func() {
		go func() {
			d, _, err := f.src.Describe()
			done <- described{d, err}
		}()
		select {
		case got := <-done:
			done <- got // for the checks below
		case <-time.After(300 * time.Millisecond):
			waited = true // an upper bound on the wait: the description is held back
		}
		f.holds[slice] = nil // pod-a deleted while its slice is made
	})
	d, err := f.m.Ensure(context.Background(), "pod-a", slice)
	if err != nil {
		t.Fatal(err)
	}
	if !waited {
		t.Error("a description ran while the slice was half made")
	}
	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	if !slices.ContainsFunc(got.devices, func(x v1alpha1.Device) bool { return x.ID == d.ID && x.Healthy }) {
		t.Errorf("the description after the making lacks the healthy MIG device %s", d.ID)
	}
	if !f.m.reconcile(klog.Background()) || len(f.dgx.MIGInstances(f.gpu)) != 0 || len(f.m.record.Instances) != 0 {
		t.Errorf("a slice whose pod was deleted while it was made: instances %v, record %+v", f.dgx.MIGInstances(f.gpu), f.m.record)
	}
}
