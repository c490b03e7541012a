package v1alpha1

import (
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Device kinds the node agent publishes.
const (
	DeviceKindNvidiaGPU = "nvidia-gpu"
	// DeviceKindNvidiaMIG is a MIG device (a GPU instance's compute instance) of
	// a GPU in MIG mode; its parent GPU is then not allocatable as a whole.
	DeviceKindNvidiaMIG = "nvidia-mig"
	DeviceKindNIC       = "nic"
	DeviceKindHugePages = "huge-pages"
)

// AttributeType is the type of a DeviceAttribute, which decides how selectors
// compare it.
type AttributeType string

// The attribute types; each matches one field of DeviceAttribute.
const (
	AttributeTypeString    AttributeType = "string"
	AttributeTypeInt       AttributeType = "int"
	AttributeTypeBool      AttributeType = "bool"
	AttributeTypeQuantity  AttributeType = "quantity"
	AttributeTypeBandwidth AttributeType = "bandwidth"
	AttributeTypeVersion   AttributeType = "version"
)

// Well-known attribute names: the contract between the node agent, which publishes
// them with the type their device kind declares (devicekind.Kind.Attributes,
// pkg/devicekind), and ResourceClass selectors, whose values for these keys are
// checked against that type when the class is created. Any other key is allowed
// too; its values are then compared with whatever type the device publishes.
const (
	AttributeMemory            = "memory"            // GPU memory (quantity)
	AttributeProduct           = "product"           // e.g. "NVIDIA A100-SXM4-40GB"
	AttributeBrand             = "brand"             // e.g. "Nvidia", "Tesla"
	AttributeArchitecture      = "architecture"      // e.g. "Ampere"
	AttributeComputeCapability = "computeCapability" // e.g. "8.0"
	AttributeDriverVersion     = "driverVersion"     // e.g. "550.54.15"
	AttributeCUDADriverVersion = "cudaDriverVersion" // e.g. "12.4"
	AttributeMIGEnabled        = "migEnabled"
	AttributeIndex             = "index"
	AttributeMinor             = "minor"
	AttributePCIAddress        = "pciAddress" // e.g. "0000:3b:00.0"
	AttributeNUMANode          = "numaNode"
	AttributeVendorID          = "vendorID" // PCI vendor id, e.g. "10de"
	AttributeDeviceID          = "deviceID" // PCI device id
	AttributeVendor            = "vendor"
	AttributeDriver            = "driver"
	AttributeInterface         = "interface" // NIC interface name
	AttributeMAC               = "mac"
	AttributeSpeed             = "speed" // NIC link speed (bandwidth)
	AttributeLinkUp            = "linkUp"
	AttributeMTU               = "mtu"
	AttributeSRIOVTotalVFs     = "sriovTotalVFs"
	AttributeSRIOVNumVFs       = "sriovNumVFs"
	AttributePhysicalFunction  = "physicalFunction" // PCI address of a VF's PF
	AttributeSize              = "size"             // hugepage size (quantity)
	AttributePagesTotal        = "pagesTotal"
	AttributePagesFree         = "pagesFree"
	AttributeResourceName      = "resourceName"      // the kubelet's native resource, e.g. "hugepages-1Gi"
	AttributeParent            = "parent"            // a MIG device's GPU UUID
	AttributeMIGProfile        = "migProfile"        // e.g. "1g.5gb"
	AttributeGPUInstanceID     = "gpuInstanceID"     // MIG GPU instance
	AttributeComputeInstanceID = "computeInstanceID" // MIG compute instance
	AttributeMultiprocessors   = "multiprocessors"   // streaming multiprocessors
	AttributeDecoders          = "decoders"          // a MIG profile's video decoders
	AttributeJPEGs             = "jpegs"             // a MIG profile's JPEG decoders
	AttributeOFAs              = "ofas"              // a MIG profile's optical flow accelerators
	AttributeNVLinkPeers       = "nvlinkPeers"       // comma-separated NVML indices of the GPUs reached over active NVLinks, ascending
	AttributeNVLinks           = "nvlinks"           // number of active NVLinks
	AttributeNVLinkPeerLinks   = "nvlinkPeerLinks"   // per peer GPU (NVML index) the NVLinks to it: "1:2,2:1,3:1"
	AttributePCIeRoot          = "pcieRoot"          // PCIe root complex, "pci0000:00" (Kubernetes DRA's resource.kubernetes.io/pcieRoot)
	AttributePCIeSwitch        = "pcieSwitch"        // PCI address of the upstream port of the closest PCIe switch above the device
)

// Type reports which field of the attribute is set, or "" when none or more than
// one is (which the API schema forbids).
func (a DeviceAttribute) Type() AttributeType {
	var t AttributeType
	n := 0
	if a.StringValue != nil {
		t, n = AttributeTypeString, n+1
	}
	if a.IntValue != nil {
		t, n = AttributeTypeInt, n+1
	}
	if a.BoolValue != nil {
		t, n = AttributeTypeBool, n+1
	}
	if a.QuantityValue != nil {
		t, n = AttributeTypeQuantity, n+1
	}
	if a.BandwidthValue != nil {
		t, n = AttributeTypeBandwidth, n+1
	}
	if a.VersionValue != nil {
		t, n = AttributeTypeVersion, n+1
	}
	if n != 1 {
		return ""
	}
	return t
}

// StringAttribute, IntAttribute, BoolAttribute, QuantityAttribute,
// BandwidthAttribute and VersionAttribute build a DeviceAttribute of one type.
func StringAttribute(v string) DeviceAttribute { return DeviceAttribute{StringValue: &v} }

// IntAttribute builds an int DeviceAttribute.
func IntAttribute(v int64) DeviceAttribute { return DeviceAttribute{IntValue: &v} }

// BoolAttribute builds a bool DeviceAttribute.
func BoolAttribute(v bool) DeviceAttribute { return DeviceAttribute{BoolValue: &v} }

// QuantityAttribute builds a quantity DeviceAttribute.
func QuantityAttribute(v resource.Quantity) DeviceAttribute {
	return DeviceAttribute{QuantityValue: &v}
}

// BandwidthAttribute builds a bandwidth DeviceAttribute, e.g. "100Gbps".
func BandwidthAttribute(v string) DeviceAttribute { return DeviceAttribute{BandwidthValue: &v} }

// VersionAttribute builds a version DeviceAttribute, e.g. "8.0".
func VersionAttribute(v string) DeviceAttribute { return DeviceAttribute{VersionValue: &v} }

// String renders the value as it is written in YAML, for tables and messages.
func (a DeviceAttribute) String() string {
	switch a.Type() {
	case AttributeTypeString:
		return *a.StringValue
	case AttributeTypeInt:
		return strconv.FormatInt(*a.IntValue, 10)
	case AttributeTypeBool:
		return strconv.FormatBool(*a.BoolValue)
	case AttributeTypeQuantity:
		return a.QuantityValue.String()
	case AttributeTypeBandwidth:
		return *a.BandwidthValue
	case AttributeTypeVersion:
		return *a.VersionValue
	}
	return "<invalid>"
}
