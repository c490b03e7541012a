package hugepages

import "testing"

// BenchmarkDiscoverHugePages times a full discovery of this machine's real sysfs:
// one directory listing per NUMA node and two small reads per pool.
func BenchmarkDiscoverHugePages(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Discover(Options{HostRoot: "/"}); err != nil {
			b.Fatal(err)
		}
	}
}
