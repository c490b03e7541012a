package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/resclass/resclass/e2e/framework"
)

// TestTeardownIsClean starts a cluster of its own with a kubelet node, checks that
// the node's mounts stay inside its mount namespace, stops the cluster and checks
// that no process, mount or file of it is left.
func TestTeardownIsClean(t *testing.T) {
	ctx := context.Background()
	c, err := framework.Start(ctx, framework.Options{})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = c.Stop()
		}
	})
	if _, err := c.AddKubeletNode(ctx, framework.NodeOptions{Name: "teardown-node", ExampleDevices: 1}); err != nil {
		t.Fatal(err)
	}
	pids := c.Processes()
	if len(pids) < 4 { // etcd, apiserver, controller manager, node
		t.Fatalf("only %d processes running", len(pids))
	}
	if m := mountsUnder(t, c.Dir); len(m) > 0 {
		t.Errorf("the node's mounts are visible in the host's mount namespace: %v", m)
	}
	if m := mountsUnder(t, "/var/lib"); len(m) > 0 {
		t.Errorf("mounts on the host's /var/lib appeared: %v", m)
	}

	dir := c.Dir
	stopped = true
	if err := c.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	for _, pid := range pids {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			t.Errorf("process %d is still there", pid)
		}
	}
	if left := processesMentioning(t, dir); len(left) > 0 {
		t.Errorf("processes of the cluster are still running: %v", left)
	}
	if m := mountsUnder(t, dir); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the cluster's directory %s is still there (%v)", dir, err)
	}
}

// mountsUnder lists the mount points in this process's (the host's) mount
// namespace at or below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			out = append(out, fields[4])
		}
	}
	return out
}

// processesMentioning lists processes whose command line mentions s.
func processesMentioning(t *testing.T, s string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), s) {
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return out
}
