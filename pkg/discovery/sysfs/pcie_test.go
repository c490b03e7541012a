package sysfs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func TestParsePCIePath(t *testing.T) {
	for path, want := range map[string]PCIeLocation{
		// A GPU behind one switch (DGX-1, DGX A100 boards).
		"/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0": {Root: "pci0000:00", Switch: "0000:01:00.0"},
		// Two levels of switches: the closest one.
		"/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/0000:83:00.0/0000:84:10.0/0000:85:00.0": {Root: "pci0000:80", Switch: "0000:83:00.0"},
		// A NIC on a root port: no switch.
		"/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0": {Root: "pci0000:3a"},
		// An integrated device on the root bus.
		"/sys/devices/pci0000:00/0000:00:1f.6": {Root: "pci0000:00"},
		// Under a host root.
		"/host/sys/devices/pci0001:00/0001:00:00.0/0001:01:00.0/0001:02:00.0/0001:03:00.0": {Root: "pci0001:00", Switch: "0001:01:00.0"},
	} {
		got, err := ParsePCIePath(path, nil)
		if err != nil || got != want {
			t.Errorf("ParsePCIePath(%q) = %+v, %v; want %+v", path, got, err, want)
		}
	}
	for path, why := range map[string]string{
		"":                                       "not under /sys/devices",
		"/sys/devices/pci0000:00":                "names no device",
		"/sys/devices/platform/foo/0000:00:01.0": "not a root complex",
		"/sys/devices/pci0000:00/0000:00:01.0/virtio1":                   "not a PCI address",
		"/sys/devices/pci0000:00/0000:00:01.0/../0000:01:00.0":           "not a PCI address",
		"/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/":             "not a PCI address",
		"/sys/devices/PCI0000:00/0000:00:01.0":                           "not a root complex",
		"/sys/devices/pci0000:00/0000:00:01.8":                           "not a PCI address",
		"/sys/devices/pci0000:00" + strings.Repeat("/0000:00:01.0", 40):  "levels deep",
		"/sys/devices/pci0000:00" + strings.Repeat("/0000:00:01.0", 400): "bytes",
	} {
		if _, err := ParsePCIePath(path, nil); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("ParsePCIePath(%.60q) = %v; want an error saying %q", path, err, why)
		}
	}
	// A component above the device that is not a bridge is refused.
	notBridge := func(a string) bool { return a != "0000:01:00.0" }
	if _, err := ParsePCIePath("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0", notBridge); err == nil || !strings.Contains(err.Error(), "not a PCI bridge") {
		t.Errorf("a non-bridge above the device: %v", err)
	}
}

// TestPCIeTopology reads a sysfs tree laid out as the kernel lays it out: the
// /sys/bus/pci/devices link to the device's directory, bridges with class
// 0x060400.
func TestPCIeTopology(t *testing.T) {
	root := t.TempDir()
	dev := "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0"
	bridges := map[string]string{"0000:00:01.0": "0x060400", "0000:01:00.0": "0x060400", "0000:02:08.0": "0x060400", "0000:03:00.0": "0x030200"}
	if err := os.MkdirAll(filepath.Join(root, dev), 0o755); err != nil {
		t.Fatal(err)
	}
	bus := filepath.Join(root, "sys/bus/pci/devices")
	if err := os.MkdirAll(bus, 0o755); err != nil {
		t.Fatal(err)
	}
	for p := dev; filepath.Base(p) != "pci0000:00"; p = filepath.Dir(p) {
		addr := filepath.Base(p)
		if err := os.WriteFile(filepath.Join(root, p, "class"), []byte(bridges[addr]+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(bus, filepath.Join(root, p))
		if err := os.Symlink(rel, filepath.Join(bus, addr)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := PCIeTopology(root, "0000:03:00.0")
	if want := (PCIeLocation{Root: "pci0000:00", Switch: "0000:01:00.0"}); err != nil || got != want {
		t.Errorf("PCIeTopology = %+v, %v; want %+v", got, err, want)
	}
	// The switch's upstream port reports another class: not a chain of bridges.
	if err := os.WriteFile(filepath.Join(root, "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/class"), []byte("0x020000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := PCIeTopology(root, "0000:03:00.0"); err == nil || !strings.Contains(err.Error(), "not a PCI bridge") {
		t.Errorf("PCIeTopology with a non-bridge above the GPU: %v", err)
	}
	if _, err := PCIeTopology(root, "0000:09:00.0"); err == nil {
		t.Error("PCIeTopology of a device that is not there: no error")
	}
	if _, err := PCIeTopology(root, "../../etc"); err == nil {
		t.Error("PCIeTopology of a path, not an address: no error")
	}
}

func FuzzParsePCIePath(f *testing.F) {
	for _, s := range []string{
		"/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0",
		"/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0",
		"/host/sys/devices/pci0000:00/0000:00:1f.6",
		"/sys/devices/pci0000:00/../../etc",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		watchdog.Run(t, func() {
			loc, err := ParsePCIePath(s, nil)
			if err != nil {
				if len(err.Error()) > 1024 { // two quoted excerpts of 80 bytes, each at most 4x escaped
					t.Fatalf("error of %d bytes", len(err.Error()))
				}
				return
			}
			if !isRootComplex(loc.Root) || (loc.Switch != "" && !IsPCIAddress(loc.Switch)) {
				t.Fatalf("%q parsed to %+v", s, loc)
			}
			if !strings.Contains(s, "/"+loc.Root+"/") || (loc.Switch != "" && !strings.Contains(s, "/"+loc.Switch+"/")) {
				t.Fatalf("%q parsed to %+v, not in the path", s, loc)
			}
		})
	})
}
