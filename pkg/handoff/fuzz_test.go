package handoff

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/checkpoint"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// FuzzAllocate sends random device-id sets (unknown ids, duplicates, slots,
// empty ids) to Allocate and checks that it never panics, and that whatever it
// grants is exactly one container's assignment for the class, never a device
// the scheduler gave no container of the class.
func FuzzAllocate(f *testing.F) {
	assigned := map[string][]string{ // container/pod -> sorted ids
		"a/main":  {"GPU-0", "GPU-1"},
		"b/main":  {"GPU-2"},
		"c/init-": {"GPU-3"},
	}
	pods := []any{
		pod("a", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-1", "GPU-0"}}}),
		pod("b", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-2"}}}),
		pod("c", map[string]map[string][]string{"init-x": {"nvidia.high.mem": {"GPU-3"}}, "main": {"nvidia.high.mem": {"GPU-3"}}}),
	}
	for _, seed := range []string{"GPU-0,GPU-1", "GPU-1,GPU-0", "GPU-2", "GPU-2,GPU-2", "GPU-3", "", ",", "GPU-9", "hugepages-1Gi-numa0/1", "GPU-0/7", "GPU-0,GPU-1,GPU-2"} {
		f.Add(seed)
	}
	var ps []*corev1.Pod
	for _, p := range pods {
		ps = append(ps, p.(*corev1.Pod))
	}
	// One allocator for every input: what earlier inputs were granted stays
	// granted, which the invariant below must survive too.
	fx := newFixtureWaiting(f, time.Millisecond, ps...)
	// ktesting's logger for f must not be used inside the fuzz target.
	fx.ctx = klog.NewContext(context.Background(), logr.Discard())
	f.Fuzz(func(t *testing.T, s string) {
		watchdog.Run(t, func() {
			ids := strings.Split(s, ",")
			resp, err := fx.allocate(highMem, ids...)
			if err != nil {
				if resp != nil {
					t.Fatalf("a response with an error: %v", resp)
				}
				return
			}
			var got []string
			for _, id := range ids {
				got = append(got, DeviceID(id))
			}
			slices.Sort(got)
			ok := false
			for _, want := range assigned {
				ok = ok || slices.Equal(got, want)
			}
			if !ok {
				t.Fatalf("Allocate(%q) granted devices no container was assigned: %v", s, resp)
			}
			if env := resp.Envs["RESCLASS_DEVICES_NVIDIA_HIGH_MEM"]; env == "" {
				t.Fatalf("granted without the class variable: %v", resp)
			}
		})
	})
}

// FuzzLoadCheckpoint reads arbitrary files as the kubelet's checkpoint, as the
// agent does at start: it must never panic or run away, a file that does not
// verify must be refused, and what it records must be containers of pods it
// knows with devices of a class.
func FuzzLoadCheckpoint(f *testing.F) {
	per := checkpoint.NewDevicesPerNUMA()
	per[0] = []string{"GPU-0", "GPU-1"}
	per[1] = []string{"hugepages-1Gi-numa0/3"}
	good, err := checkpoint.New([]checkpoint.PodDevicesEntry{
		{PodUID: "uid-a", ContainerName: "main", ResourceName: "class.resclass.io/nvidia.high.mem", DeviceIDs: per},
		{PodUID: "gone", ContainerName: "main", ResourceName: "class.resclass.io/x", DeviceIDs: per},
	}, nil).MarshalCheckpoint()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte(`{"Data":{"PodDeviceEntries":[{"PodUID":"uid-a","ContainerName":"main","ResourceName":"class.resclass.io/c","DeviceIDs":{"-1":["x","x"]}}]},"Checksum":0}`))
	f.Add([]byte(`{"Data":null,"Checksum":1e999}`))
	fx := newFixture(f, pod("a", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-0"}}}))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, blob []byte) {
		watchdog.Run(t, func() {
			path := filepath.Join(dir, CheckpointFile)
			if err := os.WriteFile(path, blob, 0o600); err != nil {
				t.Fatal(err)
			}
			n, err := fx.alloc.loadCheckpoint(path)
			if err != nil {
				return
			}
			cp := checkpoint.New(nil, nil)
			if cp.UnmarshalCheckpoint(blob) != nil || cp.VerifyChecksum() != nil {
				t.Fatalf("loaded %d containers from a checkpoint that does not verify", n)
			}
			entries, _ := cp.GetData()
			if n > len(entries) {
				t.Fatalf("loaded %d containers from %d entries", n, len(entries))
			}
		})
	})
}
