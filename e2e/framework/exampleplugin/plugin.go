// Package exampleplugin is a minimal kubelet device plugin for the e2e harness. It
// proves the kubelet path of a node (registration, capacity, Allocate, the response
// reaching the container runtime) independently of resclass's node agent.
package exampleplugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// ResourceName is the extended resource the plugin serves.
const ResourceName = "example.resclass.io/device"

// EnvDevices is set in every container that gets devices: their ids, comma-separated.
const EnvDevices = "EXAMPLE_DEVICES"

// Plugin serves n devices named example-0 ... example-(n-1).
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	ids    []string
	socket string
	srv    *grpc.Server

	// hold, when set, is where Allocate announces itself and then waits
	// until it is closed (Hold).
	holdMu sync.Mutex
	hold   *Hold
}

// Hold keeps the kubelet inside the admission of a pod: the kubelet admits
// one pod at a time, and calls Allocate from that admission.
type Hold struct {
	// Waiting is closed when an Allocate call waits.
	Waiting chan struct{}
	release chan struct{}
	waiting sync.Once
	once    sync.Once
}

// Release lets the waiting and later Allocate calls answer.
func (h *Hold) Release() { h.once.Do(func() { close(h.release) }) }

// Hold makes the next Allocate calls wait until the returned hold is
// released.
func (p *Plugin) Hold() *Hold {
	h := &Hold{Waiting: make(chan struct{}), release: make(chan struct{})}
	p.holdMu.Lock()
	defer p.holdMu.Unlock()
	p.hold = h
	return h
}

var _ pluginapi.DevicePluginServer = &Plugin{}

// Start serves the plugin in pluginDir (the kubelet's device-plugins directory) and
// registers it with the kubelet there.
func Start(ctx context.Context, pluginDir string, n int) (*Plugin, error) {
	p := &Plugin{socket: filepath.Join(pluginDir, "example.sock"), srv: grpc.NewServer()}
	for i := range n {
		p.ids = append(p.ids, fmt.Sprintf("example-%d", i))
	}
	if err := os.Remove(p.socket); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	l, err := net.Listen("unix", p.socket)
	if err != nil {
		return nil, err
	}
	pluginapi.RegisterDevicePluginServer(p.srv, p)
	go func() { _ = p.srv.Serve(l) }()

	conn, err := grpc.NewClient("unix://"+filepath.Join(pluginDir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.srv.Stop()
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The kubelet's socket can exist a moment before its registration server
	// takes connections (on a loaded machine the demo saw "connection
	// refused"): retry until the deadline.
	for {
		_, err = pluginapi.NewRegistrationClient(conn).Register(rctx, &pluginapi.RegisterRequest{
			Version:      pluginapi.Version,
			Endpoint:     filepath.Base(p.socket),
			ResourceName: ResourceName,
		})
		if err == nil || status.Code(err) != codes.Unavailable || rctx.Err() != nil {
			break
		}
		select {
		case <-rctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err != nil {
		p.srv.Stop()
		return nil, fmt.Errorf("registering with the kubelet: %w", err)
	}
	return p, nil
}

// Stop stops serving.
func (p *Plugin) Stop() { p.srv.Stop() }

// GetDevicePluginOptions reports no optional calls.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch lists the devices, all healthy, once; they never change.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	resp := &pluginapi.ListAndWatchResponse{}
	for _, id := range p.ids {
		resp.Devices = append(resp.Devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	if err := s.Send(resp); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// GetPreferredAllocation is not offered (see GetDevicePluginOptions).
func (p *Plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

// Allocate gives each container its device ids in EnvDevices and as CDI names.
func (p *Plugin) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	p.holdMu.Lock()
	h := p.hold
	p.holdMu.Unlock()
	if h != nil {
		h.waiting.Do(func() { close(h.Waiting) })
		select {
		case <-h.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.GetContainerRequests() {
		cr := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{EnvDevices: strings.Join(c.GetDevicesIds(), ",")}}
		for _, id := range c.GetDevicesIds() {
			cr.CdiDevices = append(cr.CdiDevices, &pluginapi.CDIDevice{Name: ResourceName + "=" + id})
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cr)
	}
	return resp, nil
}

// PreStartContainer is not offered (see GetDevicePluginOptions).
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
