// Package realgpu holds the tests that need a real NVIDIA driver and GPU.
// `make gpu-bundle` compiles them (go test -c) with the node agent into a
// tarball that runs on a GPU machine without Go (docs/node-agent.md, "Testing
// on a real GPU"). Without a driver every test says so and skips: CI has no
// GPU.
package realgpu

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/discovery/nvml"
)

// EnvLibrary names libnvidia-ml.so.1 when the dynamic linker does not find it.
const EnvLibrary = "RESCLASS_NVML_LIBRARY"

// EnvRequireGPU, set to 1, turns "no driver" from a skip into a failure: the
// bundle's run.sh sets it when nvidia-smi answers, so that on a GPU machine a
// driver the tests cannot open fails them instead of passing them unrun.
const EnvRequireGPU = "RESCLASS_REQUIRE_GPU"

func library() lib.Interface {
	if p := os.Getenv(EnvLibrary); p != "" {
		return lib.New(lib.WithLibraryPath(p))
	}
	return lib.New()
}

// open opens NVML through l, or skips the test saying why.
func open(t *testing.T, l lib.Interface) *nvml.Discoverer {
	t.Helper()
	d, err := nvml.Open(l, "/")
	if errors.Is(err, nvml.ErrUnavailable) && os.Getenv(EnvRequireGPU) != "1" {
		t.Skipf("no NVIDIA driver on this machine (%v): this test needs a real GPU; set %s if libnvidia-ml.so.1 is off the linker's path", err, EnvLibrary)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// smiGPU is one line of nvidia-smi --query-gpu.
type smiGPU struct {
	uuid, name, driver, computeCap, busID string
	memoryMiB                             int64
}

var smiFields = "uuid,name,memory.total,driver_version,compute_cap,pci.bus_id"

func querySMI(t *testing.T) []smiGPU {
	t.Helper()
	smi, err := exec.LookPath("nvidia-smi")
	if err != nil {
		t.Fatalf("NVML works but nvidia-smi is not on PATH: %v", err)
	}
	out, err := exec.Command(smi, "--query-gpu="+smiFields, "--format=csv,noheader,nounits").Output()
	if err != nil {
		t.Fatalf("nvidia-smi: %v", err)
	}
	t.Logf("nvidia-smi --query-gpu=%s:\n%s", smiFields, out)
	r := csv.NewReader(strings.NewReader(string(out)))
	r.TrimLeadingSpace = true
	rows, err := r.ReadAll()
	if err != nil {
		t.Fatalf("nvidia-smi output: %v", err)
	}
	var gpus []smiGPU
	for _, row := range rows {
		if len(row) != 6 {
			t.Fatalf("nvidia-smi row %v: want 6 fields", row)
		}
		mem, err := strconv.ParseInt(strings.TrimSpace(row[2]), 10, 64)
		if err != nil {
			t.Fatalf("nvidia-smi memory %q: %v", row[2], err)
		}
		gpus = append(gpus, smiGPU{uuid: row[0], name: row[1], memoryMiB: mem, driver: row[3], computeCap: row[4], busID: row[5]})
	}
	return gpus
}

// TestDiscoveryMatchesNvidiaSMI: what the agent publishes about each GPU is
// what nvidia-smi says: count, UUID, name, memory, driver, compute capability
// and PCI bus id.
func TestDiscoveryMatchesNvidiaSMI(t *testing.T) {
	d := open(t, library())
	devices, err := d.Discover()
	if err != nil {
		t.Fatal(err)
	}
	smi := querySMI(t)
	var gpus []v1alpha1.Device
	for _, dev := range devices {
		if dev.Kind == v1alpha1.DeviceKindNvidiaGPU {
			gpus = append(gpus, dev)
		}
	}
	if len(gpus) != len(smi) {
		t.Fatalf("the agent found %d GPUs, nvidia-smi %d", len(gpus), len(smi))
	}
	byUUID := map[string]v1alpha1.Device{}
	for _, g := range gpus {
		byUUID[g.ID] = g
	}
	for _, s := range smi {
		g, ok := byUUID[s.uuid]
		if !ok {
			t.Errorf("nvidia-smi's GPU %s is not among the agent's", s.uuid)
			continue
		}
		check := func(what, got, want string) {
			if got != want {
				t.Errorf("%s %s: agent %q, nvidia-smi %q", s.uuid, what, got, want)
			}
		}
		check("name", attr(g, v1alpha1.AttributeProduct), s.name)
		check("memory", attr(g, v1alpha1.AttributeMemory), fmt.Sprintf("%dMi", s.memoryMiB))
		check("driver", attr(g, v1alpha1.AttributeDriverVersion), s.driver)
		check("compute capability", attr(g, v1alpha1.AttributeComputeCapability), s.computeCap)
		check("PCI bus id", attr(g, v1alpha1.AttributePCIAddress), normalizeBusID(s.busID))
		if !g.Healthy {
			t.Errorf("%s unhealthy: %s", s.uuid, g.Reason)
		}
		t.Logf("%s: %s, %s, driver %s, compute %s, %s: agrees with nvidia-smi", s.uuid, s.name, attr(g, v1alpha1.AttributeMemory), s.driver, s.computeCap, s.busID)
	}
}

func attr(d v1alpha1.Device, name string) string {
	a, ok := d.Attributes[name]
	if !ok {
		return ""
	}
	return a.String()
}

// normalizeBusID turns nvidia-smi's 00000000:3B:00.0 into the agent's
// 0000:3b:00.0.
func normalizeBusID(id string) string {
	id = strings.ToLower(id)
	if domain, rest, ok := strings.Cut(id, ":"); ok && len(domain) == 8 {
		id = domain[4:] + ":" + rest
	}
	return id
}

// counting wraps NVML to see each GPU's event registration.
type counting struct {
	lib.Interface
	mu         sync.Mutex
	registered map[int]lib.Return
}

type countingDevice struct {
	lib.Device
	index int
	c     *counting
}

func (c *counting) DeviceGetHandleByIndex(i int) (lib.Device, lib.Return) {
	dev, ret := c.Interface.DeviceGetHandleByIndex(i)
	if ret != lib.SUCCESS {
		return dev, ret
	}
	return &countingDevice{Device: dev, index: i, c: c}, ret
}

func (d *countingDevice) RegisterEvents(mask uint64, set lib.EventSet) lib.Return {
	ret := d.Device.RegisterEvents(mask, set)
	d.c.mu.Lock()
	d.c.registered[d.index] = ret
	d.c.mu.Unlock()
	return ret
}

// TestHealthWatcherRegistersOnEveryGPU: the agent's health watcher registers
// for XID and ECC events on every GPU of the machine, and waits for events
// without an error for a few seconds.
func TestHealthWatcherRegistersOnEveryGPU(t *testing.T) {
	c := &counting{Interface: library(), registered: map[int]lib.Return{}}
	d := open(t, c)
	n, ret := c.DeviceGetCount()
	if ret != lib.SUCCESS {
		t.Fatal(ret.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var events []nvml.HealthEvent
	err := d.WatchHealth(ctx, nvml.HealthOptions{WaitTimeout: 500 * time.Millisecond}, func(e nvml.HealthEvent) { events = append(events, e) })
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range n {
		ret, ok := c.registered[i]
		switch {
		case !ok:
			t.Errorf("GPU %d: the watcher never registered for its events", i)
		case ret != lib.SUCCESS:
			t.Errorf("GPU %d: registering for events: %s", i, ret.Error())
		default:
			t.Logf("GPU %d: registered for XID and ECC events", i)
		}
	}
	for _, e := range events {
		t.Logf("health event during the watch: %+v", e)
	}
}
