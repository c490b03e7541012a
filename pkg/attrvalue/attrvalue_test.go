package attrvalue

import (
	"strings"
	"testing"
)

func TestParseQuantity(t *testing.T) {
	for _, tc := range []struct {
		in    string
		bytes int64
		err   string
	}{
		{in: "30G", bytes: 30_000_000_000},
		{in: "30Gi", bytes: 30 << 30},
		{in: "30GB", bytes: 30_000_000_000},
		{in: "30GiB", bytes: 30 << 30},
		{in: "512Mi", bytes: 512 << 20},
		{in: "1G", bytes: 1_000_000_000},
		{in: "42949672960", bytes: 42949672960},
		{in: "30 G", err: "not a quantity"},
		{in: "30gb", err: "not a quantity"},
		{in: "B", err: "not a quantity"},
		{in: "", err: "not a quantity"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			q, err := ParseQuantity(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := q.AsInt64(); got != tc.bytes {
				t.Errorf("= %d, want %d", got, tc.bytes)
			}
		})
	}
}

func TestParseBandwidth(t *testing.T) {
	for _, tc := range []struct {
		in  string
		bps int64
		err string
	}{
		{in: "40Gbps", bps: 40e9},
		{in: "40GBPS", bps: 40e9},
		{in: "40gbps", bps: 40e9},
		{in: "40G", bps: 40e9},
		{in: "100G", bps: 100e9},
		{in: "25000Mbps", bps: 25e9},
		{in: "25000mbps", bps: 25e9}, // m is mega, never milli, for rates
		{in: "2.5Gbps", bps: 2.5e9},
		{in: "400kbps", bps: 400e3},
		{in: "400Kbps", bps: 400e3},
		{in: "1Tbps", bps: 1e12},
		{in: "9600bps", bps: 9600},
		{in: "40000", err: "needs a unit"},
		{in: "40Gi", err: "not a bandwidth"},
		{in: "40Gibps", err: "not a bandwidth"},
		{in: "-40Gbps", err: "decimal digits"},
		{in: "1e3Gbps", err: "decimal digits"},
		{in: "Gbps", err: "decimal digits"},
		{in: "4.Gbps", err: "decimal digits"},
		{in: "", err: "needs a unit"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			q, err := ParseBandwidth(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := q.AsInt64(); got != tc.bps {
				t.Errorf("= %d, want %d", got, tc.bps)
			}
		})
	}
}

func TestFormatBandwidth(t *testing.T) {
	for in, want := range map[int64]string{
		100e9: "100Gbps", 25e9: "25Gbps", 2_500_000_000: "2500Mbps", 0: "0bps", 1001: "1001bps", 1e15: "1Pbps", 1e18: "1000Pbps",
	} {
		if got := FormatBandwidth(in); got != want {
			t.Errorf("FormatBandwidth(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestVersions(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"8.0", "8.6", -1},
		{"8.6", "8.0", 1},
		{"8", "8.0", 0},
		{"8.0.0", "8", 0},
		{"10.0", "9.0", 1},
		{"535.104.05", "535.104.5", 0},
		{"535.104.05", "535.86.10", 1},
		{"v12.4", "12.4", 0},
		{"550.54.15", "550.54.14", 1},
	} {
		a, errA := ParseVersion(tc.a)
		b, errB := ParseVersion(tc.b)
		if errA != nil || errB != nil {
			t.Fatalf("%s, %s: %v %v", tc.a, tc.b, errA, errB)
		}
		if got := a.Compare(b); got != tc.want {
			t.Errorf("Compare(%s, %s) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
	for _, bad := range []string{"", "v", "8.x", "8..0", ".8", "8.", "1.2.3.4.5.6.7.8.9", "12345678901", "8.0-rc1", "+1"} {
		if _, err := ParseVersion(bad); err == nil {
			t.Errorf("ParseVersion(%q) succeeded, want an error", bad)
		}
	}
	if v, _ := ParseVersion("v535.104.05"); v.String() != "535.104.5" {
		t.Errorf("String() = %q", v.String())
	}
}
