package nvml

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// libc is a library every Linux machine has, and that is not NVML.
func libc(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6", "/lib64/libc.so.6", "/usr/lib64/libc.so.6"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatalf("no libc.so.6 found on this %s machine", runtime.GOARCH)
	return ""
}

// --nvml-library naming a file that loads but is not NVML used to end the
// process at the first call ("undefined symbol: nvmlInit"): Load looks the
// symbols up first and says which are missing.
func TestWrongLibraryIsAnError(t *testing.T) {
	path := libc(t)
	_, err := Library{Path: path}.Load()
	if !errors.Is(err, ErrWrongLibrary) || !strings.Contains(err.Error(), "lacks nvmlInit_v2") {
		t.Fatalf("Load(%s) = %v, want ErrWrongLibrary naming nvmlInit_v2", path, err)
	}
}

func TestLibraryNotThereIsUnavailable(t *testing.T) {
	_, err := Library{Path: "/nonexistent/libnvidia-ml.so.1"}.Load()
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("missing file: %v, want ErrUnavailable", err)
	}
	// Not a shared library at all.
	junk := filepath.Join(t.TempDir(), LibraryName)
	if err := os.WriteFile(junk, []byte("not ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := (Library{Path: junk}).Load(); !errors.Is(err, ErrUnavailable) {
		t.Errorf("a file that is not ELF: %v, want ErrUnavailable", err)
	}
}

// The driver root layouts: the library is looked for below the root in the
// distributions' directories, at each call, so one installed later is found.
func TestLibraryBelowDriverRoot(t *testing.T) {
	root := t.TempDir()
	l := Library{DriverRoot: root}
	if _, err := l.Find(); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "below the driver root "+root) {
		t.Fatalf("empty driver root: %v", err)
	}
	for _, dir := range []string{"usr/lib64", "usr/lib/x86_64-linux-gnu"} {
		p := filepath.Join(root, dir, LibraryName)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Debian's directory comes before RHEL's.
	if got, err := l.Find(); err != nil || got != filepath.Join(root, "usr/lib/x86_64-linux-gnu", LibraryName) {
		t.Errorf("Find() = %q, %v", got, err)
	}
	if got, _ := (Library{Path: "/x/libnvidia-ml.so.1", DriverRoot: root}).Find(); got != "/x/libnvidia-ml.so.1" {
		t.Errorf("an explicit path is used as given, got %q", got)
	}
	if got, _ := (Library{}).Find(); got != LibraryName {
		t.Errorf("no root: %q, want the bare name for the dynamic linker", got)
	}
}
