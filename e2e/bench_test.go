package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/resclass/resclass/deploy/install"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
)

// BenchmarkAgentRSS is the node agent's resident memory: the real node-agent
// binary, built as the Dockerfile builds the image's (buildAgentAsImage), a
// process of its own, in the state of an agent on a busy node. It publishes
// this machine's inventory to the embedded cluster at a 1s poll; it serves and
// registers a device-plugin endpoint per ResourceClass that selects one of this
// machine's devices (its NIC, its hugepage pools) to a stand-in kubelet that
// keeps each endpoint's ListAndWatch open as the kubelet does; the cluster has
// agentBenchClasses classes, most of them selecting GPUs this node lacks; and
// agentBenchPods pods are bound to the node, in the agent's pod cache. Its
// introspection socket, GPU fault file and /metrics (HTTPS, with the
// authorizer) are on. It is measured ten polls after its endpoints are
// watched: VmRSS (MiB-rss) and the high-water mark VmHWM (MiB-peak), which
// covers the start (the first lists, the endpoints' start); ns/op means
// nothing here and is suppressed.
//
// This machine has no NVML, so the agent runs as on a GPU node whose driver is
// not loaded; on a GPU node libnvidia-ml is mapped as well. The admin
// kubeconfig stands in for the agent's ServiceAccount: the identity does not
// change what it holds.
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
	buildAgentAsImage(b, agent)
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
		agentBenchClusterState(b, ctx, node)
		// Sockets live in a short directory: a unix socket's path is at most
		// 107 bytes, which b.TempDir's can pass.
		sockets, err := os.MkdirTemp("", "rss-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = os.RemoveAll(sockets) })
		plugins := filepath.Join(sockets, "device-plugins")
		if err := os.Mkdir(plugins, 0o755); err != nil {
			b.Fatal(err)
		}
		kubelet := startBenchKubelet(b, plugins)
		rss, peak := measureRSS(b, settle, func(ctx context.Context) (bool, error) {
			_, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, node, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil && kubelet.watching.Load() > 0, err
		}, agent, "--kubeconfig", cluster.Kubeconfig, "--node-name", node,
			"--metrics-bind-address", "127.0.0.1:0", "--poll-interval", poll.String(),
			"--device-plugin-dir", plugins, "--pod-resources-socket", "",
			"--introspection-socket", filepath.Join(sockets, "agent.sock"),
			"--gpu-fault-file", filepath.Join(sockets, "gpu-faults.json"))
		for b.Loop() {
		}
		reportRSS(b, rss, peak)
		b.ReportMetric(float64(kubelet.watching.Load()), "endpoints")
	})
	b.Run("baseline-idle-go", func(b *testing.B) {
		rss, peak := measureRSS(b, settle, nil, idle)
		for b.Loop() {
		}
		reportRSS(b, rss, peak)
	})
}

// The cluster BenchmarkAgentRSS's agent sees: classes as a fleet with a few GPU
// models has, and the pods of a busy GPU node (its DaemonSets' and its
// workloads').
const (
	agentBenchClasses = 24
	agentBenchPods    = 60
)

// agentBenchClusterState creates the classes (two that select this machine's
// NIC and hugepage pools, the rest GPUs by memory) and the pods bound to node,
// removed after b.
func agentBenchClusterState(b *testing.B, ctx context.Context, node string) {
	b.Helper()
	schedClass(b, ctx, "rss-nic", req("Kind", v1alpha1.ResourceSelectorOpIn, "nic"))
	schedClass(b, ctx, "rss-hugepages", req("Kind", v1alpha1.ResourceSelectorOpIn, "huge-pages"))
	for i := range agentBenchClasses - 2 {
		schedClass(b, ctx, fmt.Sprintf("rss-gpu-%d", i), req("Kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"), req("memory", v1alpha1.ResourceSelectorOpGtEq, fmt.Sprintf("%dGi", 8+4*i)))
	}
	ns, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-rss-"}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cluster.Client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	for i := range agentBenchPods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Name:   fmt.Sprintf("pod-%d", i),
				Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%8), "team": "bench"},
			},
			Spec: corev1.PodSpec{
				NodeName: node,
				Containers: []corev1.Container{{
					Name:  "main",
					Image: "registry.example/team/app:1.0",
					Args:  []string{"--config=/etc/app/config.yaml", "--port=8080"},
					Env:   []corev1.EnvVar{{Name: "MODE", Value: "serve"}, {Name: "REPLICA", Value: strconv.Itoa(i)}},
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("1Gi"),
					}},
				}},
			},
		}
		if _, err := cluster.Client.CoreV1().Pods(ns.Name).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// benchKubelet is the kubelet's side of the device-plugin API as an agent
// meets it: a registration server on kubelet.sock that, as the kubelet does,
// dials each endpoint registered and keeps its ListAndWatch stream open.
type benchKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	ctx context.Context
	dir string
	// watching counts the endpoints whose first device list arrived.
	watching atomic.Int32
}

func startBenchKubelet(b *testing.B, dir string) *benchKubelet {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	k := &benchKubelet{ctx: ctx, dir: dir}
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	go func() { _ = srv.Serve(l) }()
	b.Cleanup(func() { cancel(); srv.Stop() })
	return k
}

func (k *benchKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	go k.watch(r.Endpoint)
	return &pluginapi.Empty{}, nil
}

func (k *benchKubelet) watch(endpoint string) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return
	}
	defer func() { _ = conn.Close() }()
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(k.ctx, &pluginapi.Empty{})
	if err != nil {
		return
	}
	if _, err := stream.Recv(); err != nil {
		return
	}
	k.watching.Add(1)
	for {
		if _, err := stream.Recv(); err != nil {
			return
		}
	}
}

// buildAgentAsImage builds the node agent into out with the command of the
// Dockerfile's node-agent stage (its environment and flags: cgo, -trimpath,
// the build tags), so that the binary measured is the one shipped: build tags
// change what the linker keeps, and the agent's mapped text is most of its
// resident memory (docs/node-agent.md, "Memory").
func buildAgentAsImage(b *testing.B, out string) {
	b.Helper()
	root, err := install.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		b.Fatal(err)
	}
	m := regexp.MustCompile(`((?:[A-Z_]+=\S+ )*)go build (.*?)-o /out/node-agent (\./cmd/node-agent)\n`).FindSubmatch(dockerfile)
	if m == nil {
		b.Fatal("Dockerfile: no `go build ... -o /out/node-agent ./cmd/node-agent` line")
	}
	cmd := exec.Command("go", append(append([]string{"build"}, strings.Fields(string(m[2]))...), "-o", out, string(m[3]))...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), strings.Fields(string(m[1]))...)
	if output, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("%s: %v\n%s", cmd, err, output)
	}
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
