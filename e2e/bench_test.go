package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/pkg/client/clientset/versioned"
)

// BenchmarkAgentRSS is the node agent's steady-state resident memory: the real
// node-agent binary, a process of its own, publishing this machine's inventory
// to the embedded cluster at a 1s poll, measured after ten polls. It reports
// VmRSS (MiB-rss) and the high-water mark VmHWM (MiB-peak); ns/op means nothing
// here and is suppressed.
//
// This machine has no NVML, so the agent runs as on a NIC-only node; on a GPU
// node libnvidia-ml is mapped as well. The admin kubeconfig stands in for the
// agent's ServiceAccount: the identity does not change what it holds.
//
// baseline-idle-go is a Go program that only sleeps, measured the same way: the
// Go runtime's floor. The ratio is the agent's memory in multiples of that floor;
// the difference is what its code, client-go and its informers' caches hold.
func BenchmarkAgentRSS(b *testing.B) {
	const (
		node = "bench-agent"
		poll = time.Second
	)
	settle := 10 * poll
	dir := b.TempDir()
	agent := filepath.Join(dir, "node-agent")
	goBuild(b, "", agent, "github.com/resclass/resclass/cmd/node-agent")
	idleSource := filepath.Join(dir, "idle.go")
	if err := os.WriteFile(idleSource, []byte("package main\n\nimport \"time\"\n\nfunc main() { time.Sleep(24 * time.Hour) }\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	idle := filepath.Join(dir, "idle-go")
	goBuild(b, dir, idle, idleSource)

	b.Run("resclass", func(b *testing.B) {
		ctx := context.Background()
		rc, err := versioned.NewForConfig(cluster.Config)
		if err != nil {
			b.Fatal(err)
		}
		nodes := cluster.Client.CoreV1().Nodes()
		if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := nodes.Delete(context.Background(), node, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				b.Errorf("deleting Node %s: %v", node, err)
			}
		})
		rss, peak := measureRSS(b, settle, func(ctx context.Context) (bool, error) {
			_, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, node, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil, err
		}, agent, "--kubeconfig", cluster.Kubeconfig, "--node-name", node,
			"--metrics-bind-address", "127.0.0.1:0", "--poll-interval", poll.String())
		for b.Loop() {
		}
		reportRSS(b, rss, peak)
	})
	b.Run("baseline-idle-go", func(b *testing.B) {
		rss, peak := measureRSS(b, settle, nil, idle)
		for b.Loop() {
		}
		reportRSS(b, rss, peak)
	})
}

// goBuild builds pkg (a package path, or a file) into out, in dir ("" for the
// test's working directory).
func goBuild(b *testing.B, dir, out, pkg string) {
	b.Helper()
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = dir
	if output, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build %s: %v\n%s", pkg, err, output)
	}
}

// measureRSS runs bin with args until ready (nil: at once) says it is up, lets
// it run for settle more, and returns its VmRSS and VmHWM in KiB. The process is
// killed on return, and with the benchmark if the benchmark dies.
func measureRSS(b *testing.B, settle time.Duration, ready wait.ConditionWithContextFunc, bin string, args ...string) (rss, peak int64) {
	b.Helper()
	logPath := filepath.Join(b.TempDir(), filepath.Base(bin)+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = logFile.Close() }()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()
	fail := func(format string, args ...any) {
		b.Helper()
		output, _ := os.ReadFile(logPath)
		b.Fatalf("%s: %s\n%s", filepath.Base(bin), fmt.Sprintf(format, args...), output)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if ready != nil {
		err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			select {
			case <-exited:
				return false, fmt.Errorf("exited: %w", waitErr)
			default:
			}
			return ready(ctx)
		})
		if err != nil {
			fail("not ready: %v", err)
		}
	}
	select {
	case <-exited:
		fail("exited: %v", waitErr)
	case <-time.After(settle):
	}
	rss, peak, err = procMemory(cmd.Process.Pid)
	if err != nil {
		fail("%v", err)
	}
	return rss, peak
}

// procMemory reads a process's VmRSS and VmHWM, in KiB, from /proc.
func procMemory(pid int) (rss, peak int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = f.Close() }()
	fields := map[string]*int64{"VmRSS:": &rss, "VmHWM:": &peak}
	found := 0
	s := bufio.NewScanner(f)
	for s.Scan() {
		// "VmRSS:	   12345 kB"
		kv := strings.Fields(s.Text())
		if len(kv) != 3 || kv[2] != "kB" {
			continue
		}
		if p, ok := fields[kv[0]]; ok {
			if *p, err = strconv.ParseInt(kv[1], 10, 64); err != nil {
				return 0, 0, fmt.Errorf("/proc/%d/status %s: %w", pid, kv[0], err)
			}
			found++
		}
	}
	if err := s.Err(); err != nil {
		return 0, 0, err
	}
	if found != len(fields) {
		return 0, 0, fmt.Errorf("/proc/%d/status lacks VmRSS or VmHWM", pid)
	}
	return rss, peak, nil
}

// reportRSS reports KiB figures in MiB. After b.Loop, whose timer reset would
// drop them.
func reportRSS(b *testing.B, rss, peak int64) {
	b.ReportMetric(float64(rss)/1024, "MiB-rss")
	b.ReportMetric(float64(peak)/1024, "MiB-peak")
	b.ReportMetric(0, "ns/op")
}
