package handoff

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/internal/watchdog"
	"github.com/resclass/resclass/pkg/selector"
)

const (
	gib      = int64(1) << 30
	gpu10g   = "gpu-10g"
	gpu10gRN = v1alpha1.ResourceNamePrefix + gpu10g
)

// sharedGPU is an 80Gi GPU in a sharing mode.
func sharedGPU(id string, minor int64, mode v1alpha1.SharingMode) v1alpha1.Device {
	d := gpu(id, minor)
	d.Sharing = &v1alpha1.DeviceSharing{Mode: mode, Capacity: map[string]resource.Quantity{
		v1alpha1.CapacityMemory:  *resource.NewQuantity(80*gib, resource.BinarySI),
		v1alpha1.CapacityCompute: *resource.NewQuantity(100, resource.DecimalSI),
	}}
	return d
}

// share is one container's share: units of gpu-10g (10Gi and 25%) of gpu.
type share struct {
	gpu   string
	units int64
}

// sharePod is a pod whose containers hold shares of gpu-10g.
func sharePod(name string, containers map[string]share) *corev1.Pod {
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
	for _, n := range slices.Sorted(func(yield func(string) bool) {
		for n := range containers {
			if !yield(n) {
				return
			}
		}
	}) {
		s := containers[n]
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: n, Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			gpu10gRN: *resource.NewQuantity(s.units, resource.DecimalSI),
		}}})
		a.Containers = append(a.Containers, assignment.Container{
			Name:    n,
			Classes: map[string][]string{gpu10g: {s.gpu}},
			Shares:  map[string]assignment.Share{gpu10g: {v1alpha1.CapacityMemory: 10 * gib * s.units, v1alpha1.CapacityCompute: 25 * s.units}},
		})
	}
	v, err := assignment.Encode(a)
	if err != nil {
		panic(err)
	}
	p.Annotations = map[string]string{assignment.AnnotationKey: v}
	return p
}

func shareFixture(t *testing.T, pods ...*corev1.Pod) *fixture {
	f := newFixture(t, pods...)
	f.alloc.SetDevices(append(inventory(), sharedGPU("GPU-M", 4, v1alpha1.SharingMPS), sharedGPU("GPU-T", 5, v1alpha1.SharingTimeSlicing), sharedGPU("GPU-U", 6, v1alpha1.SharingMPS)))
	return f
}

func slots(gpu string, n ...int) []string {
	out := make([]string, len(n))
	for i, s := range n {
		out[i] = gpu + "/share/" + strconv.Itoa(s)
	}
	return out
}

func TestShareSlotsPerClass(t *testing.T) {
	capacity := selector.Capacity{Memory: 80 * gib, Compute: 100}
	for _, c := range []struct {
		unit selector.Share
		c    selector.Capacity
		want int
	}{
		{selector.Share{Memory: 10 * gib, Compute: 25}, capacity, 4}, // compute is the bound
		{selector.Share{Memory: 10 * gib}, capacity, 8},
		{selector.Share{Compute: 30}, capacity, 3},
		{selector.Share{Memory: 100 * gib}, capacity, 0},
		{selector.Share{Memory: 1}, capacity, MaxShareSlots},
		{selector.Share{Memory: gib}, selector.Capacity{Memory: -1, Compute: 100}, 0}, // no memory published
		{selector.Share{}, capacity, 0},
	} {
		if got := ShareSlots(c.unit, c.c); got != c.want {
			t.Errorf("ShareSlots(%+v, %+v) = %d, want %d", c.unit, c.c, got, c.want)
		}
	}
	d := sharedGPU("GPU-M", 4, v1alpha1.SharingMPS)
	ids := KubeletIDs(kinds.Builtin, &d, 110, 3)
	if !slices.Equal(ids, slots("GPU-M", 0, 1, 2)) || DeviceID(ids[2]) != "GPU-M" {
		t.Errorf("KubeletIDs of a shared GPU: %v", ids)
	}
	whole := gpu("GPU-0", 0)
	if ids := KubeletIDs(kinds.Builtin, &whole, 110, 3); !slices.Equal(ids, []string{"GPU-0"}) {
		t.Errorf("KubeletIDs of a whole GPU: %v", ids)
	}
}

func TestPreferredPicksTheAssignedGPUsSlots(t *testing.T) {
	a := sharePod("a", map[string]share{"main": {"GPU-M", 1}})
	b := sharePod("b", map[string]share{"main": {"GPU-T", 2}})
	f := shareFixture(t, a, b)
	all := append(slots("GPU-M", 3, 1, 2), slots("GPU-T", 2, 0, 3)...)
	// Two units: b's, on GPU-T, its lowest free slots.
	if got := f.preferred(gpu10gRN, 2, all); !slices.Equal(got, slots("GPU-T", 0, 2)) {
		t.Errorf("preferred for 2 units: %v", got)
	}
	// One unit: a's, on GPU-M.
	if got := f.preferred(gpu10gRN, 1, all); !slices.Equal(got, slots("GPU-M", 1)) {
		t.Errorf("preferred for 1 unit: %v", got)
	}
	// A must-include slot of the assigned GPU is kept.
	if got := f.preferred(gpu10gRN, 2, all, slots("GPU-T", 3)...); !slices.Equal(got, slots("GPU-T", 3, 0)) {
		t.Errorf("preferred with a must-include slot: %v", got)
	}
	// Not enough free slots on the assigned GPU: no preference.
	if got := f.preferred(gpu10gRN, 2, slots("GPU-T", 1)); got != nil {
		t.Errorf("preferred with one free slot for two units: %v", got)
	}
}

func TestAllocateRefusesSharesNotAssigned(t *testing.T) {
	a := sharePod("a", map[string]share{"main": {"GPU-M", 2}})
	// A container assigned the GPU for the class without a share.
	noShare := pod("c", map[string]map[string][]string{"main": {gpu10g: {"GPU-T"}}})
	f := shareFixture(t, a, noShare)

	// Slots of a GPU nobody was assigned.
	_, err := f.allocate(gpu10gRN, slots("GPU-U", 0, 1)...)
	if err == nil || !strings.Contains(err.Error(), "share slots") || !strings.Contains(err.Error(), "[GPU-M]") {
		t.Fatalf("slots of another GPU: %v", err)
	}
	if ev := f.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+ReasonMismatch) {
		t.Errorf("events %v", ev)
	}
	if n := testutil.ToFloat64(f.metrics.outcomes.WithLabelValues(gpu10g, "mismatch")); n != 1 {
		t.Errorf("mismatch count %v", n)
	}
	// Slots split over two GPUs, and a count other than the container's units.
	for _, ids := range [][]string{append(slots("GPU-M", 0), slots("GPU-U", 0)...), slots("GPU-M", 0, 1, 2)} {
		if _, err := f.allocate(gpu10gRN, ids...); err == nil {
			t.Errorf("Allocate(%v): granted", ids)
		}
	}
	// Ids not in the form the device is advertised in.
	for _, ids := range [][]string{{"GPU-M"}, {"GPU-M/0"}, {"GPU-0/share/0"}, {"GPU-M/share/01"}, {"GPU-M/share/0", "GPU-0"}} {
		if _, err := f.allocate(gpu10gRN, ids...); err == nil {
			t.Errorf("Allocate(%v): granted", ids)
		}
	}
	// The container without a share is not given share slots of its GPU.
	f.events()
	if _, err := f.allocate(gpu10gRN, slots("GPU-T", 0)...); err == nil || !strings.Contains(err.Error(), "without a share") {
		t.Errorf("a container without a share got share slots: %v", err)
	}
	if ev := f.events(); len(ev) != 1 || !strings.Contains(ev[0], ReasonMismatch) {
		t.Errorf("events %v", ev)
	}
	// The right slots still work.
	if _, err := f.allocate(gpu10gRN, slots("GPU-M", 3, 0)...); err != nil {
		t.Errorf("the assigned GPU's slots: %v", err)
	}
}

func TestShareResponseCarriesTheContainersOwnLimits(t *testing.T) {
	// Two containers of different sizes on one MPS GPU, in two pods, and a
	// third on a time-sliced GPU.
	small := sharePod("small", map[string]share{"main": {"GPU-M", 1}})
	big := sharePod("big", map[string]share{"main": {"GPU-M", 3}})
	sliced := sharePod("sliced", map[string]share{"main": {"GPU-T", 2}})
	f := shareFixture(t, small, big, sliced)

	resp, err := f.allocate(gpu10gRN, slots("GPU-M", 1, 2, 3)...)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		EnvShareMemory:                strconv.FormatInt(30*gib, 10),
		EnvShareCompute:               "75",
		nvidiagpu.EnvMPSPipeDirectory: "/run/resclass/mps/GPU-M/pipe",
		nvidiagpu.EnvMPSMemLimit:      "0=30720M",
		nvidiagpu.EnvMPSThreads:       "75",
		"RESCLASS_DEVICES_GPU_10G":    "GPU-M",
	}
	for k, v := range want {
		if resp.Envs[k] != v {
			t.Errorf("big: %s=%q, want %q", k, resp.Envs[k], v)
		}
	}
	var mounts []string
	for _, m := range resp.Mounts {
		mounts = append(mounts, m.HostPath+":"+m.ContainerPath+":"+strconv.FormatBool(m.ReadOnly))
	}
	if !slices.Equal(mounts, []string{"/run/resclass/mps/GPU-M/pipe:/run/resclass/mps/GPU-M/pipe:false", "/run/resclass/mps/shm:/dev/shm:false"}) {
		t.Errorf("big: mounts %v", mounts)
	}
	if len(resp.CdiDevices) != 1 || resp.CdiDevices[0].Name != "resclass.io/gpu=GPU-M" {
		t.Errorf("big: the GPU as for a whole GPU: %v", resp.CdiDevices)
	}

	resp, err = f.allocate(gpu10gRN, slots("GPU-M", 0)...)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Envs[nvidiagpu.EnvMPSMemLimit] != "0=10240M" || resp.Envs[nvidiagpu.EnvMPSThreads] != "25" || resp.Envs[EnvShareMemory] != strconv.FormatInt(10*gib, 10) {
		t.Errorf("small: its own limits, not big's: %v", resp.Envs)
	}

	// Time-sliced: the share is said, no MPS.
	resp, err = f.allocate(gpu10gRN, slots("GPU-T", 4, 5)...)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Envs[EnvShareCompute] != "50" || resp.Envs[nvidiagpu.EnvMPSPipeDirectory] != "" || len(resp.Mounts) != 0 {
		t.Errorf("time-sliced: %v, mounts %v", resp.Envs, resp.Mounts)
	}

	recs := f.alloc.Allocations()
	if len(recs) != 3 || recs[0].Name != "big" || recs[0].Share[v1alpha1.CapacityMemory] != 30*gib || recs[1].Share[v1alpha1.CapacityCompute] != 50 {
		t.Errorf("records show the shares: %+v", recs)
	}
}

func TestTwoContainersOfOnePodOnOneGPU(t *testing.T) {
	p := sharePod("p", map[string]share{"a": {"GPU-M", 2}, "b": {"GPU-M", 1}})
	f := shareFixture(t, p)
	// The kubelet admits a first, then b; each gets its own size.
	for _, c := range []struct {
		ids     []string
		threads string
	}{{slots("GPU-M", 0, 1), "50"}, {slots("GPU-M", 2), "25"}} {
		if got := f.preferred(gpu10gRN, len(c.ids), slots("GPU-M", 0, 1, 2, 3)); len(got) != len(c.ids) {
			t.Errorf("preferred for %d units: %v", len(c.ids), got)
		}
		resp, err := f.allocate(gpu10gRN, c.ids...)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Envs[nvidiagpu.EnvMPSThreads] != c.threads {
			t.Errorf("%d units: threads %q, want %s", len(c.ids), resp.Envs[nvidiagpu.EnvMPSThreads], c.threads)
		}
	}
}

func TestHolders(t *testing.T) {
	whole := pod("whole", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-0"}}})
	s1 := sharePod("s1", map[string]share{"main": {"GPU-M", 1}})
	s2 := sharePod("s2", map[string]share{"main": {"GPU-M", 1}})
	done := sharePod("done", map[string]share{"main": {"GPU-M", 1}})
	done.Status.Phase = corev1.PodSucceeded
	f := shareFixture(t, whole, s1, s2, done)
	if got := f.alloc.Holders("GPU-0"); len(got) != 1 || got[0].Name != "whole" || got[0].Share {
		t.Errorf("GPU-0 holders %+v", got)
	}
	if got := f.alloc.Holders("GPU-M"); len(got) != 2 || got[0].Name != "s1" || got[1].Name != "s2" || !got[0].Share {
		t.Errorf("GPU-M holders %+v (a finished pod holds nothing)", got)
	}
	if got := f.alloc.Holders("GPU-3"); len(got) != 0 {
		t.Errorf("GPU-3 holders %+v", got)
	}
}

// FuzzParseKubeletID: any id parses into a device and a form or is refused;
// what parses is exactly what the agent writes.
func FuzzParseKubeletID(f *testing.F) {
	for _, s := range []string{"GPU-0", "hugepages-1Gi-numa0/3", "GPU-M/share/0", "GPU-M/share/", "GPU-M/share/-1", "/share/1", "a/b/c", "GPU-M/share/007", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 256 {
			return
		}
		dev, kind, ok := ParseKubeletID(s)
		if !ok {
			return
		}
		if dev == "" || dev != DeviceID(s) {
			t.Fatalf("%q: device %q", s, dev)
		}
		var again string
		switch kind {
		case wholeID:
			again = dev
		case poolSlot:
			again = dev + "/" + s[len(dev)+1:]
		case shareSlot:
			n, err := strconv.Atoi(s[len(dev)+len(shareInfix):])
			if err != nil {
				t.Fatalf("%q: share slot without a number", s)
			}
			again = ShareSlotIDs(dev, n+1)[n]
		}
		if again != s {
			t.Fatalf("%q parsed as %q %d, written back %q", s, dev, kind, again)
		}
	})
}

// FuzzAllocateShares sends random slot lists to a share class's Allocate:
// whatever it grants is slots of one GPU, as many as the units of a
// container with a share of that GPU, and carries that many units' limits.
func FuzzAllocateShares(f *testing.F) {
	units := map[string][]int64{"GPU-M": {2, 1}, "GPU-T": {3}}
	pods := []*corev1.Pod{
		sharePod("fa", map[string]share{"main": {"GPU-M", 2}}),
		sharePod("fb", map[string]share{"main": {"GPU-M", 1}}),
		sharePod("fc", map[string]share{"main": {"GPU-T", 3}}),
	}
	for _, seed := range []string{"GPU-M/share/0,GPU-M/share/1", "GPU-M/share/2", "GPU-T/share/0,GPU-T/share/1,GPU-T/share/2", "GPU-M/share/0,GPU-T/share/0", "GPU-M", "GPU-M/share/x", "GPU-M/0", ""} {
		f.Add(seed)
	}
	fx := newFixtureWaiting(f, time.Millisecond, pods...)
	fx.alloc.SetDevices(append(inventory(), sharedGPU("GPU-M", 4, v1alpha1.SharingMPS), sharedGPU("GPU-T", 5, v1alpha1.SharingTimeSlicing)))
	fx.ctx = klog.NewContext(context.Background(), logr.Discard())
	f.Fuzz(func(t *testing.T, s string) {
		watchdog.Run(t, func() {
			ids := strings.Split(s, ",")
			resp, err := fx.allocate(gpu10gRN, ids...)
			if err != nil {
				return
			}
			gpu := DeviceID(ids[0])
			for _, id := range ids {
				if _, kind, _ := ParseKubeletID(id); kind != shareSlot || DeviceID(id) != gpu {
					t.Fatalf("Allocate(%q) granted ids that are not slots of one GPU", s)
				}
			}
			if !slices.Contains(units[gpu], int64(len(ids))) {
				t.Fatalf("Allocate(%q) granted %d slots of %s, no container's units", s, len(ids), gpu)
			}
			if got := resp.Envs[EnvShareCompute]; got != strconv.Itoa(25*len(ids)) {
				t.Fatalf("Allocate(%q): compute %q for %d units", s, got, len(ids))
			}
		})
	})
}
