package nic

import "testing"

// TestThisMachine discovers this machine's real NICs: every physical one has a PCI
// address as its id and no virtual interface is listed.
func TestThisMachine(t *testing.T) {
	devs, err := Discover(Options{HostRoot: "/"})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		t.Logf("%s %s healthy=%v attributes=%d", d.ID, *d.Attributes["interface"].StringValue, d.Healthy, len(d.Attributes))
		if !pciAddress.MatchString(d.ID) {
			t.Errorf("%s: id is not a PCI address", d.ID)
		}
	}
	all, err := Discover(Options{HostRoot: "/", IncludeVirtual: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) < len(devs) {
		t.Errorf("IncludeVirtual lists %d NICs, fewer than %d", len(all), len(devs))
	}
}
