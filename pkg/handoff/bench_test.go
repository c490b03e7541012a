package handoff

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/deviceplugin"
)

// BenchmarkKubeletCalls measures what the kubelet waits for when it admits a
// class pod: GetPreferredAllocation and Allocate, each one call over the
// endpoint's unix socket (gRPC, as the kubelet calls), answered from an
// informer cache holding 500 pods bound to the node. It reports the p50 and p99
// latency of a call; the goal is p99 under 1 ms.
//
// baseline-options is GetDevicePluginOptions on the same socket: a call that
// does no work, so the ratios show what finding the pod and building the
// response add to the gRPC round trip itself.
//
// gpu: 7 pods hold a GPU each, 492 request none, and the pod being admitted
// was assigned the eighth. pool: 499 pods share one hugepage pool and the pod
// being admitted is the 500th, the worst case for the lookup (every pod of the
// pool is a candidate that must be checked).
func BenchmarkKubeletCalls(b *testing.B) {
	gpuPods := make([]*corev1.Pod, 0, 500)
	for i := range 7 {
		gpuPods = append(gpuPods, pod(fmt.Sprintf("held-%d", i), map[string]map[string][]string{"main": {"nvidia.high.mem": {fmt.Sprintf("GPU-1%d", i)}}}))
	}
	for i := range 492 {
		gpuPods = append(gpuPods, pod(fmt.Sprintf("plain-%d", i), map[string]map[string][]string{"main": nil}))
	}
	gpuPods = append(gpuPods, pod("target", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-3"}}}))

	pool := "hugepages-1Gi-numa0"
	poolPods := make([]*corev1.Pod, 0, 500)
	for i := range 500 {
		poolPods = append(poolPods, pod(fmt.Sprintf("fwd-%03d", i), map[string]map[string][]string{"fwd": {"hugepages-1gig": {pool}}}))
	}

	b.Run("baseline-options", func(b *testing.B) {
		_, client := serveBench(b, nil, highMem)
		measure(b, func(ctx context.Context) error {
			_, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
			return err
		})
	})
	b.Run("gpu-preferred", func(b *testing.B) {
		_, client := serveBench(b, gpuPods, highMem)
		req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: []string{"GPU-1", "GPU-2", "GPU-3"}, AllocationSize: 1},
		}}
		measure(b, func(ctx context.Context) error {
			resp, err := client.GetPreferredAllocation(ctx, req)
			if err == nil && !slices.Equal(resp.ContainerResponses[0].DeviceIDs, []string{"GPU-3"}) {
				err = fmt.Errorf("preferred %v", resp.ContainerResponses[0].DeviceIDs)
			}
			return err
		})
	})
	b.Run("gpu-allocate", func(b *testing.B) {
		f, client := serveBench(b, gpuPods, highMem)
		req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-3"}}}}
		measure(b, func(ctx context.Context) error {
			_, err := client.Allocate(ctx, req)
			f.unallocate("target", "main", "nvidia.high.mem")
			return err
		})
	})
	poolRes := v1alpha1.ResourceNamePrefix + "hugepages-1gig"
	b.Run("pool-preferred", func(b *testing.B) {
		f, client := serveBench(b, poolPods, poolRes)
		f.allocateAllBut(poolRes, pool+"/0", "fwd-499")
		req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: []string{pool + "/3", pool + "/4"}, AllocationSize: 1},
		}}
		measure(b, func(ctx context.Context) error {
			resp, err := client.GetPreferredAllocation(ctx, req)
			if err == nil && !slices.Equal(resp.ContainerResponses[0].DeviceIDs, []string{pool + "/3"}) {
				err = fmt.Errorf("preferred %v", resp.ContainerResponses[0].DeviceIDs)
			}
			return err
		})
	})
	b.Run("pool-allocate", func(b *testing.B) {
		f, client := serveBench(b, poolPods, poolRes)
		f.allocateAllBut(poolRes, pool+"/0", "fwd-499")
		req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{pool + "/3"}}}}
		measure(b, func(ctx context.Context) error {
			_, err := client.Allocate(ctx, req)
			f.unallocate("fwd-499", "fwd", "hugepages-1gig")
			return err
		})
	})
}

// serveBench serves resource's endpoint, backed by an allocator whose cache
// holds pods, and returns a client on its socket.
func serveBench(b *testing.B, pods []*corev1.Pod, resource string) (*fixture, pluginapi.DevicePluginClient) {
	f := newFixtureWaiting(b, time.Second, pods...)
	f.ctx = klog.NewContext(context.Background(), logr.Discard())
	dir := b.TempDir()
	m := deviceplugin.NewManager(dir, f.alloc, deviceplugin.Observer{})
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	m.Set(map[string][]deviceplugin.Device{resource: {{ID: "GPU-0", Healthy: true, NUMANode: -1}}})
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, deviceplugin.SocketName(resource)), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	client := pluginapi.NewDevicePluginClient(conn)
	// Wait for the endpoint to serve (WaitForReady) and warm the connection.
	if _, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true)); err != nil {
		b.Fatal(err)
	}
	return f, client
}

// allocateAllBut allocates a slot of the pool to every pod but one, so that
// they count as running.
func (f *fixture) allocateAllBut(resource, slot, pending string) {
	objs := f.alloc.informer.GetIndexer().List()
	for _, o := range objs {
		if o.(*podInfo).Name == pending {
			continue
		}
		if _, err := f.alloc.Allocate(f.ctx, resource, []string{slot}); err != nil {
			f.t.Fatal(err)
		}
	}
	if n := len(f.alloc.Allocations()); n != len(objs)-1 {
		f.t.Fatalf("%d pods allocated, want %d", n, len(objs)-1)
	}
}

// unallocate forgets one container's allocation, so the next call can repeat it.
func (f *fixture) unallocate(pod, container, class string) {
	f.alloc.recordsMu.Lock()
	delete(f.alloc.allocated, allocKey{pod: types.UID("uid-" + pod), container: container, class: class})
	f.alloc.recordsMu.Unlock()
}

// measure runs call b.N times and reports its p50 and p99 latency.
func measure(b *testing.B, call func(context.Context) error) {
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		if err := call(ctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}
