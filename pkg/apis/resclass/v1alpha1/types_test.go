package v1alpha1

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
)

func TestAddToScheme(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"ResourceClass", "ResourceClassList", "NodeDevices", "NodeDevicesList", "ResourceDistribution", "ResourceDistributionList"} {
		if !scheme.Recognizes(SchemeGroupVersion.WithKind(kind)) {
			t.Errorf("scheme does not recognize %s", kind)
		}
	}
	if got := Resource("resourceclasses").String(); got != "resourceclasses.resclass.io" {
		t.Errorf("Resource() = %s", got)
	}
}

func TestDeepCopyIsIndependent(t *testing.T) {
	q := resource.MustParse("40Gi")
	nd := &NodeDevices{Status: NodeDevicesStatus{Devices: []Device{{ID: "GPU-1", Kind: DeviceKindNvidiaGPU, Attributes: map[string]DeviceAttribute{AttributeMemory: {QuantityValue: &q}}}}}}
	cp := nd.DeepCopy()
	*cp.Status.Devices[0].Attributes[AttributeMemory].QuantityValue = resource.MustParse("1Gi")
	cp.Status.Devices[0].Attributes["extra"] = DeviceAttribute{}
	if got := nd.Status.Devices[0].Attributes[AttributeMemory].QuantityValue.String(); got != "40Gi" {
		t.Errorf("original changed through the copy: memory = %s", got)
	}
	if len(nd.Status.Devices[0].Attributes) != 1 {
		t.Errorf("original attributes changed through the copy")
	}
}

func TestDeviceAttributeType(t *testing.T) {
	s, i, b, v, bw := "x", int64(1), true, "8.0", "100Gbps"
	q := resource.MustParse("1Gi")
	for _, tc := range []struct {
		attr DeviceAttribute
		want AttributeType
	}{
		{DeviceAttribute{StringValue: &s}, AttributeTypeString},
		{DeviceAttribute{IntValue: &i}, AttributeTypeInt},
		{DeviceAttribute{BoolValue: &b}, AttributeTypeBool},
		{DeviceAttribute{QuantityValue: &q}, AttributeTypeQuantity},
		{DeviceAttribute{BandwidthValue: &bw}, AttributeTypeBandwidth},
		{DeviceAttribute{VersionValue: &v}, AttributeTypeVersion},
		{DeviceAttribute{}, ""},
		{DeviceAttribute{StringValue: &s, IntValue: &i}, ""},
	} {
		if got := tc.attr.Type(); got != tc.want {
			t.Errorf("%+v: Type() = %q, want %q", tc.attr, got, tc.want)
		}
	}
	for attr, want := range map[*DeviceAttribute]string{
		ptr(StringAttribute("x")): "x", ptr(IntAttribute(-3)): "-3", ptr(BoolAttribute(true)): "true",
		ptr(QuantityAttribute(resource.MustParse("40Gi"))): "40Gi", ptr(BandwidthAttribute("100Gbps")): "100Gbps",
		ptr(VersionAttribute("8.0")): "8.0", {}: "<invalid>",
	} {
		if got := attr.String(); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
}

func ptr(a DeviceAttribute) *DeviceAttribute { return &a }
