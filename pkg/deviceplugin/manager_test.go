package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	kubeletplugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
)

// kubelet is the kubelet's own device-plugin registration server and plugin
// client (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1), run on a
// directory of the test's, with a ClientHandler that records what the device
// manager would receive.
type kubelet struct {
	dir    string
	server kubeletplugin.Server

	mu        sync.Mutex
	plugins   map[string]kubeletplugin.DevicePlugin
	devices   map[string][]*pluginapi.Device // last ListAndWatch response per resource
	connected map[string]int
}

func startKubelet(t *testing.T, dir string) *kubelet {
	t.Helper()
	k := &kubelet{dir: dir, plugins: map[string]kubeletplugin.DevicePlugin{}, devices: map[string][]*pluginapi.Device{}, connected: map[string]int{}}
	logger := klog.Background()
	srv, err := kubeletplugin.NewServer(logger, filepath.Join(dir, KubeletSocket), k, k)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(logger); err != nil {
		t.Fatal(err)
	}
	k.server = srv
	t.Cleanup(func() { _ = srv.Stop(logger) })
	return k
}

// CleanupPluginDirectory removes every file but kubelet.sock, as the kubelet's
// device manager does when it starts.
func (k *kubelet) CleanupPluginDirectory(_ klog.Logger, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() != KubeletSocket && !e.IsDir() {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func (k *kubelet) PluginConnected(_ context.Context, resource string, p kubeletplugin.DevicePlugin) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.plugins[resource] = p
	k.connected[resource]++
	return nil
}

func (k *kubelet) PluginDisconnected(_ klog.Logger, resource string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.plugins, resource)
	delete(k.devices, resource)
}

func (k *kubelet) PluginListAndWatchReceiver(_ klog.Logger, resource string, resp *pluginapi.ListAndWatchResponse) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.devices[resource] = resp.Devices
}

func (k *kubelet) state(resource string) (kubeletplugin.DevicePlugin, []*pluginapi.Device, int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.plugins[resource], k.devices[resource], k.connected[resource]
}

// stop stops the kubelet and removes its socket, as a dying kubelet does.
func (k *kubelet) stop(t *testing.T) {
	t.Helper()
	if err := k.server.Stop(klog.Background()); err != nil {
		t.Fatal(err)
	}
}

type recordingHandler struct {
	mu        sync.Mutex
	allocated [][]string
}

func (h *recordingHandler) Preferred(_ context.Context, _ string, req *pluginapi.ContainerPreferredAllocationRequest) []string {
	// Prefer the last available devices, so the test sees the preference used.
	ids := req.GetAvailableDeviceIDs()
	return ids[len(ids)-int(req.GetAllocationSize()):]
}

func (h *recordingHandler) Allocate(_ context.Context, resource string, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.allocated = append(h.allocated, ids)
	if strings.Contains(strings.Join(ids, ","), "refuse") {
		return nil, os.ErrPermission
	}
	return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"IDS": strings.Join(ids, ",")}}, nil
}

const gpus = "class.resclass.io/gpus"

func runManager(t *testing.T, dir string) (*Manager, context.CancelFunc) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	m := NewManager(dir, &recordingHandler{}, Observer{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := m.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return m, cancel
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func TestServeRegisterAndStreamHealth(t *testing.T) {
	dir := t.TempDir()
	k := startKubelet(t, dir)
	m, _ := runManager(t, dir)
	m.Set(map[string][]Device{gpus: {{ID: "gpu-1", Healthy: true, NUMANode: 1}, {ID: "gpu-0", Healthy: true, NUMANode: 0}, {ID: "gpu-2", Healthy: true, NUMANode: -1}}})

	eventually(t, "the kubelet lists 3 devices", func() bool { _, d, _ := k.state(gpus); return len(d) == 3 })
	p, devices, _ := k.state(gpus)
	if got := devices[0]; got.ID != "gpu-0" || got.Health != pluginapi.Healthy || got.Topology.GetNodes()[0].GetID() != 0 {
		t.Errorf("first device %v, want gpu-0 healthy on NUMA node 0", got)
	}
	if devices[2].Topology != nil {
		t.Errorf("device without NUMA node has topology %v", devices[2].Topology)
	}
	if !strings.HasSuffix(p.SocketPath(), "/rc-gpus.sock") {
		t.Errorf("socket %s", p.SocketPath())
	}
	opts, err := p.API().GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable {
		t.Errorf("options %v, %v: GetPreferredAllocation must be offered", opts, err)
	}

	// Health changes reach the kubelet, both ways.
	m.Set(map[string][]Device{gpus: {{ID: "gpu-0", Healthy: true, NUMANode: 0}, {ID: "gpu-1", NUMANode: 1}, {ID: "gpu-2", Healthy: true, NUMANode: -1}}})
	eventually(t, "gpu-1 unhealthy", func() bool { _, d, _ := k.state(gpus); return len(d) == 3 && d[1].Health == pluginapi.Unhealthy })
	m.Set(map[string][]Device{gpus: {{ID: "gpu-0", Healthy: true, NUMANode: 0}, {ID: "gpu-1", Healthy: true, NUMANode: 1}, {ID: "gpu-2", Healthy: true, NUMANode: -1}}})
	eventually(t, "gpu-1 healthy again", func() bool { _, d, _ := k.state(gpus); return len(d) == 3 && d[1].Health == pluginapi.Healthy })

	// The kubelet's calls reach the handler.
	pref, err := p.API().GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"gpu-0", "gpu-1", "gpu-2"}, AllocationSize: 2},
	}})
	if err != nil || strings.Join(pref.ContainerResponses[0].DeviceIDs, ",") != "gpu-1,gpu-2" {
		t.Errorf("GetPreferredAllocation: %v, %v", pref, err)
	}
	resp, err := p.API().Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"gpu-1"}}, {DevicesIds: []string{"gpu-2"}}}})
	if err != nil || len(resp.ContainerResponses) != 2 || resp.ContainerResponses[1].Envs["IDS"] != "gpu-2" {
		t.Errorf("Allocate: %v, %v", resp, err)
	}
	if _, err := p.API().Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"refuse"}}}}); err == nil {
		t.Error("a refused Allocate succeeded")
	}
}

func TestKubeletRestartReregisters(t *testing.T) {
	dir := t.TempDir()
	k := startKubelet(t, dir)
	m, _ := runManager(t, dir)
	m.Set(map[string][]Device{gpus: {{ID: "gpu-0", Healthy: true, NUMANode: -1}}})
	eventually(t, "registered", func() bool { _, d, _ := k.state(gpus); return len(d) == 1 })

	for restart := 1; restart <= 2; restart++ {
		k.stop(t)
		// The new kubelet wipes the directory, our socket included.
		k = startKubelet(t, dir)
		eventually(t, "re-registered with the new kubelet", func() bool { _, d, n := k.state(gpus); return n == 1 && len(d) == 1 })
	}
}

func TestSocketRemovedRestartsEndpoint(t *testing.T) {
	dir := t.TempDir()
	k := startKubelet(t, dir)
	m, _ := runManager(t, dir)
	m.Set(map[string][]Device{gpus: {{ID: "gpu-0", Healthy: true, NUMANode: -1}}})
	eventually(t, "registered", func() bool { _, _, n := k.state(gpus); return n == 1 })
	if err := os.Remove(filepath.Join(dir, SocketName(gpus))); err != nil {
		t.Fatal(err)
	}
	// Serving again on a new socket and registered again (the kubelet's
	// connection to the old one is gone with it).
	eventually(t, "registered again", func() bool { _, _, n := k.state(gpus); return n == 2 })
	if _, err := os.Stat(filepath.Join(dir, SocketName(gpus))); err != nil {
		t.Fatal(err)
	}
}

func TestRemovedResourceStopsEndpoint(t *testing.T) {
	dir := t.TempDir()
	k := startKubelet(t, dir)
	m, _ := runManager(t, dir)
	nics := "class.resclass.io/nics"
	m.Set(map[string][]Device{gpus: {{ID: "gpu-0", Healthy: true, NUMANode: -1}}, nics: {{ID: "0000:3b:00.0", Healthy: true, NUMANode: 0}}})
	eventually(t, "both registered", func() bool {
		_, g, _ := k.state(gpus)
		_, n, _ := k.state(nics)
		return len(g) == 1 && len(n) == 1
	})
	m.Set(map[string][]Device{gpus: {{ID: "gpu-0", Healthy: true, NUMANode: -1}}})
	eventually(t, "the kubelet lost the nics endpoint", func() bool { p, _, _ := k.state(nics); return p == nil })
	if _, err := os.Stat(filepath.Join(dir, SocketName(nics))); !os.IsNotExist(err) {
		t.Errorf("socket of the removed endpoint: %v", err)
	}
	if p, _, _ := k.state(gpus); p == nil {
		t.Error("the remaining endpoint lost its kubelet connection")
	}
}

func TestRegistersWhenKubeletStartsLater(t *testing.T) {
	dir := t.TempDir()
	m, _ := runManager(t, dir)
	m.Set(map[string][]Device{gpus: {{ID: "gpu-0", Healthy: true, NUMANode: -1}}})
	// Serving without a kubelet: its own socket answers.
	eventually(t, "serving without a kubelet", func() bool {
		return confirm(context.Background(), filepath.Join(dir, SocketName(gpus))) == nil
	})
	k := startKubelet(t, dir)
	eventually(t, "registered once the kubelet came", func() bool { _, d, _ := k.state(gpus); return len(d) == 1 })
}
