package nvml

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// dgx returns the DGX A100 mock of nvmlmock (PCI bus ids, GPUs 0-3 on NUMA node 0
// and 4-7 on node 1 in a sysfs tree under root) with NVLink answered as NVML does
// for a GPU without any: nvlink_test.go wires its own topologies.
// wellKnown are the attribute types the device kinds declare.
var wellKnown = kinds.Builtin.Attributes()

func dgx(t *testing.T) (*dgxa100.Server, string) {
	t.Helper()
	server, root := dgxMock(t)
	return server.Server, root
}

// dgxMock is dgx's server, as nvmlmock's (with its failures and MIG).
func dgxMock(t *testing.T) (*nvmlmock.Server, string) {
	t.Helper()
	server := nvmlmock.New()
	root := t.TempDir()
	if err := server.WriteSysfs(root); err != nil {
		t.Fatal(err)
	}
	for _, d := range server.Devices {
		d.(*dgxa100.Device).GetNvLinkStateFunc = func(int) (lib.EnableState, lib.Return) {
			return lib.FEATURE_DISABLED, lib.ERROR_NOT_SUPPORTED
		}
	}
	return server, root
}

// discover opens NVML on server and describes its GPUs.
func discover(t *testing.T, server *dgxa100.Server, root string) []v1alpha1.Device {
	t.Helper()
	_, gpus := openDiscover(t, server, root)
	return gpus
}

// openDiscover opens NVML on server, closed when the test ends, and
// describes its GPUs.
func openDiscover(t *testing.T, server lib.Interface, root string) (*Discoverer, []v1alpha1.Device) {
	t.Helper()
	d, err := Open(server, root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	gpus, err := d.Discover()
	if err != nil {
		t.Fatal(err)
	}
	return d, gpus
}

func TestDiscoverDGXA100(t *testing.T) {
	server, root := dgx(t)
	gpus := discover(t, server, root)
	if len(gpus) != 8 {
		t.Fatalf("found %d GPUs, want 8", len(gpus))
	}
	seen := map[string]bool{}
	for i, g := range gpus {
		if g.Kind != v1alpha1.DeviceKindNvidiaGPU || !strings.HasPrefix(g.ID, "GPU-") || seen[g.ID] || !g.Healthy {
			t.Errorf("GPU %d: %+v", i, g)
		}
		seen[g.ID] = true
	}
	g := gpus[5]
	want := map[string]string{
		v1alpha1.AttributeProduct:           "Mock NVIDIA A100-SXM4-40GB",
		v1alpha1.AttributeBrand:             "Nvidia",
		v1alpha1.AttributeArchitecture:      "Ampere",
		v1alpha1.AttributeMemory:            "40Gi",
		v1alpha1.AttributeComputeCapability: "8.0",
		v1alpha1.AttributeDriverVersion:     "550.54.15",
		v1alpha1.AttributeCUDADriverVersion: "12.4",
		v1alpha1.AttributeMIGEnabled:        "false",
		v1alpha1.AttributeIndex:             "5",
		v1alpha1.AttributeMinor:             "5",
		AttributeDevicePath:                 "/dev/nvidia5",
		v1alpha1.AttributePCIAddress:        "0000:05:00.0",
		v1alpha1.AttributeNUMANode:          "1",
		v1alpha1.AttributePCIeRoot:          nvmlmock.PCIeRoot(5),
		v1alpha1.AttributePCIeSwitch:        nvmlmock.PCIeSwitch(5),
	}
	for name, w := range want {
		if got := g.Attributes[name].String(); got != w {
			t.Errorf("%s = %q, want %q", name, got, w)
		}
	}
	if len(g.Attributes) != len(want) {
		t.Errorf("%d attributes, want %d: %v", len(g.Attributes), len(want), g.Attributes)
	}
	for name, a := range g.Attributes {
		if wk, ok := wellKnown[name]; ok && a.Type() != wk {
			t.Errorf("%s published as %s, the contract says %s", name, a.Type(), wk)
		}
	}
}

func TestMIGModeIsReported(t *testing.T) {
	server, root := dgx(t)
	partition(t, server.Devices[2].(*dgxa100.Device)) // MIG mode, no GPU instances yet
	gpus := discover(t, server, root)
	for i, g := range gpus {
		if got, want := *g.Attributes[v1alpha1.AttributeMIGEnabled].BoolValue, i == 2; got != want {
			t.Errorf("GPU %d migEnabled = %v, want %v", i, got, want)
		}
	}
}

func TestNoNVML(t *testing.T) {
	for _, ret := range []lib.Return{lib.ERROR_LIBRARY_NOT_FOUND, lib.ERROR_DRIVER_NOT_LOADED} {
		l := &mock.Interface{InitFunc: func() lib.Return { return ret }}
		if _, err := Open(l, "/"); !errors.Is(err, ErrUnavailable) {
			t.Errorf("Init -> %v: err = %v, want ErrUnavailable", ret, err)
		}
	}
	l := &mock.Interface{InitFunc: func() lib.Return { return lib.ERROR_UNKNOWN }}
	if _, err := Open(l, "/"); err == nil || errors.Is(err, ErrUnavailable) {
		t.Errorf("Init -> ERROR_UNKNOWN: err = %v, want a plain error", err)
	}
}

// TestThisMachine runs against the real NVML library: on a machine without it
// (CI, this project's build machines) that is ErrUnavailable, cleanly.
func TestThisMachine(t *testing.T) {
	d, err := Open(lib.New(), "/")
	if errors.Is(err, ErrUnavailable) {
		t.Logf("no NVML here: %v", err)
		return
	}
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer func() { _ = d.Close() }()
	gpus, err := d.Discover()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d GPUs", len(gpus))
}

func TestAttributeFailureMarksTheGPUUnhealthy(t *testing.T) {
	server, root := dgx(t)
	server.Devices[1].(*dgxa100.Device).GetMemoryInfoFunc = func() (lib.Memory, lib.Return) {
		return lib.Memory{}, lib.ERROR_GPU_IS_LOST
	}
	server.Devices[3].(*dgxa100.Device).GetArchitectureFunc = func() (lib.DeviceArchitecture, lib.Return) {
		return 0, lib.ERROR_NOT_SUPPORTED
	}
	gpus := discover(t, server, root)
	if g := gpus[1]; g.Healthy || !strings.Contains(g.Reason, "memory") {
		t.Errorf("GPU 1: healthy=%v reason=%q, want unhealthy because of memory", g.Healthy, g.Reason)
	}
	if _, ok := gpus[1].Attributes[v1alpha1.AttributeMemory]; ok {
		t.Errorf("GPU 1 has a memory attribute although NVML could not read it")
	}
	// Not supported is not a fault: the attribute is left out.
	if g := gpus[3]; !g.Healthy {
		t.Errorf("GPU 3 unhealthy: %s", g.Reason)
	}
	if _, ok := gpus[3].Attributes[v1alpha1.AttributeArchitecture]; ok {
		t.Errorf("GPU 3 has an architecture although NVML does not support it")
	}
}

func TestPCIBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00.0",
		"0000:3b:00.0":     "0000:3b:00.0",
		"00000001:AF:00.1": "0001:af:00.1",
		"":                 "",
		"0000:3b:00.0 ":    "",
		"0000:3b:\xff0.0":  "",
	} {
		var p lib.PciInfo
		for i, c := range in {
			p.BusId[i] = uint8(c)
		}
		if got := pciBusID(p); got != want {
			t.Errorf("pciBusID(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzPCIBusID: any bytes NVML might put in BusId give a lower-case address without
// NULs, and an address already in sysfs form is kept.
func FuzzPCIBusID(f *testing.F) {
	for _, s := range []string{"00000000:3B:00.0", "0000:3b:00.0", "", "00000001:AF:00.1\x00junk", ":::"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		watchdog.Run(t, func() {
			var p lib.PciInfo
			copy(p.BusId[:], s)
			got := pciBusID(p)
			if strings.ContainsRune(got, 0) || got != strings.ToLower(got) {
				t.Fatalf("pciBusID(%q) = %q", s, got)
			}
			if again := pciBusID(busID(got)); again != got {
				t.Fatalf("not stable: %q -> %q -> %q", s, got, again)
			}
		})
	})
}

func busID(s string) lib.PciInfo {
	var p lib.PciInfo
	copy(p.BusId[:], s)
	return p
}

func TestParseXIDs(t *testing.T) {
	for in, want := range map[string]string{
		"94,95":          "[94 95]",
		" 94 , 95 ,94 ":  "[94 95]",
		"":               "[]",
		"0":              "error: entry 1, \"0\", is not an XID",
		"94,,95":         "error: entry 2, \"\", is not an XID",
		"65536":          "error: entry 1, \"65536\", is not an XID: write decimal numbers from 1 to 65535",
		"0x5e":           "error: entry 1, \"0x5e\"",
		"+5":             "error: entry 1, \"+5\"",
		"-5":             "error: entry 1, \"-5\"",
		"1e999999999":    "error: entry 1, \"1e999999999\"",
		"99999999999999": "error: entry 1, \"99999999999999\"",
	} {
		got, err := ParseXIDs(in)
		s := fmt.Sprint(got)
		if got == nil {
			s = "[]"
		}
		if err != nil {
			s = "error: " + err.Error()
		}
		if !strings.HasPrefix(s, want) {
			t.Errorf("ParseXIDs(%q) = %s, want %s", in, s, want)
		}
	}
	long := strings.Repeat("1,", 3000)
	if _, err := ParseXIDs(long); err == nil || !strings.Contains(err.Error(), "too long") {
		t.Errorf("a 6000-character list: %v", err)
	}
	var many []string
	for i := 1; i <= 300; i++ {
		many = append(many, fmt.Sprint(i))
	}
	if _, err := ParseXIDs(strings.Join(many, ",")); err == nil || !strings.Contains(err.Error(), "more than 256 XIDs") {
		t.Errorf("300 XIDs: %v", err)
	}
}

func FuzzParseXIDs(f *testing.F) {
	for _, s := range []string{"94,95", "", "0", "65535,1", "1e999999999", " 7 ,7", strings.Repeat("9,", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		watchdog.Run(t, func() {
			xids, err := ParseXIDs(s)
			if err != nil {
				if len(err.Error()) > 200 {
					t.Fatalf("a %d-byte message", len(err.Error()))
				}
				return
			}
			if len(xids) > maxXIDCount {
				t.Fatalf("%d XIDs", len(xids))
			}
			seen := map[uint64]bool{}
			for _, x := range xids {
				if x < 1 || x > MaxXID || seen[x] {
					t.Fatalf("%q gave %v", s, xids)
				}
				seen[x] = true
			}
			// What it reads, written back, reads the same.
			var parts []string
			for _, x := range xids {
				parts = append(parts, fmt.Sprint(x))
			}
			again, err := ParseXIDs(strings.Join(parts, ","))
			if err != nil || !slices.Equal(again, xids) {
				t.Fatalf("%v -> %v, %v", xids, again, err)
			}
		})
	})
}

// One GPU whose handle NVML refuses used to make Open fail, and the node publish
// no GPU at all. Now the other seven are described, the eighth is listed as
// unnamed, and it is published once NVML gives its handle.
func TestGPUWithoutHandleIsLeftOutAlone(t *testing.T) {
	server := nvmlmock.New()
	root := t.TempDir()
	if err := server.WriteSysfs(root); err != nil {
		t.Fatal(err)
	}
	server.FailHandle(3, lib.ERROR_UNKNOWN)
	d, err := Open(server, root)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	gpus, err := d.Discover()
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	uuids := server.UUIDs()
	if len(gpus) != 7 || slices.ContainsFunc(gpus, func(g v1alpha1.Device) bool { return g.ID == uuids[3] }) {
		t.Fatalf("%d GPUs, want the 7 NVML can name", len(gpus))
	}
	for _, g := range gpus {
		if !g.Healthy {
			t.Errorf("GPU %s unhealthy: %s", g.ID, g.Reason)
		}
	}
	// NVLink peers are still named by NVML index, not by position in the list.
	if got := *gpus[3].Attributes[v1alpha1.AttributeIndex].IntValue; got != 4 {
		t.Errorf("the fourth GPU published has index %d, want 4", got)
	}
	if got := d.Unnamed(); len(got) != 1 || got[0] != "GPU 3: handle: "+lib.ERROR_UNKNOWN.Error() {
		t.Errorf("Unnamed() = %q", got)
	}
	server.FailHandle(3, lib.SUCCESS)
	if gpus, err = d.Discover(); err != nil || len(gpus) != 8 || len(d.Unnamed()) != 0 {
		t.Errorf("after NVML gives the handle: %d GPUs, unnamed %q, err %v; want 8", len(gpus), d.Unnamed(), err)
	}
}

// A GPU whose UUID NVML no longer reads used to make Discover fail for the whole
// node. It is published by the UUID it had, unhealthy with NVML's answer; a GPU
// whose UUID was never read is left out.
func TestGPUWithoutUUIDIsUnhealthyByTheUUIDItHad(t *testing.T) {
	server := nvmlmock.New()
	root := t.TempDir()
	if err := server.WriteSysfs(root); err != nil {
		t.Fatal(err)
	}
	uuids := server.UUIDs()
	server.FailUUID(uuids[6], lib.ERROR_UNKNOWN)
	d, err := Open(server, root)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	server.FailUUID(uuids[2], lib.ERROR_GPU_IS_LOST)
	gpus, err := d.Discover()
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if len(gpus) != 7 {
		t.Fatalf("%d GPUs, want 7 (GPU 6 never named)", len(gpus))
	}
	g := gpus[2]
	if g.ID != uuids[2] || g.Healthy || !strings.Contains(g.Reason, "UUID: "+lib.ERROR_GPU_IS_LOST.Error()) {
		t.Errorf("GPU 2: id %s healthy=%v reason %q; want %s unhealthy because its UUID is lost", g.ID, g.Healthy, g.Reason, uuids[2])
	}
	if got := d.Unnamed(); len(got) != 1 || !strings.HasPrefix(got[0], "GPU 6: UUID: ") {
		t.Errorf("Unnamed() = %q", got)
	}
}

// The driver unloaded under an open NVML (an upgrade, the GPU operator's driver
// container restarting): Discover says NVML is unavailable, so the caller closes
// it and opens it again, rather than publishing the GPUs on as they were.
func TestDiscoverAfterTheDriverWentAway(t *testing.T) {
	server := nvmlmock.New()
	d, err := Open(server, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	server.SetAbsent(true)
	if _, err := d.Discover(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Discover: %v, want ErrUnavailable", err)
	}
	_ = d.Close()
	if _, err := Open(server, t.TempDir()); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Open while absent: %v, want ErrUnavailable", err)
	}
	server.SetAbsent(false)
	d, err = Open(server, t.TempDir())
	if err != nil {
		t.Fatalf("Open after the driver loaded: %v", err)
	}
	defer func() { _ = d.Close() }()
	if gpus, err := d.Discover(); err != nil || len(gpus) != 8 {
		t.Fatalf("%d GPUs, %v", len(gpus), err)
	}
}
