// Package deviceplugin serves the kubelet device-plugin API (v1beta1) for many
// resources from one process: one endpoint, with its own unix socket, per resource.
// It owns the kubelet-facing lifecycle only — serving, registering, re-registering
// after a kubelet restart, restarting a failed server, streaming device health.
// What a container gets is decided by a Handler.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Device is one device as an endpoint advertises it to the kubelet.
type Device struct {
	ID      string
	Healthy bool
	// NUMANode is the device's NUMA node, -1 when unknown. The kubelet's
	// topology manager aligns on it.
	NUMANode int
}

// Handler decides what the kubelet's allocation calls of one resource get.
type Handler interface {
	// Preferred returns the ids to prefer for one container, or nil to leave the
	// choice to the kubelet.
	Preferred(ctx context.Context, resource string, req *pluginapi.ContainerPreferredAllocationRequest) []string
	// Allocate returns the container's runtime configuration for the ids the
	// kubelet chose, or an error that fails the pod's admission.
	Allocate(ctx context.Context, resource string, ids []string) (*pluginapi.ContainerAllocateResponse, error)
}

// endpoint is the gRPC server of one resource.
type endpoint struct {
	pluginapi.UnimplementedDevicePluginServer

	resource string
	socket   string // absolute path
	handler  Handler

	mu      sync.Mutex
	devices []*pluginapi.Device
	// changed is closed, and replaced, whenever devices change: every
	// ListAndWatch stream waits on the one it saw last.
	changed chan struct{}
	// stopped is closed when the endpoint is removed for good.
	stopped chan struct{}
	// calls counts the unary calls running, which a stopping endpoint lets
	// finish before it ends its streams.
	calls inFlight
}

// inFlight counts calls running and tells when none is.
type inFlight struct {
	mu    sync.Mutex
	n     int
	empty chan struct{} // closed when n drops to 0; nil until asked for
}

func (f *inFlight) begin() {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
}

func (f *inFlight) end() {
	f.mu.Lock()
	f.n--
	if f.n == 0 && f.empty != nil {
		close(f.empty)
		f.empty = nil
	}
	f.mu.Unlock()
}

// callCounter counts the unary calls in inFlight from their start until
// their answer is written to the connection (stats.End comes after the
// status): a drain that ends the ListAndWatch stream once none runs cannot
// make the kubelet close its connection before it has an answer.
type callCounter struct{ calls *inFlight }

type countedKey struct{}

func (c callCounter) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if strings.HasSuffix(info.FullMethodName, "/ListAndWatch") {
		return ctx
	}
	return context.WithValue(ctx, countedKey{}, true)
}

func (c callCounter) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if ctx.Value(countedKey{}) == nil {
		return
	}
	switch s.(type) {
	case *stats.Begin:
		c.calls.begin()
	case *stats.End:
		c.calls.end()
	}
}

func (callCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (callCounter) HandleConn(context.Context, stats.ConnStats)                       {}

// idle is closed when no call is running.
func (f *inFlight) idle() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	if f.empty == nil {
		f.empty = make(chan struct{})
	}
	return f.empty
}

func newEndpoint(resource, socket string, handler Handler) *endpoint {
	return &endpoint{resource: resource, socket: socket, handler: handler, changed: make(chan struct{}), stopped: make(chan struct{})}
}

// setDevices replaces the advertised devices; it reports whether they changed.
func (e *endpoint) setDevices(devices []Device) bool {
	list := make([]*pluginapi.Device, 0, len(devices))
	for _, d := range devices {
		pd := &pluginapi.Device{ID: d.ID, Health: pluginapi.Unhealthy}
		if d.Healthy {
			pd.Health = pluginapi.Healthy
		}
		if d.NUMANode >= 0 {
			pd.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.NUMANode)}}}
		}
		list = append(list, pd)
	}
	slices.SortFunc(list, func(a, b *pluginapi.Device) int { return strings.Compare(a.ID, b.ID) })
	e.mu.Lock()
	defer e.mu.Unlock()
	if slices.EqualFunc(e.devices, list, sameDevice) {
		return false
	}
	e.devices = list
	close(e.changed)
	e.changed = make(chan struct{})
	return true
}

func sameDevice(a, b *pluginapi.Device) bool {
	return a.ID == b.ID && a.Health == b.Health && a.Topology.String() == b.Topology.String()
}

func (e *endpoint) snapshot() ([]*pluginapi.Device, <-chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.devices, e.changed
}

// stop ends every ListAndWatch stream of the endpoint.
func (e *endpoint) stop() { close(e.stopped) }

// newServer returns a gRPC server of the endpoint whose unary calls log with
// logger (the kubelet's requests carry no logger of their own).
func (e *endpoint) newServer(logger klog.Logger) *grpc.Server {
	logger = logger.WithValues("resource", e.resource)
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return handler(klog.NewContext(ctx, logger), req)
	}), grpc.StatsHandler(callCounter{&e.calls}))
	pluginapi.RegisterDevicePluginServer(srv, e)
	return srv
}

// GetDevicePluginOptions offers GetPreferredAllocation: it is how the kubelet
// learns which devices the scheduler chose.
func (e *endpoint) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the devices, then again every time they (or their health)
// change, until the kubelet hangs up or the endpoint stops.
func (e *endpoint) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		devices, changed := e.snapshot()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-e.stopped:
			return nil
		case <-s.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation asks the handler, container by container.
func (e *endpoint) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.GetContainerRequests() {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{
			DeviceIDs: e.handler.Preferred(ctx, e.resource, c),
		})
	}
	return resp, nil
}

// Allocate asks the handler, container by container; one refusal fails the
// whole request, as the kubelet then fails the pod's admission anyway.
func (e *endpoint) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.GetContainerRequests() {
		cr, err := e.handler.Allocate(ctx, e.resource, c.GetDevicesIds())
		if err != nil {
			var se interface{ GRPCStatus() *status.Status }
			if errors.As(err, &se) {
				return nil, err
			}
			return nil, status.Error(codes.FailedPrecondition, err.Error())
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cr)
	}
	return resp, nil
}

// PreStartContainer is not offered (see GetDevicePluginOptions).
func (e *endpoint) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return nil, status.Error(codes.Unimplemented, fmt.Sprintf("%s does not use PreStartContainer", e.resource))
}
