package mps

import (
	"fmt"
	"sync"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVMLComputeMode sets compute modes through NVML. nvmlDeviceGetHandleByUUID
// and nvmlDeviceSetComputeMode are in every NVML the agent supports (they
// predate driver 450, which pkg/discovery/nvml requires); setting the mode
// needs root and the GPU's device node, which the privileged DaemonSet has.
type NVMLComputeMode struct {
	// NVML is the library, loaded (pkg/discovery/nvml.Library.Load) but
	// not initialised: Init is called at the first use, and again after a
	// failure, so that a driver loaded after the supervisor started is used.
	NVML lib.Interface

	mu          sync.Mutex
	initialised bool
}

// SetComputeMode sets the GPU's mode: EXCLUSIVE_PROCESS or DEFAULT.
func (n *NVMLComputeMode) SetComputeMode(uuid string, exclusive bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.initialised {
		if ret := n.NVML.Init(); ret != lib.SUCCESS {
			return fmt.Errorf("initialising NVML: %s", ret.Error())
		}
		n.initialised = true
	}
	mode := lib.COMPUTEMODE_DEFAULT
	if exclusive {
		mode = lib.COMPUTEMODE_EXCLUSIVE_PROCESS
	}
	dev, ret := n.NVML.DeviceGetHandleByUUID(uuid)
	if ret == lib.SUCCESS {
		ret = dev.SetComputeMode(mode)
	}
	switch ret {
	case lib.SUCCESS:
		return nil
	case lib.ERROR_UNINITIALIZED, lib.ERROR_DRIVER_NOT_LOADED:
		// The driver went away: initialise again next time.
		_ = n.NVML.Shutdown()
		n.initialised = false
	}
	return fmt.Errorf("NVML compute mode of %s: %s", uuid, ret.Error())
}

// Close shuts NVML down if it was initialised.
func (n *NVMLComputeMode) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.initialised {
		_ = n.NVML.Shutdown()
		n.initialised = false
	}
}
