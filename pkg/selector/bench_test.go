package selector

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	dracel "k8s.io/dynamic-resource-allocation/cel"
)

// BenchmarkSelectorMatch evaluates the proposal's nvidia.high.mem class against two
// devices, one it selects (an A100 80GB) and one it does not (a 100G NIC). The
// baseline is the same question asked the way Kubernetes DRA asks it: a CEL device
// selector, compiled once, as NVIDIA's DRA driver publishes GPUs.
func BenchmarkSelectorMatch(b *testing.B) {
	b.Run("resclass", func(b *testing.B) {
		c := mustCompile(b, seedNvidiaHighMem)
		hit, miss := a100x80.prepared(), nic100G.prepared()
		b.ReportAllocs()
		for b.Loop() {
			if !c.Matches(hit) || c.Matches(miss) {
				b.Fatal("wrong answer")
			}
		}
	})
	b.Run("baseline-dra-cel", func(b *testing.B) {
		expr := `device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu" && ` +
			`device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("30G")) >= 0`
		prog := dracel.GetCompiler(dracel.Features{}).CompileCELExpression(expr, dracel.Options{})
		if prog.Error != nil {
			b.Fatal(prog.Error)
		}
		str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
		hit := dracel.Device{
			Driver: "gpu.nvidia.com",
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type": str("gpu"), "productName": str("NVIDIA A100-SXM4-80GB"), "uuid": str("GPU-a100-80"),
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("80Gi")}},
		}
		miss := dracel.Device{
			Driver:     "nic.example.com",
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("nic")},
		}
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			okHit, _, err1 := prog.DeviceMatches(ctx, hit)
			okMiss, _, err2 := prog.DeviceMatches(ctx, miss)
			if err1 != nil || err2 != nil || !okHit || okMiss {
				b.Fatal("wrong answer", err1, err2)
			}
		}
	})
}

// BenchmarkSelectorCompile is the one-time cost of a class, paid when it is created
// or changes, never per pod.
func BenchmarkSelectorCompile(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		mustCompile(b, seedNvidiaHighMem)
	}
}
