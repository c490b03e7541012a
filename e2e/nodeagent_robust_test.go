package e2e

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/deviceplugin"
	"github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/introspection"
	"github.com/resclass/resclass/pkg/nodeagent"
	agentv1 "github.com/resclass/resclass/proto/resclass/agent/v1"
)

// robustNode registers a Node for an agent and returns the agent's clients.
func robustNode(t *testing.T, ctx context.Context, name string) (versioned.Interface, kubernetes.Interface) {
	t.Helper()
	if _, err := cluster.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return agentClients(t, name)
}

// runAgent runs agent until the test ends, or until stop is called; stop
// returns Run's error, and exited is closed when Run returned.
func runAgent(t *testing.T, ctx context.Context, agent *nodeagent.Agent) (stop func() error, exited <-chan struct{}) {
	t.Helper()
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var err error
	go func() { err = agent.Run(actx); close(done) }()
	stop = func() error {
		cancel()
		<-done
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop, done
}

func nvmlCondition(nd *v1alpha1.NodeDevices) *metav1.Condition {
	return meta.FindStatusCondition(nd.Status.Conditions, nvidiagpu.Condition)
}

// TestNodeAgentRobustness plays what a fleet does to the node agent, on the real
// apiserver with the agent's identity: a driver that loads after the agent and
// goes away again, a GPU NVML cannot name, a GPU that falls off the bus, an
// apiserver that is down when the agent starts, and the agent being stopped.
func TestNodeAgentRobustness(t *testing.T) {
	ctx, cancel := agentTest(t, 4*time.Minute)
	defer cancel()
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}

	// The driver loads after the agent started (the GPU operator's driver
	// container): the agent used to keep NVMLAvailable=False until restarted.
	t.Run("late driver, GPU without handle, driver gone and back", func(t *testing.T) {
		const node = "robust-late-driver"
		arc, akc := robustNode(t, ctx, node)
		dgx, root := mockDGX(t)
		dgx.SetAbsent(true)
		dgx.FailHandle(5, lib.ERROR_UNKNOWN)
		agent := nodeagent.New(nodeagent.Config{
			NodeName: node, HostRoot: root,
			Kinds:        kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{Binding: dgx, Health: nvml.HealthOptions{WaitTimeout: 100 * time.Millisecond}}}),
			PollInterval: 200 * time.Millisecond, ResyncInterval: time.Second, OpenRetryMax: 500 * time.Millisecond,
			// The GPUs are kept through NVML's failures for this long
			// (TestNodeAgentKeepsGPUsThroughNVMLErrors); here, where the
			// driver goes for good, they go soon after.
			DeviceGracePeriod: time.Second,
		}, arc, akc)
		runAgent(t, ctx, agent)
		waitNodeDevices(t, ctx, rc, node, func(nd *v1alpha1.NodeDevices) bool {
			c := nvmlCondition(nd)
			return c != nil && c.Status == metav1.ConditionFalse && c.Reason == "Unavailable" && nd.Status.Summary.GPUs == 0
		})
		dgx.SetAbsent(false)
		nd := waitNodeDevices(t, ctx, rc, node, func(nd *v1alpha1.NodeDevices) bool {
			c := nvmlCondition(nd)
			return c != nil && c.Status == metav1.ConditionTrue && nd.Status.Summary.GPUs == 7
		})
		// The GPU without a handle is left out, and the condition says so.
		if c := nvmlCondition(nd); c.Reason != "Incomplete" || !strings.Contains(c.Message, "GPU 5: handle: "+lib.ERROR_UNKNOWN.Error()) {
			t.Errorf("NVMLAvailable %+v, want Incomplete naming GPU 5", c)
		}
		if findDevice(nd, dgx.UUIDs()[5]) != nil || nd.Status.Summary.Unhealthy != 0 {
			t.Errorf("GPU 5 published, or GPUs unhealthy: %+v", nd.Status.Summary)
		}
		// NVML gives the handle at last: published at the next resync.
		dgx.FailHandle(5, lib.SUCCESS)
		waitNodeDevices(t, ctx, rc, node, func(nd *v1alpha1.NodeDevices) bool {
			c := nvmlCondition(nd)
			return c != nil && c.Reason == "Discovered" && nd.Status.Summary.GPUs == 8
		})
		// The driver is unloaded: the GPUs go once the grace has passed, NVML
		// is shut down.
		dgx.SetAbsent(true)
		waitNodeDevices(t, ctx, rc, node, func(nd *v1alpha1.NodeDevices) bool {
			c := nvmlCondition(nd)
			return c != nil && c.Status == metav1.ConditionFalse && nd.Status.Summary.GPUs == 0
		})
		if dgx.Initialised() {
			t.Error("NVML still initialised after the driver went away")
		}
		dgx.SetAbsent(false)
		waitNodeDevices(t, ctx, rc, node, func(nd *v1alpha1.NodeDevices) bool {
			c := nvmlCondition(nd)
			return c != nil && c.Status == metav1.ConditionTrue && nd.Status.Summary.GPUs == 8
		})
	})

	// A GPU falls off the bus: NVML's event wait fails with ERROR_GPU_IS_LOST.
	// That used to be logged, and the GPU stayed Healthy until the resync (an
	// hour here, 5 minutes by default).
	t.Run("lost GPU is unhealthy at once", func(t *testing.T) {
		const node = "robust-lost-gpu"
		arc, akc := robustNode(t, ctx, node)
		dgx, root := mockDGX(t)
		agent := nodeagent.New(nodeagent.Config{
			NodeName: node, HostRoot: root,
			Kinds: kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{
				Binding: dgx,
				Health:  nvml.HealthOptions{RecoveryAfter: 2 * time.Second, WaitTimeout: 100 * time.Millisecond},
			}}),
			PollInterval: 200 * time.Millisecond, ResyncInterval: time.Hour,
		}, arc, akc)
		runAgent(t, ctx, agent)
		waitNodeDevices(t, ctx, rc, node, func(nd *v1alpha1.NodeDevices) bool { return nd.Status.Summary.GPUs == 8 })
		gpu := dgx.UUIDs()[4]
		dgx.SetLost(gpu, true)
		waitNodeDevices(t, ctx, rc, node, func(nd *v1alpha1.NodeDevices) bool {
			d := findDevice(nd, gpu)
			return d != nil && !d.Healthy && d.Reason == "NVML: "+lib.ERROR_GPU_IS_LOST.Error() && nd.Status.Summary.Unhealthy == 1
		})
		waitEvent(t, ctx, node, "DeviceUnhealthy", gpu)
		dgx.SetLost(gpu, false) // reset
		waitNodeDevices(t, ctx, rc, node, func(nd *v1alpha1.NodeDevices) bool {
			d := findDevice(nd, gpu)
			return d != nil && d.Healthy && nd.Status.Summary.Unhealthy == 0
		})
	})

	// The apiserver refuses connections when the agent starts (a control-plane
	// upgrade), then closes them unanswered: the agent used to exit at once.
	t.Run("apiserver down at start", func(t *testing.T) {
		const node = "robust-apiserver-down"
		robustNode(t, ctx, node)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close() // nothing listens: connection refused
		cfg := cluster.NodeAgentConfig(node)
		apiserver, err := url.Parse(cfg.Host)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Host = "https://" + addr
		cfg.ServerName = apiserver.Hostname()
		drc, dkc := clientsFor(t, cfg)
		agent := nodeagent.New(nodeagent.Config{
			NodeName: node, HostRoot: t.TempDir(),
			Kinds:        kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{Binding: nvmlmock.New()}}),
			PollInterval: 200 * time.Millisecond, ResyncInterval: time.Hour,
		}, drc, dkc)
		stop, exited := runAgent(t, ctx, agent)
		select {
		case <-exited:
			t.Fatalf("the agent exited while the apiserver was unreachable: %v", stop())
		case <-time.After(3 * time.Second):
		}
		if agent.Published() {
			t.Fatal("published (ready) without an apiserver")
		}
		// Now it accepts connections and closes them: still no apiserver.
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listening on %s again: %v", addr, err)
		}
		defer func() { _ = ln.Close() }()
		var forward atomic.Bool // false: close connections; true: forward them
		go proxy(ln, apiserver.Host, &forward)
		select {
		case <-exited:
			t.Fatalf("the agent exited while the apiserver closed its connections: %v", stop())
		case <-time.After(3 * time.Second):
		}
		if agent.Published() {
			t.Fatal("published (ready) without an apiserver")
		}
		forward.Store(true)
		waitNodeDevices(t, ctx, rc, node, func(nd *v1alpha1.NodeDevices) bool { return nd.Status.Summary.GPUs == 8 })
		deadline := time.Now().Add(30 * time.Second)
		for !agent.Published() && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if !agent.Published() {
			t.Error("not ready (Published) after publishing")
		}
	})

	// The agent is stopped (SIGTERM ends the context in cmd/node-agent) right
	// after it found eight GPUs unhealthy. Run used to return with its
	// endpoints still being torn down and the Events not yet written.
	t.Run("shutdown stops endpoints, removes sockets and flushes Events", func(t *testing.T) {
		const node, class = "robust-shutdown", "e2e-robust-gpu"
		schedClass(t, ctx, class, v1alpha1.ResourceSelectorRequirement{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{"nvidia-gpu"}})
		arc, akc := robustNode(t, ctx, node)
		dgx, root := mockDGX(t)
		pluginDir, socketDir := t.TempDir(), t.TempDir()
		introspectionSocket := filepath.Join(socketDir, "agent.sock")
		endpoint := filepath.Join(pluginDir, deviceplugin.SocketName(v1alpha1.ResourceNamePrefix+class))
		agent := nodeagent.New(nodeagent.Config{
			NodeName: node, HostRoot: root,
			Kinds: kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{
				Binding: dgx,
				Health:  nvml.HealthOptions{RecoveryAfter: time.Hour, WaitTimeout: 100 * time.Millisecond},
			}}),
			PollInterval: 200 * time.Millisecond, ResyncInterval: time.Hour,
			PluginDir: pluginDir, IntrospectionSocket: introspectionSocket,
			// Not the host's /var/run/cdi (the default strategy is cdi-cri).
			CDISpecDir: filepath.Join(t.TempDir(), "cdi"),
		}, arc, akc)
		stop, _ := runAgent(t, ctx, agent)
		waitNodeDevices(t, ctx, rc, node, func(nd *v1alpha1.NodeDevices) bool { return nd.Status.Summary.GPUs == 8 })
		waitFile(t, ctx, endpoint)
		waitFile(t, ctx, introspectionSocket)
		// The agent's health stream says when it has recorded the Events:
		// it publishes each change there just before recording its Event.
		client, conn, err := introspection.Dial(introspectionSocket)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		stream, err := client.WatchHealth(ctx, &agentv1.WatchHealthRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil { // the stream is open
			t.Fatal(err)
		}
		for _, gpu := range dgx.UUIDs() {
			dgx.InjectXID(gpu, 48)
		}
		for unhealthy := map[string]bool{}; len(unhealthy) < 8; {
			ev, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if !ev.GetHealthy() && strings.Contains(ev.GetReason(), "XID 48") {
				unhealthy[ev.GetDeviceId()] = true
			}
		}
		// Stopped at once, with the Events just recorded.
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		// Everything is done when Run returns: no waiting here.
		for _, p := range []string{endpoint, introspectionSocket} {
			if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s still there after Run returned (%v)", p, err)
			}
		}
		if entries, _ := os.ReadDir(pluginDir); len(entries) > 1 { // the kubelet's checkpoint may be there
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Errorf("plugin directory after Run returned: %v", names)
		}
		list, err := cluster.Client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node, "reason": "DeviceUnhealthy"}.String(),
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, gpu := range dgx.UUIDs() {
			found := false
			for _, e := range list.Items {
				found = found || strings.Contains(e.Message, gpu)
			}
			if !found {
				t.Errorf("no DeviceUnhealthy Event for %s written before Run returned (%d Events)", gpu, len(list.Items))
			}
		}
	})
}

func clientsFor(t *testing.T, cfg *rest.Config) (versioned.Interface, kubernetes.Interface) {
	t.Helper()
	rc, err := versioned.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rc, kc
}

// proxy forwards the connections ln accepts to target once forward is true,
// and closes them unanswered before.
func proxy(ln net.Listener, target string, forward *atomic.Bool) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if !forward.Load() {
			_ = c.Close()
			continue
		}
		go func() {
			defer func() { _ = c.Close() }()
			up, err := net.Dial("tcp", target)
			if err != nil {
				return
			}
			defer func() { _ = up.Close() }()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			_, _ = io.Copy(c, up)
		}()
	}
}

func waitFile(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
