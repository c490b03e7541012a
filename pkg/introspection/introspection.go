// Package introspection serves the node agent's own gRPC API (resclass.agent.v1,
// proto/resclass/agent/v1/agent.proto) on a unix socket on the node: the devices
// the agent discovered, its allocation decisions, and a stream of device health.
// `node-agent status` is its client.
//
// The socket is the only access control: it is created with mode 0600, so only
// root on the node (or a pod running as root with the directory mounted) can
// connect. There is no TLS and no authentication on top.
package introspection

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/resclass/resclass/proto/resclass/agent/v1"
)

// DefaultIntrospectionSocket is where the node agent serves its introspection
// API unless told otherwise, and where `node-agent status` looks for it.
const DefaultIntrospectionSocket = "/var/run/resclass/agent.sock"

// shutdownGrace is how long Serve waits for calls in flight to finish once its
// context is done, before it closes their connections.
const shutdownGrace = 2 * time.Second

// Source is what the agent knows; the node agent implements it. Its methods are
// called concurrently, from one goroutine per call in flight, and must not block
// for long. The returned messages are only read, never modified.
type Source interface {
	// Devices returns every device the agent discovered, healthy or not.
	// ListDevices orders them by id.
	Devices() []*agentv1.Device
	// Allocations returns the agent's recent allocation decisions. ListAllocations
	// orders them by time, oldest first (decisions of the same time keep the
	// order Allocations gives them).
	Allocations() []*agentv1.Allocation
	// SubscribeHealth returns the current state of every device as events and a
	// channel of later changes; cancel stops it (the channel is then closed).
	// When the channel is closed before cancel, the subscriber was dropped (it
	// fell behind): WatchHealth then ends with codes.ResourceExhausted and the
	// client watches again. HealthHub implements it.
	SubscribeHealth() (current []*agentv1.HealthEvent, changes <-chan *agentv1.HealthEvent, cancel func())
}

// Serve serves the introspection API of src on a unix socket at socketPath until
// ctx is done. It creates the socket's directory (0755) if needed and replaces
// a stale socket left by an agent that did not shut down cleanly (but no other
// kind of file: that is an error); the socket itself has mode 0600 from the start, so only root can connect. When ctx
// is done, open WatchHealth streams end with codes.Unavailable, calls in flight
// get a short grace period, and the socket is removed. Serve returns nil after
// such a shutdown, or the error that kept it from serving.
func Serve(ctx context.Context, socketPath string, src Source) error {
	lis, err := listen(socketPath)
	if err != nil {
		return err
	}
	// Remove the socket on the way out, unless another agent has replaced it
	// meanwhile (an overlapping restart): that one is not ours to remove.
	mine, statErr := os.Stat(socketPath)
	defer func() {
		if now, err := os.Stat(socketPath); statErr == nil && err == nil && os.SameFile(mine, now) {
			_ = os.Remove(socketPath)
		}
	}()

	srv := &server{src: src, stopping: make(chan struct{})}
	gs := grpc.NewServer()
	agentv1.RegisterAgentServer(gs, srv)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()

	select {
	case err := <-served:
		gs.Stop()
		return fmt.Errorf("serving %s: %w", socketPath, err)
	case <-ctx.Done():
	}
	close(srv.stopping) // ends the WatchHealth streams, which would never end by themselves
	stopped := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(shutdownGrace):
		gs.Stop()
		<-stopped
	}
	// Serve returns nil after GracefulStop or Stop; anything else is worth
	// reporting.
	return <-served
}

// listen creates the socket in a private directory next to socketPath, sets its
// mode to 0600 there and then renames it into place, so that there is no moment
// at which anyone but root could connect to it. The rename replaces a stale
// socket file atomically.
func listen(socketPath string) (*net.UnixListener, error) {
	dir := filepath.Dir(socketPath)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("introspection socket directory: %w", err)
	}
	// Replace a stale socket, never anything else a wrong flag may point at.
	if fi, err := os.Lstat(socketPath); err == nil && fi.Mode().Type() != fs.ModeSocket {
		return nil, fmt.Errorf("introspection socket %s exists and is not a socket: not replacing it", socketPath)
	}
	private, err := os.MkdirTemp(dir, ".s") // 0700; a short name, as socket paths are limited to 107 bytes
	if err != nil {
		return nil, fmt.Errorf("introspection socket: %w", err)
	}
	defer func() { _ = os.RemoveAll(private) }()
	tmp := filepath.Join(private, "s")
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("introspection socket: %w", err)
	}
	lis.SetUnlinkOnClose(false) // the file moves; Serve removes it at socketPath
	if err := os.Chmod(tmp, 0o600); err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("introspection socket: %w", err)
	}
	if err := os.Rename(tmp, socketPath); err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("introspection socket: %w", err)
	}
	return lis, nil
}

// Dial returns a client of the introspection API served at socketPath, and the
// connection to close when done. It does not connect yet: a missing socket or a
// refused connection shows as codes.Unavailable on the first call.
func Dial(socketPath string) (agentv1.AgentClient, io.Closer, error) {
	abs, err := filepath.Abs(socketPath) // unix:// targets take absolute paths only
	if err != nil {
		return nil, nil, err
	}
	conn, err := grpc.NewClient("unix://"+abs, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("introspection client for %s: %w", socketPath, err)
	}
	return agentv1.NewAgentClient(conn), conn, nil
}

type server struct {
	agentv1.UnimplementedAgentServer
	src      Source
	stopping chan struct{} // closed when Serve shuts down
}

func (s *server) ListDevices(context.Context, *agentv1.ListDevicesRequest) (*agentv1.ListDevicesResponse, error) {
	devices := slices.Clone(s.src.Devices())
	slices.SortStableFunc(devices, func(a, b *agentv1.Device) int { return cmp.Compare(a.GetId(), b.GetId()) })
	return &agentv1.ListDevicesResponse{Devices: devices}, nil
}

func (s *server) ListAllocations(context.Context, *agentv1.ListAllocationsRequest) (*agentv1.ListAllocationsResponse, error) {
	allocations := slices.Clone(s.src.Allocations())
	slices.SortStableFunc(allocations, func(a, b *agentv1.Allocation) int {
		return a.GetTime().AsTime().Compare(b.GetTime().AsTime())
	})
	return &agentv1.ListAllocationsResponse{Allocations: allocations}, nil
}

func (s *server) WatchHealth(_ *agentv1.WatchHealthRequest, stream grpc.ServerStreamingServer[agentv1.HealthEvent]) error {
	current, changes, cancel := s.src.SubscribeHealth()
	defer cancel()
	for _, ev := range current {
		if err := stream.Send(ev); err != nil {
			return err
		}
	}
	for {
		select {
		case <-stream.Context().Done():
			return status.FromContextError(stream.Context().Err()).Err()
		case <-s.stopping:
			return status.Error(codes.Unavailable, "the node agent is shutting down")
		case ev, ok := <-changes:
			if !ok {
				return status.Error(codes.ResourceExhausted, "this watch fell behind the device health changes and was dropped: watch again for the current state")
			}
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
	}
}

// DefaultHealthBuffer is the number of health changes a HealthHub holds for a
// subscriber that has not received them yet, unless NewHealthHub is told
// otherwise. Changes are rare (a device failing or recovering), so a subscriber
// that falls this far behind is stuck, not busy.
const DefaultHealthBuffer = 64

// HealthHub is the health part of a Source, in memory: the agent Publishes each
// change of a device's health; HealthHub keeps the latest event per device and
// passes every event on to the subscribers (the WatchHealth streams). Publish
// never blocks: a subscriber whose buffer is full is dropped, its channel closed,
// and its WatchHealth call ends with codes.ResourceExhausted so that the client
// watches again and starts over from the current state. The zero value is not
// usable; use NewHealthHub.
type HealthHub struct {
	buffer int

	mu     sync.Mutex
	latest map[string]*agentv1.HealthEvent
	subs   map[*subscriber]struct{}
}

type subscriber struct {
	ch chan *agentv1.HealthEvent
}

// NewHealthHub returns a hub that buffers up to buffer events per subscriber
// (DefaultHealthBuffer when buffer <= 0).
func NewHealthHub(buffer int) *HealthHub {
	if buffer <= 0 {
		buffer = DefaultHealthBuffer
	}
	return &HealthHub{buffer: buffer, latest: map[string]*agentv1.HealthEvent{}, subs: map[*subscriber]struct{}{}}
}

// Publish records ev as the current state of its device and sends it to every
// subscriber. It keeps a copy of ev, stamped with the current time when ev has
// none, so the caller may reuse ev. An event without a device id is ignored.
func (h *HealthHub) Publish(ev *agentv1.HealthEvent) {
	if ev.GetDeviceId() == "" {
		return
	}
	ev = proto.CloneOf(ev)
	if ev.Time == nil {
		ev.Time = timestamppb.Now()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.latest[ev.DeviceId] = ev
	for sub := range h.subs {
		select {
		case sub.ch <- ev:
		default: // fell behind: drop it rather than wait for it
			delete(h.subs, sub)
			close(sub.ch)
		}
	}
}

// Forget removes a device that is gone (unplugged, or a MIG device that was
// reconfigured away) from the current state that new subscribers receive.
// Subscribers already watching are not told; the agent publishes whatever
// should tell them (an unhealthy event, say) before forgetting the device.
func (h *HealthHub) Forget(deviceID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.latest, deviceID)
}

// SubscribeHealth implements Source: the latest event of every device, ordered
// by device id, and the changes published from now on. The events are shared
// with other subscribers: read them, do not modify them.
func (h *HealthHub) SubscribeHealth() ([]*agentv1.HealthEvent, <-chan *agentv1.HealthEvent, func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	current := make([]*agentv1.HealthEvent, 0, len(h.latest))
	for _, ev := range h.latest {
		current = append(current, ev)
	}
	slices.SortFunc(current, func(a, b *agentv1.HealthEvent) int { return cmp.Compare(a.DeviceId, b.DeviceId) })
	sub := &subscriber{ch: make(chan *agentv1.HealthEvent, h.buffer)}
	h.subs[sub] = struct{}{}
	cancel := func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if _, ok := h.subs[sub]; ok { // not yet dropped or cancelled
			delete(h.subs, sub)
			close(sub.ch)
		}
	}
	return current, sub.ch, cancel
}

// subscribers is the number of subscribers not dropped or cancelled (for tests).
func (h *HealthHub) subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}
