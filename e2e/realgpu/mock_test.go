package realgpu

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
)

// TestKubeletHandsOutAMockGPU is TestKubeletHandsOutARealGPU on go-nvml's
// DGX A100 mock (eight GPUs) and a host tree of the test's own, the GPUs'
// device nodes and the driver's library in it, so that the path it checks
// runs in `go test ./...` on machines without a GPU. It needs root (mknod, and
// the mount namespace), as the e2e tests do.
func TestKubeletHandsOutAMockGPU(t *testing.T) {
	if !inPrivateKubeletDir(t) {
		return
	}
	dgx, root := nvmlmock.New(), t.TempDir()
	if err := dgx.WriteSysfs(root); err != nil {
		t.Fatal(err)
	}
	// NVIDIA's major is 195; /dev/nvidiactl is its minor 255.
	for i := range 8 {
		mknod(t, root, "/dev/nvidia"+strconv.Itoa(i), uint32(i))
	}
	mknod(t, root, "/dev/nvidiactl", 255)
	libDir := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	if err := os.MkdirAll(libDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(libDir, "libnvidia-ml.so.580.95.05"), []byte("elf"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("libnvidia-ml.so.580.95.05", filepath.Join(libDir, "libnvidia-ml.so.1")); err != nil {
		t.Fatal(err)
	}
	runKubeletScenario(t, scenario{hostRoot: root, nvmlMock: dgx})
}

func mknod(t *testing.T, root, p string, minor uint32) {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(full, unix.S_IFCHR|0o666, int(unix.Mkdev(195, minor))); err != nil {
		t.Fatalf("mknod %s (the tests run as root): %v", full, err)
	}
}
