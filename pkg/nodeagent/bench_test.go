package nodeagent

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
)

// BenchmarkInventoryDGXA100 times one full inventory as the agent makes it on
// resync: the GPUs of a DGX A100 described through NVML (go-nvml's mock, with
// the NUMA nodes read from sysfs written below a temporary root), plus this
// machine's real NICs and hugepage pools (sysfs below "/"), assembled into the
// NodeDevices status. The goal is under 50 ms a pass.
//
// The GPUs and the host are two sources because they read two roots: the mock's
// sysfs and the real one.
//
// resclass opens NVML once and keeps its handles, as the agent does;
// baseline-reinit is the naive agent that initialises NVML, enumerates the GPUs
// and shuts NVML down again on every pass. What the ratio can show is the cost
// of that enumeration through the mock: a few function calls and allocations,
// next to the sysfs reads (NUMA nodes, NICs, hugepages) that dominate a pass, so
// expect about 1 within the noise. What it cannot show is what caching saves on
// a node, where Init attaches to the driver and every GPU: there the baseline
// can only be slower. Neither side includes loading libnvidia-ml.
func BenchmarkInventoryDGXA100(b *testing.B) {
	server := nvmlmock.New()
	root := b.TempDir()
	if err := server.WriteSysfs(root); err != nil {
		b.Fatal(err)
	}
	gpuKinds := kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{Binding: server}})
	gpuOpts := devicekind.DiscoverOptions{HostRoot: root}
	openGPUs := func(b *testing.B) (*sources, *opened) {
		src := newSources(gpuKinds, gpuOpts)
		if len(src.opened) != 1 || !src.open(src.opened[0]) {
			b.Fatalf("NVML did not open")
		}
		return src, src.opened[0]
	}
	host := newSources(kinds.Builtin, devicekind.DiscoverOptions{HostRoot: "/"})
	inventory := func(gpus *opened) v1alpha1.NodeDevicesStatus {
		gpus.describe(time.Now(), DefaultDeviceGracePeriod)
		devices, hostConds := host.discoverHost()
		return assemble(host.kinds, append(gpus.devices, devices...), append([]metav1.Condition{gpus.cond}, hostConds...)...)
	}
	check := func(b *testing.B, status v1alpha1.NodeDevicesStatus) {
		b.Helper()
		for _, c := range status.Conditions {
			if c.Status != metav1.ConditionTrue {
				b.Fatalf("%s: %s", c.Type, c.Message)
			}
		}
		if status.Summary.GPUs != 8 {
			b.Fatalf("%d GPUs, want a DGX A100's 8", status.Summary.GPUs)
		}
	}

	b.Run("resclass", func(b *testing.B) {
		src, gpus := openGPUs(b)
		defer src.close()
		status := inventory(gpus)
		check(b, status)
		b.ReportAllocs()
		for b.Loop() {
			inventory(gpus)
		}
		// What one pass describes depends on this machine's NICs. Reported
		// after the loop: b.Loop's timer reset drops earlier metrics.
		b.ReportMetric(float64(len(status.Devices)), "devices")
	})
	b.Run("baseline-reinit", func(b *testing.B) {
		reinit := func() v1alpha1.NodeDevicesStatus {
			src, gpus := openGPUs(b)
			defer src.close()
			return inventory(gpus)
		}
		check(b, reinit())
		b.ReportAllocs()
		for b.Loop() {
			reinit()
		}
	})
}
