package deviceplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// waitingHandler's Allocate waits, as the agent's does for a pod its cache
// has not shown yet, until release is closed or its call is cancelled.
type waitingHandler struct {
	entered chan struct{} // closed when an Allocate started waiting
	release chan struct{}
}

func newWaitingHandler() *waitingHandler {
	return &waitingHandler{entered: make(chan struct{}), release: make(chan struct{})}
}

func (h *waitingHandler) Preferred(context.Context, string, *pluginapi.ContainerPreferredAllocationRequest) []string {
	return nil
}

func (h *waitingHandler) Allocate(ctx context.Context, _ string, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	close(h.entered)
	select {
	case <-h.release:
		return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"IDS": ids[0]}}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// startWaiting runs a manager with h and drain, serving gpus, registered
// with a kubelet; it returns the kubelet, the manager, its cancel, and a
// channel closed when Run returned.
func startWaiting(t *testing.T, h Handler, drain time.Duration) (*kubelet, *Manager, context.CancelFunc, <-chan struct{}) {
	t.Helper()
	dir := t.TempDir()
	k := startKubelet(t, dir)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	m := NewManager(dir, h, Observer{})
	m.SetDrainTimeout(drain)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := m.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	m.Set(map[string][]Device{gpus: {{ID: "gpu-0", Healthy: true, NUMANode: -1}}})
	eventually(t, "registered", func() bool { _, d, _ := k.state(gpus); return len(d) == 1 })
	return k, m, cancel, done
}

type allocateResult struct {
	resp *pluginapi.AllocateResponse
	err  error
}

// allocate calls Allocate as the kubelet does, over its own connection.
func allocate(k *kubelet) <-chan allocateResult {
	p, _, _ := k.state(gpus)
	out := make(chan allocateResult, 1)
	go func() {
		resp, err := p.API().Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"gpu-0"}}}})
		out <- allocateResult{resp, err}
	}()
	return out
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Stopping (SIGTERM ends Run's context) while an Allocate waits for its pod:
// the socket goes at once, so nothing new reaches the endpoint, and Run
// waits for the call, which succeeds when its pod comes within the bound.
func TestStopLetsAllocateInFlightFinish(t *testing.T) {
	h := newWaitingHandler()
	k, m, cancel, done := startWaiting(t, h, time.Minute)
	result := allocate(k)
	<-h.entered

	cancel()
	socket := filepath.Join(m.dir, SocketName(gpus))
	eventually(t, "the socket removed", func() bool { _, err := os.Stat(socket); return errors.Is(err, os.ErrNotExist) })
	if isClosed(done) {
		t.Fatal("Run returned with an Allocate in flight")
	}
	close(h.release) // the pod reaches the cache
	r := <-result
	if r.err != nil || r.resp.GetContainerResponses()[0].GetEnvs()["IDS"] != "gpu-0" {
		t.Fatalf("Allocate in flight when stopped: %v, %v; want it answered", r.resp, r.err)
	}
	eventually(t, "Run returned", func() bool { return isClosed(done) })
}

// A call that outlives the drain timeout is cancelled: stopping is bounded.
func TestStopCancelsCallsPastTheDrainTimeout(t *testing.T) {
	h := newWaitingHandler()
	k, _, cancel, done := startWaiting(t, h, 100*time.Millisecond)
	result := allocate(k)
	<-h.entered
	cancel()
	eventually(t, "Run returned", func() bool { return isClosed(done) })
	if r := <-result; r.err == nil {
		t.Fatalf("Allocate still waiting after the drain timeout answered %v, want an error", r.resp)
	}
}

// A class that goes away while an Allocate of it waits: the endpoint drains
// as on shutdown, and the other endpoints are not held up meanwhile.
func TestRemovedResourceLetsAllocateInFlightFinish(t *testing.T) {
	h := newWaitingHandler()
	k, m, _, _ := startWaiting(t, h, time.Minute)
	result := allocate(k)
	<-h.entered

	nics := "class.resclass.io/nics"
	m.Set(map[string][]Device{nics: {{ID: "0000:3b:00.0", Healthy: true, NUMANode: 0}}})
	eventually(t, "the new endpoint registered while the old one drains", func() bool { _, d, _ := k.state(nics); return len(d) == 1 })
	if _, err := os.Stat(filepath.Join(m.dir, SocketName(gpus))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket of the removed endpoint: %v, want it gone at once", err)
	}
	close(h.release)
	if r := <-result; r.err != nil {
		t.Fatalf("Allocate in flight when its class went away: %v", r.err)
	}
	eventually(t, "the kubelet lost the removed endpoint", func() bool { p, _, _ := k.state(gpus); return p == nil })
}
