package sysfs

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func TestParseInt(t *testing.T) {
	for in, want := range map[string]int64{"100000\n": 100000, " -1 ": -1, "0x15b3": 0x15b3, "8": 8} {
		if got, ok := ParseInt(in); !ok || got != want {
			t.Errorf("ParseInt(%q) = %d, %v; want %d", in, got, ok, want)
		}
	}
	for _, bad := range []string{"", "\n", "unknown", "1e3", "0x", "12 34", "99999999999999999999"} {
		if _, ok := ParseInt(bad); ok {
			t.Errorf("ParseInt(%q) accepted", bad)
		}
	}
}

func TestReadInt(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, ok := ReadInt(filepath.Join(dir, "numa_node")); !ok || n != 1 {
		t.Errorf("ReadInt = %d, %v", n, ok)
	}
	if _, ok := ReadInt(filepath.Join(dir, "missing")); ok {
		t.Errorf("a missing file read as a number")
	}
}

// FuzzParseInt: truncated or garbage sysfs files never panic, and what is
// accepted reads back the same.
func FuzzParseInt(f *testing.F) {
	for _, s := range []string{"100000\n", "-1", "0x15b3", "", "0x", " 1 \n", "unknown"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		watchdog.Run(t, func() {
			n, ok := ParseInt(s)
			if !ok {
				return
			}
			if again, ok2 := ParseInt(strconv.FormatInt(n, 10)); !ok2 || again != n {
				t.Fatalf("%q -> %d does not read back", s, n)
			}
		})
	})
}
