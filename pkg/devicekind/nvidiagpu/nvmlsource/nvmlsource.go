// Package nvmlsource is how the nvidia-gpu kind reads the GPUs in the node
// agent: NVML (pkg/discovery/nvml), opened, described and watched for health.
// It loads NVML through cgo, so it is a package apart: the agent gives it to
// the kind (nvidiagpu.Kind{NVML: &nvmlsource.NVML{...}}), and the scheduler,
// the webhook and kubectl-resclass, which ask the same kind, never link it.
package nvmlsource

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	nvmldiscovery "github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/mig"
)

// NVML is the nvidia-gpu kind's source: how the node agent reads the GPUs.
type NVML struct {
	// Library finds and checks the NVML library at each attempt to open
	// NVML, on a node (the file may appear later: the GPU operator's driver
	// container installs it after the agent started).
	Library *nvmldiscovery.Library
	// Binding is NVML when Library is nil: a mock in tests.
	Binding lib.Interface
	// Health tunes the health watcher.
	Health nvmldiscovery.HealthOptions
	// Faults keeps the GPUs' faults across restarts of the agent and of
	// NVML (nvmldiscovery.OpenFaultFile); nil keeps none.
	Faults *nvmldiscovery.FaultFile
}

var _ nvidiagpu.NVML = &NVML{}

// Open opens NVML and keeps a handle per GPU.
func (cfg *NVML) Open(opts devicekind.DiscoverOptions) (devicekind.Source, error) {
	l := cfg.Binding
	if cfg.Library != nil || l == nil {
		library := cfg.Library
		if library == nil {
			library = &nvmldiscovery.Library{}
		}
		var err error
		if l, err = library.Load(); err != nil {
			return nil, err
		}
	}
	gpus, err := nvmldiscovery.Open(l, opts.HostRoot)
	if err != nil {
		return nil, err
	}
	gpus.KeepFaults(cfg.Faults)
	return &source{gpus: gpus, health: cfg.Health}, nil
}

var _ nvidiagpu.Slicer = &source{}

// NotOpen says why NVML is not open.
func (*NVML) NotOpen(err error) metav1.Condition {
	cond := metav1.Condition{Type: nvidiagpu.Condition, Status: metav1.ConditionFalse, Reason: "Failed", Message: err.Error()}
	switch {
	case errors.Is(err, nvmldiscovery.ErrWrongLibrary):
		cond.Reason = "WrongLibrary"
	case errors.Is(err, nvmldiscovery.ErrUnavailable):
		cond.Reason = "Unavailable"
	case errors.Is(err, nvmldiscovery.ErrChanged):
		cond.Reason = "Changed"
	}
	return cond
}

// source is NVML, open.
type source struct {
	gpus   *nvmldiscovery.Discoverer
	health nvmldiscovery.HealthOptions
	// mu keeps a description from seeing a slice half made or half
	// destroyed (nvidiagpu.Slicer), and a slice from being made on NVML
	// closed.
	mu     sync.Mutex
	closed bool
}

// Describe describes the GPUs and MIG devices. NVML found gone (the driver
// unloaded, the GPUs changed) is an error: the agent closes it and opens it
// again.
func (s *source) Describe() ([]v1alpha1.Device, metav1.Condition, error) {
	s.mu.Lock()
	gpus, err := s.gpus.Discover()
	s.mu.Unlock()
	if err != nil {
		return nil, metav1.Condition{}, err
	}
	cond := metav1.Condition{Type: nvidiagpu.Condition, Status: metav1.ConditionTrue, Reason: "Discovered"}
	cond.Message = fmt.Sprintf("%d GPUs", countKind(gpus, v1alpha1.DeviceKindNvidiaGPU))
	if n := countKind(gpus, v1alpha1.DeviceKindNvidiaMIG); n > 0 {
		cond.Message += fmt.Sprintf(", %d MIG devices", n)
	}
	if unnamed := s.gpus.Unnamed(); len(unnamed) > 0 {
		// Published are the GPUs that can be named; the others are here
		// until NVML names them (tried at each resync).
		cond.Reason = "Incomplete"
		cond.Message += fmt.Sprintf("; %d not published, NVML cannot name them: %s", len(unnamed), strings.Join(unnamed, "; "))
	}
	return gpus, cond, nil
}

// WatchHealth watches XID and ECC events, with recovery.
func (s *source) WatchHealth(ctx context.Context, report func(devicekind.HealthEvent)) error {
	return s.gpus.WatchHealth(ctx, s.health, func(e nvmldiscovery.HealthEvent) {
		report(devicekind.HealthEvent{ID: e.ID, Healthy: e.Healthy, Reason: e.Reason})
	})
}

// Close shuts NVML down.
func (s *source) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	_ = s.gpus.Close()
}

// errClosed is a slice asked of NVML closed.
var errClosed = errors.New("NVML is closed")

// CreateSlice creates a MIG slice (nvmldiscovery.Discoverer.CreateSlice).
func (s *source) CreateSlice(gpu *v1alpha1.Device, profile string, start int) (uint32, v1alpha1.Device, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, v1alpha1.Device{}, errClosed
	}
	sl, err := s.gpus.CreateSlice(gpu, profile, start)
	return sl.GPUInstance, sl.Device, err
}

// DestroySlice destroys a MIG slice.
func (s *source) DestroySlice(gpu string, gpuInstance uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	return s.gpus.DestroySlice(gpu, gpuInstance)
}

// SliceInstances lists a GPU's GPU instances.
func (s *source) SliceInstances(gpu *v1alpha1.Device) ([]mig.Existing, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	return s.gpus.SliceInstances(gpu)
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
