// Package nvmlmock is go-nvml's DGX A100 mock server completed with what the node
// agent uses beyond discovery: PCI bus ids, an NVML event set that tests feed with
// XIDs and ECC errors, and the recovery probes. It stands in for the GPUs this
// machine lacks, in unit tests, e2e tests and benchmarks alike.
//
// It also plays the failures a fleet shows: a driver that is not loaded yet (or
// unloaded while the agent runs, SetAbsent), a GPU whose handle or UUID NVML
// cannot read (FailHandle, FailUUID), a GPU that fell off the bus, which
// NVML reports on every call for it and as the event set's wait error (SetLost),
// NVML failing mid-run without the driver going away (FailCount), and the
// volatile ECC counts an uncorrected error raises and a reset zeroes (Reset).
//
// And MIG as NVML does it (EnableMIG, mig.go): the A100's or the H100's
// profiles, placements that conflict, MIG devices with UUIDs, failures.
package nvmlmock

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// Server is a DGX A100: 8 A100-SXM4-40GB GPUs, GPUs 0-3 on NUMA node 0 and 4-7
// on node 1 (see WriteSysfs), all linked through NVSwitches, MIG disabled.
type Server struct {
	*dgxa100.Server

	events chan lib.EventData

	mu          sync.Mutex
	lost        map[string]bool // UUID → NVML answers ERROR_GPU_IS_LOST
	absent      bool            // the driver is not loaded
	failHandle  map[int]lib.Return
	failUUID    map[string]lib.Return
	failCount   lib.Return
	ecc         map[string]uint64 // UUID → volatile uncorrected ECC errors
	initialised bool
	mig         map[string]*migGPU // UUID → MIG state, for GPUs EnableMIG put in MIG mode (mig.go)
}

// New returns a DGX A100 whose GPUs answer every call the node agent makes.
func New() *Server {
	s := &Server{Server: dgxa100.New(), events: make(chan lib.EventData, 64), lost: map[string]bool{},
		failHandle: map[int]lib.Return{}, failUUID: map[string]lib.Return{}, ecc: map[string]uint64{}}
	// The system calls answer as NVML does without a driver: Init fails, and
	// every call after the driver went away says it is not loaded.
	s.InitFunc = func() lib.Return {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.absent {
			return lib.ERROR_DRIVER_NOT_LOADED
		}
		s.initialised = true
		return lib.SUCCESS
	}
	s.ShutdownFunc = func() lib.Return {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.initialised = false
		return lib.SUCCESS
	}
	driverVersion, count, handle := s.SystemGetDriverVersionFunc, s.DeviceGetCountFunc, s.DeviceGetHandleByIndexFunc
	s.SystemGetDriverVersionFunc = func() (string, lib.Return) {
		if ret := s.system(); ret != lib.SUCCESS {
			return "", ret
		}
		return driverVersion()
	}
	s.DeviceGetCountFunc = func() (int, lib.Return) {
		if ret := s.system(); ret != lib.SUCCESS {
			return 0, ret
		}
		s.mu.Lock()
		ret := s.failCount
		s.mu.Unlock()
		if ret != lib.SUCCESS {
			return 0, ret
		}
		return count()
	}
	s.DeviceGetHandleByIndexFunc = func(i int) (lib.Device, lib.Return) {
		if ret := s.system(); ret != lib.SUCCESS {
			return nil, ret
		}
		s.mu.Lock()
		ret, fail := s.failHandle[i]
		s.mu.Unlock()
		if fail {
			return nil, ret
		}
		return handle(i)
	}
	s.EventSetCreateFunc = func() (lib.EventSet, lib.Return) {
		return &mock.EventSet{WaitFunc: s.wait, FreeFunc: func() lib.Return { return lib.SUCCESS }}, lib.SUCCESS
	}
	for _, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		busID, uuid := dev.PciBusID, dev.UUID
		// NVML's form of the bus id: an 8-digit domain, upper case.
		dev.GetPciInfoFunc = func() (lib.PciInfo, lib.Return) {
			var p lib.PciInfo
			for j, c := range "0000" + strings.ToUpper(busID) {
				p.BusId[j] = uint8(c)
			}
			p.PciDeviceId = 0x20B010DE
			return p, lib.SUCCESS
		}
		dev.GetSupportedEventTypesFunc = func() (uint64, lib.Return) {
			return lib.EventTypeXidCriticalError | lib.EventTypeDoubleBitEccError | lib.EventTypeSingleBitEccError, lib.SUCCESS
		}
		dev.RegisterEventsFunc = func(uint64, lib.EventSet) lib.Return { return lib.SUCCESS }
		// A DGX A100's GPUs have 12 NVLinks each, two to each of six NVSwitches.
		dev.GetNvLinkStateFunc = func(link int) (lib.EnableState, lib.Return) {
			if link >= 12 {
				return 0, lib.ERROR_INVALID_ARGUMENT
			}
			return lib.FEATURE_ENABLED, lib.SUCCESS
		}
		dev.GetNvLinkRemotePciInfoFunc = func(link int) (lib.PciInfo, lib.Return) {
			var p lib.PciInfo
			copy(p.BusId[:], fmt.Sprintf("00000000:%02X:00.0", 0xC0+link/2))
			return p, lib.SUCCESS
		}
		dev.GetUUIDFunc = func() (string, lib.Return) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if ret, fail := s.failUUID[uuid]; fail {
				return "", ret
			}
			if s.lost[uuid] {
				return "", lib.ERROR_GPU_IS_LOST
			}
			return uuid, lib.SUCCESS
		}
		dev.GetMemoryInfoFunc = func() (lib.Memory, lib.Return) {
			if s.isLost(uuid) {
				return lib.Memory{}, lib.ERROR_GPU_IS_LOST
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			return dev.MemoryInfo, lib.SUCCESS // EnableMIG may give it another table's
		}
		dev.GetRetiredPagesPendingStatusFunc = func() (lib.EnableState, lib.Return) {
			return lib.FEATURE_DISABLED, lib.SUCCESS
		}
		dev.GetRemappedRowsFunc = func() (int, int, bool, bool, lib.Return) {
			return 0, 0, false, false, lib.SUCCESS
		}
		dev.GetTotalEccErrorsFunc = func(errorType lib.MemoryErrorType, counter lib.EccCounterType) (uint64, lib.Return) {
			if s.isLost(uuid) {
				return 0, lib.ERROR_GPU_IS_LOST
			}
			if errorType != lib.MEMORY_ERROR_TYPE_UNCORRECTED || counter != lib.VOLATILE_ECC {
				return 0, lib.SUCCESS
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.ecc[uuid], lib.SUCCESS
		}
	}
	return s
}

// WriteSysfs writes the sysfs files NVML discovery reads below root, laid out
// as on a DGX A100: each GPU's PCI device directory, with its NUMA node, below
// a PCIe switch (GPUs 0-1, 2-3, 4-5, 6-7 share one) below a root port of the
// socket's root complex (pci0000:00 for GPUs 0-3, pci0000:80 for 4-7), and
// the /sys/bus/pci/devices link to it; the bridges report class 0x060400.
func (s *Server) WriteSysfs(root string) error {
	bus := filepath.Join(root, "sys/bus/pci/devices")
	if err := os.MkdirAll(bus, 0o755); err != nil {
		return err
	}
	for i, d := range s.Devices {
		sw := i / 2
		rootBus := []int{0x00, 0x80}[i/4]
		bridges := []string{
			fmt.Sprintf("0000:%02x:%02x.0", rootBus, 1+sw%2),              // root port
			fmt.Sprintf("0000:%02x:00.0", rootBus+0x10*(sw%2+1)),          // switch upstream port
			fmt.Sprintf("0000:%02x:%02x.0", rootBus+0x10*(sw%2+1)+1, i%2), // switch downstream port
		}
		dir := filepath.Join(root, "sys/devices", fmt.Sprintf("pci0000:%02x", rootBus))
		for _, b := range bridges {
			dir = filepath.Join(dir, b)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, "class"), []byte("0x060400\n"), 0o644); err != nil {
				return err
			}
		}
		busID := d.(*dgxa100.Device).PciBusID
		dir = filepath.Join(dir, busID)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "class"), []byte("0x030200\n"), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte([]string{"0\n", "1\n"}[i/4]), 0o644); err != nil {
			return err
		}
		rel, err := filepath.Rel(bus, dir)
		if err != nil {
			return err
		}
		if err := os.Symlink(rel, filepath.Join(bus, busID)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	return nil
}

// PCIeSwitch is the PCIe switch WriteSysfs puts GPU i under (the address of
// its upstream port), and PCIeRoot its root complex.
func PCIeSwitch(i int) string {
	sw, rootBus := i/2, []int{0x00, 0x80}[i/4]
	return fmt.Sprintf("0000:%02x:00.0", rootBus+0x10*(sw%2+1))
}

// PCIeRoot is GPU i's root complex in WriteSysfs's layout.
func PCIeRoot(i int) string { return fmt.Sprintf("pci0000:%02x", []int{0x00, 0x80}[i/4]) }

// UUIDs lists the GPUs' UUIDs by index.
func (s *Server) UUIDs() []string {
	out := make([]string, len(s.Devices))
	for i, d := range s.Devices {
		out[i] = d.(*dgxa100.Device).UUID
	}
	return out
}

// InjectXID delivers an XID critical error for the GPU with this UUID (every GPU
// for ""), as the driver reports one to NVML event sets.
// XIDs 48, 94 and 95 are uncorrected ECC errors: they raise the GPU's volatile
// uncorrected ECC count first, as the driver does.
func (s *Server) InjectXID(uuid string, xid uint64) {
	if xid == 48 || xid == 94 || xid == 95 {
		s.raiseECC(uuid)
	}
	s.events <- lib.EventData{Device: s.device(uuid), EventType: lib.EventTypeXidCriticalError, EventData: xid, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
}

// InjectDoubleBitECC delivers a double-bit ECC error for the GPU.
func (s *Server) InjectDoubleBitECC(uuid string) {
	s.raiseECC(uuid)
	s.events <- lib.EventData{Device: s.device(uuid), EventType: lib.EventTypeDoubleBitEccError, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
}

// SetLost makes NVML answer ERROR_GPU_IS_LOST for the GPU (it fell off the bus)
// until called again with false (it was reset): its UUID and memory cannot be
// read, and the event set's wait fails with ERROR_GPU_IS_LOST, as NVML's does
// while a GPU is lost.
func (s *Server) SetLost(uuid string, lost bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lost[uuid] = lost
}

// Reset resets the GPU, as nvidia-smi --gpu-reset does: its volatile ECC
// counts are zero again and it answers NVML (it is no longer lost).
func (s *Server) Reset(uuid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ecc, uuid)
	s.lost[uuid] = false
}

// FailCount makes NVML answer ret when asked for the GPU count (discovery's
// first call, at every open and description), as a transient fault of NVML
// does while the driver stays loaded; SUCCESS ends it.
func (s *Server) FailCount(ret lib.Return) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failCount = ret
}

func (s *Server) raiseECC(uuid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.Devices {
		if u := d.(*dgxa100.Device).UUID; u == uuid || uuid == "" {
			s.ecc[u]++
		}
	}
}

// SetAbsent unloads (true) or loads (false) the driver: while it is absent,
// Init answers ERROR_DRIVER_NOT_LOADED and an NVML opened before answers
// ERROR_DRIVER_NOT_LOADED to the system calls. New(); SetAbsent(true) is a node
// whose driver loads after the agent started.
func (s *Server) SetAbsent(absent bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.absent = absent
}

// FailHandle makes NVML answer ret for the handle of the GPU with this index,
// and a GPU without a handle cannot be named; SUCCESS ends it.
func (s *Server) FailHandle(index int, ret lib.Return) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ret == lib.SUCCESS {
		delete(s.failHandle, index)
		return
	}
	s.failHandle[index] = ret
}

// FailUUID makes NVML answer ret when the GPU's UUID is read; SUCCESS ends it.
func (s *Server) FailUUID(uuid string, ret lib.Return) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ret == lib.SUCCESS {
		delete(s.failUUID, uuid)
		return
	}
	s.failUUID[uuid] = ret
}

// Initialised says whether NVML is initialised (Init without a Shutdown since).
func (s *Server) Initialised() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.initialised
}

// system is what a system call answers before its own answer.
func (s *Server) system() lib.Return {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.absent {
		return lib.ERROR_DRIVER_NOT_LOADED
	}
	return lib.SUCCESS
}

func (s *Server) anyLost() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, lost := range s.lost {
		if lost {
			return true
		}
	}
	return false
}

func (s *Server) isLost(uuid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost[uuid]
}

func (s *Server) device(uuid string) lib.Device {
	for _, d := range s.Devices {
		if d.(*dgxa100.Device).UUID == uuid {
			return d
		}
	}
	return nil
}

// wait is the event set's Wait: the next injected event, or ERROR_TIMEOUT after
// timeoutMs as NVML does; ERROR_GPU_IS_LOST at once while a GPU is lost (NVML's
// wait names no GPU then).
func (s *Server) wait(timeoutMs uint32) (lib.EventData, lib.Return) {
	if s.anyLost() {
		return lib.EventData{}, lib.ERROR_GPU_IS_LOST
	}
	select {
	case e := <-s.events:
		return e, lib.SUCCESS
	case <-time.After(time.Duration(timeoutMs) * time.Millisecond):
		return lib.EventData{}, lib.ERROR_TIMEOUT
	}
}
