package mps

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/mpsstate"
)

// standIn plays nvidia-cuda-mps-control, which this machine lacks. "-f" is
// the daemon: it records its environment in <GPU dir>/env and its pid in
// the pipe directory, then sleeps (exec keeps the pid). Without arguments it
// is the control client: it reads one command, appends it with the GPU to
// <GPU dir>/calls, answers get_server_list while the daemon lives (and the
// test has not made it "hung"), and ends the daemon on quit.
const standIn = `#!/bin/sh
pipe="$CUDA_MPS_PIPE_DIRECTORY"
if [ "$1" = "-f" ]; then
	env > "$pipe/../env"
	echo $$ > "$pipe/pid"
	echo "daemon for $CUDA_VISIBLE_DEVICES"
	exec sleep 100000
fi
read -r cmd
echo "$cmd $CUDA_VISIBLE_DEVICES" >> "$pipe/../calls"
pid=$(cat "$pipe/pid" 2>/dev/null) || exit 1
case "$cmd" in
get_server_list) [ ! -e "$pipe/hung" ] && kill -0 "$pid" 2>/dev/null ;;
quit) kill "$pid" ;;
*) exit 2 ;;
esac
`

type harness struct {
	t      *testing.T
	ctx    context.Context
	s      *Supervisor
	dir    string
	clock  *clocktesting.FakeClock
	mu     sync.Mutex
	events []string
}

func newHarness(t *testing.T, mutate func(*Config)) *harness {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	bin := filepath.Join(t.TempDir(), DefaultBinary)
	if err := os.WriteFile(bin, []byte(standIn), 0o755); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, ctx: ctx, dir: t.TempDir(), clock: clocktesting.NewFakeClock(time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC))}
	cfg := Config{Dir: h.dir, Binary: bin, ProbePeriod: 10 * time.Second, ProbeTimeout: 5 * time.Second, Metrics: NewMetrics(), Clock: h.clock,
		Event: func(eventType, reason, message string) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.events = append(h.events, eventType+" "+reason+" "+message)
		}}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.s = s
	t.Cleanup(func() { s.stopAll(ctx) })
	return h
}

func klogger(h *harness) klog.Logger { return klog.FromContext(h.ctx) }

func (h *harness) state(uuid string) mpsstate.State {
	h.t.Helper()
	st, err := mpsstate.Read(h.dir, uuid)
	if err != nil {
		h.t.Fatalf("state of %s: %v", uuid, err)
	}
	return st
}

// untilRunning passes until the GPU's daemon answers its probe: the stand-in
// writes its pid a moment after it starts. The bound is for a hung test, not
// a timing assertion.
func (h *harness) untilRunning(uuid string) {
	h.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		h.s.pass(h.ctx)
		if h.state(uuid).Phase == mpsstate.Running {
			return
		}
	}
	h.t.Fatalf("%s: daemon never Running: %+v", uuid, h.state(uuid))
}

func (h *harness) pid(uuid string) int {
	h.t.Helper()
	data, err := os.ReadFile(filepath.Join(h.dir, uuid, "pipe", "pid"))
	if err != nil {
		h.t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		h.t.Fatal(err)
	}
	return pid
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func (h *harness) waitExited(uuid string) {
	h.t.Helper()
	select {
	case <-h.s.daemons[uuid].exited:
	case <-time.After(20 * time.Second):
		h.t.Fatalf("%s: daemon did not end", uuid)
	}
}

// One daemon per GPU, each with its GPU, pipe and log directories in its
// environment, the directories made 0755; probes carry the same environment.
func TestStartsOneDaemonPerGPU(t *testing.T) {
	h := newHarness(t, nil)
	h.s.Update(klogger(h), []string{"GPU-a", "GPU-b", "../escape"})
	h.s.pass(h.ctx)
	for _, u := range []string{"GPU-a", "GPU-b"} {
		if p := h.state(u).Phase; p != mpsstate.Starting && p != mpsstate.Running {
			t.Errorf("%s after the first pass: %s, want Starting", u, p)
		}
	}
	h.untilRunning("GPU-a")
	h.untilRunning("GPU-b")
	for _, u := range []string{"GPU-a", "GPU-b"} {
		env, err := os.ReadFile(filepath.Join(h.dir, u, "env"))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{
			"CUDA_VISIBLE_DEVICES=" + u,
			"CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(h.dir, u, "pipe"),
			"CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(h.dir, u, "log"),
		} {
			if !slices.Contains(strings.Split(string(env), "\n"), want) {
				t.Errorf("%s: daemon environment lacks %s:\n%s", u, want, env)
			}
		}
		for _, sub := range []string{"pipe", "log"} {
			st, err := os.Stat(filepath.Join(h.dir, u, sub))
			if err != nil || st.Mode().Perm() != 0o755 {
				t.Errorf("%s/%s: %v, mode %v, want 0755", u, sub, err, st.Mode())
			}
		}
		calls, _ := os.ReadFile(filepath.Join(h.dir, u, "calls"))
		if !strings.Contains(string(calls), "get_server_list "+u+"\n") {
			t.Errorf("%s: probes were %q, want get_server_list with CUDA_VISIBLE_DEVICES=%s", u, calls, u)
		}
	}
	if got := testutil.ToFloat64(h.s.cfg.Metrics.running); got != 2 {
		t.Errorf("resclass_mps_daemons_running %v, want 2", got)
	}
	if _, err := os.Stat(filepath.Join(h.dir, "..", "escape")); err == nil {
		t.Error("a UUID that is a path escaped the MPS directory")
	}
	if len(h.s.daemons) != 2 {
		t.Errorf("%d daemons, want 2 (the path-like UUID left out)", len(h.s.daemons))
	}
}

// A daemon that dies is Failed, counted, announced, and started again once
// its backoff has passed, not before.
func TestKilledDaemonIsRestarted(t *testing.T) {
	h := newHarness(t, nil)
	h.s.Update(klogger(h), []string{"GPU-a"})
	h.untilRunning("GPU-a")
	old := h.pid("GPU-a")
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.waitExited("GPU-a")
	h.s.pass(h.ctx)
	if st := h.state("GPU-a"); st.Phase != mpsstate.Failed || !strings.Contains(st.Message, "exited") {
		t.Errorf("after the kill: %+v, want Failed, exited", st)
	}
	if got := testutil.ToFloat64(h.s.cfg.Metrics.restarts.WithLabelValues("GPU-a", "exited")); got != 1 {
		t.Errorf("restarts{exited} %v, want 1", got)
	}
	if len(h.events) != 1 || !strings.HasPrefix(h.events[0], "Warning MPSControlDaemonRestarted GPU GPU-a") {
		t.Errorf("events %q, want one MPSControlDaemonRestarted", h.events)
	}
	// Within its backoff: not started.
	h.s.pass(h.ctx)
	if h.s.daemons["GPU-a"].cmd != nil || h.state("GPU-a").Phase != mpsstate.Failed {
		t.Errorf("started again within its backoff: %+v", h.state("GPU-a"))
	}
	h.clock.Step(backoffInitial)
	h.untilRunning("GPU-a")
	if now := h.pid("GPU-a"); now == old || !alive(now) {
		t.Errorf("daemon pid %d after the restart (was %d), want a new live one", now, old)
	}
	if got := testutil.ToFloat64(h.s.cfg.Metrics.running); got != 1 {
		t.Errorf("resclass_mps_daemons_running %v, want 1", got)
	}
}

// A daemon that stops answering is killed after probeFailures probes and
// started again.
func TestHungDaemonIsKilledAndRestarted(t *testing.T) {
	h := newHarness(t, nil)
	h.s.Update(klogger(h), []string{"GPU-a"})
	h.untilRunning("GPU-a")
	old := h.pid("GPU-a")
	if err := os.WriteFile(filepath.Join(h.dir, "GPU-a", "pipe", "hung"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < probeFailures; i++ {
		h.s.pass(h.ctx)
		if !alive(old) || h.state("GPU-a").Phase != mpsstate.Running {
			t.Fatalf("after %d failed probes: killed or not Running (%+v)", i, h.state("GPU-a"))
		}
	}
	h.s.pass(h.ctx)
	if st := h.state("GPU-a"); st.Phase != mpsstate.Failed || !strings.Contains(st.Message, "killed") {
		t.Errorf("after %d failed probes: %+v, want Failed, killed", probeFailures, st)
	}
	if alive(old) {
		t.Errorf("hung daemon %d still runs", old)
	}
	if got := testutil.ToFloat64(h.s.cfg.Metrics.restarts.WithLabelValues("GPU-a", "probe")); got != 1 {
		t.Errorf("restarts{probe} %v, want 1", got)
	}
	if err := os.Remove(filepath.Join(h.dir, "GPU-a", "pipe", "hung")); err != nil {
		t.Fatal(err)
	}
	h.clock.Step(backoffInitial)
	h.untilRunning("GPU-a")
}

// A GPU that leaves the set has its daemon quit and its state Stopped; the
// others run on.
func TestGPULeavingTheSetIsQuit(t *testing.T) {
	h := newHarness(t, nil)
	h.s.Update(klogger(h), []string{"GPU-a", "GPU-b"})
	h.untilRunning("GPU-a")
	h.untilRunning("GPU-b")
	a, b := h.pid("GPU-a"), h.pid("GPU-b")
	h.s.Update(klogger(h), []string{"GPU-b"})
	h.s.pass(h.ctx)
	if st := h.state("GPU-a"); st.Phase != mpsstate.Stopped {
		t.Errorf("GPU-a left the set: %+v, want Stopped", st)
	}
	calls, _ := os.ReadFile(filepath.Join(h.dir, "GPU-a", "calls"))
	if !strings.HasSuffix(string(calls), "quit GPU-a\n") {
		t.Errorf("GPU-a's control calls %q, want a quit last", calls)
	}
	if alive(a) {
		t.Errorf("GPU-a's daemon %d still runs", a)
	}
	if !alive(b) || h.state("GPU-b").Phase != mpsstate.Running {
		t.Errorf("GPU-b: alive %v, %+v, want Running", alive(b), h.state("GPU-b"))
	}
	if got := testutil.ToFloat64(h.s.cfg.Metrics.restarts.WithLabelValues("GPU-a", "exited")); got != 0 {
		t.Errorf("a quit counted as a restart")
	}
	// Stopping the supervisor quits the rest.
	h.s.stopAll(h.ctx)
	if alive(b) || h.state("GPU-b").Phase != mpsstate.Stopped {
		t.Errorf("after stop: GPU-b alive %v, %+v", alive(b), h.state("GPU-b"))
	}
}

// A daemon that cannot start is Failed with the reason.
func TestDaemonThatCannotStartIsFailed(t *testing.T) {
	h := newHarness(t, nil)
	h.s.Update(klogger(h), []string{"GPU-a"})
	// The pipe directory's place is taken by a file.
	if err := os.MkdirAll(filepath.Join(h.dir, "GPU-a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.dir, "GPU-a", "pipe"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h.s.pass(h.ctx)
	if st := h.state("GPU-a"); st.Phase != mpsstate.Failed || !strings.Contains(st.Message, "pipe") {
		t.Errorf("%+v, want Failed naming the pipe directory", st)
	}
}

// State left by a previous supervisor's pod that was killed, of a GPU not in
// the set, is rewritten Stopped (its daemon died with that pod) and the GPU
// made DEFAULT again; a GPU it stopped itself is left alone.
func TestLeftoverStateIsStopped(t *testing.T) {
	modes := &computeModes{}
	server := modes.mock(t)
	killed, stopped := server.UUIDs()[0], server.UUIDs()[1]
	h := newHarness(t, func(c *Config) {
		c.ExclusiveProcess = true
		c.ComputeMode = &NVMLComputeMode{NVML: server}
	})
	for u, phase := range map[string]mpsstate.Phase{killed: mpsstate.Running, stopped: mpsstate.Stopped} {
		if err := mpsstate.Write(h.dir, u, mpsstate.State{Phase: phase, Updated: h.clock.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	h.s.Update(klogger(h), nil)
	h.s.pass(h.ctx)
	if st := h.state(killed); st.Phase != mpsstate.Stopped {
		t.Errorf("leftover state %+v, want Stopped", st)
	}
	if want := []string{killed + "=" + strconv.Itoa(int(lib.COMPUTEMODE_DEFAULT))}; !slices.Equal(modes.calls, want) {
		t.Errorf("compute modes %v, want %v (the killed pod's GPU only)", modes.calls, want)
	}
}

// computeModes records the compute modes the NVML mock is given.
type computeModes struct {
	mu    sync.Mutex
	calls []string
}

func (c *computeModes) mock(t *testing.T) *nvmlmock.Server {
	t.Helper()
	server := nvmlmock.New()
	for _, d := range server.Devices {
		dev := d.(*dgxa100.Device)
		dev.SetComputeModeFunc = func(mode lib.ComputeMode) lib.Return {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.calls = append(c.calls, dev.UUID+"="+strconv.Itoa(int(mode)))
			return lib.SUCCESS
		}
	}
	return server
}

// With ExclusiveProcess the GPU is EXCLUSIVE_PROCESS before its daemon
// starts and DEFAULT after it quit, through NVML; without, NVML is not
// called.
func TestComputeModeOnlyWithExclusiveProcess(t *testing.T) {
	for _, exclusive := range []bool{true, false} {
		t.Run(strconv.FormatBool(exclusive), func(t *testing.T) {
			modes := &computeModes{}
			server := modes.mock(t)
			gpu := server.UUIDs()[0]
			h := newHarness(t, func(c *Config) {
				c.ExclusiveProcess = exclusive
				c.ComputeMode = &NVMLComputeMode{NVML: server}
			})
			h.s.Update(klogger(h), []string{gpu})
			h.untilRunning(gpu)
			var want []string
			if exclusive {
				want = []string{gpu + "=" + strconv.Itoa(int(lib.COMPUTEMODE_EXCLUSIVE_PROCESS))}
			}
			if !slices.Equal(modes.calls, want) {
				t.Errorf("running: compute modes %v, want %v", modes.calls, want)
			}
			h.s.Update(klogger(h), nil)
			h.s.pass(h.ctx)
			if exclusive {
				want = append(want, gpu+"="+strconv.Itoa(int(lib.COMPUTEMODE_DEFAULT)))
			}
			if !slices.Equal(modes.calls, want) {
				t.Errorf("quit: compute modes %v, want %v", modes.calls, want)
			}
		})
	}
}

// A GPU whose compute mode cannot be set gets no daemon: clients could
// bypass it.
func TestComputeModeFailureStartsNoDaemon(t *testing.T) {
	server := nvmlmock.New()
	gpu := server.UUIDs()[0]
	server.SetAbsent(true)
	h := newHarness(t, func(c *Config) {
		c.ExclusiveProcess = true
		c.ComputeMode = &NVMLComputeMode{NVML: server}
	})
	h.s.Update(klogger(h), []string{gpu})
	h.s.pass(h.ctx)
	if st := h.state(gpu); st.Phase != mpsstate.Failed || !strings.Contains(st.Message, "EXCLUSIVE_PROCESS") {
		t.Errorf("%+v, want Failed naming EXCLUSIVE_PROCESS", st)
	}
	if h.s.daemons[gpu].cmd != nil {
		t.Error("daemon started on a GPU not EXCLUSIVE_PROCESS")
	}
}

// With a driver root the daemon runs chrooted there: the binary is found
// below it and the directories are given as the daemon sees them.
func TestDriverRoot(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/bin", DefaultBinary), []byte(standIn), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := Config{DriverRoot: root, Dir: filepath.Join(root, "run/resclass/mps"), Binary: DefaultBinary, ProbePeriod: time.Second, ProbeTimeout: time.Second}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.binary != "/usr/bin/"+DefaultBinary {
		t.Errorf("binary %s, want /usr/bin/%s in the driver root", s.binary, DefaultBinary)
	}
	env := s.env("GPU-a")
	if !slices.Contains(env, "PATH=/usr/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") {
		t.Errorf("env %v, want PATH in the driver root, the control program's directory first (nvidia-cuda-mps-server is beside it)", env)
	}
	if !slices.Contains(env, "CUDA_MPS_PIPE_DIRECTORY=/run/resclass/mps/GPU-a/pipe") || !slices.Contains(env, "CUDA_MPS_LOG_DIRECTORY=/run/resclass/mps/GPU-a/log") {
		t.Errorf("env %v, want the directories as seen in the driver root", env)
	}
	if cmd := s.command(context.Background(), "GPU-a"); cmd.SysProcAttr.Chroot != root {
		t.Errorf("chroot %q, want %s", cmd.SysProcAttr.Chroot, root)
	}
	cfg.Dir = t.TempDir()
	if _, err := New(cfg); err == nil {
		t.Error("an MPS directory outside the driver root: no error")
	}
	cfg.Dir, cfg.Binary = filepath.Join(root, "mps"), "nvidia-cuda-mps-nothing"
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "not found below the driver root") {
		t.Errorf("a missing binary: %v", err)
	}
}

// Run passes when the set changes and at every probe period, and quits every
// daemon when its context ends.
func TestRun(t *testing.T) {
	h := newHarness(t, nil)
	ctx, cancel := context.WithCancel(h.ctx)
	started, done := make(chan struct{}), make(chan struct{})
	go func() {
		h.s.Run(ctx, started)
		close(done)
	}()
	h.s.Update(klogger(h), []string{"GPU-a"})
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("no first pass after Update")
	}
	// Probe periods pass until the daemon answers.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if st, err := mpsstate.Read(h.dir, "GPU-a"); err == nil && st.Phase == mpsstate.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("GPU-a never Running under Run")
		}
		h.clock.Step(h.s.cfg.ProbePeriod)
	}
	pid := h.pid("GPU-a")
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if alive(pid) || h.state("GPU-a").Phase != mpsstate.Stopped {
		t.Errorf("after Run: daemon alive %v, %+v, want quit and Stopped", alive(pid), h.state("GPU-a"))
	}
}
