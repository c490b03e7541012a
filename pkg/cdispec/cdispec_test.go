package cdispec_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/cdispec"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func mknod(t *testing.T, root, p string, major, minor uint32) {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(full, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatalf("mknod %s (the tests run as root): %v", full, err)
	}
}

func write(t *testing.T, root, p, content string) {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func link(t *testing.T, root, p, target string) {
	t.Helper()
	if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
		t.Fatal(err)
	}
}

func devices() []v1alpha1.Device {
	return []v1alpha1.Device{
		{ID: "GPU-a", Kind: v1alpha1.DeviceKindNvidiaGPU, Attributes: map[string]v1alpha1.DeviceAttribute{v1alpha1.AttributeMinor: v1alpha1.IntAttribute(0)}},
		{ID: "GPU-b", Kind: v1alpha1.DeviceKindNvidiaGPU, Attributes: map[string]v1alpha1.DeviceAttribute{v1alpha1.AttributeMinor: v1alpha1.IntAttribute(1)}},
		{ID: "MIG-c", Kind: v1alpha1.DeviceKindNvidiaMIG, Attributes: map[string]v1alpha1.DeviceAttribute{
			v1alpha1.AttributeParent:            v1alpha1.StringAttribute("GPU-b"),
			v1alpha1.AttributeGPUInstanceID:     v1alpha1.IntAttribute(3),
			v1alpha1.AttributeComputeInstanceID: v1alpha1.IntAttribute(0),
		}},
		{ID: "0000:3b:00.0", Kind: v1alpha1.DeviceKindNIC},
	}
}

// TestGenerate: the spec of a host with the driver in a driver container's
// root (/run/nvidia/driver): device nodes with their numbers, MIG capability
// nodes from the kernel's table, libraries mounted under their soname from
// the file the soname links to, and host paths in the spec.
func TestGenerate(t *testing.T) {
	host := t.TempDir()
	mknod(t, host, "/dev/nvidia0", 195, 0)
	mknod(t, host, "/dev/nvidia1", 195, 1)
	mknod(t, host, "/dev/nvidiactl", 195, 255)
	mknod(t, host, "/dev/nvidia-uvm", 509, 0)
	mknod(t, host, "/dev/nvidia-caps/nvidia-cap30", 237, 30)
	mknod(t, host, "/dev/nvidia-caps/nvidia-cap31", 237, 31)
	drv := "/run/nvidia/driver"
	lib := filepath.Join(drv, "usr/lib/x86_64-linux-gnu")
	write(t, host, filepath.Join(lib, "libcuda.so.580.95.05"), "elf")
	link(t, host, filepath.Join(lib, "libcuda.so.1"), "libcuda.so.580.95.05")
	write(t, host, filepath.Join(lib, "libnvidia-ml.so.580.95.05"), "elf")
	// An absolute link is resolved below the driver root, as the host would.
	link(t, host, filepath.Join(lib, "libnvidia-ml.so.1"), "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05")
	// A link out of the root, and a loop, are not followed.
	link(t, host, filepath.Join(lib, "libnvidia-cfg.so.1"), "../../../../../../../etc/shadow")
	link(t, host, filepath.Join(lib, "libnvidia-opencl.so.1"), "libnvidia-opencl.so.1")
	write(t, host, filepath.Join(drv, "usr/bin/nvidia-smi"), "elf")
	minors := filepath.Join(t.TempDir(), "mig-minors")
	if err := os.WriteFile(minors, []byte("config 1\nmonitor 2\ngpu1/gi3/access 30\ngpu1/gi3/ci0/access 31\ngpu0/gi1/access 12\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	spec, err := cdispec.Generate(cdispec.Config{HostRoot: host, DriverRoot: drv, MIGMinors: minors, Kinds: kinds.Builtin}, devices())
	if err != nil {
		t.Fatal(err)
	}
	if spec.Kind != cdispec.Kind || spec.Version == "" {
		t.Errorf("kind %q version %q", spec.Kind, spec.Version)
	}
	got := map[string][]string{}
	for _, d := range spec.Devices {
		for _, n := range d.ContainerEdits.DeviceNodes {
			got[d.Name] = append(got[d.Name], n.Path)
			if n.Type != "c" || n.Major == 0 {
				t.Errorf("%s: node %s not fully described: %+v", d.Name, n.Path, n)
			}
		}
	}
	want := map[string][]string{
		"GPU-a": {"/dev/nvidia0"},
		"GPU-b": {"/dev/nvidia1"},
		"MIG-c": {"/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"},
	}
	for id, nodes := range want {
		if !slices.Equal(got[id], nodes) {
			t.Errorf("%s: nodes %v, want %v", id, got[id], nodes)
		}
	}
	if len(got) != len(want) {
		t.Errorf("devices %v: the NIC has no place in the spec", cdispec.IDs(spec))
	}
	var common []string
	for _, n := range spec.ContainerEdits.DeviceNodes {
		common = append(common, n.Path)
	}
	if !slices.Equal(common, []string{"/dev/nvidiactl", "/dev/nvidia-uvm"}) {
		t.Errorf("control nodes %v (only those the host has)", common)
	}
	var mounts []string
	for _, m := range spec.ContainerEdits.Mounts {
		mounts = append(mounts, m.HostPath+" -> "+m.ContainerPath)
	}
	wantMounts := []string{
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05 -> /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05 -> /usr/lib/x86_64-linux-gnu/libcuda.so.1",
		"/run/nvidia/driver/usr/bin/nvidia-smi -> /usr/bin/nvidia-smi",
	}
	if !slices.Equal(mounts, wantMounts) {
		t.Errorf("mounts:\n%v\nwant\n%v", mounts, wantMounts)
	}

	// No GPU: no spec.
	if spec, err := cdispec.Generate(cdispec.Config{HostRoot: host, Kinds: kinds.Builtin}, devices()[3:]); spec != nil || err != nil {
		t.Errorf("no GPUs: %v, %v", spec, err)
	}
}

// TestWriter: written once, not again while unchanged, again when deleted or
// changed, removed when the node has no GPU left.
func TestWriter(t *testing.T) {
	host := t.TempDir()
	mknod(t, host, "/dev/nvidia0", 195, 0)
	dir := filepath.Join(t.TempDir(), "cdi")
	w, err := cdispec.NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := cdispec.Generate(cdispec.Config{HostRoot: host, Kinds: kinds.Builtin}, devices()[:1])
	if err != nil {
		t.Fatal(err)
	}
	step := func(what string, wantWrote bool) {
		t.Helper()
		wrote, err := w.Write(spec)
		if err != nil || wrote != wantWrote {
			t.Fatalf("%s: wrote %v, %v; want %v", what, wrote, err, wantWrote)
		}
	}
	step("first", true)
	if _, err := os.Stat(filepath.Join(dir, cdispec.FileName)); err != nil {
		t.Fatal(err)
	}
	step("unchanged", false)
	if err := os.Remove(w.Path()); err != nil {
		t.Fatal(err)
	}
	step("deleted by someone", true)
	spec, _ = cdispec.Generate(cdispec.Config{HostRoot: host, Kinds: kinds.Builtin}, devices()[:2])
	step("a GPU more", true)
	spec = nil
	step("no GPU left", true)
	if _, err := os.Stat(w.Path()); !os.IsNotExist(err) {
		t.Errorf("the spec of no GPUs is still there: %v", err)
	}
	step("still none", false)
}

func TestParseMIGMinors(t *testing.T) {
	m, err := cdispec.ParseMIGMinors([]byte("config 1\nmonitor 2\n\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n"))
	if err != nil || len(m) != 4 || m["gpu0/gi1/ci0/access"] != 13 {
		t.Errorf("%v %v", m, err)
	}
	m, err = cdispec.ParseMIGMinors([]byte("gpu0/gi1/access 12\nbroken\ngpu0/gi2/access -1\ngpu0/gi3/access 99999999\n"))
	if err == nil || len(m) != 1 {
		t.Errorf("bad lines: %v %v", m, err)
	}
}

func FuzzParseMIGMinors(f *testing.F) {
	for _, s := range []string{"config 1\nmonitor 2\ngpu0/gi1/access 12\n", "", "x", "a 1 2", "gpu0/gi0/access 1048576"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		watchdog.Run(t, func() {
			m, _ := cdispec.ParseMIGMinors(data)
			for k, v := range m {
				if k == "" || v >= 1<<20 {
					t.Fatalf("entry %q=%d", k, v)
				}
			}
		})
	})
}
