// Package nic discovers network interfaces with jaypipes/ghw and sysfs and
// describes them as v1alpha1.Devices of kind nic.
//
// A NIC's id is its PCI address, stable across reboots and renames. A virtio NIC's
// net device hangs off a virtio device, so its PCI address is that of the nearest
// PCI ancestor. Virtual interfaces (loopback, veth, bridges, tunnels) have no
// hardware behind them and are left out unless asked for; their id is then
// "virtual:<interface>".
package nic

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jaypipes/ghw"
	"github.com/jaypipes/pcidb"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/attrvalue"
	"github.com/resclass/resclass/pkg/discovery/sysfs"
)

// Options of a discovery.
type Options struct {
	// HostRoot is where the host's / is mounted ("/" on the node itself).
	HostRoot string
	// IncludeVirtual also lists interfaces without hardware behind them.
	IncludeVirtual bool
}

var pciAddress = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// Discover lists the NICs under opts.HostRoot, sorted by id.
func Discover(opts Options) ([]v1alpha1.Device, error) {
	root := opts.HostRoot
	if root == "" {
		root = "/"
	}
	// ghw would run ethtool for capabilities we do not publish: keep discovery to
	// file reads.
	info, err := ghw.Network(ghw.WithChroot(root), ghw.WithDisableTools(), ghw.WithNullAlerter())
	if err != nil {
		return nil, fmt.Errorf("listing network interfaces: %w", err)
	}
	classNet := filepath.Join(root, "sys/class/net")
	db := loadPCIDB(root)
	var out []v1alpha1.Device
	for _, n := range info.NICs {
		if n.IsVirtual && !opts.IncludeVirtual {
			continue
		}
		out = append(out, describe(classNet, db, n))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// pciIDsPaths are where distributions install the pci.ids database, in pcidb's
// order of preference.
var pciIDsPaths = []string{
	"usr/share/hwdata/pci.ids",
	"usr/share/misc/pci.ids",
	"usr/share/hwdata/pci.ids.gz",
	"usr/share/misc/pci.ids.gz",
}

// loadPCIDB reads the host's pci.ids, or returns nil when the host has none or it
// cannot be read: names are then left out. We pick the file ourselves rather than
// with pcidb.WithChroot because pcidb v1.1.1 looks in $HOME/.cache/pci.ids first
// (and ignores WithCachePath), which would describe the agent's container rather
// than the host; and pcidb must never fetch from the network, whatever
// PCIDB_ENABLE_NETWORK_FETCH says.
func loadPCIDB(root string) *pcidb.DB {
	for _, p := range pciIDsPaths {
		path := filepath.Join(root, p)
		info, err := os.Stat(path)
		if err != nil {
			continue
		}
		return pciDBCache.load(path, info)
	}
	return nil
}

// pciDBCache keeps the last database parsed: pci.ids is over a megabyte, and
// the agent re-reads its NICs at every poll, while the file changes only when
// the host's hwdata package is updated.
var pciDBCache pciDBs

type pciDBs struct {
	mu      sync.Mutex
	path    string
	modTime time.Time
	size    int64
	db      *pcidb.DB
}

// load returns the database in path, parsing it again only when the file is
// another one or has changed; nil if it cannot be parsed.
func (c *pciDBs) load(path string, info os.FileInfo) *pcidb.DB {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.path == path && c.modTime.Equal(info.ModTime()) && c.size == info.Size() {
		return c.db
	}
	noFetch := false
	db, err := pcidb.New(pcidb.WithPath(path), &pcidb.WithOption{EnableNetworkFetch: &noFetch})
	if err != nil {
		db = nil
	}
	c.path, c.modTime, c.size, c.db = path, info.ModTime(), info.Size(), db
	return db
}

func describe(classNet string, db *pcidb.DB, n *ghw.NIC) v1alpha1.Device {
	netDir := filepath.Join(classNet, n.Name)
	devDir := filepath.Join(netDir, "device")
	d := v1alpha1.Device{Kind: v1alpha1.DeviceKindNIC, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{}}
	a := d.Attributes

	// The PCI device behind the interface: its device directory itself for a
	// PCI NIC, an ancestor for virtio, none for a virtual interface.
	pciDir := ""
	if !n.IsVirtual {
		pciDir = pciAncestor(devDir)
	}
	switch {
	case n.PCIAddress != nil:
		d.ID = *n.PCIAddress
	case pciDir != "":
		d.ID = filepath.Base(pciDir)
	}
	if d.ID == "" {
		d.ID = "virtual:" + n.Name
	} else {
		a[v1alpha1.AttributePCIAddress] = v1alpha1.StringAttribute(d.ID)
	}
	a[v1alpha1.AttributeInterface] = v1alpha1.StringAttribute(n.Name)
	if n.MACAddress != "" {
		a[v1alpha1.AttributeMAC] = v1alpha1.StringAttribute(n.MACAddress)
	}
	// sysfs reports the speed in Mbit/s, and -1 or nothing without a link.
	if mbps, ok := sysfs.ParseInt(n.Speed); ok && mbps > 0 && mbps < 1<<40 {
		a[v1alpha1.AttributeSpeed] = v1alpha1.BandwidthAttribute(attrvalue.FormatBandwidth(mbps * 1_000_000))
	}
	if mtu, ok := sysfs.ReadInt(filepath.Join(netDir, "mtu")); ok {
		a[v1alpha1.AttributeMTU] = v1alpha1.IntAttribute(mtu)
	}
	state := sysfs.ReadString(filepath.Join(netDir, "operstate"))
	up := state == "up"
	a[v1alpha1.AttributeLinkUp] = v1alpha1.BoolAttribute(up)
	if !up {
		d.Healthy = false
		d.Reason = "link " + orUnknown(state)
	}
	if driver, err := os.Readlink(filepath.Join(devDir, "driver")); err == nil {
		a[v1alpha1.AttributeDriver] = v1alpha1.StringAttribute(filepath.Base(driver))
	}
	if pciDir == "" {
		return d
	}
	// NUMA and PCI identity belong to the PCI device (for virtio, an ancestor).
	if numa, ok := sysfs.ReadInt(filepath.Join(pciDir, "numa_node")); ok && numa >= 0 {
		a[v1alpha1.AttributeNUMANode] = v1alpha1.IntAttribute(numa)
	}
	vendorID := strings.TrimPrefix(sysfs.ReadString(filepath.Join(pciDir, "vendor")), "0x")
	deviceID := strings.TrimPrefix(sysfs.ReadString(filepath.Join(pciDir, "device")), "0x")
	if vendorID != "" {
		a[v1alpha1.AttributeVendorID] = v1alpha1.StringAttribute(vendorID)
	}
	if deviceID != "" {
		a[v1alpha1.AttributeDeviceID] = v1alpha1.StringAttribute(deviceID)
	}
	if db != nil && vendorID != "" {
		if v, ok := db.Vendors[vendorID]; ok {
			setName(a, v1alpha1.AttributeVendor, v.Name)
		}
		if p, ok := db.Products[vendorID+deviceID]; ok && deviceID != "" {
			setName(a, v1alpha1.AttributeProduct, p.Name)
		}
	}
	if vfs, ok := sysfs.ReadInt(filepath.Join(pciDir, "sriov_totalvfs")); ok {
		a[v1alpha1.AttributeSRIOVTotalVFs] = v1alpha1.IntAttribute(vfs)
		if num, ok := sysfs.ReadInt(filepath.Join(pciDir, "sriov_numvfs")); ok {
			a[v1alpha1.AttributeSRIOVNumVFs] = v1alpha1.IntAttribute(num)
		}
	}
	// Where it sits in the PCIe tree, for the scheduler's Topology strategy;
	// a directory of another shape (not under a root complex) publishes none.
	if loc, err := sysfs.LocatePCIeDir(pciDir); err == nil {
		a[v1alpha1.AttributePCIeRoot] = v1alpha1.StringAttribute(loc.Root)
		if loc.Switch != "" {
			a[v1alpha1.AttributePCIeSwitch] = v1alpha1.StringAttribute(loc.Switch)
		}
	}
	if pf, err := os.Readlink(filepath.Join(pciDir, "physfn")); err == nil {
		a[v1alpha1.AttributePhysicalFunction] = v1alpha1.StringAttribute(filepath.Base(pf))
	}
	return d
}

// maxStringAttribute is the API's limit on a string attribute, in bytes.
const maxStringAttribute = 256

// setName publishes a name from pci.ids, trimmed and cut to the API's limit on a
// rune boundary.
func setName(a map[string]v1alpha1.DeviceAttribute, attr, name string) {
	name = strings.TrimSpace(name)
	if len(name) > maxStringAttribute {
		cut := maxStringAttribute
		for cut > 0 && !utf8.RuneStart(name[cut]) {
			cut--
		}
		name = strings.TrimSpace(name[:cut])
	}
	if name != "" {
		a[attr] = v1alpha1.StringAttribute(name)
	}
}

// pciAncestor returns the directory of the nearest PCI device at or above the net
// device's backing device, or "".
func pciAncestor(devDir string) string {
	for p := resolve(devDir); p != "" && p != "/" && p != "."; p = filepath.Dir(p) {
		if pciAddress.MatchString(filepath.Base(p)) {
			return p
		}
	}
	return ""
}

// resolve follows symlinks; "" if path does not exist.
func resolve(path string) string {
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		return ""
	}
	return p
}

func orUnknown(s string) string {
	if s == "" {
		return "state unknown"
	}
	return s
}
