package nodeagent

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	nvmldiscovery "github.com/resclass/resclass/pkg/discovery/nvml"
)

// ConditionNVML reports whether GPU discovery through NVML works on the node.
// The kinds the agent polls report their own (devicekind.Poller).
const ConditionNVML = "NVMLAvailable"

// sourceOptions choose what the discovery sources read.
type sourceOptions struct {
	hostRoot       string
	includeVirtual bool
	// kinds are the device kinds: those that are Pollers are read at every
	// poll, and the summary counts devices by kind.
	kinds *devicekind.Registry
	// library finds and checks the NVML library at each attempt to open
	// NVML (on a node); nil uses nvml.
	library *nvmldiscovery.Library
	// nvml is the NVML binding when library is nil: a mock in tests.
	nvml lib.Interface
}

// sources are the node's discovery sources. NVML is opened by openNVML and
// kept until discoverGPUs finds it gone; a node without it is a condition, not
// an error, and the agent calls openNVML again (with backoff) until it opens.
type sources struct {
	opts    sourceOptions
	gpus    *nvmldiscovery.Discoverer // nil while NVML is not usable
	nvmlErr error                     // why gpus is nil
}

// openSources returns the sources with NVML opened once (or the reason it
// did not open).
func openSources(opts sourceOptions) *sources {
	s := &sources{opts: opts}
	s.openNVML()
	return s
}

// openNVML opens NVML if it is not open, and reports whether it is.
func (s *sources) openNVML() bool {
	if s.gpus != nil {
		return true
	}
	l := s.opts.nvml
	if s.opts.library != nil {
		if l, s.nvmlErr = s.opts.library.Load(); s.nvmlErr != nil {
			return false
		}
	}
	s.gpus, s.nvmlErr = nvmldiscovery.Open(l, s.opts.hostRoot)
	return s.gpus != nil
}

// closeNVML shuts NVML down; err says why, for the condition until it opens
// again.
func (s *sources) closeNVML(err error) {
	if s.gpus != nil {
		_ = s.gpus.Close()
	}
	s.gpus, s.nvmlErr = nil, err
}

func (s *sources) close() {
	s.closeNVML(nvmldiscovery.ErrUnavailable)
}

// discoverGPUs describes the GPUs (and MIG devices) with the NVML condition.
// NVML found gone (the driver unloaded, the GPUs changed) is closed: the
// caller opens it again.
func (s *sources) discoverGPUs() ([]v1alpha1.Device, metav1.Condition) {
	cond := metav1.Condition{Type: ConditionNVML, Status: metav1.ConditionTrue, Reason: "Discovered"}
	if s.gpus != nil {
		gpus, err := s.gpus.Discover()
		if err == nil {
			cond.Message = fmt.Sprintf("%d GPUs", countKind(gpus, v1alpha1.DeviceKindNvidiaGPU))
			if n := countKind(gpus, v1alpha1.DeviceKindNvidiaMIG); n > 0 {
				cond.Message += fmt.Sprintf(", %d MIG devices", n)
			}
			if unnamed := s.gpus.Unnamed(); len(unnamed) > 0 {
				// Published are the GPUs that can be named; the others
				// are here until NVML names them (tried at each resync).
				cond.Reason = "Incomplete"
				cond.Message += fmt.Sprintf("; %d not published, NVML cannot name them: %s", len(unnamed), strings.Join(unnamed, "; "))
			}
			return gpus, cond
		}
		s.closeNVML(err)
	}
	cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Failed", s.nvmlErr.Error()
	switch {
	case errors.Is(s.nvmlErr, nvmldiscovery.ErrWrongLibrary):
		cond.Reason = "WrongLibrary"
	case errors.Is(s.nvmlErr, nvmldiscovery.ErrUnavailable):
		cond.Reason = "Unavailable"
	case errors.Is(s.nvmlErr, nvmldiscovery.ErrChanged):
		cond.Reason = "Changed"
	}
	return nil, cond
}

// discoverHost reads every kind the agent polls (NICs, hugepage pools: sysfs
// only, cheap enough for every poll), in the registry's order.
func (s *sources) discoverHost() ([]v1alpha1.Device, []metav1.Condition) {
	kinds := s.kinds().Kinds()
	var devices []v1alpha1.Device
	conds := make([]metav1.Condition, 0, len(kinds))
	opts := devicekind.DiscoverOptions{HostRoot: s.opts.hostRoot, IncludeVirtual: s.opts.includeVirtual}
	for _, k := range kinds {
		if p, ok := k.(devicekind.Poller); ok {
			found, cond := p.Discover(opts)
			if devices == nil {
				devices = found // the first kind's slice, not a copy: this runs at every poll
			} else {
				devices = append(devices, found...)
			}
			conds = append(conds, cond)
		}
	}
	return devices, conds
}

// kinds are the device kinds of the sources (kinds.Builtin unless set).
func (s *sources) kinds() *devicekind.Registry {
	if s.opts.kinds == nil {
		return kinds.Builtin
	}
	return s.opts.kinds
}

// assemble makes the NodeDevices status of the sources' devices: sorted by id,
// counted by kind, with the conditions in a fixed order.
func assemble(kinds *devicekind.Registry, devices []v1alpha1.Device, conditions ...metav1.Condition) v1alpha1.NodeDevicesStatus {
	var status v1alpha1.NodeDevicesStatus
	status.Devices = append([]v1alpha1.Device(nil), devices...)
	sort.Slice(status.Devices, func(i, j int) bool { return status.Devices[i].ID < status.Devices[j].ID })
	status.Summary = kinds.Summarize(status.Devices)
	for _, c := range conditions {
		meta.SetStatusCondition(&status.Conditions, c)
	}
	return status
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
