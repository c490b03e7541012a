package kinds_test

import (
	"maps"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/hugepages"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nic"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
)

func gpu(product, memory string, mig bool) v1alpha1.Device {
	return v1alpha1.Device{Kind: v1alpha1.DeviceKindNvidiaGPU, Attributes: map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeProduct:    v1alpha1.StringAttribute(product),
		v1alpha1.AttributeMemory:     v1alpha1.QuantityAttribute(resource.MustParse(memory)),
		v1alpha1.AttributeMIGEnabled: v1alpha1.BoolAttribute(mig),
	}}
}

func nicDevice(speed string) v1alpha1.Device {
	d := v1alpha1.Device{Kind: v1alpha1.DeviceKindNIC, Attributes: map[string]v1alpha1.DeviceAttribute{}}
	if speed != "" {
		d.Attributes[v1alpha1.AttributeSpeed] = v1alpha1.BandwidthAttribute(speed)
	}
	return d
}

func poolDevice(size string, total int64) v1alpha1.Device {
	return v1alpha1.Device{Kind: v1alpha1.DeviceKindHugePages, Attributes: map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeSize:       v1alpha1.QuantityAttribute(resource.MustParse(size)),
		v1alpha1.AttributePagesTotal: v1alpha1.IntAttribute(total),
	}}
}

func TestNodeLabels(t *testing.T) {
	for _, tc := range []struct {
		name    string
		devices []v1alpha1.Device
		want    map[string]string
	}{
		{"nothing", nil, map[string]string{}},
		{"one product", []v1alpha1.Device{gpu("NVIDIA A100-SXM4-80GB", "80Gi", false), gpu("NVIDIA A100-SXM4-80GB", "80Gi", true)}, map[string]string{
			nvidiagpu.LabelCount: "2", nvidiagpu.LabelProduct: "NVIDIA-A100-SXM4-80GB", nvidiagpu.LabelMemory: "80Gi", nvidiagpu.LabelMIG: "true",
		}},
		{"mixed products, smallest memory", []v1alpha1.Device{gpu("Tesla T4", "15Gi", false), gpu("NVIDIA H100 80GB HBM3", "81559Mi", false)}, map[string]string{
			nvidiagpu.LabelCount: "2", nvidiagpu.LabelProduct: "mixed", nvidiagpu.LabelMemory: "15Gi",
		}},
		{"NICs, fastest link; hugepage sizes with pages", []v1alpha1.Device{nicDevice("25000Mbps"), nicDevice("100Gbps"), nicDevice(""), poolDevice("1Gi", 8), poolDevice("2Mi", 512), poolDevice("2Mi", 0), poolDevice("32Mi", 0)}, map[string]string{
			nic.LabelCount: "3", nic.LabelSpeed: "100Gbps", hugepages.LabelSizes: "2Mi_1Gi",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := kinds.Builtin.NodeLabels(tc.devices)
			if len(got) != len(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q (all: %v)", k, got[k], v, got)
				}
			}
			for k, v := range got {
				if !kinds.Builtin.IsLabel(k) || len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
					t.Errorf("label %s=%q is not a valid resclass label", k, v)
				}
			}
		})
	}
}

// The well-known attributes are what each kind declares: together, exactly
// the list the API documented before the kinds had packages of their own.
func TestBuiltinAttributes(t *testing.T) {
	want := map[string]v1alpha1.AttributeType{
		v1alpha1.AttributeMemory:            v1alpha1.AttributeTypeQuantity,
		v1alpha1.AttributeProduct:           v1alpha1.AttributeTypeString,
		v1alpha1.AttributeBrand:             v1alpha1.AttributeTypeString,
		v1alpha1.AttributeArchitecture:      v1alpha1.AttributeTypeString,
		v1alpha1.AttributeComputeCapability: v1alpha1.AttributeTypeVersion,
		v1alpha1.AttributeDriverVersion:     v1alpha1.AttributeTypeVersion,
		v1alpha1.AttributeCUDADriverVersion: v1alpha1.AttributeTypeVersion,
		v1alpha1.AttributeMIGEnabled:        v1alpha1.AttributeTypeBool,
		v1alpha1.AttributeIndex:             v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeDecoders:          v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeJPEGs:             v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeOFAs:              v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeMinor:             v1alpha1.AttributeTypeInt,
		v1alpha1.AttributePCIAddress:        v1alpha1.AttributeTypeString,
		v1alpha1.AttributeNUMANode:          v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeVendorID:          v1alpha1.AttributeTypeString,
		v1alpha1.AttributeDeviceID:          v1alpha1.AttributeTypeString,
		v1alpha1.AttributeVendor:            v1alpha1.AttributeTypeString,
		v1alpha1.AttributeDriver:            v1alpha1.AttributeTypeString,
		v1alpha1.AttributeInterface:         v1alpha1.AttributeTypeString,
		v1alpha1.AttributeMAC:               v1alpha1.AttributeTypeString,
		v1alpha1.AttributeSpeed:             v1alpha1.AttributeTypeBandwidth,
		v1alpha1.AttributeLinkUp:            v1alpha1.AttributeTypeBool,
		v1alpha1.AttributeMTU:               v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeSRIOVTotalVFs:     v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeSRIOVNumVFs:       v1alpha1.AttributeTypeInt,
		v1alpha1.AttributePhysicalFunction:  v1alpha1.AttributeTypeString,
		v1alpha1.AttributeSize:              v1alpha1.AttributeTypeQuantity,
		v1alpha1.AttributePagesTotal:        v1alpha1.AttributeTypeInt,
		v1alpha1.AttributePagesFree:         v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeResourceName:      v1alpha1.AttributeTypeString,
		v1alpha1.AttributeParent:            v1alpha1.AttributeTypeString,
		v1alpha1.AttributeMIGProfile:        v1alpha1.AttributeTypeString,
		v1alpha1.AttributeGPUInstanceID:     v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeComputeInstanceID: v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeMultiprocessors:   v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeNVLinkPeers:       v1alpha1.AttributeTypeString,
		v1alpha1.AttributeNVLinks:           v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeNVLinkPeerLinks:   v1alpha1.AttributeTypeString,
		v1alpha1.AttributePCIeRoot:          v1alpha1.AttributeTypeString,
		v1alpha1.AttributePCIeSwitch:        v1alpha1.AttributeTypeString,
	}
	if got := kinds.Builtin.Attributes(); !maps.Equal(got, want) {
		t.Errorf("the kinds declare %v\nwant %v", got, want)
	}
	if got := kinds.Builtin.AttributeType("custom"); got != "" {
		t.Errorf("a key no kind declares has type %q, want none", got)
	}
}

func TestBuiltinAllocation(t *testing.T) {
	mig := true
	for _, tc := range []struct {
		d    v1alpha1.Device
		want devicekind.Allocation
	}{
		{v1alpha1.Device{Kind: v1alpha1.DeviceKindNvidiaGPU}, devicekind.Exclusive},
		{v1alpha1.Device{Kind: v1alpha1.DeviceKindNvidiaGPU, Attributes: map[string]v1alpha1.DeviceAttribute{v1alpha1.AttributeMIGEnabled: {BoolValue: &mig}}}, devicekind.Unallocatable},
		{v1alpha1.Device{Kind: v1alpha1.DeviceKindNvidiaMIG}, devicekind.Exclusive},
		{v1alpha1.Device{Kind: v1alpha1.DeviceKindNIC}, devicekind.Exclusive},
		{v1alpha1.Device{Kind: v1alpha1.DeviceKindHugePages}, devicekind.Pool},
		{v1alpha1.Device{Kind: "fpga"}, devicekind.Exclusive},
	} {
		if got := kinds.Builtin.Allocation(&tc.d); got != tc.want {
			t.Errorf("%s: allocation %d, want %d", tc.d.Kind, got, tc.want)
		}
	}
}

// A kind that redeclares a name or gives an attribute another type is refused
// when the registry is built.
func TestRegistryRefusesConflicts(t *testing.T) {
	for name, k := range map[string]devicekind.Kind{
		"same name":            renamed{nic.Kind{}, []string{v1alpha1.DeviceKindNIC}},
		"another type for one": retyped{nic.Kind{}},
	} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), "devicekind:") {
					t.Errorf("%s: %v, want a devicekind panic", name, r)
				}
			}()
			kinds.Builtin.With(k)
		}()
	}
}

type renamed struct {
	devicekind.Kind
	names []string
}

func (r renamed) Names() []string { return r.names }

type retyped struct{ devicekind.Kind }

func (retyped) Names() []string { return []string{"other"} }
func (retyped) Attributes() map[string]v1alpha1.AttributeType {
	return map[string]v1alpha1.AttributeType{v1alpha1.AttributeNUMANode: v1alpha1.AttributeTypeString}
}

// Configured puts a kind with its settings in the place of the kind of its
// name: the same order, the same names, the settings kept.
func TestConfigured(t *testing.T) {
	settings := &nvmlsource.NVML{}
	r := kinds.Builtin.Configured(nvidiagpu.Kind{NVML: settings})
	if len(r.Kinds()) != len(kinds.Builtin.Kinds()) {
		t.Fatalf("%d kinds, want %d", len(r.Kinds()), len(kinds.Builtin.Kinds()))
	}
	for i, k := range r.Kinds() {
		if k.Names()[0] != kinds.Builtin.Kinds()[i].Names()[0] {
			t.Errorf("kind %d is %v, want %v", i, k.Names(), kinds.Builtin.Kinds()[i].Names())
		}
	}
	if k, ok := r.Kind(v1alpha1.DeviceKindNvidiaMIG).(nvidiagpu.Kind); !ok || k.NVML != settings {
		t.Errorf("the MIG devices' kind is %#v, want the configured one", r.Kind(v1alpha1.DeviceKindNvidiaMIG))
	}
	if k := kinds.Builtin.Kind(v1alpha1.DeviceKindNvidiaGPU).(nvidiagpu.Kind); k.NVML != nil {
		t.Errorf("Configured changed kinds.Builtin")
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "no kind") {
			t.Errorf("configuring a kind not registered: %v, want a panic", r)
		}
	}()
	kinds.Builtin.Configured(retyped{nic.Kind{}})
}

// A MIG device is unhealthy when its GPU is; other devices have their own
// health.
func TestBuiltinInheritedHealth(t *testing.T) {
	unhealthy := func(id string) (string, bool) { return "XID 79", id == "GPU-a" }
	mig := func(parent string) *v1alpha1.Device {
		return &v1alpha1.Device{ID: "MIG-" + parent, Kind: v1alpha1.DeviceKindNvidiaMIG, Attributes: map[string]v1alpha1.DeviceAttribute{v1alpha1.AttributeParent: v1alpha1.StringAttribute(parent)}}
	}
	if reason, sick := kinds.Builtin.InheritedHealth(mig("GPU-a"), unhealthy); !sick || reason != "GPU GPU-a: XID 79" {
		t.Errorf("MIG device of a sick GPU: %v %q", sick, reason)
	}
	if _, sick := kinds.Builtin.InheritedHealth(mig("GPU-b"), unhealthy); sick {
		t.Errorf("MIG device of a healthy GPU is sick")
	}
	nicOfParent := &v1alpha1.Device{ID: "0000:01:00.1", Kind: v1alpha1.DeviceKindNIC, Attributes: map[string]v1alpha1.DeviceAttribute{v1alpha1.AttributeParent: v1alpha1.StringAttribute("GPU-a")}}
	for _, d := range []*v1alpha1.Device{{ID: "GPU-c", Kind: v1alpha1.DeviceKindNvidiaGPU}, nicOfParent, {ID: "x", Kind: "fpga"}} {
		if _, sick := kinds.Builtin.InheritedHealth(d, unhealthy); sick {
			t.Errorf("%s (%s) inherits health", d.ID, d.Kind)
		}
	}
}

// The kubelet reports a hugepage pool's pages as node capacity; no other
// device is capacity.
func TestBuiltinNodeCapacity(t *testing.T) {
	got := kinds.Builtin.NodeCapacity([]v1alpha1.Device{
		poolDevice("2Mi", 512), poolDevice("2Mi", 256), poolDevice("1Gi", 4),
		{Kind: v1alpha1.DeviceKindHugePages}, // no size: counts nothing
		gpu("NVIDIA A100-SXM4-80GB", "80Gi", false), nicDevice("100Gbps"),
	})
	want := map[string]string{"hugepages-2Mi": "1536Mi", "hugepages-1Gi": "4Gi"}
	if len(got) != len(want) {
		t.Errorf("capacity %v, want %v", got, want)
	}
	for name, q := range want {
		if v, ok := got[corev1.ResourceName(name)]; !ok || v.Cmp(resource.MustParse(q)) != 0 {
			t.Errorf("%s = %v, want %s", name, v.String(), q)
		}
	}
}
