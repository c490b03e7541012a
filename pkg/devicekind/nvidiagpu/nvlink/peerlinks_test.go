package nvlink

import (
	"strings"
	"testing"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func TestParsePeerLinks(t *testing.T) {
	got, err := ParsePeerLinks("1:1,2:1,3:2,4:2")
	if err != nil || len(got) != 4 || got[1] != 1 || got[3] != 2 || got[4] != 2 {
		t.Errorf("ParsePeerLinks = %v, %v", got, err)
	}
	if got.String() != "1:1,2:1,3:2,4:2" {
		t.Errorf("String = %q", got.String())
	}
	if got, err := ParsePeerLinks(""); err != nil || len(got) != 0 {
		t.Errorf("empty: %v, %v", got, err)
	}
	for in, why := range map[string]string{
		"1":                         "not <peer index>:<links>",
		"1:0":                       "link count",
		"1:65":                      "link count",
		"-1:2":                      "peer index",
		"01:2":                      "peer index",
		"1024:1":                    "more than 1023",
		"2:1,1:1":                   "ascend",
		"1:1,1:1":                   "ascend",
		"1:1,":                      "not <peer index>",
		"1:+2":                      "link count",
		strings.Repeat("1:1,", 100): "bytes",
	} {
		if _, err := ParsePeerLinks(in); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("ParsePeerLinks(%.40q) = %v; want an error saying %q", in, err, why)
		}
	}
}

func FuzzParsePeerLinks(f *testing.F) {
	for _, s := range []string{"1:1,2:1,3:2,4:2", "", "0:12,1:12,2:12,3:12,4:12,5:12,6:12", "1:", ":1", "9999:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		watchdog.Run(t, func() {
			p, err := ParsePeerLinks(s)
			if err != nil {
				return
			}
			for i, n := range p {
				if i < 0 || i > MaxNVLinkIndex || n < 1 || n > MaxNVLinks {
					t.Fatalf("%q parsed to %v", s, p)
				}
			}
			if back, err := ParsePeerLinks(p.String()); err != nil || back.String() != p.String() || p.String() != s {
				t.Fatalf("%q -> %q -> %v, %v", s, p.String(), back, err)
			}
		})
	})
}
