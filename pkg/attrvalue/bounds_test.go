package attrvalue

import (
	"errors"
	"strings"
	"testing"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// Every value below once cost 10^|exponent| to compare, or to parse: each is
// refused, or makes its attribute unusable, at once and with a message that
// names the bound.

func TestHostileQuantitiesAreRefused(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"1e999999999", "the exponent 999999999 is out of range (at most e18"},
		{"1e-999999999", "the exponent -999999999 is out of range"},
		{"1E19", "the exponent 19 is out of range"},
		{"9999999999999999999999999999999999999e999999", "the exponent 999999 is out of range"},
		{"0." + strings.Repeat("0", 70) + "1", "longer than 64 characters"},
		{strings.Repeat("9", 20), "out of range: larger than 4Ei (2^62)"},
		{"8Ei", "larger than 4Ei"},
		{"4611686018427387905", "larger than 4Ei"},
		{"-8Ei", "larger than 4Ei"},
		{"16EiB", "larger than 4Ei"},
	} {
		watchdog.Run(t, func() {
			_, err := ParseQuantity(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrOutOfRange) {
				t.Errorf("ParseQuantity(%.30q) = %v, want an out-of-range error containing %q", tc.in, err, tc.want)
			}
			if err != nil && len(err.Error()) > 200 {
				t.Errorf("ParseQuantity(%.30q): a %d-byte message", tc.in, len(err.Error()))
			}
		})
	}
}

func TestRealValuesFitTheBounds(t *testing.T) {
	for _, q := range []string{"1Ei", "1EiB", "4Ei", "81559Mi", "1e18", "5e-6", "1n", "4611686018427387904", "-4Ei", "0"} {
		if _, err := ParseQuantity(q); err != nil {
			t.Errorf("ParseQuantity(%q): %v", q, err)
		}
	}
	for _, b := range []string{"1.6Tbps", "800Gbps", "400000Mbps", "4611686018427387904bps", "1Pbps"} {
		if _, err := ParseBandwidth(b); err != nil {
			t.Errorf("ParseBandwidth(%q): %v", b, err)
		}
	}
	for _, v := range []string{"580.159.04", "12.8", "9.0", "v1.2.3.4.5.6.7.8", "999999999.999999999"} {
		if _, err := ParseVersion(v); err != nil {
			t.Errorf("ParseVersion(%q): %v", v, err)
		}
	}
}

func TestHostileBandwidthsAndVersionsAreRefused(t *testing.T) {
	for _, tc := range []struct {
		parse func(string) error
		in    string
		want  string
	}{
		{bandwidth, "4611686018427387905bps", "larger than 4Ei"},
		{bandwidth, "4000Pbps", ""},
		{bandwidth, strings.Repeat("9", 30) + "Pbps", "longer than 32 characters"},
		{bandwidth, "10000Pbps", "larger than 4Ei"},
		{version, "1.2.3.4.5.6.7.8.9", "more than 8 parts"},
		{version, "1.1234567890", "more than 9 digits"},
		{version, strings.Repeat("1.", 50) + "1", "longer than 80 characters"},
	} {
		watchdog.Run(t, func() {
			err := tc.parse(tc.in)
			if tc.want == "" {
				if err != nil {
					t.Errorf("%.30q: %v", tc.in, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrOutOfRange) {
				t.Errorf("%.30q: %v, want an out-of-range error containing %q", tc.in, err, tc.want)
			}
		})
	}
}

func bandwidth(s string) error { _, err := ParseBandwidth(s); return err }
func version(s string) error   { _, err := ParseVersion(s); return err }
