// Package node runs one kubelet node of the e2e harness: the real kubelet with the
// recording CRI runtime, inside a private mount namespace so that nothing the
// kubelet writes reaches the host. The harness starts it as its own process (the
// e2e-node binary) in a new mount namespace; Run refuses to run anywhere else.
//
// Inside the namespace /var/lib and /var/log are overlays whose upper layers live
// in the node's directory, and the kernel settings the kubelet insists on writing
// (/proc/sys/vm/overcommit_memory, kernel/panic, kernel/panic_on_oops) are files of
// that directory bind-mounted over the real ones. Every mount disappears with the
// namespace when the process exits.
package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/resclass/resclass/e2e/framework/cri"
	"github.com/resclass/resclass/e2e/framework/exampleplugin"
)

// DevicePluginDir is where the kubelet (and so every device plugin) keeps its
// sockets; the kubelet hard-codes it.
const DevicePluginDir = "/var/lib/kubelet/device-plugins"

// Files in a node's directory that the harness reads.
const (
	RecordsFile   = "create-container.jsonl" // cri.Record per CreateContainer
	KubeletLog    = "kubelet.log"
	AgentLog      = "agent.log"
	KubeletConfig = "kubelet-config.yaml"
)

// Config describes one node.
type Config struct {
	Dir            string // the node's directory, absolute; everything the node writes goes here
	Name           string
	Kubeconfig     string
	Kubelet        string // path of the kubelet binary
	KubeletPort    int
	HealthzPort    int
	ClientCAFile   string // CA of the clients the kubelet accepts (the apiserver's kubelet client cert)
	Labels         string // node labels, k=v,k=v
	ExampleDevices int    // serve exampleplugin with this many devices (0: none)
	// Agent, if set, is the node agent's command line. It runs in the node's mount
	// namespace (so it shares the kubelet's device-plugin directory) once the
	// kubelet serves device plugins, with NODE_NAME and KUBECONFIG set, and stops
	// with the node. Its output goes to AgentLog.
	Agent     []string
	Verbosity int
}

// Run runs the node until ctx is done, then stops the kubelet. Run it as root.
func Run(ctx context.Context, cfg Config) error {
	if err := ensurePrivateMountNamespace(); err != nil {
		return err
	}
	if err := isolate(cfg.Dir); err != nil {
		return fmt.Errorf("isolating the node: %w", err)
	}
	containerRuntime, err := cri.Start(filepath.Join(cfg.Dir, "cri.sock"), filepath.Join(cfg.Dir, RecordsFile))
	if err != nil {
		return fmt.Errorf("container runtime: %w", err)
	}
	defer containerRuntime.Stop()

	kubelet, err := startKubelet(cfg)
	if err != nil {
		return err
	}
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = kubelet.Wait(); close(exited) }()
	stopKubelet := func() {
		_ = kubelet.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = kubelet.Process.Kill()
			<-exited
		}
	}

	if err := waitForFile(ctx, filepath.Join(DevicePluginDir, "kubelet.sock"), exited); err != nil {
		stopKubelet()
		return fmt.Errorf("kubelet did not start its device manager (see %s): %w", filepath.Join(cfg.Dir, KubeletLog), err)
	}
	if cfg.ExampleDevices > 0 {
		p, err := exampleplugin.Start(ctx, DevicePluginDir, cfg.ExampleDevices)
		if err != nil {
			stopKubelet()
			return fmt.Errorf("example device plugin: %w", err)
		}
		defer p.Stop()
	}
	if len(cfg.Agent) > 0 {
		agent, err := startAgent(cfg)
		if err != nil {
			stopKubelet()
			return err
		}
		defer func() {
			_ = agent.Process.Signal(syscall.SIGTERM)
			_ = agent.Wait()
		}()
	}
	// SIGUSR1 restarts the kubelet, as an upgrade or a crash would: the new
	// kubelet wipes the device-plugin directory and every plugin must
	// register again.
	restart := make(chan os.Signal, 1)
	signal.Notify(restart, syscall.SIGUSR1)
	defer signal.Stop(restart)
	for {
		select {
		case <-ctx.Done():
			stopKubelet()
			return nil
		case <-exited:
			return fmt.Errorf("kubelet exited (see %s): %w", filepath.Join(cfg.Dir, KubeletLog), exitErr)
		case <-restart:
			stopKubelet()
			if kubelet, err = startKubelet(cfg); err != nil {
				return err
			}
			exited = make(chan struct{})
			go func(k *exec.Cmd, done chan struct{}) { exitErr = k.Wait(); close(done) }(kubelet, exited)
		}
	}
}

// ensurePrivateMountNamespace refuses to run in the mount namespace of the process
// that started it (where a mount would change the host) and makes every mount here
// private, so that nothing propagates back.
func ensurePrivateMountNamespace() error {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	if err != nil {
		return err
	}
	if self == parent {
		return errors.New("refusing to run in the mount namespace of the process that started it: start it with CLONE_NEWNS (the e2e harness does)")
	}
	return unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "")
}

// isolate overlays /var/lib and /var/log and fakes the sysctls the kubelet writes.
func isolate(dir string) error {
	for _, target := range []string{"/var/lib", "/var/log"} {
		base := filepath.Join(dir, "overlay", filepath.Base(target))
		upper, work := filepath.Join(base, "upper"), filepath.Join(base, "work")
		if err := os.MkdirAll(upper, 0o755); err != nil {
			return err
		}
		if err := os.MkdirAll(work, 0o755); err != nil {
			return err
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", target, upper, work)
		if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
			return fmt.Errorf("overlay on %s: %w", target, err)
		}
	}
	sysctls := map[string]string{
		"/proc/sys/vm/overcommit_memory": "1",
		"/proc/sys/kernel/panic":         "10",
		"/proc/sys/kernel/panic_on_oops": "1",
	}
	for target, value := range sysctls {
		f := filepath.Join(dir, "sysctl", filepath.Base(filepath.Dir(target))+"."+filepath.Base(target))
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(f, []byte(value+"\n"), 0o644); err != nil {
			return err
		}
		if err := unix.Mount(f, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting over %s: %w", target, err)
		}
	}
	return nil
}

func startKubelet(cfg Config) (*exec.Cmd, error) {
	configPath := filepath.Join(cfg.Dir, KubeletConfig)
	if err := os.WriteFile(configPath, []byte(kubeletConfig(cfg)), 0o644); err != nil {
		return nil, err
	}
	// The kubelet's log cleanup has deleted files in its working directory when a
	// runtime misreported log paths: give it an empty one.
	cwd := filepath.Join(cfg.Dir, "cwd")
	if err := os.MkdirAll(cwd, 0o755); err != nil {
		return nil, err
	}
	// Appended to: a restarted kubelet's log follows the first one's.
	logFile, err := os.OpenFile(filepath.Join(cfg.Dir, KubeletLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	args := []string{
		"--config=" + configPath,
		"--kubeconfig=" + cfg.Kubeconfig,
		"--root-dir=" + filepath.Join(cfg.Dir, "root"),
		"--cert-dir=" + filepath.Join(cfg.Dir, "pki"),
		"--hostname-override=" + cfg.Name,
		fmt.Sprintf("--v=%d", cfg.Verbosity),
	}
	if cfg.Labels != "" {
		args = append(args, "--node-labels="+cfg.Labels)
	}
	cmd := exec.Command(cfg.Kubelet, args...)
	cmd.Dir = cwd
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// The kubelet must not outlive this process, whatever happens to it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting the kubelet: %w", err)
	}
	return cmd, nil
}

func startAgent(cfg Config) (*exec.Cmd, error) {
	logFile, err := os.Create(filepath.Join(cfg.Dir, AgentLog))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(cfg.Agent[0], cfg.Agent[1:]...)
	cmd.Env = append(os.Environ(), "NODE_NAME="+cfg.Name, "KUBECONFIG="+cfg.Kubeconfig)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting the node agent: %w", err)
	}
	return cmd, nil
}

// kubeletConfig is a KubeletConfiguration that works without cgroup management,
// swap checks or real images (docs/e2e.md, "What runs").
func kubeletConfig(cfg Config) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
containerRuntimeEndpoint: unix://%[1]s/cri.sock
imageServiceEndpoint: unix://%[1]s/cri.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %[2]s}
authorization: {mode: AlwaysAllow}
port: %[3]d
readOnlyPort: 0
healthzPort: %[4]d
healthzBindAddress: 127.0.0.1
podLogsDir: %[1]s/pod-logs
resolvConf: ""
registerNode: true
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
`, cfg.Dir, cfg.ClientCAFile, cfg.KubeletPort, cfg.HealthzPort)
}

func waitForFile(ctx context.Context, path string, exited <-chan struct{}) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(60 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			return errors.New("the kubelet exited")
		case <-timeout:
			return fmt.Errorf("%s did not appear within 60s", path)
		case <-tick.C:
		}
	}
}
