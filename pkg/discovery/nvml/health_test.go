package nvml_test

import (
	"context"
	"strings"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
)

// watch starts WatchHealth on a DGX A100 mock and returns its events.
func watch(t *testing.T, opts nvml.HealthOptions) (*nvmlmock.Server, *clocktesting.FakeClock, <-chan nvml.HealthEvent) {
	t.Helper()
	server := nvmlmock.New()
	d, err := nvml.Open(server, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	clock := clocktesting.NewFakeClock(time.Unix(1e9, 0))
	opts.Clock, opts.WaitTimeout, opts.RecoveryAfter = clock, 5*time.Millisecond, time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan nvml.HealthEvent, 100)
	done := make(chan error)
	go func() { done <- d.WatchHealth(ctx, opts, func(e nvml.HealthEvent) { events <- e }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		_ = d.Close()
	})
	return server, clock, events
}

func next(t *testing.T, events <-chan nvml.HealthEvent) nvml.HealthEvent {
	t.Helper()
	select {
	case e := <-events:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no health event")
	}
	return nvml.HealthEvent{}
}

func none(t *testing.T, events <-chan nvml.HealthEvent) {
	t.Helper()
	select {
	case e := <-events:
		t.Fatalf("unexpected health event %+v", e)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestXIDMakesGPUUnhealthyAndItRecovers(t *testing.T) {
	server, clock, events := watch(t, nvml.HealthOptions{})
	gpu := server.UUIDs()[2]

	server.InjectXID(gpu, 79)
	e := next(t, events)
	if e.ID != gpu || e.Healthy || !strings.Contains(e.Reason, "XID 79 (GPU has fallen off the bus)") {
		t.Fatalf("got %+v", e)
	}
	// Still within the quiet period: no recovery.
	clock.Step(30 * time.Second)
	none(t, events)
	// A second XID restarts the quiet period (and, the same reason, reports
	// nothing new).
	server.InjectXID(gpu, 79)
	none(t, events)
	clock.Step(45 * time.Second)
	none(t, events)
	clock.Step(20 * time.Second)
	if e := next(t, events); e.ID != gpu || !e.Healthy || e.Reason != "" {
		t.Fatalf("got %+v, want GPU %s healthy again", e, gpu)
	}
}

func TestApplicationAndIgnoredXIDsLeaveGPUHealthy(t *testing.T) {
	server, _, events := watch(t, nvml.HealthOptions{IgnoredXIDs: []uint64{94}})
	gpu := server.UUIDs()[0]
	for _, xid := range []uint64{13, 31, 43, 45, 68, 109, 94} {
		server.InjectXID(gpu, xid)
	}
	none(t, events)
	server.InjectXID(gpu, 95)
	if e := next(t, events); e.ID != gpu || e.Healthy || !strings.Contains(e.Reason, "XID 95") {
		t.Fatalf("got %+v", e)
	}
}

// A GPU that falls off the bus shows as the event wait failing with
// ERROR_GPU_IS_LOST, naming no GPU; that used to be logged at V(2), and the GPU
// stayed healthy until the next resync. Now the GPU that no longer answers is
// unhealthy at once, and only it; it recovers once reset and quiet.
func TestLostGPUWaitErrorMarksTheLostGPU(t *testing.T) {
	server, clock, events := watch(t, nvml.HealthOptions{})
	gpu := server.UUIDs()[7]
	server.SetLost(gpu, true)
	e := next(t, events)
	if e.ID != gpu || e.Healthy || e.Reason != "NVML: "+lib.ERROR_GPU_IS_LOST.Error() {
		t.Fatalf("got %+v, want GPU %s unhealthy because it is lost", e, gpu)
	}
	none(t, events)
	// While it is lost, the quiet period does not start.
	clock.Step(2 * time.Minute)
	none(t, events)
	server.SetLost(gpu, false) // the GPU was reset
	clock.Step(30 * time.Second)
	none(t, events)
	clock.Step(31 * time.Second)
	if e := next(t, events); e.ID != gpu || !e.Healthy {
		t.Fatalf("got %+v, want healthy after the reset", e)
	}
}

func TestLostGPURecoversOnlyWhenNVMLAnswers(t *testing.T) {
	server, clock, events := watch(t, nvml.HealthOptions{})
	gpu := server.UUIDs()[7]
	server.InjectDoubleBitECC(gpu)
	if e := next(t, events); e.ID != gpu || e.Healthy || e.Reason != "double-bit ECC error" {
		t.Fatalf("got %+v", e)
	}
	// Lost after the ECC error, answering NVML no more.
	server.SetLost(gpu, true)
	if e := next(t, events); e.ID != gpu || e.Healthy || !strings.Contains(e.Reason, "NVML:") {
		t.Fatalf("got %+v, want still unhealthy because NVML does not answer", e)
	}
	clock.Step(2 * time.Minute)
	none(t, events)
	server.Reset(gpu) // answers again, its ECC counts zeroed
	clock.Step(61 * time.Second)
	if e := next(t, events); e.ID != gpu || !e.Healthy {
		t.Fatalf("got %+v, want healthy after the reset", e)
	}
}

func TestUnattributedEventMarksEveryGPU(t *testing.T) {
	server, _, events := watch(t, nvml.HealthOptions{})
	server.InjectXID("", 119)
	seen := map[string]bool{}
	for range server.UUIDs() {
		e := next(t, events)
		if e.Healthy || !strings.Contains(e.Reason, "not attributed to a GPU") {
			t.Fatalf("got %+v", e)
		}
		seen[e.ID] = true
	}
	if len(seen) != len(server.UUIDs()) {
		t.Fatalf("marked %d GPUs, want all %d", len(seen), len(server.UUIDs()))
	}
}
