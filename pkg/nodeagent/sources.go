package nodeagent

import (
	"errors"
	"fmt"
	"sort"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/discovery/hugepages"
	nicdiscovery "github.com/resclass/resclass/pkg/discovery/nic"
	nvmldiscovery "github.com/resclass/resclass/pkg/discovery/nvml"
)

// Conditions, one per discovery source.
const (
	// ConditionNVML reports whether GPU discovery through NVML works on the node.
	ConditionNVML = "NVMLAvailable"
	// ConditionNICs reports whether NIC discovery works on the node.
	ConditionNICs = "NICsDiscovered"
	// ConditionHugePages reports whether hugepage discovery works on the node.
	ConditionHugePages = "HugePagesDiscovered"
)

// sourceOptions choose what the discovery sources read.
type sourceOptions struct {
	hostRoot       string
	includeVirtual bool
	// nvml is the NVML library (lib.New() on a node, a mock in tests).
	nvml lib.Interface
}

// sources are the node's discovery sources. NVML is opened once, for the life of
// the sources; a node without it is a condition, not an error.
type sources struct {
	opts    sourceOptions
	gpus    *nvmldiscovery.Discoverer // nil when NVML is not usable
	nvmlErr error
}

func openSources(opts sourceOptions) *sources {
	s := &sources{opts: opts}
	s.gpus, s.nvmlErr = nvmldiscovery.Open(opts.nvml, opts.hostRoot)
	return s
}

func (s *sources) close() {
	if s.gpus != nil {
		_ = s.gpus.Close()
	}
}

// discoverGPUs describes the GPUs (and MIG devices) with the NVML condition.
func (s *sources) discoverGPUs() ([]v1alpha1.Device, metav1.Condition) {
	cond := metav1.Condition{Type: ConditionNVML, Status: metav1.ConditionTrue, Reason: "Discovered"}
	if s.gpus == nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Failed", s.nvmlErr.Error()
		if errors.Is(s.nvmlErr, nvmldiscovery.ErrUnavailable) {
			cond.Reason = "Unavailable"
		}
		return nil, cond
	}
	gpus, err := s.gpus.Discover()
	if err != nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Failed", err.Error()
		return nil, cond
	}
	cond.Message = fmt.Sprintf("%d GPUs", countKind(gpus, v1alpha1.DeviceKindNvidiaGPU))
	if n := countKind(gpus, v1alpha1.DeviceKindNvidiaMIG); n > 0 {
		cond.Message += fmt.Sprintf(", %d MIG devices", n)
	}
	return gpus, cond
}

// discoverHost describes the NICs and hugepage pools, which are cheap to read
// (sysfs only) and so are re-read at every poll.
func (s *sources) discoverHost() ([]v1alpha1.Device, []metav1.Condition) {
	nics, err := nicdiscovery.Discover(nicdiscovery.Options{HostRoot: s.opts.hostRoot, IncludeVirtual: s.opts.includeVirtual})
	nicCond := sourceCondition(ConditionNICs, err, fmt.Sprintf("%d NICs", len(nics)))
	pools, err := hugepages.Discover(hugepages.Options{HostRoot: s.opts.hostRoot})
	hpCond := sourceCondition(ConditionHugePages, err, fmt.Sprintf("%d hugepage pools", len(pools)))
	return append(nics, pools...), []metav1.Condition{nicCond, hpCond}
}

func sourceCondition(typ string, err error, found string) metav1.Condition {
	if err != nil {
		return metav1.Condition{Type: typ, Status: metav1.ConditionFalse, Reason: "Failed", Message: err.Error()}
	}
	return metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: "Discovered", Message: found}
}

// assemble makes the NodeDevices status of the sources' devices: sorted by id,
// counted, with the conditions in a fixed order.
func assemble(devices []v1alpha1.Device, conditions ...metav1.Condition) v1alpha1.NodeDevicesStatus {
	var status v1alpha1.NodeDevicesStatus
	status.Devices = append([]v1alpha1.Device(nil), devices...)
	sort.Slice(status.Devices, func(i, j int) bool { return status.Devices[i].ID < status.Devices[j].ID })
	status.Summary = Summarize(status.Devices)
	for _, c := range conditions {
		meta.SetStatusCondition(&status.Conditions, c)
	}
	return status
}

// Summarize counts devices by kind for NodeDevices' printer columns.
func Summarize(devices []v1alpha1.Device) v1alpha1.DeviceSummary {
	var s v1alpha1.DeviceSummary
	for _, d := range devices {
		switch d.Kind {
		case v1alpha1.DeviceKindNvidiaGPU:
			s.GPUs++
		case v1alpha1.DeviceKindNIC:
			s.NICs++
		case v1alpha1.DeviceKindHugePages:
			s.HugePagePools++
		}
		if !d.Healthy {
			s.Unhealthy++
		}
	}
	return s
}

func countKind(devices []v1alpha1.Device, kind string) int {
	n := 0
	for _, d := range devices {
		if d.Kind == kind {
			n++
		}
	}
	return n
}

// applyHealth marks the devices the health watchers found unhealthy. A MIG
// device is unhealthy when its GPU is: NVML reports faults per GPU.
func applyHealth(devices []v1alpha1.Device, unhealthy map[string]string) {
	for i := range devices {
		d := &devices[i]
		reason, sick := unhealthy[d.ID]
		if !sick && d.Kind == v1alpha1.DeviceKindNvidiaMIG {
			if parent := d.Attributes[v1alpha1.AttributeParent].StringValue; parent != nil {
				if reason, sick = unhealthy[*parent]; sick {
					reason = "GPU " + *parent + ": " + reason
				}
			}
		}
		if sick && d.Healthy {
			d.Healthy, d.Reason = false, reason
		}
	}
}
