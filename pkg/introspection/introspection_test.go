package introspection

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/resclass/resclass/proto/resclass/agent/v1"
)

// fakeSource is a Source with fixed devices and allocations and a real HealthHub.
type fakeSource struct {
	*HealthHub
	devices     []*agentv1.Device
	allocations []*agentv1.Allocation
}

func (f *fakeSource) Devices() []*agentv1.Device         { return f.devices }
func (f *fakeSource) Allocations() []*agentv1.Allocation { return f.allocations }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newFakeSource(buffer int) *fakeSource {
	return &fakeSource{
		HealthHub: NewHealthHub(buffer),
		devices: []*agentv1.Device{
			{Id: "GPU-b", Kind: "nvidia-gpu", Healthy: false, Reason: "XID 79", NumaNode: 1, Classes: []string{"a100"}, Attributes: map[string]string{"memory": "80Gi"}},
			{Id: "GPU-a", Kind: "nvidia-gpu", Healthy: true, NumaNode: 0, Classes: []string{"a100", "any-gpu"}, Attributes: map[string]string{"memory": "80Gi"}},
			{Id: "hugepages-1Gi", Kind: "huge-pages", Healthy: true, NumaNode: -1},
		},
		allocations: []*agentv1.Allocation{
			{PodNamespace: "ml", PodName: "train-1", PodUid: "uid-2", Container: "main", ClassName: "a100", Time: timestamppb.New(t0.Add(time.Minute)), Outcome: "refused", Message: "no healthy device"},
			{PodNamespace: "ml", PodName: "train-0", PodUid: "uid-1", Container: "main", ClassName: "a100", DeviceIds: []string{"GPU-a"}, Time: timestamppb.New(t0), Outcome: "allocated"},
		},
	}
}

// serve runs Serve on a socket below a fresh temporary directory until the test
// ends, and returns the socket's path, a client, and a function that stops the
// server and returns Serve's error.
func serve(t *testing.T, src Source) (string, agentv1.AgentClient, func() error) {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "run", "resclass", "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, socket, src) }()
	waitForSocket(t, socket, done)
	client, conn, err := Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	var stopErr error
	stopped := false
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case stopErr = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Serve did not return within 10s of its context ending")
			}
		}
		return stopErr
	}
	t.Cleanup(func() {
		_ = conn.Close()
		_ = stop()
	})
	return socket, client, stop
}

func waitForSocket(t *testing.T, socket string, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if fi, err := os.Stat(socket); err == nil && fi.Mode().Type() == fs.ModeSocket {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("Serve returned before serving: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket at %s after 10s", socket)
		}
	}
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestIntrospectionListDevices(t *testing.T) {
	src := newFakeSource(0)
	_, client, _ := serve(t, src)
	resp, err := client.ListDevices(callCtx(t), &agentv1.ListDevicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := []*agentv1.Device{src.devices[1], src.devices[0], src.devices[2]} // by id
	if diff := cmp.Diff(want, resp.GetDevices(), protocmp.Transform()); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
	if src.devices[0].Id != "GPU-b" {
		t.Error("ListDevices reordered the source's slice")
	}
}

func TestIntrospectionListAllocations(t *testing.T) {
	src := newFakeSource(0)
	_, client, _ := serve(t, src)
	resp, err := client.ListAllocations(callCtx(t), &agentv1.ListAllocationsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := []*agentv1.Allocation{src.allocations[1], src.allocations[0]} // oldest first
	if diff := cmp.Diff(want, resp.GetAllocations(), protocmp.Transform()); diff != "" {
		t.Errorf("allocations (-want +got):\n%s", diff)
	}
}

func TestWatchHealthInitialStateThenChanges(t *testing.T) {
	src := newFakeSource(0)
	src.Publish(&agentv1.HealthEvent{DeviceId: "GPU-b", Kind: "nvidia-gpu", Reason: "XID 79", Time: timestamppb.New(t0)})
	src.Publish(&agentv1.HealthEvent{DeviceId: "GPU-a", Kind: "nvidia-gpu", Healthy: true, Time: timestamppb.New(t0)})
	src.Publish(&agentv1.HealthEvent{DeviceId: "GPU-b", Kind: "nvidia-gpu", Healthy: true, Reason: "recovered", Time: timestamppb.New(t0.Add(time.Second))})
	_, client, _ := serve(t, src)

	stream, err := client.WatchHealth(callCtx(t), &agentv1.WatchHealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// The current state: the latest event per device, by device id.
	for _, want := range []*agentv1.HealthEvent{
		{DeviceId: "GPU-a", Kind: "nvidia-gpu", Healthy: true, Time: timestamppb.New(t0)},
		{DeviceId: "GPU-b", Kind: "nvidia-gpu", Healthy: true, Reason: "recovered", Time: timestamppb.New(t0.Add(time.Second))},
	} {
		got, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("current state (-want +got):\n%s", diff)
		}
	}
	// The stream has subscribed once it has sent the current state; a change
	// published now reaches it.
	waitFor(t, func() bool { return src.subscribers() == 1 })
	change := &agentv1.HealthEvent{DeviceId: "GPU-a", Kind: "nvidia-gpu", Reason: "XID 48: double-bit ECC error"}
	src.Publish(change)
	got, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got.GetDeviceId() != "GPU-a" || got.GetHealthy() || got.GetReason() != change.Reason {
		t.Errorf("change: got %v, want %v", got, change)
	}
	if got.GetTime() == nil || time.Since(got.GetTime().AsTime()) > time.Minute {
		t.Errorf("a change published without a time should be stamped now, got %v", got.GetTime())
	}
	if change.Time != nil {
		t.Error("Publish modified the caller's event")
	}
}

// A subscriber that does not keep up is dropped: Publish does not wait for it.
func TestHealthHubDropsSlowSubscriber(t *testing.T) {
	h := NewHealthHub(2)
	_, slow, cancelSlow := h.SubscribeHealth()
	defer cancelSlow()
	_, fast, cancelFast := h.SubscribeHealth()
	defer cancelFast()

	published := make(chan struct{})
	received := 0
	go func() {
		defer close(published)
		for i := range 10 {
			h.Publish(&agentv1.HealthEvent{DeviceId: "GPU-a", Healthy: i%2 == 0})
			<-fast // the fast subscriber keeps up
			received++
		}
	}()
	select {
	case <-published:
	case <-time.After(10 * time.Second):
		t.Fatal("Publish blocked on a subscriber that does not read")
	}
	if received != 10 {
		t.Errorf("the fast subscriber got %d events, want 10", received)
	}
	var got int
	for range slow {
		got++
	}
	if got != 2 {
		t.Errorf("the slow subscriber got %d events before its channel was closed, want its buffer (2)", got)
	}
	if n := h.subscribers(); n != 1 {
		t.Errorf("%d subscribers, want 1 (the fast one)", n)
	}
	cancelSlow() // after the drop: a no-op, not a second close
	cancelFast()
	if _, ok := <-fast; ok {
		t.Error("cancel did not close the channel")
	}
	cancelFast()
}

// Over gRPC: a client that stops reading is cut off with ResourceExhausted once
// the transport's buffers and the hub's are full, and the publisher never waits.
func TestWatchHealthSlowClientIsCutOff(t *testing.T) {
	src := newFakeSource(4)
	src.Publish(&agentv1.HealthEvent{DeviceId: "GPU-a", Healthy: true})
	_, client, _ := serve(t, src)
	ctx := callCtx(t)
	stream, err := client.WatchHealth(ctx, &agentv1.WatchHealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil { // the current state; then stop reading
		t.Fatal(err)
	}
	waitFor(t, func() bool { return src.subscribers() == 1 })

	big := strings.Repeat("x", 64<<10) // fills gRPC's flow-control windows quickly
	deadline := time.Now().Add(20 * time.Second)
	published := 0
	for src.subscribers() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still subscribed after %d large events", published)
		}
		start := time.Now()
		src.Publish(&agentv1.HealthEvent{DeviceId: "GPU-a", Reason: big})
		if d := time.Since(start); d > time.Second {
			t.Fatalf("Publish took %v", d)
		}
		published++
		time.Sleep(time.Millisecond) // let the stream's sender run
	}
	// Reading again, the client gets what was in flight and then the verdict.
	for {
		_, err := stream.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("the stream ended with %v, want ResourceExhausted", err)
		}
		break
	}
	// Watching again works and starts with the current state.
	stream, err = client.WatchHealth(ctx, &agentv1.WatchHealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ev.GetDeviceId() != "GPU-a" || ev.GetReason() != big {
		t.Errorf("re-watch started with %s %q..., want the latest state of GPU-a", ev.GetDeviceId(), ev.GetReason()[:min(10, len(ev.GetReason()))])
	}
}

func TestServeSocketPermissionsAndShutdown(t *testing.T) {
	src := newFakeSource(0)
	socket, client, stop := serve(t, src)
	fi, err := os.Stat(socket)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("socket mode %v, want 0600", perm)
	}
	dir, err := os.Stat(filepath.Dir(socket))
	if err != nil {
		t.Fatal(err)
	}
	if perm := dir.Mode().Perm(); perm != 0o755 {
		t.Errorf("socket directory mode %v, want 0755", perm)
	}
	entries, _ := os.ReadDir(filepath.Dir(socket))
	if len(entries) != 1 {
		t.Errorf("socket directory holds %d entries, want only the socket", len(entries))
	}

	// An open watch does not hold up the shutdown: it ends with Unavailable.
	stream, err := client.WatchHealth(callCtx(t), &agentv1.WatchHealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return src.subscribers() == 1 })
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if d := time.Since(start); d >= shutdownGrace {
		t.Errorf("shutdown took %v: the watch held it up", d)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("the watch ended with %v, want Unavailable", err)
	}
	if _, err := os.Stat(socket); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the socket is still there after shutdown: %v", err)
	}
	if src.subscribers() != 0 {
		t.Error("the watch's subscription outlived it")
	}
}

func TestServeReplacesStaleSocketOnly(t *testing.T) {
	// A socket left behind by an agent that died is replaced.
	socket := filepath.Join(t.TempDir(), "agent.sock")
	lis, err := listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	_ = lis.Close() // SetUnlinkOnClose(false): the file stays, as after a crash
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, socket, newFakeSource(0)) }()
	client, conn, err := Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	waitFor(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := client.ListDevices(ctx, &agentv1.ListDevicesRequest{}, grpc.WaitForReady(true))
		return err == nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Anything else at the path is left alone.
	if err := os.WriteFile(socket, []byte("not a socket"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = Serve(context.Background(), socket, newFakeSource(0))
	if err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Serve on a regular file: %v, want an error", err)
	}
	if data, _ := os.ReadFile(socket); string(data) != "not a socket" {
		t.Error("Serve replaced a regular file")
	}
}

func TestDialRelativePath(t *testing.T) {
	socket, _, _ := serve(t, newFakeSource(0))
	t.Chdir(filepath.Dir(socket))
	client, conn, err := Dial(filepath.Base(socket))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := client.ListDevices(callCtx(t), &agentv1.ListDevicesRequest{}); err != nil {
		t.Fatal(err)
	}
}

func TestDialMissingSocketIsUnavailable(t *testing.T) {
	client, conn, err := Dial(filepath.Join(t.TempDir(), "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_, err = client.ListDevices(callCtx(t), &agentv1.ListDevicesRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("got %v, want Unavailable", err)
	}
}

func TestHealthHubForget(t *testing.T) {
	h := NewHealthHub(0)
	h.Publish(&agentv1.HealthEvent{DeviceId: "MIG-1", Healthy: true})
	h.Publish(&agentv1.HealthEvent{DeviceId: "GPU-a", Healthy: true})
	h.Publish(&agentv1.HealthEvent{}) // no device: ignored
	h.Forget("MIG-1")
	current, _, cancel := h.SubscribeHealth()
	defer cancel()
	if len(current) != 1 || current[0].GetDeviceId() != "GPU-a" {
		t.Errorf("current state %v, want GPU-a only", current)
	}
	if !proto.Equal(current[0], &agentv1.HealthEvent{DeviceId: "GPU-a", Healthy: true, Time: current[0].GetTime()}) {
		t.Errorf("current state %v", current[0])
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
