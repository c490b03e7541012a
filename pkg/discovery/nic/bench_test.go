package nic

import (
	"testing"

	"github.com/jaypipes/ghw"
)

// BenchmarkDiscoverNICs times a full NIC discovery of this machine's real sysfs.
// The baseline is ghw's own enumeration with the same options, so the ratio is
// what the sysfs reads resclass adds on top of it.
func BenchmarkDiscoverNICs(b *testing.B) {
	b.Run("resclass", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Discover(Options{HostRoot: "/"}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline-ghw", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ghw.Network(ghw.WithChroot("/"), ghw.WithDisableTools(), ghw.WithNullAlerter()); err != nil {
				b.Fatal(err)
			}
		}
	})
}
