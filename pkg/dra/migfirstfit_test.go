package dra

import (
	"fmt"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/dra/dradevice"
	"github.com/resclass/resclass/pkg/internal/arrivals"
	migtable "github.com/resclass/resclass/pkg/mig"
)

// TestMIGStockAllocatorIsTheReplay: make bench BENCH=MIGPlacement reports
// what the stock DRA allocator serves on the potential slices resclass
// publishes (dra-first-fit) by replaying first fit over
// mig.Table.PublishOrder, GPU after GPU. Here upstream's structured
// allocator itself (what kube-scheduler runs, partitionable devices on)
// serves the start of the benchmark's stream on the same fleet, through the
// DeviceClasses of six createMIG classes, and must serve exactly what the
// replay serves, arrival by arrival: the benchmark's figure is the real
// allocator's.
func TestMIGStockAllocatorIsTheReplay(t *testing.T) {
	const (
		gpus     = 32
		count    = 1500 // of the benchmark's 6000: the fleet is full at times; 13 s on a 2-core machine
		lifetime = 120
	)
	table := migtable.A100_80GB
	weights := []int{6, 4, 3, 2, 1, 1}
	stream := arrivals.Stream(38, count, weights, lifetime)

	// The requests: one class per profile that is not limited, asking for
	// at least its memory and multiprocessors, never a media extension
	// (the benchmark's requests).
	var limited []string
	type request struct {
		class string
		p     *migtable.Profile
	}
	var reqs []request
	for i := range table.Profiles {
		if p := &table.Profiles[i]; p.Max < len(p.Starts) {
			limited = append(limited, p.Name)
		}
	}
	cls := classes{}
	kindMIG := expr("kind", v1alpha1.ResourceSelectorOpIn, v1alpha1.DeviceKindNvidiaMIG)
	for i := range table.Profiles {
		p := &table.Profiles[i]
		if p.Max < len(p.Starts) {
			continue
		}
		rc := migClass("at-least-"+p.Name, true, kindMIG,
			expr("memory", v1alpha1.ResourceSelectorOpGtEq, strconv.FormatInt(p.MemoryMiB, 10)+"Mi"),
			expr("multiprocessors", v1alpha1.ResourceSelectorOpGtEq, strconv.Itoa(p.Multiprocessors)),
			expr("migProfile", v1alpha1.ResourceSelectorOpNotIn, limited...))
		dc, err := DeviceClass(rc)
		if err != nil {
			t.Fatal(err)
		}
		cls[rc.Name] = dc
		reqs = append(reqs, request{rc.Name, p})
	}
	if len(reqs) != len(weights) {
		t.Fatalf("%d requests for %d weights", len(reqs), len(weights))
	}

	// The fleet as a DRA node publishes it: each GPU's potential slices in
	// a slice of its own, in the fleet's order, and the counter sets.
	var slices []*resourceapi.ResourceSlice
	var counters []resourceapi.CounterSet
	place := map[string]migtable.Instance{} // DRA device name -> its instance
	gpuOf := map[string]int{}
	for g := range gpus {
		dev := v1alpha1.Device{ID: fmt.Sprintf("GPU-%02d", g), Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, MIG: table.API(), Attributes: map[string]v1alpha1.DeviceAttribute{
			v1alpha1.AttributeMIGEnabled: v1alpha1.BoolAttribute(true),
			v1alpha1.AttributeProduct:    v1alpha1.StringAttribute(table.Product),
		}}
		dev.MIG.Mode = v1alpha1.MIGDynamic
		m, err := dradevice.MIGPotentials(&dev)
		if err != nil {
			t.Fatal(err)
		}
		counters = append(counters, m.Counters)
		slices = append(slices, &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: m.Devices}})
		for i, d := range m.Devices {
			_, profile, start, _ := migtable.ParseSliceID(m.Potentials[i].ID)
			place[d.Name] = migtable.Instance{Profile: table.Profile(profile), Start: start}
			gpuOf[d.Name] = g
		}
	}
	for len(counters) > 0 {
		n := min(len(counters), resourceapi.ResourceSliceMaxCounterSets)
		slices = append(slices, &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{SharedCounters: counters[:n]}})
		counters = counters[n:]
	}
	for i, s := range slices {
		s.Name = fmt.Sprintf("node-1-resclass.io-%03d", i)
		s.Spec.Driver, s.Spec.NodeName = dradevice.DriverName, ptr("node-1")
		s.Spec.Pool = resourceapi.ResourcePool{Name: "node-1", ResourceSliceCount: int64(len(slices))}
	}

	ctx := klog.NewContext(t.Context(), klog.Background().V(10)) // the allocator's logs are too many for a test
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	features := structured.Features{ConsumableCapacity: true, DeviceTaints: true, PrioritizedList: true, PartitionableDevices: true}
	allocated := sets.New[structured.DeviceID]()
	cache := dracel.NewCache(10, dracel.Features{EnableConsumableCapacity: true})
	holding := map[int]string{} // arrival -> its device
	stock := arrivals.Replay(stream, func(i int) bool {
		state := structured.AllocatedState{AllocatedDevices: allocated, AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](), AggregatedCapacity: structured.NewConsumedCapacityCollection()}
		a, err := structured.NewAllocator(ctx, features, state, cls, slices, cache)
		if err != nil {
			t.Fatal(err)
		}
		out, err := a.Allocate(ctx, node, []*resourceapi.ResourceClaim{countClaim(strconv.Itoa(i), reqs[stream[i].Kind].class, 1)})
		if err != nil {
			t.Fatal(err)
		}
		if len(out) == 0 {
			return false
		}
		r := out[0].Devices.Results[0]
		allocated.Insert(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
		holding[i] = r.Device
		return true
	}, func(i int) {
		allocated.Delete(structured.MakeDeviceID(dradevice.DriverName, "node-1", holding[i]))
	}, func() int { return 0 })

	// The replay, checked arrival by arrival against what the allocator
	// gave.
	fleet := make([]*migtable.GPU, gpus)
	for i := range fleet {
		fleet[i] = migtable.NewGPU(table)
	}
	order := table.PublishOrder()
	type held struct {
		gpu int
		in  migtable.Instance
	}
	replayed := map[int]held{}
	replay := arrivals.Replay(stream, func(i int) bool {
		want := reqs[stream[i].Kind].p
		for g, gpu := range fleet {
			for _, in := range order {
				if in.Profile.Name != want.Name && (in.Profile.MemoryMiB < want.MemoryMiB || in.Profile.Multiprocessors < want.Multiprocessors || in.Profile.Max < len(in.Profile.Starts)) {
					continue
				}
				if !gpu.Fits(in.Profile, in.Start) {
					continue
				}
				if err := gpu.Add(in.Profile, in.Start); err != nil {
					t.Fatal(err)
				}
				replayed[i] = held{g, in}
				if d, ok := holding[i]; !ok || gpuOf[d] != g || place[d] != in {
					t.Fatalf("arrival %d (%s): the replay places %s on GPU %d, the allocator gave %s (%v on GPU %d)", i, want.Name, in, g, d, place[d], gpuOf[d])
				}
				return true
			}
		}
		if d, ok := holding[i]; ok {
			t.Fatalf("arrival %d (%s): the replay refuses it, the allocator gave %s", i, want.Name, d)
		}
		return false
	}, func(i int) {
		h := replayed[i]
		delete(replayed, i)
		if err := fleet[h.gpu].Remove(h.in.Profile, h.in.Start); err != nil {
			t.Fatal(err)
		}
	}, func() int { return 0 })
	t.Logf("of %d arrivals: the stock allocator served %d, the replay %d", count, stock.Served, replay.Served)
	if stock.Served != replay.Served || stock.Refused == 0 {
		t.Errorf("served %d by the allocator, %d by the replay (refused %d): want equal, with the fleet full at times", stock.Served, replay.Served, stock.Refused)
	}
}
