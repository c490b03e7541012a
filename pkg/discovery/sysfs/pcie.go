package sysfs

import (
	"fmt"
	"path/filepath"
	"strings"
)

// PCIeLocation is where a PCI device sits in the PCIe tree: what the scheduler's
// Topology strategy compares between devices (docs/scheduler.md).
type PCIeLocation struct {
	// Root is the root complex, named as sysfs names its directory under
	// /sys/devices ("pci0000:00"): the value Kubernetes DRA standardised as
	// resource.kubernetes.io/pcieRoot. Devices under one root reach each
	// other without crossing the CPU interconnect.
	Root string
	// Switch is the PCI address of the upstream port of the closest PCIe
	// switch above the device ("0000:02:00.0"), or "" when the device hangs
	// directly off a root port. Devices under one switch exchange data
	// (GPUDirect peer-to-peer, RDMA) without going through the root complex.
	Switch string
}

// Bounds on what PCIeTopology reads: a real path is a few hundred bytes and a
// handful of levels (root port, one or two switches, the device).
const (
	maxPCIePath   = 4096
	maxPCIeLevels = 32
)

// ParsePCIePath reads a device's location from its resolved sysfs path, the
// target of /sys/bus/pci/devices/<address>:
//
//	/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0
//	             root       root port    switch up    switch down  device
//
// The components below the root are PCI addresses, each a bridge to the next.
// The first is a root port (or, for an integrated device, the device itself);
// every bridge between it and the device belongs to a switch, which shows as
// an upstream port with downstream ports below it. The closest switch is the
// grandparent of the device when that is not the root port: its upstream
// port, shared by every device below the switch, names it (a downstream port
// usually serves one device, so it would name nothing shared). isBridge, when
// not nil, confirms that a component is a PCI bridge (class 0x0604); it lets
// the caller refuse a path whose middle is not a chain of bridges. Anything
// else than this shape is refused with an error that says what is wrong.
func ParsePCIePath(path string, isBridge func(address string) bool) (PCIeLocation, error) {
	if len(path) > maxPCIePath {
		return PCIeLocation{}, fmt.Errorf("PCI device path is %d bytes, more than %d", len(path), maxPCIePath)
	}
	rest, ok := strings.CutPrefix(path, "/sys/devices/")
	if !ok {
		// Under a host root ("/host/sys/devices/..."): the last /sys/devices/.
		i := strings.LastIndex(path, "/sys/devices/")
		if i < 0 {
			return PCIeLocation{}, fmt.Errorf("PCI device path %q is not under /sys/devices", truncate(path))
		}
		rest = path[i+len("/sys/devices/"):]
	}
	parts := strings.SplitN(rest, "/", maxPCIeLevels+2)
	if len(parts) > maxPCIeLevels+1 {
		return PCIeLocation{}, fmt.Errorf("PCI device path %q is more than %d levels deep", truncate(path), maxPCIeLevels)
	}
	root := parts[0]
	if !isRootComplex(root) {
		return PCIeLocation{}, fmt.Errorf("PCI device path %q: %q is not a root complex (pciDDDD:BB)", truncate(path), truncate(root))
	}
	chain := parts[1:]
	if len(chain) == 0 {
		return PCIeLocation{}, fmt.Errorf("PCI device path %q names no device below the root complex", truncate(path))
	}
	for _, c := range chain {
		if !IsPCIAddress(c) {
			return PCIeLocation{}, fmt.Errorf("PCI device path %q: %q is not a PCI address", truncate(path), truncate(c))
		}
	}
	if isBridge != nil {
		for _, c := range chain[:len(chain)-1] {
			if !isBridge(c) {
				return PCIeLocation{}, fmt.Errorf("PCI device path %q: %s is above a device but is not a PCI bridge", truncate(path), c)
			}
		}
	}
	loc := PCIeLocation{Root: root}
	// chain: root port, [switch up, switch down]..., device.
	if len(chain) >= 4 {
		loc.Switch = chain[len(chain)-3]
	}
	return loc, nil
}

// PCIeTopology resolves /sys/bus/pci/devices/<address> under hostRoot and
// locates it (LocatePCIeDir).
func PCIeTopology(hostRoot, address string) (PCIeLocation, error) {
	if !IsPCIAddress(address) {
		return PCIeLocation{}, fmt.Errorf("%q is not a PCI address", truncate(address))
	}
	dir, err := filepath.EvalSymlinks(filepath.Join(hostRoot, "sys/bus/pci/devices", address))
	if err != nil {
		return PCIeLocation{}, fmt.Errorf("resolving the PCI device link: %w", err)
	}
	return LocatePCIeDir(dir)
}

// LocatePCIeDir parses a PCI device's resolved sysfs directory
// (ParsePCIePath), checking that each component above the device is a bridge
// by its class file; an unreadable class is taken on the path's word.
func LocatePCIeDir(dir string) (PCIeLocation, error) {
	dir = filepath.Clean(dir)
	return ParsePCIePath(dir, func(bridge string) bool {
		i := strings.Index(dir, "/"+bridge+"/")
		if i < 0 {
			return true
		}
		class, ok := ReadInt(filepath.Join(dir[:i+1+len(bridge)], "class"))
		return !ok || class>>8 == 0x0604
	})
}

// IsPCIAddress reports whether s is a PCI address as sysfs writes one:
// "0000:3b:00.0" (domain:bus:device.function, lower-case hex).
func IsPCIAddress(s string) bool {
	if len(s) != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.' || s[11] < '0' || s[11] > '7' {
		return false
	}
	for i, c := range s[:10] {
		if i == 4 || i == 7 {
			continue
		}
		if !isLowerHex(c) {
			return false
		}
	}
	return true
}

// isRootComplex: "pci" and a domain:bus, "pci0000:00".
func isRootComplex(s string) bool {
	if len(s) != 10 || !strings.HasPrefix(s, "pci") || s[7] != ':' {
		return false
	}
	for i, c := range s[3:] {
		if i != 4 && !isLowerHex(c) {
			return false
		}
	}
	return true
}

func isLowerHex(c rune) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }

// truncate keeps error messages short whatever the input.
func truncate(s string) string {
	const limit = 80
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "..."
}
