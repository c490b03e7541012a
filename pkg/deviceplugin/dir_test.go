package deviceplugin

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestDirChange(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "device-plugins")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	d, err := openDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	// A container whose mount is the directory itself keeps seeing the
	// deleted one at its path; /proc/self/fd/<fd> resolves as that mount does.
	orphan := &watchedDir{path: fmt.Sprintf("/proc/self/fd/%d", d.f.Fd()), f: d.f}
	want := func(what string, w *watchedDir, c dirChange) {
		t.Helper()
		if got, err := w.change(); err != nil || got != c {
			t.Errorf("%s: change() = %v, %v; want %v", what, got, err, c)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "kubelet.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	want("a file created in it", d, dirSame)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	want("deleted", d, dirRemoved)
	want("deleted, seen through its own mount", orphan, dirOrphaned)
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	want("made again", d, dirReplaced)
}

// The directory deleted and made again by a new kubelet: the endpoints are
// served and registered in the new one.
func TestReplacedDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "device-plugins")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	k := startKubelet(t, dir)
	m, _ := runManager(t, dir)
	m.Set(map[string][]Device{gpus: {{ID: "gpu-0", Healthy: true, NUMANode: -1}}})
	eventually(t, "registered", func() bool { _, d, _ := k.state(gpus); return len(d) == 1 })

	k.stop(t)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	k = startKubelet(t, dir)
	eventually(t, "registered with the kubelet of the new directory", func() bool { _, d, n := k.state(gpus); return n == 1 && len(d) == 1 })
	if _, err := os.Stat(filepath.Join(dir, SocketName(gpus))); err != nil {
		t.Errorf("endpoint socket in the new directory: %v", err)
	}
	if err := m.Orphaned(); err != nil {
		t.Errorf("Orphaned after a replacement: %v", err)
	}
}
