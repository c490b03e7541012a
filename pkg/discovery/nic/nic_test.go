package nic

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// fixture builds a sysfs tree with the layout the kernel uses: a ConnectX PF with
// SR-IOV and one of its VFs (link down), a virtio NIC whose net device hangs off a
// virtio device, and a veth.
func fixture(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	file := func(path, content string) {
		t.Helper()
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(path, target string) {
		t.Helper()
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	netdev := func(devPath, ifname, mac, speed, mtu, state, deviceLink string) {
		file(devPath+"/net/"+ifname+"/address", mac)
		file(devPath+"/net/"+ifname+"/addr_assign_type", "0") // permanent: ghw reports only those
		file(devPath+"/net/"+ifname+"/speed", speed)
		file(devPath+"/net/"+ifname+"/mtu", mtu)
		file(devPath+"/net/"+ifname+"/operstate", state)
		if deviceLink != "" {
			link(devPath+"/net/"+ifname+"/device", deviceLink)
		}
		rel, _ := filepath.Rel("sys/class/net", devPath+"/net/"+ifname)
		link("sys/class/net/"+ifname, rel)
	}
	pf := "sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
	file(pf+"/vendor", "0x15b3")
	file(pf+"/device", "0x1017")
	file(pf+"/numa_node", "1")
	file(pf+"/sriov_totalvfs", "8")
	file(pf+"/sriov_numvfs", "2")
	link(pf+"/subsystem", "../../../../bus/pci")
	link(pf+"/driver", "../../../../bus/pci/drivers/mlx5_core")
	netdev(pf, "ens1f0", "0c:42:a1:00:00:01", "100000", "9000", "up", "../../../0000:3b:00.0")

	vf := "sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.2"
	file(vf+"/vendor", "0x15b3")
	file(vf+"/device", "0x1018")
	file(vf+"/numa_node", "1")
	link(vf+"/subsystem", "../../../../bus/pci")
	link(vf+"/driver", "../../../../bus/pci/drivers/mlx5_core")
	link(vf+"/physfn", "../0000:3b:00.0")
	netdev(vf, "ens1f0v0", "0c:42:a1:00:00:11", "-1", "1500", "down", "../../../0000:3b:00.2")

	virtio := "sys/devices/pci0000:00/0000:00:03.0"
	file(virtio+"/vendor", "0x1af4")
	file(virtio+"/device", "0x1000")
	file(virtio+"/numa_node", "-1")
	link(virtio+"/subsystem", "../../../bus/pci")
	link(virtio+"/virtio2/subsystem", "../../../../bus/virtio")
	link(virtio+"/virtio2/driver", "../../../../bus/virtio/drivers/virtio_net")
	netdev(virtio+"/virtio2", "eth0", "52:54:00:12:34:56", "", "1500", "up", "../../../virtio2")

	netdev("sys/devices/virtual/net", "veth0", "ee:ee:ee:00:00:01", "10000", "1500", "up", "")
	return root
}

func str(d v1alpha1.Device, name string) string {
	if a, ok := d.Attributes[name]; ok {
		return a.String()
	}
	return "<none>"
}

func TestDiscoverFixture(t *testing.T) {
	root := fixture(t)
	devs, err := Discover(Options{HostRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range devs {
		ids = append(ids, d.ID)
	}
	if want := []string{"0000:00:03.0", "0000:3b:00.0", "0000:3b:00.2"}; !slices.Equal(ids, want) {
		t.Fatalf("ids %v, want %v (virtual interfaces left out)", ids, want)
	}
	for _, tc := range []struct {
		dev     v1alpha1.Device
		healthy bool
		want    map[string]string
	}{{
		dev: devs[1], healthy: true,
		want: map[string]string{
			"interface": "ens1f0", "mac": "0c:42:a1:00:00:01", "pciAddress": "0000:3b:00.0", "speed": "100Gbps",
			"mtu": "9000", "linkUp": "true", "numaNode": "1", "driver": "mlx5_core", "vendorID": "15b3",
			"deviceID": "1017", "sriovTotalVFs": "8", "sriovNumVFs": "2", "physicalFunction": "<none>",
			"pcieRoot": "pci0000:3a", "pcieSwitch": "<none>", // on a root port
		},
	}, {
		dev: devs[2], healthy: false,
		want: map[string]string{
			"interface": "ens1f0v0", "speed": "<none>", "linkUp": "false", "physicalFunction": "0000:3b:00.0",
			"deviceID": "1018", "sriovTotalVFs": "<none>",
		},
	}, {
		// virtio: the PCI identity comes from the PCI device above the virtio device.
		dev: devs[0], healthy: true,
		want: map[string]string{
			"interface": "eth0", "pciAddress": "0000:00:03.0", "driver": "virtio_net", "vendorID": "1af4",
			"speed": "<none>", "numaNode": "<none>", "mtu": "1500", "pcieRoot": "pci0000:00",
		},
	}} {
		if tc.dev.Healthy != tc.healthy || tc.dev.Kind != v1alpha1.DeviceKindNIC {
			t.Errorf("%s: kind %s healthy %v (%s), want nic and %v", tc.dev.ID, tc.dev.Kind, tc.dev.Healthy, tc.dev.Reason, tc.healthy)
		}
		for name, want := range tc.want {
			if got := str(tc.dev, name); got != want {
				t.Errorf("%s %s = %q, want %q", tc.dev.ID, name, got, want)
			}
		}
		for name, a := range tc.dev.Attributes {
			if wk := WellKnown(name); wk != "" && a.Type() != wk {
				t.Errorf("%s: %s published as %s, the contract says %s", tc.dev.ID, name, a.Type(), wk)
			}
		}
	}
	if devs[2].Reason != "link down" {
		t.Errorf("VF reason %q, want link down", devs[2].Reason)
	}

	all, err := Discover(Options{HostRoot: root, IncludeVirtual: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 || all[3].ID != "virtual:veth0" || str(all[3], "pciAddress") != "<none>" || str(all[3], "speed") != "10Gbps" {
		t.Errorf("with virtual interfaces: %d devices, last %+v", len(all), all[len(all)-1])
	}
}

// pciIDs is an excerpt of pci.ids in its real format: a vendor line, then its
// devices indented by a tab and subsystems by two.
const pciIDs = `# excerpt of pci.ids
15b3  Mellanox Technologies
	1017  MT27800 Family [ConnectX-5]
	101b  MT28908 Family [ConnectX-6]
		15b3 0006  ConnectX-6 VPI adapter card
1af4  Red Hat, Inc.
`

func TestDiscoverPCINames(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		pciIDs                      string // path under the host root, "" for none
		pfVendor, pfProduct         string
		virtioVendor, virtioProduct string
	}{
		{name: "hwdata", pciIDs: "usr/share/hwdata/pci.ids", pfVendor: "Mellanox Technologies", pfProduct: "MT28908 Family [ConnectX-6]",
			// 1af4:1000 is not in the excerpt: the vendor name alone.
			virtioVendor: "Red Hat, Inc.", virtioProduct: "<none>"},
		{name: "misc", pciIDs: "usr/share/misc/pci.ids", pfVendor: "Mellanox Technologies", pfProduct: "MT28908 Family [ConnectX-6]",
			virtioVendor: "Red Hat, Inc.", virtioProduct: "<none>"},
		{name: "no database", pfVendor: "<none>", pfProduct: "<none>", virtioVendor: "<none>", virtioProduct: "<none>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fixture(t)
			pf := filepath.Join(root, "sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0")
			if err := os.WriteFile(filepath.Join(pf, "device"), []byte("0x101b\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.pciIDs != "" {
				p := filepath.Join(root, tc.pciIDs)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(pciIDs), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			devs, err := Discover(Options{HostRoot: root})
			if err != nil {
				t.Fatal(err)
			}
			if len(devs) != 3 || devs[1].ID != "0000:3b:00.0" || devs[0].ID != "0000:00:03.0" {
				t.Fatalf("devices %v", devs)
			}
			for _, c := range []struct {
				dev        v1alpha1.Device
				name, want string
			}{
				{devs[1], "vendor", tc.pfVendor},
				{devs[1], "product", tc.pfProduct},
				{devs[0], "vendor", tc.virtioVendor},
				{devs[0], "product", tc.virtioProduct},
			} {
				if got := str(c.dev, c.name); got != c.want {
					t.Errorf("%s %s = %q, want %q", c.dev.ID, c.name, got, c.want)
				}
			}
			if !devs[1].Healthy {
				t.Errorf("PF unhealthy: %s", devs[1].Reason)
			}
		})
	}
}

func TestSetNameCutsOnRuneBoundary(t *testing.T) {
	a := map[string]v1alpha1.DeviceAttribute{}
	// 255 bytes of ASCII then a 3-byte rune straddling the limit.
	setName(a, "product", "  "+strings.Repeat("x", 255)+"€tail  ")
	got := a["product"].String()
	if len(got) != 255 || !utf8.ValidString(got) {
		t.Errorf("cut to %d bytes (valid UTF-8: %v), want 255", len(got), utf8.ValidString(got))
	}
	setName(a, "vendor", "   ")
	if _, ok := a["vendor"]; ok {
		t.Error("blank name published")
	}
}
