package selector

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	nvmldiscovery "github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
)

// deviceBuilder builds v1alpha1.Devices for tests: dev("nic", "0000:3b:00.0").bw("speed", "100Gbps").obj().
type deviceBuilder struct{ d v1alpha1.Device }

func dev(kind, id string) *deviceBuilder {
	return &deviceBuilder{d: v1alpha1.Device{ID: id, Kind: kind, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{}}}
}

func (b *deviceBuilder) str(k, v string) *deviceBuilder {
	b.d.Attributes[k] = v1alpha1.DeviceAttribute{StringValue: &v}
	return b
}

func (b *deviceBuilder) int(k string, v int64) *deviceBuilder {
	b.d.Attributes[k] = v1alpha1.DeviceAttribute{IntValue: &v}
	return b
}

func (b *deviceBuilder) bool(k string, v bool) *deviceBuilder {
	b.d.Attributes[k] = v1alpha1.DeviceAttribute{BoolValue: &v}
	return b
}

func (b *deviceBuilder) qty(k, v string) *deviceBuilder {
	q := resource.MustParse(v)
	b.d.Attributes[k] = v1alpha1.DeviceAttribute{QuantityValue: &q}
	return b
}

func (b *deviceBuilder) bw(k, v string) *deviceBuilder {
	b.d.Attributes[k] = v1alpha1.DeviceAttribute{BandwidthValue: &v}
	return b
}

func (b *deviceBuilder) ver(k, v string) *deviceBuilder {
	b.d.Attributes[k] = v1alpha1.DeviceAttribute{VersionValue: &v}
	return b
}

func (b *deviceBuilder) raw(k string, a v1alpha1.DeviceAttribute) *deviceBuilder {
	b.d.Attributes[k] = a
	return b
}

func (b *deviceBuilder) prepared() *Device { return NewDevice(&b.d) }

// gpu describes a GPU the way the node agent publishes it, from the figures NVML
// reports for that model (memory in bytes as nvmlDeviceGetMemoryInfo gives it).
func gpu(id, product string, memoryBytes int64, cc string) *deviceBuilder {
	return dev(v1alpha1.DeviceKindNvidiaGPU, id).
		str(v1alpha1.AttributeProduct, product).
		qty(v1alpha1.AttributeMemory, resource.NewQuantity(memoryBytes, resource.BinarySI).String()).
		ver(v1alpha1.AttributeComputeCapability, cc).
		ver(v1alpha1.AttributeDriverVersion, "550.54.15").
		int(v1alpha1.AttributeNUMANode, 0)
}

const mib = 1 << 20

var (
	teslaT4  = gpu("GPU-t4", "Tesla T4", 15360*mib, "7.5")                   // sold as 16GB
	a100x80  = gpu("GPU-a100-80", "NVIDIA A100-SXM4-80GB", 81920*mib, "8.0") // sold as 80GB
	h100x80  = gpu("GPU-h100", "NVIDIA H100 80GB HBM3", 81559*mib, "9.0")    // sold as 80GB, reports less than 80GiB
	nic100G  = dev(v1alpha1.DeviceKindNIC, "0000:3b:00.0").bw(v1alpha1.AttributeSpeed, "100Gbps").str(v1alpha1.AttributeDriver, "mlx5_core").int(v1alpha1.AttributeMTU, 9000)
	nic25G   = dev(v1alpha1.DeviceKindNIC, "0000:5e:00.0").bw(v1alpha1.AttributeSpeed, "25000Mbps").str(v1alpha1.AttributeDriver, "ice").int(v1alpha1.AttributeMTU, 1500)
	nic10G   = dev(v1alpha1.DeviceKindNIC, "0000:af:00.1").bw(v1alpha1.AttributeSpeed, "10Gbps").str(v1alpha1.AttributeDriver, "ixgbe")
	pages1G  = dev(v1alpha1.DeviceKindHugePages, "hugepages-1Gi-numa0").qty(v1alpha1.AttributeSize, "1Gi").int(v1alpha1.AttributePagesTotal, 16)
	pages2M  = dev(v1alpha1.DeviceKindHugePages, "hugepages-2Mi-numa0").qty(v1alpha1.AttributeSize, "2Mi").int(v1alpha1.AttributePagesTotal, 1024)
	allSeeds = []*deviceBuilder{teslaT4, a100x80, h100x80, nic100G, nic25G, nic10G, pages1G, pages2M}
)

// mockDGXA100GPUs describes the eight GPUs of go-nvml's DGX A100 mock as the node
// agent's GPU discovery does.
func mockDGXA100GPUs(t testing.TB) []*deviceBuilder {
	t.Helper()
	d, err := nvmldiscovery.Open(nvmlmock.New(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := d.Discover()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*deviceBuilder, 0, len(gpus))
	for _, g := range gpus {
		out = append(out, &deviceBuilder{d: g})
	}
	return out
}

func requirement(key string, op v1alpha1.ResourceSelectorOperator, values ...string) v1alpha1.ResourceSelectorRequirement {
	return v1alpha1.ResourceSelectorRequirement{Key: key, Operator: op, Values: values}
}

// spec builds a class spec; each argument is one selector (its expressions ANDed).
func spec(selectors ...[]v1alpha1.ResourceSelectorRequirement) *v1alpha1.ResourceClassSpec {
	s := &v1alpha1.ResourceClassSpec{}
	for _, exprs := range selectors {
		s.ResourceSelector = append(s.ResourceSelector, v1alpha1.ResourcePropertySelector{MatchExpressions: exprs})
	}
	return s
}

func all(exprs ...v1alpha1.ResourceSelectorRequirement) []v1alpha1.ResourceSelectorRequirement {
	return exprs
}

func mustCompile(t testing.TB, s *v1alpha1.ResourceClassSpec) *Class {
	t.Helper()
	c, errs := Compile(s, field.NewPath("spec"))
	if len(errs) > 0 {
		t.Fatalf("compile: %v", errs.ToAggregate())
	}
	return c
}

// The three classes of the resource-class proposal, verbatim.
var (
	seedNvidiaHighMem = spec(all(requirement("Kind", "In", "nvidia-gpu"), requirement("memory", "GtEq", "30G")))
	seedHugepages1Gig = spec(all(requirement("Kind", "In", "huge-pages"), requirement("size", "GtEq", "1G")))
	seedFastNIC       = spec(all(requirement("Kind", "In", "nic"), requirement("speed", "GtEq", "40GBPS")))
)
