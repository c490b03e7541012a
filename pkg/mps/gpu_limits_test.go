package mps

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/resclass/resclass/pkg/mpsstate"
)

// TestRealMPSClientLimits runs, with RESCLASS_MPS_GPU_TEST=1 on a GPU, two
// CUDA clients at once through the daemon the supervisor started for GPU 0,
// each with the limit the agent gives an MPS share (0=<MiB>M): A 1024M, B
// 4096M. B allocates 2048 MiB and holds it; A's 2048 MiB then fails and its
// 256 MiB succeeds (a context takes about 514 MiB of the limit on an H200);
// both are clients of the one MPS server (get_client_list). After A exited,
// B writes its allocation, reads it back and exits 0. The compute mode is
// left alone (no ExclusiveProcess). It passed on an H200, driver 580.159.04
// (docs/sharing.md, "On a real GPU").
//
// The client is testdata/cudaclient (cgo, dlopen of libcuda.so.1, no CUDA
// toolkit): RESCLASS_MPS_CUDACLIENT names a built one (for a GPU machine
// without Go); unset, the test builds it with go and gcc.
func TestRealMPSClientLimits(t *testing.T) {
	binary, nvml, dev, gpu := realGPU(t)
	client := os.Getenv("RESCLASS_MPS_CUDACLIENT")
	if client == "" {
		if _, err := exec.LookPath("go"); err != nil {
			t.Fatal("RESCLASS_MPS_GPU_TEST=1 but no RESCLASS_MPS_CUDACLIENT and no go to build testdata/cudaclient")
		}
		client = filepath.Join(t.TempDir(), "cudaclient")
		build := exec.Command("go", "build", "-o", client, "./testdata/cudaclient")
		build.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building testdata/cudaclient: %v\n%s", err, out)
		}
	}
	name, _ := dev.GetName()
	driver, _ := nvml.SystemGetDriverVersion()
	before, ret := dev.GetComputeMode()
	if ret != lib.SUCCESS {
		t.Fatalf("compute mode: %v", ret)
	}
	t.Logf("GPU %s (%s, driver %s), compute mode %d", gpu, name, driver, before)

	// Short: under t.TempDir's (/tmp/TestRealMPSClientLimits<n>/001) the
	// daemon exited at once, status 1, silent; under /tmp/mps<n> it ran.
	dir, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	_, ctx := ktesting.NewTestContext(t)
	s, err := New(Config{Dir: dir, Binary: binary, ProbePeriod: time.Second, ProbeTimeout: 5 * time.Second, Metrics: NewMetrics()})
	if err != nil {
		t.Fatal(err)
	}
	s.Update(klog.FromContext(ctx), []string{gpu})
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		s.Update(klog.FromContext(ctx), nil)
		s.pass(ctx)
		if st, _ := mpsstate.Read(dir, gpu); st.Phase != mpsstate.Stopped {
			t.Errorf("after leaving the set: %+v, want Stopped", st)
		}
		for _, f := range []string{"control.log", "server.log"} {
			logs, _ := os.ReadFile(filepath.Join(dir, gpu, "log", f))
			t.Logf("%s:\n%s", f, logs)
		}
	}
	t.Cleanup(stop)
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		s.pass(ctx)
		if st, _ := mpsstate.Read(dir, gpu); st.Phase == mpsstate.Running || st.Phase == mpsstate.Failed {
			break
		}
	}
	if st, err := mpsstate.Read(dir, gpu); err != nil || st.Phase != mpsstate.Running {
		t.Fatalf("state %+v, %v, want Running", st, err)
	}
	pipe := filepath.Join(dir, gpu, mpsstate.PipeDir)

	// B first: its 2048 MiB is held while A runs, until the test closes its
	// stdin (at most 120 s).
	b := startCUDAClient(t, ctx, client, gpu, pipe, "0=4096M", "-alloc", "2048", "-hold", "120s", "-until-eof")
	b.waitFor(t, "holding ")
	a := startCUDAClient(t, ctx, client, gpu, pipe, "0=1024M", "-alloc", "2048,256", "-hold", "2s")
	a.waitFor(t, "holding ")

	// Both are clients of the one MPS server of the GPU.
	control := func(command string) string {
		cmd := s.command(ctx, gpu)
		cmd.Stdin = strings.NewReader(command + "\n")
		out, err := cmd.Output()
		t.Logf("%s: %q %v", command, out, err)
		return strings.TrimSpace(string(out))
	}
	servers := strings.Fields(control("get_server_list"))
	if len(servers) != 1 {
		t.Errorf("servers %q, want one", servers)
	} else {
		clients := strings.Fields(control("get_client_list " + servers[0]))
		for _, c := range []*cudaClient{a, b} {
			if !slices.Contains(clients, strconv.Itoa(c.cmd.Process.Pid)) {
				t.Errorf("client %s (pid %d) is not in the server's clients %q", c.limit, c.cmd.Process.Pid, clients)
			}
		}
	}

	aErr := a.wait()
	if b.exited() {
		t.Error("B ended before A: its allocation was not held through A's failure")
	}
	b.closeStdin()
	bErr := b.wait()
	a.log(t, aErr)
	b.log(t, bErr)

	if aErr != nil {
		t.Errorf("A (%s): %v", a.limit, aErr)
	}
	if r := a.result(t, "alloc 2048MiB"); r == 0 {
		t.Errorf("A (%s): 2048 MiB allocated, want a failure", a.limit)
	}
	for _, step := range []string{"alloc 256MiB", "check 256MiB read back"} {
		if r := a.result(t, step); r != 0 {
			t.Errorf("A (%s): %s: result %d, want 0", a.limit, step, r)
		}
	}
	// Each client sees its limit as its memory: what is free is below it.
	for _, c := range []struct {
		c     *cudaClient
		limit int
	}{{a, 1024}, {b, 4096}} {
		if free := c.c.freeMiB(); free < 0 || free > c.limit {
			t.Errorf("client %s: free memory %d MiB, want at most %d", c.c.limit, free, c.limit)
		}
	}
	if bErr != nil {
		t.Errorf("B (%s): %v", b.limit, bErr)
	}
	for _, step := range []string{"alloc 2048MiB", "check 2048MiB memset", "check 2048MiB read back", "free 2048MiB"} {
		if r := b.result(t, step); r != 0 {
			t.Errorf("B (%s): %s: result %d, want 0", b.limit, step, r)
		}
	}
	if !slices.Contains(b.output(), "check 2048MiB: last byte 0x5a") {
		t.Errorf("B (%s): its 2048 MiB did not read back as written", b.limit)
	}

	stop()
	if after, ret := dev.GetComputeMode(); ret != lib.SUCCESS || after != before {
		t.Errorf("compute mode %d (%v) after the test, %d before", after, ret, before)
	}
}

// cudaClient is one run of testdata/cudaclient, its output read line by line.
type cudaClient struct {
	limit string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	done  chan struct{}
	err   error

	mu  sync.Mutex
	out []string
}

func startCUDAClient(t *testing.T, ctx context.Context, binary, gpu, pipe, limit string, args ...string) *cudaClient {
	c := &cudaClient{limit: limit, lines: make(chan string, 100), done: make(chan struct{})}
	c.cmd = exec.CommandContext(ctx, binary, args...)
	c.cmd.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES="+gpu, "CUDA_MPS_PIPE_DIRECTORY="+pipe,
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="+limit)
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.cmd.Stderr = c.cmd.Stdout
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !c.exited() {
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.mu.Lock()
			c.out = append(c.out, sc.Text())
			c.mu.Unlock()
			select {
			case c.lines <- sc.Text():
			default:
			}
		}
		c.err = c.cmd.Wait()
		close(c.lines)
		close(c.done)
	}()
	return c
}

// waitFor waits (60 s at most) for a line that starts with prefix.
func (c *cudaClient) waitFor(t *testing.T, prefix string) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				<-c.done
				c.log(t, c.err)
				t.Fatalf("client %s ended before %q", c.limit, prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return
			}
		case <-timeout:
			c.log(t, nil)
			t.Fatalf("client %s: no %q in 60 s", c.limit, prefix)
		}
	}
}

func (c *cudaClient) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *cudaClient) closeStdin() { _ = c.stdin.Close() }

func (c *cudaClient) wait() error {
	select {
	case <-c.done:
	case <-time.After(150 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	return c.err
}

func (c *cudaClient) output() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.out)
}

func (c *cudaClient) log(t *testing.T, err error) {
	t.Logf("client %s (pid %d), %v:\n%s", c.limit, c.cmd.Process.Pid, err, strings.Join(c.output(), "\n"))
}

var resultLine = regexp.MustCompile(`^(.*): result=(-?\d+) `)

// result is the CUresult of a step's line; -1 where there is none.
func (c *cudaClient) result(t *testing.T, step string) int {
	for _, l := range c.output() {
		if m := resultLine.FindStringSubmatch(l); m != nil && m[1] == step {
			r, _ := strconv.Atoi(m[2])
			return r
		}
	}
	t.Errorf("client %s: no line for %s", c.limit, step)
	return -1
}

// freeMiB is the free memory the client saw after its context was made; -1
// where it did not say.
func (c *cudaClient) freeMiB() int {
	for _, l := range c.output() {
		var free, total int
		if n, _ := fmt.Sscanf(l, "memory: free %dMiB, total %dMiB", &free, &total); n == 2 {
			return free
		}
	}
	return -1
}
