package nvml_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
)

const bootA, bootB = "3f1c0e52-5a8e-4d0b-9b55-2f0a8f7c1d01", "8d2e4b1a-0c3f-4f5e-8a6b-7c9d0e1f2a3b"

// agentRun is one life of the agent's GPU side: NVML opened on server, its
// faults kept in path, a health watcher on a fake clock at now.
type agentRun struct {
	d      *nvml.Discoverer
	clock  *clocktesting.FakeClock
	events chan nvml.HealthEvent
	stop   func()
}

func startRun(t *testing.T, server *nvmlmock.Server, path, boot string, now time.Time) *agentRun {
	t.Helper()
	logger := ktesting.NewLogger(t, ktesting.NewConfig())
	faults, err := nvml.OpenFaultFile(logger, path, boot)
	if err != nil {
		t.Fatal(err)
	}
	d, err := nvml.Open(server, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d.KeepFaults(faults)
	r := &agentRun{d: d, clock: clocktesting.NewFakeClock(now), events: make(chan nvml.HealthEvent, 100)}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	done := make(chan error)
	opts := nvml.HealthOptions{Clock: r.clock, WaitTimeout: 5 * time.Millisecond, RecoveryAfter: time.Minute}
	go func() { done <- d.WatchHealth(ctx, opts, func(e nvml.HealthEvent) { r.events <- e }) }()
	stopped := false
	r.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		_ = d.Close()
	}
	t.Cleanup(r.stop)
	return r
}

func gpuByID(t *testing.T, d *nvml.Discoverer, id string) v1alpha1.Device {
	t.Helper()
	devices, err := d.Discover()
	if err != nil {
		t.Fatal(err)
	}
	for _, dev := range devices {
		if dev.ID == id {
			return dev
		}
	}
	t.Fatalf("GPU %s not discovered", id)
	return v1alpha1.Device{}
}

// An uncorrected ECC error (XID 48) is invisible to NVML's queries once
// delivered: before, a restarted agent published the GPU healthy. Now it is
// kept, published unhealthy after the restart, stays so past the quiet
// period, and is healthy again only once the GPU is reset.
func TestFaultNeedingResetSurvivesRestartUntilReset(t *testing.T) {
	server := nvmlmock.New()
	gpu := server.UUIDs()[3]
	path := filepath.Join(t.TempDir(), "gpu-faults.json")
	start := time.Unix(1e9, 0)

	first := startRun(t, server, path, bootA, start)
	server.InjectXID(gpu, 48)
	if e := next(t, first.events); e.ID != gpu || e.Healthy || e.Reason != "XID 48 (double-bit ECC error)" {
		t.Fatalf("got %+v", e)
	}
	first.stop()

	// The agent restarts, ten minutes later: the fault is still there.
	second := startRun(t, server, path, bootA, start.Add(10*time.Minute))
	if e := next(t, second.events); e.ID != gpu || e.Healthy || e.Reason != "XID 48 (double-bit ECC error)" {
		t.Fatalf("after the restart got %+v, want GPU %s unhealthy with its XID", e, gpu)
	}
	if d := gpuByID(t, second.d, gpu); d.Healthy || d.Reason != "XID 48 (double-bit ECC error)" {
		t.Fatalf("discovered after the restart: %+v, want unhealthy", d)
	}
	if other := gpuByID(t, second.d, server.UUIDs()[0]); !other.Healthy {
		t.Fatalf("another GPU is unhealthy: %+v", other)
	}
	// Quiet, answering, nothing pending: not enough for an ECC error.
	second.clock.Step(5 * time.Minute)
	none(t, second.events)

	server.Reset(gpu)
	second.clock.Step(time.Second)
	if e := next(t, second.events); e.ID != gpu || !e.Healthy {
		t.Fatalf("after the reset got %+v, want healthy", e)
	}
	if d := gpuByID(t, second.d, gpu); !d.Healthy {
		t.Fatalf("discovered after the reset: %+v, want healthy", d)
	}
	second.stop()
	// And cleared from the file: the next start knows no fault.
	third := startRun(t, server, path, bootA, start.Add(20*time.Minute))
	none(t, third.events)
}

// An XID with no ECC count behind it (79) is kept too, and recovers by the
// quiet-period rule measured from when it happened, not from the restart.
func TestFaultWithoutECCRecoversAfterQuietPeriodAcrossRestart(t *testing.T) {
	server := nvmlmock.New()
	gpu := server.UUIDs()[1]
	path := filepath.Join(t.TempDir(), "gpu-faults.json")
	start := time.Unix(1e9, 0)

	first := startRun(t, server, path, bootA, start)
	server.InjectXID(gpu, 79)
	if e := next(t, first.events); e.ID != gpu || e.Healthy {
		t.Fatalf("got %+v", e)
	}
	first.stop()

	second := startRun(t, server, path, bootA, start.Add(30*time.Second))
	if e := next(t, second.events); e.ID != gpu || e.Healthy || !strings.Contains(e.Reason, "XID 79") {
		t.Fatalf("after the restart got %+v", e)
	}
	second.clock.Step(20 * time.Second) // 50 s after the XID
	none(t, second.events)
	second.clock.Step(11 * time.Second) // 61 s
	if e := next(t, second.events); e.ID != gpu || !e.Healthy {
		t.Fatalf("got %+v, want healthy a minute after the XID", e)
	}
}

// A reboot resets every GPU: a file of another boot is dropped.
func TestFaultClearedByReboot(t *testing.T) {
	server := nvmlmock.New()
	gpu := server.UUIDs()[5]
	path := filepath.Join(t.TempDir(), "gpu-faults.json")
	first := startRun(t, server, path, bootA, time.Unix(1e9, 0))
	server.InjectDoubleBitECC(gpu)
	if e := next(t, first.events); e.ID != gpu || e.Healthy {
		t.Fatalf("got %+v", e)
	}
	first.stop()
	server.Reset(gpu) // what the reboot did to the GPU
	second := startRun(t, server, path, bootB, time.Unix(1e9, 0).Add(time.Hour))
	none(t, second.events)
	if d := gpuByID(t, second.d, gpu); !d.Healthy {
		t.Fatalf("after the reboot: %+v, want healthy", d)
	}
}

// A pending row remap is visible to NVML, but was asked only by the recovery
// probe: a restarted agent published the GPU healthy until an event came.
func TestPendingRowRemapIsDiscovered(t *testing.T) {
	server := nvmlmock.New()
	dev := server.Devices[2].(*dgxa100.Device)
	dev.GetRemappedRowsFunc = func() (int, int, bool, bool, lib.Return) { return 0, 1, true, false, lib.SUCCESS }
	d, err := nvml.Open(server, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Close() }()
	if got := gpuByID(t, d, dev.UUID); got.Healthy || got.Reason != "row remapping pending: reset the GPU" {
		t.Fatalf("got %+v, want unhealthy with the pending remap", got)
	}
}

func TestCorruptFaultFileIsSetAside(t *testing.T) {
	for name, content := range map[string]string{
		"not JSON":      "XID 48\n",
		"unknown field": `{"version":1,"bootID":"` + bootA + `","faults":{},"extra":1}`,
		"no time":       `{"version":1,"bootID":"` + bootA + `","faults":{"GPU-1":{"reason":"XID 48"}}}`,
		"other version": `{"version":2,"bootID":"` + bootA + `","faults":{}}`,
		"two objects":   `{"version":1,"bootID":"` + bootA + `","faults":{}}{}`,
		"too big":       strings.Repeat(" ", 65<<10) + "{}",
		"control chars": `{"version":1,"bootID":"` + bootA + `","faults":{"GPU-1\u0007":{"reason":"x","time":"2026-01-01T00:00:00Z"}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "gpu-faults.json")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := nvml.OpenFaultFile(ktesting.NewLogger(t, ktesting.NewConfig()), path, bootA)
			if err != nil {
				t.Fatalf("a corrupt file must not stop the agent: %v", err)
			}
			if _, ok := f.Get("GPU-1"); ok {
				t.Fatal("a fault read from a corrupt file")
			}
			if aside, err := os.ReadFile(path + ".corrupt"); err != nil || string(aside) != content {
				t.Fatalf("not set aside as it was: %v", err)
			}
			// The file works again.
			if err := f.Record("GPU-1", nvml.Fault{Reason: "XID 95", Time: time.Unix(1e9, 0)}); err != nil {
				t.Fatal(err)
			}
			g, err := nvml.OpenFaultFile(ktesting.NewLogger(t, ktesting.NewConfig()), path, bootA)
			if err != nil {
				t.Fatal(err)
			}
			if got, ok := g.Get("GPU-1"); !ok || got.Reason != "XID 95" || !got.Time.Equal(time.Unix(1e9, 0)) {
				t.Fatalf("read back %+v, %v", got, ok)
			}
		})
	}
}

func TestReadBootID(t *testing.T) {
	path := filepath.Join(t.TempDir(), "boot_id")
	if err := os.WriteFile(path, []byte(bootA+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if id, err := nvml.ReadBootID(path); err != nil || id != bootA {
		t.Fatalf("got %q, %v", id, err)
	}
	if err := os.WriteFile(path, []byte(strings.Repeat("x", 200)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := nvml.ReadBootID(path); err == nil {
		t.Fatal("a 200-byte boot id accepted")
	}
}
