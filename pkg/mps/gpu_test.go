package mps

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	nvmldiscovery "github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/mpsstate"
)

// TestRealMPSControl runs the supervisor against the driver's own
// nvidia-cuda-mps-control and NVML, on a machine with a GPU and
// RESCLASS_MPS_GPU_TEST=1 (root, for the compute mode); elsewhere it is
// skipped. The stand-in of the other tests is checked against the real
// program here: -f, get_server_list, quit, and the compute mode. It passed
// on an H100 with driver 580.159.04 (CUDA 13.0's nvidia-cuda-mps-control),
// also chrooted in a recursive bind mount of / (as the DaemonSet runs it)
// with a PyTorch client, for which the daemon started its server from the
// driver root under EXCLUSIVE_PROCESS:
//
//	mount --rbind / /tmp/dr
//	RESCLASS_MPS_GPU_TEST=1 RESCLASS_MPS_DRIVER_ROOT=/tmp/dr \
//	RESCLASS_MPS_CLIENT="python3 -c \"import torch; torch.ones(1, device='cuda')\"" \
//	  go test ./pkg/mps -run Real -v
func TestRealMPSControl(t *testing.T) {
	binary, nvml, dev, gpu := realGPU(t)
	var err error
	// RESCLASS_MPS_DRIVER_ROOT, a view of the machine's / (a bind mount),
	// runs the daemon chrooted there as the DaemonSet does.
	root := os.Getenv("RESCLASS_MPS_DRIVER_ROOT")
	dir := t.TempDir()
	if root != "" {
		if dir, err = os.MkdirTemp(filepath.Join(root, os.TempDir()), "mps"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
	}
	mode := func() lib.ComputeMode {
		m, ret := dev.GetComputeMode()
		if ret != lib.SUCCESS {
			t.Fatalf("compute mode: %v", ret)
		}
		return m
	}
	before := mode()
	t.Logf("GPU %s, compute mode %d", gpu, before)

	_, ctx := ktesting.NewTestContext(t)
	s, err := New(Config{Dir: dir, DriverRoot: root, Binary: binary, ExclusiveProcess: true, ComputeMode: &NVMLComputeMode{NVML: nvml},
		ProbePeriod: time.Second, ProbeTimeout: 5 * time.Second, Metrics: NewMetrics()})
	if err != nil {
		t.Fatal(err)
	}
	s.Update(klog.FromContext(ctx), []string{gpu})
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		s.pass(ctx)
		if st, _ := mpsstate.Read(dir, gpu); st.Phase == mpsstate.Running || st.Phase == mpsstate.Failed {
			break
		}
	}
	st, err := mpsstate.Read(dir, gpu)
	if err != nil || st.Phase != mpsstate.Running {
		t.Fatalf("state %+v, %v, want Running", st, err)
	}
	if m := mode(); m != lib.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("running: compute mode %d, want EXCLUSIVE_PROCESS", m)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, gpu, "pipe"))
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	t.Logf("pipe directory: %s", strings.Join(names, " "))
	if len(names) == 0 {
		t.Error("the daemon made nothing in its pipe directory")
	}
	// RESCLASS_MPS_CLIENT, a CUDA program run by sh with the GPU's pipe
	// directory as a client sees it (the host's path), must run through the
	// daemon: an MPS server is started for it, from the driver root.
	if client := os.Getenv("RESCLASS_MPS_CLIENT"); client != "" {
		cmd := exec.CommandContext(ctx, "sh", "-c", client)
		cmd.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES="+gpu, "CUDA_MPS_PIPE_DIRECTORY="+filepath.Join(s.daemonDir, gpu, "pipe"))
		out, err := cmd.CombinedOutput()
		t.Logf("client: %v\n%s", err, out)
		if err != nil {
			t.Errorf("the MPS client failed: %v", err)
		}
		list := s.command(ctx, gpu)
		list.Stdin = strings.NewReader("get_server_list\n")
		servers, err := list.Output()
		t.Logf("servers: %q", servers)
		if err != nil || len(strings.TrimSpace(string(servers))) == 0 {
			t.Errorf("no MPS server after the client: %v %q", err, servers)
		}
	}
	s.Update(klog.FromContext(ctx), nil)
	s.pass(ctx)
	if st, _ := mpsstate.Read(dir, gpu); st.Phase != mpsstate.Stopped {
		t.Errorf("after leaving the set: %+v, want Stopped", st)
	}
	if m := mode(); m != lib.COMPUTEMODE_DEFAULT {
		t.Errorf("stopped: compute mode %d, want DEFAULT", m)
	}
	logs, _ := os.ReadFile(filepath.Join(dir, gpu, "log", "control.log"))
	t.Logf("control.log:\n%s", logs)
}

// realGPU is what the tests on a real GPU share: they run only when asked
// (RESCLASS_MPS_GPU_TEST=1), and once asked, a machine without the MPS
// control program or NVML fails them rather than skipping: a skip would
// report a proof that was not made. It returns the control program, NVML
// initialized, and GPU 0 with its UUID.
func realGPU(t *testing.T) (binary string, nvml lib.Interface, dev lib.Device, gpu string) {
	t.Helper()
	if os.Getenv("RESCLASS_MPS_GPU_TEST") != "1" {
		t.Skip("runs only on a machine with a GPU, with RESCLASS_MPS_GPU_TEST=1 (docs/sharing.md, \"On a real GPU\")")
	}
	binary, err := exec.LookPath(DefaultBinary)
	if err != nil {
		t.Fatalf("RESCLASS_MPS_GPU_TEST=1 but no %s: %v", DefaultBinary, err)
	}
	nvml, err = nvmldiscovery.Library{}.Load()
	if err != nil {
		t.Fatal(err)
	}
	if ret := nvml.Init(); ret != lib.SUCCESS {
		t.Fatalf("NVML: %v", ret)
	}
	dev, ret := nvml.DeviceGetHandleByIndex(0)
	if ret != lib.SUCCESS {
		t.Fatal(ret)
	}
	gpu, _ = dev.GetUUID()
	return binary, nvml, dev, gpu
}
