// Package mps runs the CUDA MPS control daemons of a node (docs/sharing.md,
// "Where the MPS control daemon runs"): one nvidia-cuda-mps-control per GPU
// in MPS mode, probed, started again when it dies, quit when its GPU leaves
// MPS mode, with its state written where the node agent reads it
// (pkg/mpsstate). It is "node-agent mps-control", the DaemonSet
// resclass-mps-control.
package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/resclass/resclass/pkg/mpsstate"
)

// DefaultBinary is the MPS control program's name, as the driver installs it.
const DefaultBinary = "nvidia-cuda-mps-control"

// probeFailures is how many probes in a row must fail before a daemon that
// still runs is taken for hung, killed and started again: one slow answer on
// a loaded node must not end every client of the GPU.
const probeFailures = 3

// quitTimeout bounds how long a daemon told to quit may take before it is
// killed. Quit lets the clients of its servers finish first; the agent
// takes a GPU out of MPS mode only when no pod holds it, so a quit that
// waits this long has clients no pod owns any more.
const quitTimeout = 10 * time.Second

// Restart backoff: a daemon that died waits this long before it is started
// again, doubled after each failure up to the maximum, and back to the start
// once a probe succeeds.
const (
	backoffInitial = time.Second
	backoffMax     = 5 * time.Minute
)

// maxMessage bounds the messages written into state files (the node agent
// republishes them in Device.Sharing.Message).
const maxMessage = 200

// ComputeMode sets a GPU's compute mode: exclusive is EXCLUSIVE_PROCESS, so
// that no process but the MPS server opens the GPU; otherwise DEFAULT.
type ComputeMode interface {
	SetComputeMode(uuid string, exclusive bool) error
}

// Config is a Supervisor's.
type Config struct {
	// Dir holds each GPU's pipe and log directories and state file,
	// <Dir>/<UUID>/{pipe,log,state}, as this process sees it.
	Dir string
	// DriverRoot, unless "" or "/", is the driver's root filesystem as this
	// process sees it: the daemon runs chrooted there, so that it finds
	// nvidia-cuda-mps-server and the driver's libraries as the host installed
	// them (not with this image's C library), and Dir must be below it.
	DriverRoot string
	// Binary is the MPS control program: a path (in DriverRoot) or a name
	// looked up in PATH, or below DriverRoot in binDirs.
	Binary string
	// ExclusiveProcess makes every GPU EXCLUSIVE_PROCESS (through
	// ComputeMode) before its daemon starts, and DEFAULT after it quit: no
	// process bypasses the MPS server. Without it ComputeMode is not used.
	ExclusiveProcess bool
	ComputeMode      ComputeMode
	// ProbePeriod is how often each daemon is probed (and its state file
	// rewritten: at most mpsstate.StaleAfter/3). ProbeTimeout bounds one probe.
	ProbePeriod  time.Duration
	ProbeTimeout time.Duration
	// Metrics, if set, counts daemons and restarts.
	Metrics *Metrics
	// Event, if set, records an Event on the Node (a daemon started again).
	Event func(eventType, reason, message string)
	// Clock is time for backoff and state files; nil is the real one.
	Clock clock.Clock
}

// Supervisor keeps one MPS control daemon running per GPU of its set.
type Supervisor struct {
	cfg Config
	// daemonDir is Dir as the daemon sees it (below DriverRoot).
	daemonDir string
	binary    string
	clock     clock.Clock

	mu      sync.Mutex
	desired map[string]bool
	// wake asks Run for a pass: the set changed or a daemon exited.
	wake chan struct{}

	// Owned by the pass (Run's goroutine).
	daemons map[string]*daemon
	swept   bool
	// lastPass is when a pass last finished, for Live.
	lastPass   time.Time
	lastPassMu sync.Mutex
}

// daemon is one GPU's control daemon.
type daemon struct {
	uuid string
	cmd  *exec.Cmd
	// exited is closed when cmd has ended; err is how.
	exited chan struct{}
	err    error
	// failures counts probes failed in a row.
	failures  int
	backoff   time.Duration
	notBefore time.Time
	state     mpsstate.State
	exclusive bool
}

// New checks cfg and finds the binary.
func New(cfg Config) (*Supervisor, error) {
	if cfg.ExclusiveProcess && cfg.ComputeMode == nil {
		return nil, errors.New("exclusive process mode without a way to set compute modes")
	}
	if cfg.ProbePeriod <= 0 || cfg.ProbeTimeout <= 0 {
		return nil, errors.New("the probe period and timeout must be positive")
	}
	if cfg.ProbePeriod > mpsstate.StaleAfter/3 {
		return nil, fmt.Errorf("the probe period %s is longer than %s: the node agent would take the daemons' states for stale", cfg.ProbePeriod, mpsstate.StaleAfter/3)
	}
	s := &Supervisor{cfg: cfg, clock: cfg.Clock, desired: map[string]bool{}, wake: make(chan struct{}, 1), daemons: map[string]*daemon{}}
	if s.clock == nil {
		s.clock = clock.RealClock{}
	}
	// Live counts from here until the first pass.
	s.lastPass = s.clock.Now()
	root := s.root()
	s.daemonDir = filepath.Clean(cfg.Dir)
	if root != "" {
		rel, err := filepath.Rel(root, s.daemonDir)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return nil, fmt.Errorf("the MPS directory %s is not below the driver root %s, where the daemon runs", cfg.Dir, root)
		}
		s.daemonDir = filepath.Join("/", rel)
	}
	var err error
	if s.binary, err = findBinary(root, cfg.Binary); err != nil {
		return nil, err
	}
	return s, nil
}

// root is the directory the daemons run chrooted in, "" for none.
func (s *Supervisor) root() string {
	if r := filepath.Clean(s.cfg.DriverRoot); s.cfg.DriverRoot != "" && r != "/" {
		return r
	}
	return ""
}

// binDirs are where a driver root keeps the MPS programs.
var binDirs = []string{"usr/bin", "usr/sbin", "usr/local/bin", "bin", "sbin"}

// findBinary resolves name: a path as given (below root when there is one),
// a bare name in PATH without a root, in binDirs below root with one. The
// result is the path to exec (in root).
func findBinary(root, name string) (string, error) {
	if name == "" {
		return "", errors.New("no MPS control binary named")
	}
	if root == "" {
		p, err := exec.LookPath(name)
		if err != nil {
			return "", fmt.Errorf("MPS control binary: %w", err)
		}
		return p, nil
	}
	candidates := []string{filepath.Join("/", name)}
	if !strings.Contains(name, "/") {
		candidates = candidates[:0]
		for _, d := range binDirs {
			candidates = append(candidates, filepath.Join("/", d, name))
		}
	}
	for _, c := range candidates {
		if st, err := os.Stat(filepath.Join(root, c)); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			return c, nil
		}
	}
	return "", fmt.Errorf("MPS control binary %s: not found below the driver root %s (in %s)", name, root, strings.Join(candidates, ", "))
}

// Update sets the GPUs that should run MPS. A UUID that is not one path
// element is left out (it names no directory).
func (s *Supervisor) Update(logger klog.Logger, uuids []string) {
	desired := map[string]bool{}
	for _, u := range uuids {
		if _, err := mpsstate.Path(s.cfg.Dir, u); err != nil {
			logger.Error(err, "GPU left out of MPS")
			continue
		}
		desired[u] = true
	}
	s.mu.Lock()
	s.desired = desired
	s.mu.Unlock()
	s.poke()
}

func (s *Supervisor) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run supervises until ctx ends, then quits every daemon. started is
// closed after the first pass (for readiness).
func (s *Supervisor) Run(ctx context.Context, started chan<- struct{}) {
	logger := klog.FromContext(ctx)
	timer := s.clock.NewTimer(0)
	defer timer.Stop()
	first := true
	for {
		select {
		case <-ctx.Done():
			s.stopAll(context.WithoutCancel(ctx))
			return
		case <-s.wake:
		case <-timer.C():
		}
		next := s.pass(ctx)
		if first {
			close(started)
			first = false
		}
		if !timer.Stop() {
			select {
			case <-timer.C():
			default:
			}
		}
		timer.Reset(next)
		logger.V(5).Info("MPS pass done", "next", next)
	}
}

// Live reports an error when no pass finished within three probe periods: a
// probe or a quit that does not return.
func (s *Supervisor) Live() error {
	s.lastPassMu.Lock()
	last := s.lastPass
	s.lastPassMu.Unlock()
	if age := s.clock.Since(last); age > 3*s.cfg.ProbePeriod+quitTimeout {
		return fmt.Errorf("no supervision pass for %s", age.Round(time.Second))
	}
	return nil
}

// pass brings the daemons to the desired set once, and returns how long
// until the next pass is due.
func (s *Supervisor) pass(ctx context.Context) time.Duration {
	logger := klog.FromContext(ctx)
	s.mu.Lock()
	desired := make(map[string]bool, len(s.desired))
	for u := range s.desired {
		desired[u] = true
	}
	s.mu.Unlock()

	if !s.swept {
		s.sweep(logger, desired)
		s.swept = true
	}
	for _, u := range sortedKeys(s.daemons) {
		if !desired[u] {
			s.stop(ctx, s.daemons[u], "the GPU left MPS mode")
			delete(s.daemons, u)
		}
	}
	next := s.cfg.ProbePeriod
	running := 0
	for _, u := range sortedKeys(desired) {
		d := s.daemons[u]
		if d == nil {
			d = &daemon{uuid: u, backoff: backoffInitial}
			s.daemons[u] = d
		}
		s.supervise(ctx, d)
		if d.state.Phase == mpsstate.Running {
			running++
		}
		if d.cmd == nil {
			if wait := d.notBefore.Sub(s.clock.Now()); wait < next {
				next = max(wait, 0)
			}
		}
	}
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.running.Set(float64(running))
	}
	s.lastPassMu.Lock()
	s.lastPass = s.clock.Now()
	s.lastPassMu.Unlock()
	return next
}

// sweep handles what a previous supervisor left without stopping (killed):
// its daemons died with its container, so every state file below Dir of a
// GPU not in the set that is not Stopped is rewritten Stopped, and such a
// GPU's compute mode goes back to DEFAULT.
func (s *Supervisor) sweep(logger klog.Logger, desired map[string]bool) {
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			logger.Error(err, "cannot look for state left by a previous supervisor", "dir", s.cfg.Dir)
		}
		return
	}
	for _, e := range entries {
		u := e.Name()
		if !e.IsDir() || desired[u] {
			continue
		}
		// Stopped: the previous supervisor cleaned up after it.
		if st, err := mpsstate.Read(s.cfg.Dir, u); errors.Is(err, os.ErrNotExist) || (err == nil && st.Phase == mpsstate.Stopped) {
			continue
		}
		d := &daemon{uuid: u, exclusive: s.cfg.ExclusiveProcess}
		s.leaveExclusive(logger, d)
		s.setState(logger, d, mpsstate.Stopped, "the GPU is not in MPS mode")
	}
}

// supervise does what one desired daemon needs: note its exit, probe it, or
// start it when its backoff allows.
func (s *Supervisor) supervise(ctx context.Context, d *daemon) {
	logger := klog.FromContext(ctx).WithValues("gpu", d.uuid)
	if d.cmd != nil {
		select {
		case <-d.exited:
			s.failed(logger, d, "exited", fmt.Sprintf("%s exited: %v", filepath.Base(s.binary), exitText(d.err)))
		default:
			if err := s.control(ctx, d.uuid, "get_server_list"); err != nil {
				d.failures++
				logger.V(2).Info("MPS control daemon probe failed", "failures", d.failures, "err", err)
				if d.failures < probeFailures {
					// Starting or Running, its time refreshed.
					s.setState(logger, d, d.state.Phase, d.state.Message)
					return
				}
				s.kill(d)
				s.failed(logger, d, "probe", fmt.Sprintf("no answer to %d probes in a row, killed: %v", probeFailures, err))
			} else {
				d.failures = 0
				d.backoff = backoffInitial
				if d.state.Phase != mpsstate.Running {
					logger.Info("MPS control daemon running")
				}
				s.setState(logger, d, mpsstate.Running, "")
				return
			}
		}
	}
	if d.cmd == nil && !s.clock.Now().Before(d.notBefore) {
		if err := s.start(logger, d); err != nil {
			logger.Error(err, "MPS control daemon not started")
			s.setState(logger, d, mpsstate.Failed, err.Error())
			s.delay(d)
			return
		}
		s.setState(logger, d, mpsstate.Starting, "")
		return
	}
	// Waiting out its backoff: the Failed state, its time refreshed.
	s.setState(logger, d, d.state.Phase, d.state.Message)
}

// failed records a daemon that ended without being asked to (reason
// "exited") or was killed for not answering ("probe"), and delays its next
// start.
func (s *Supervisor) failed(logger klog.Logger, d *daemon, reason, message string) {
	d.cmd = nil
	d.failures = 0
	logger.Info("MPS control daemon failed, starting it again after backoff", "reason", reason, "message", message, "backoff", d.backoff)
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.restarts.WithLabelValues(d.uuid, reason).Inc()
	}
	if s.cfg.Event != nil {
		s.cfg.Event("Warning", "MPSControlDaemonRestarted", fmt.Sprintf("GPU %s: %s; starting it again in %s", d.uuid, message, d.backoff))
	}
	s.setState(logger, d, mpsstate.Failed, message)
	s.delay(d)
}

func (s *Supervisor) delay(d *daemon) {
	d.notBefore = s.clock.Now().Add(d.backoff)
	d.backoff = min(2*d.backoff, backoffMax)
}

// env is the environment of every MPS control call for a GPU: its daemon
// and the control client that talks to it.
func (s *Supervisor) env(uuid string) []string {
	path := os.Getenv("PATH")
	if s.root() != "" {
		// The daemon starts nvidia-cuda-mps-server from PATH, in the
		// driver root: the driver installs it beside the control program.
		path = filepath.Dir(s.binary) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	dir := filepath.Join(s.daemonDir, uuid)
	return []string{
		"PATH=" + path,
		"CUDA_VISIBLE_DEVICES=" + uuid,
		"CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(dir, mpsstate.PipeDir),
		"CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(dir, "log"),
	}
}

func (s *Supervisor) command(ctx context.Context, uuid string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, s.binary, args...)
	cmd.Env = s.env(uuid)
	cmd.Dir = "/"
	// Its own process group, so that a kill reaches the servers it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if r := s.root(); r != "" {
		cmd.SysProcAttr.Chroot = r
	}
	return cmd
}

// start makes the GPU's directories, its compute mode, and starts its
// daemon in the foreground (-f), as this process's child: its end is seen at
// once (no pid file, no orphan for PID 1 to reap), and its output goes to
// this process's log.
func (s *Supervisor) start(logger klog.Logger, d *daemon) error {
	for _, sub := range []string{mpsstate.PipeDir, "log"} {
		p := filepath.Join(s.cfg.Dir, d.uuid, sub)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		// Whatever the umask: clients of any uid reach the pipes.
		if err := os.Chmod(p, 0o755); err != nil {
			return err
		}
	}
	if s.cfg.ExclusiveProcess {
		if err := s.cfg.ComputeMode.SetComputeMode(d.uuid, true); err != nil {
			return fmt.Errorf("compute mode EXCLUSIVE_PROCESS: %w", err)
		}
		d.exclusive = true
	}
	// Not ctx: the daemon outlives a pass, and is quit, not killed, at the end.
	cmd := s.command(context.Background(), d.uuid, "-f")
	out := &logWriter{logger: logger.WithValues("daemon", filepath.Base(s.binary))}
	cmd.Stdout, cmd.Stderr = out, out
	// A server the daemon started may hold its output open after it ended.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return err
	}
	d.cmd, d.exited = cmd, make(chan struct{})
	exited := d.exited
	go func() {
		err := cmd.Wait()
		d.err = err
		close(exited)
		s.poke()
	}()
	logger.Info("MPS control daemon started", "pid", cmd.Process.Pid, "binary", s.binary, "root", s.root())
	return nil
}

// control sends one command to a GPU's daemon through the control client,
// within the probe timeout.
func (s *Supervisor) control(ctx context.Context, uuid, command string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ProbeTimeout)
	defer cancel()
	cmd := s.command(ctx, uuid)
	cmd.Stdin = strings.NewReader(command + "\n")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", command, err, bounded(out.String()))
	}
	return nil
}

// stop quits a daemon (killing it after quitTimeout), then gives the GPU its
// DEFAULT compute mode back.
func (s *Supervisor) stop(ctx context.Context, d *daemon, why string) {
	logger := klog.FromContext(ctx).WithValues("gpu", d.uuid)
	if d.cmd != nil {
		select {
		case <-d.exited:
		default:
			if err := s.control(ctx, d.uuid, "quit"); err != nil {
				logger.Error(err, "MPS control daemon did not take quit")
			}
			select {
			case <-d.exited:
			case <-s.clock.After(quitTimeout):
				logger.Info("MPS control daemon still runs after quit, killed", "timeout", quitTimeout)
				s.kill(d)
			}
		}
		d.cmd = nil
		logger.Info("MPS control daemon stopped", "why", why)
	}
	s.leaveExclusive(logger, d)
	s.setState(logger, d, mpsstate.Stopped, why)
}

func (s *Supervisor) leaveExclusive(logger klog.Logger, d *daemon) {
	if !d.exclusive || !s.cfg.ExclusiveProcess {
		return
	}
	if err := s.cfg.ComputeMode.SetComputeMode(d.uuid, false); err != nil {
		logger.Error(err, "compute mode not set back to DEFAULT")
		return
	}
	d.exclusive = false
}

// kill ends a daemon's process group and waits for it.
func (s *Supervisor) kill(d *daemon) {
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
	<-d.exited
}

// stopAll quits every daemon: the supervisor is stopping (its pod is
// deleted). The daemons are its container's processes and would die with it
// anyway; quitting lets their servers end in order, resets the compute modes
// and leaves Stopped states behind for the agent.
func (s *Supervisor) stopAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, u := range sortedKeys(s.daemons) {
		d := s.daemons[u]
		wg.Go(func() { s.stop(ctx, d, "the MPS control DaemonSet's pod stopped") })
	}
	wg.Wait()
}

func (s *Supervisor) setState(logger klog.Logger, d *daemon, phase mpsstate.Phase, message string) {
	d.state = mpsstate.State{Phase: phase, Message: bounded(message), Updated: s.clock.Now().UTC().Truncate(time.Second)}
	if err := mpsstate.Write(s.cfg.Dir, d.uuid, d.state); err != nil {
		logger.Error(err, "MPS state not written")
	}
}

// bounded is s on one line, valid UTF-8, at most maxMessage bytes.
func bounded(s string) string {
	s = strings.Join(strings.Fields(strings.ToValidUTF8(s, "?")), " ")
	if len(s) <= maxMessage {
		return s
	}
	cut := maxMessage
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func exitText(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// logWriter logs a daemon's output, one line at a time.
type logWriter struct {
	logger klog.Logger
	mu     sync.Mutex
	buf    []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.logger.Info("MPS control daemon output", "line", bounded(string(w.buf[:i])))
		w.buf = w.buf[i+1:]
	}
	// A daemon that writes without newlines is cut, not buffered forever.
	if len(w.buf) > 4096 {
		w.logger.Info("MPS control daemon output", "line", bounded(string(w.buf)))
		w.buf = w.buf[:0]
	}
	return len(p), nil
}
