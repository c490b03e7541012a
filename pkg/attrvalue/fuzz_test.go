package attrvalue

import (
	"testing"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func FuzzParseBandwidth(f *testing.F) {
	for _, s := range []string{"40Gbps", "40GBPS", "100G", "25000Mbps", "2.5Gbps", "1", "bps", "9999999999999999999Pbps"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		watchdog.Run(t, func() {
			q, err := ParseBandwidth(s)
			if err != nil {
				return
			}
			if q.Sign() < 0 {
				t.Fatalf("%q parsed to a negative rate %s", s, q.String())
			}
			if bps, ok := q.AsInt64(); ok {
				back, err := ParseBandwidth(FormatBandwidth(bps))
				if err != nil || back.Cmp(q) != 0 {
					t.Fatalf("%q -> %d -> %q -> %v, %v", s, bps, FormatBandwidth(bps), back.String(), err)
				}
			}
		})
	})
}

func FuzzParseVersion(f *testing.F) {
	for _, s := range []string{"8.0", "535.104.05", "v12.4", "1.2.3.4.5.6.7.8", "", "8..0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		watchdog.Run(t, func() {
			v, err := ParseVersion(s)
			if err != nil {
				return
			}
			back, err := ParseVersion(v.String())
			if err != nil || back.Compare(v) != 0 {
				t.Fatalf("%q -> %q -> %v, %v", s, v.String(), back, err)
			}
		})
	})
}

func FuzzParseQuantity(f *testing.F) {
	for _, s := range []string{"30G", "30GiB", "80GB", "1G", "B", "iB", "1EB", "1e999999999", "1e-999999999", "8Ei", "9999999999999999999999e999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		watchdog.Run(t, func() {
			q, err := ParseQuantity(s)
			if err != nil {
				return
			}
			back, err := ParseQuantity(q.String())
			if err != nil || back.Cmp(q) != 0 {
				t.Fatalf("%q -> %q -> %v, %v", s, q.String(), back.String(), err)
			}
		})
	})
}
