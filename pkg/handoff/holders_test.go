package handoff

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/checkpoint"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

const holderHeader = `# HELP resclass_node_agent_device_holder 1 for each device the node agent handed to a pod through a class (what Allocate answered, or what the kubelet's checkpoint listed after a restart of the agent; on a DRA node, each pod a prepared claim was reserved for), until the pod ends or is deleted (on a DRA node, until the claim is unprepared); kind is the device's kind (unknown: it left the inventory). A GPU shared by several pods has one series per pod.
# TYPE resclass_node_agent_device_holder gauge
`

// TestDeviceHolderSeries: one series per device, pod and class, from what
// Allocate answered and what the checkpoint listed; a pod's go when it ends
// or is deleted.
func TestDeviceHolderSeries(t *testing.T) {
	whole := pod("whole", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-0"}}})
	restored := pod("restored", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-1"}}})
	// Two containers of s1 on one GPU: one series.
	s1 := sharePod("s1", map[string]share{"a": {"GPU-M", 1}, "b": {"GPU-M", 1}})
	s2 := sharePod("s2", map[string]share{"main": {"GPU-M", 1}})
	f := shareFixture(t, whole, restored, s1, s2)

	per := checkpoint.NewDevicesPerNUMA()
	per[0] = []string{"GPU-1"}
	blob, err := checkpoint.New([]checkpoint.PodDevicesEntry{{PodUID: "uid-restored", ContainerName: "main", ResourceName: highMem, DeviceIDs: per}}, nil).MarshalCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), CheckpointFile)
	if err := os.WriteFile(path, blob, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.alloc.loadCheckpoint(path); err != nil {
		t.Fatal(err)
	}
	if _, err := f.allocate(highMem, "GPU-0"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // s1's a and b, then s2
		if _, err := f.allocate(gpu10gRN, slots("GPU-M", i)...); err != nil {
			t.Fatal(err)
		}
	}
	f.expectHolders(`
resclass_node_agent_device_holder{class="gpu-10g",device="GPU-M",kind="nvidia-gpu",namespace="ml",pod="s1"} 1
resclass_node_agent_device_holder{class="gpu-10g",device="GPU-M",kind="nvidia-gpu",namespace="ml",pod="s2"} 1
resclass_node_agent_device_holder{class="nvidia.high.mem",device="GPU-0",kind="nvidia-gpu",namespace="ml",pod="whole"} 1
resclass_node_agent_device_holder{class="nvidia.high.mem",device="GPU-1",kind="nvidia-gpu",namespace="ml",pod="restored"} 1
`)

	// A device that leaves the inventory keeps its holder, of kind unknown.
	f.alloc.SetDevices(nil)
	f.expectHolders(`
resclass_node_agent_device_holder{class="gpu-10g",device="GPU-M",kind="unknown",namespace="ml",pod="s1"} 1
resclass_node_agent_device_holder{class="gpu-10g",device="GPU-M",kind="unknown",namespace="ml",pod="s2"} 1
resclass_node_agent_device_holder{class="nvidia.high.mem",device="GPU-0",kind="unknown",namespace="ml",pod="whole"} 1
resclass_node_agent_device_holder{class="nvidia.high.mem",device="GPU-1",kind="unknown",namespace="ml",pod="restored"} 1
`)

	if err := f.kube.CoreV1().Pods("ml").Delete(f.ctx, "s1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	whole.Status.Phase = corev1.PodSucceeded
	if _, err := f.kube.CoreV1().Pods("ml").UpdateStatus(f.ctx, whole, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.expectHolders(`
resclass_node_agent_device_holder{class="gpu-10g",device="GPU-M",kind="unknown",namespace="ml",pod="s2"} 1
resclass_node_agent_device_holder{class="nvidia.high.mem",device="GPU-1",kind="unknown",namespace="ml",pod="restored"} 1
`)
}

// expectHolders waits for the registry's device_holder series to be want
// (the pod informer delivers deletions asynchronously).
func (f *fixture) expectHolders(want string) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := testutil.GatherAndCompare(f.registry, strings.NewReader(holderHeader+strings.TrimPrefix(want, "\n")), "resclass_node_agent_device_holder")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDeviceHolderSeriesOfTheRunningAllocator: the allocator attached last
// is exported; one that stops (detaches) after another was attached does not
// take the other's series away, and once none runs nothing is exported.
func TestDeviceHolderSeriesOfTheRunningAllocator(t *testing.T) {
	f := newFixture(t, pod("a", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-0"}}}))
	if _, err := f.allocate(highMem, "GPU-0"); err != nil {
		t.Fatal(err)
	}
	series := `
resclass_node_agent_device_holder{class="nvidia.high.mem",device="GPU-0",kind="nvidia-gpu",namespace="ml",pod="a"} 1
`
	f.expectHolders(series)
	detachOld := f.metrics.attach(&Allocator{})
	f.expectHolders("")
	detach := f.metrics.attach(f.alloc)
	detachOld()
	f.expectHolders(series)
	detach()
	f.expectHolders("")
}

// BenchmarkDeviceHolderScrape is one scrape of the holder series of a node
// at its pod limit: 110 pods of one container, each with the node's 8 GPUs
// (880 series, the most a node of whole GPUs has; shares add one per pod
// sharing a GPU).
func BenchmarkDeviceHolderScrape(b *testing.B) {
	factory := NodePods(fake.NewClientset(), node)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	a := New(Config{Node: node, Metrics: m}, factory.Core().V1().Pods().Informer())
	var devices []v1alpha1.Device
	var ids []string
	for i := range 8 {
		d := gpu(fmt.Sprintf("GPU-%d", i), int64(i))
		devices = append(devices, d)
		ids = append(ids, d.ID)
	}
	a.SetDevices(devices)
	for p := range 110 {
		uid := types.UID(fmt.Sprintf("uid-%d", p))
		a.allocated[allocKey{pod: uid, container: "main", class: "gpu"}] = &Record{PodUID: uid, Namespace: "ml", Name: fmt.Sprintf("pod-%d", p), Container: "main", Class: "gpu", Devices: ids}
	}
	m.attach(a)
	for b.Loop() {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}
