// Package nic is the device kind of network interfaces: discovered from sysfs
// (pkg/discovery/nic) at every poll, handed out exclusively, named to the
// container by PCI address and interface name, and through VFIO when bound to
// vfio-pci.
package nic

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/attrvalue"
	"github.com/resclass/resclass/pkg/devicekind"
	nicdiscovery "github.com/resclass/resclass/pkg/discovery/nic"
)

// The environment a container gets: every class's NICs of the container (the
// kubelet merges the classes' responses; the last one wins).
const (
	EnvPCIAddresses = "RESCLASS_NIC_PCI_ADDRESSES"
	EnvInterfaces   = "RESCLASS_NIC_INTERFACES"
)

// The node labels of the kind.
const (
	// LabelCount is the number of NICs (hardware ones, as discovered).
	LabelCount = devicekind.LabelPrefix + "nic.count"
	// LabelSpeed is the fastest NIC link speed ("100Gbps").
	LabelSpeed = devicekind.LabelPrefix + "nic.speed"
)

// Condition reports whether NIC discovery works on the node.
const Condition = "NICsDiscovered"

// Kind is the nic kind.
type Kind struct{}

var (
	_ devicekind.Kind   = Kind{}
	_ devicekind.Poller = Kind{}
)

// Names: one kind.
func (Kind) Names() []string { return []string{v1alpha1.DeviceKindNIC} }

// Attributes are what NIC discovery publishes.
func (Kind) Attributes() map[string]v1alpha1.AttributeType {
	return map[string]v1alpha1.AttributeType{
		v1alpha1.AttributeProduct:          v1alpha1.AttributeTypeString,
		v1alpha1.AttributePCIAddress:       v1alpha1.AttributeTypeString,
		v1alpha1.AttributeNUMANode:         v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeVendorID:         v1alpha1.AttributeTypeString,
		v1alpha1.AttributeDeviceID:         v1alpha1.AttributeTypeString,
		v1alpha1.AttributeVendor:           v1alpha1.AttributeTypeString,
		v1alpha1.AttributeDriver:           v1alpha1.AttributeTypeString,
		v1alpha1.AttributeInterface:        v1alpha1.AttributeTypeString,
		v1alpha1.AttributeMAC:              v1alpha1.AttributeTypeString,
		v1alpha1.AttributeSpeed:            v1alpha1.AttributeTypeBandwidth,
		v1alpha1.AttributeLinkUp:           v1alpha1.AttributeTypeBool,
		v1alpha1.AttributeMTU:              v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeSRIOVTotalVFs:    v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeSRIOVNumVFs:      v1alpha1.AttributeTypeInt,
		v1alpha1.AttributePhysicalFunction: v1alpha1.AttributeTypeString,
		v1alpha1.AttributePCIeRoot:         v1alpha1.AttributeTypeString,
		v1alpha1.AttributePCIeSwitch:       v1alpha1.AttributeTypeString,
	}
}

// Discover reads the NICs from sysfs.
func (Kind) Discover(opts devicekind.DiscoverOptions) ([]v1alpha1.Device, metav1.Condition) {
	nics, err := nicdiscovery.Discover(nicdiscovery.Options{HostRoot: opts.HostRoot, IncludeVirtual: opts.IncludeVirtual})
	return nics, devicekind.DiscoveryCondition(Condition, err, fmt.Sprintf("%d NICs", len(nics)))
}

// Allocation: a NIC goes to one pod.
func (Kind) Allocation(*v1alpha1.Device) devicekind.Allocation { return devicekind.Exclusive }

// LabelKeys lists the labels of the kind.
func (Kind) LabelKeys() []string { return []string{LabelCount, LabelSpeed} }

// Labels count the NICs and name the fastest link.
func (Kind) Labels(devices []*v1alpha1.Device) map[string]string {
	labels := map[string]string{}
	if len(devices) == 0 {
		return labels
	}
	var maxSpeed int64
	for _, d := range devices {
		if s := d.Attributes[v1alpha1.AttributeSpeed].BandwidthValue; s != nil {
			if q, err := attrvalue.ParseBandwidth(*s); err == nil && q.Value() > maxSpeed {
				maxSpeed = q.Value()
			}
		}
	}
	labels[LabelCount] = strconv.Itoa(len(devices))
	if maxSpeed > 0 {
		labels[LabelSpeed] = attrvalue.FormatBandwidth(maxSpeed)
	}
	return labels
}

// Summarize counts NICs.
func (Kind) Summarize(s v1alpha1.DeviceSummary, _ *v1alpha1.Device) v1alpha1.DeviceSummary {
	s.NICs++
	return s
}

// ContainerEdits name the container's NICs by PCI address and interface, and
// hand over a NIC bound to vfio-pci through its IOMMU group's device node and
// the VFIO container device.
func (Kind) ContainerEdits(h *devicekind.Handoff, class, all []*v1alpha1.Device, e *devicekind.ContainerEdits) error {
	ids := make([]string, len(all))
	var names []string
	for i, d := range all {
		ids[i] = d.ID
		if s := d.Attributes[v1alpha1.AttributeInterface].StringValue; s != nil && *s != "" {
			names = append(names, *s)
		}
	}
	e.Env[EnvPCIAddresses] = strings.Join(ids, ",")
	if len(names) > 0 {
		e.Env[EnvInterfaces] = strings.Join(names, ",")
	}
	e.AddDeviceNodes(vfioDeviceNodes(h.HostRoot, class))
	return nil
}

func vfioDeviceNodes(hostRoot string, nics []*v1alpha1.Device) []string {
	var paths []string
	for _, d := range nics {
		if v := d.Attributes[v1alpha1.AttributeDriver].StringValue; v == nil || *v != "vfio-pci" {
			continue
		}
		group, err := os.Readlink(filepath.Join(hostRoot, "sys/bus/pci/devices", d.ID, "iommu_group"))
		if err != nil {
			continue
		}
		if p := "/dev/vfio/" + filepath.Base(group); !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		return nil
	}
	return append([]string{"/dev/vfio/vfio"}, paths...)
}
