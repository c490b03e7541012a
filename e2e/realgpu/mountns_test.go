package realgpu

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// envChild names the test a child process of the test binary runs in its
// private mount namespace.
const envChild = "RESCLASS_REALGPU_CHILD"

// inPrivateKubeletDir runs the calling test again in a child process of the
// test binary, in a mount namespace of its own where the kubelet's
// device-plugin directory (/var/lib/kubelet/device-plugins) is an empty
// tmpfs, and reports whether the caller is that child (true: go on with the
// test) or the parent (false: the child's result is already the test's).
//
// Why: the kubelet's device manager serves /var/lib/kubelet/device-plugins/
// kubelet.sock and keeps its checkpoint there, a path NewManagerImpl does not
// let a caller change. On a GPU node a real kubelet may be using it; in the
// child's namespace the test sees and touches none of it, and nothing it
// mounts reaches the host (the child makes every mount private first). As
// root the child has a mount namespace only; otherwise a user namespace too,
// mapping the caller to root in it.
func inPrivateKubeletDir(t *testing.T) bool {
	t.Helper()
	if os.Getenv(envChild) == t.Name() {
		privateKubeletDir(t)
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.v", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), envChild+"="+t.Name())
	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if uid := os.Geteuid(); uid != 0 {
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
	}
	cmd.SysProcAttr = attr
	out, err := cmd.CombinedOutput()
	t.Logf("in a private mount namespace (%s):\n%s", strings.Join(cmd.Args, " "), out)
	switch {
	case err != nil:
		t.Fatalf("the test in its private mount namespace: %v", err)
	case bytes.Contains(out, []byte("--- SKIP: "+t.Name()+" ")):
		t.Skipf("skipped in its private mount namespace: %s", skipReason(out, t.Name()))
	case !bytes.Contains(out, []byte("--- PASS: "+t.Name()+" ")):
		t.Fatal("the test did not run in its private mount namespace: see above")
	}
	return false
}

// privateKubeletDir, in the child, mounts an empty tmpfs on the kubelet's
// device-plugin directory, or on the nearest directory above it that exists
// (a machine without a kubelet has none), and creates the directory in it.
func privateKubeletDir(t *testing.T) {
	t.Helper()
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("making the child's mounts private: %v", err)
	}
	for _, dir := range []string{pluginapi.DevicePluginPath, "/var/lib/kubelet", "/var/lib"} {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			continue
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=16m"); err != nil {
			t.Fatalf("mounting a private tmpfs on %s: %v", dir, err)
		}
		if err := os.MkdirAll(pluginapi.DevicePluginPath, 0o750); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no /var/lib on this machine to mount the kubelet's device-plugin directory in")
}

// skipReason is the child's own skip message: with -test.v, go test prints
// a test's last log entry, the t.Skip text, just above its "--- SKIP:" line
// ("    file.go:N: message", continued on more indented lines).
func skipReason(out []byte, name string) string {
	before, _, _ := strings.Cut(string(out), "--- SKIP: "+name+" ")
	lines := strings.Split(strings.TrimRight(before, "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if logEntry.MatchString(lines[i]) {
			reason := lines[i:]
			for j := range reason {
				reason[j] = strings.TrimSpace(reason[j])
			}
			return strings.Join(reason, " ")
		}
	}
	return "the child gave no reason (its output is above)"
}

// logEntry is the first line of a test's log entry in go test's output.
var logEntry = regexp.MustCompile(`^    \S+\.go:\d+: `)

// TestSkipReason: the parent reports the child's own skip message, not a
// pointer to output a reader must search.
func TestSkipReason(t *testing.T) {
	out := []byte("=== RUN   TestX\n    x_test.go:5: opening NVML\n    x_test.go:9: no NVIDIA driver\n        on this machine\n--- SKIP: TestX (0.00s)\nPASS\n")
	if got, want := skipReason(out, "TestX"), "x_test.go:9: no NVIDIA driver on this machine"; got != want {
		t.Errorf("skipReason = %q, want %q", got, want)
	}
	if got := skipReason([]byte("--- SKIP: TestX (0.00s)\nPASS\n"), "TestX"); !strings.Contains(got, "no reason") {
		t.Errorf("skipReason without a message = %q", got)
	}
}
