package nvml

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrWrongLibrary means the file named as the NVML library loads but is not
// NVML (it lacks symbols the agent calls). go-nvml binds NVML's functions
// lazily, so calling one that is missing would end the process ("undefined
// symbol: nvmlInit"); Library.Load checks them first.
var ErrWrongLibrary = errors.New("not the NVML library")

// LibraryName is the NVML library's file name, as the driver installs it.
const LibraryName = "libnvidia-ml.so.1"

// LibraryDirs are where a driver root keeps LibraryName, in the order they are
// searched: Debian and Ubuntu (x86_64, arm64), RHEL and SUSE, then the plain
// directories a driver container may use.
var LibraryDirs = []string{
	"usr/lib/x86_64-linux-gnu",
	"usr/lib/aarch64-linux-gnu",
	"usr/lib64",
	"lib/x86_64-linux-gnu",
	"lib/aarch64-linux-gnu",
	"lib64",
	"usr/lib",
	"lib",
}

// requiredSymbols are the NVML functions the agent calls, each with the older
// name go-nvml falls back to where it has one. Every one is in NVML since
// driver 470 (MIG placements, which dynamic MIG creates at; R450 and R460,
// both past NVIDIA's support, lack nvmlDeviceCreateGpuInstanceWithPlacement);
// a library without one is not a driver the agent supports. TestRequiredSymbolsAreWhatGoNVMLCalls derives the list from the
// sources (this package's calls, go-nvml's methods and versioned fallbacks)
// and fails when the two differ either way.
var requiredSymbols = [][]string{
	{"nvmlInit_v2", "nvmlInit"},
	{"nvmlShutdown"},
	{"nvmlErrorString"},
	{"nvmlSystemGetDriverVersion"},
	{"nvmlSystemGetCudaDriverVersion"},
	{"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"},
	{"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"},
	{"nvmlDeviceGetUUID"},
	{"nvmlDeviceGetName"},
	{"nvmlDeviceGetBrand"},
	{"nvmlDeviceGetArchitecture"},
	{"nvmlDeviceGetMemoryInfo"},
	{"nvmlDeviceGetCudaComputeCapability"},
	{"nvmlDeviceGetMigMode"},
	{"nvmlDeviceGetMaxMigDeviceCount"},
	{"nvmlDeviceGetMigDeviceHandleByIndex"},
	{"nvmlDeviceGetGpuInstanceId"},
	{"nvmlDeviceGetComputeInstanceId"},
	{"nvmlDeviceGetGpuInstanceProfileInfo"},
	{"nvmlDeviceGetGpuInstanceById"},
	{"nvmlDeviceGetGpuInstancePossiblePlacements_v2", "nvmlDeviceGetGpuInstancePossiblePlacements"},
	{"nvmlDeviceGetGpuInstances"},
	{"nvmlGpuInstanceGetInfo"},
	{"nvmlDeviceGetAttributes_v2", "nvmlDeviceGetAttributes"},
	{"nvmlDeviceGetIndex"},
	{"nvmlDeviceGetMinorNumber"},
	{"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo"},
	{"nvmlDeviceGetNvLinkState"},
	{"nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo"},
	{"nvmlDeviceGetSupportedEventTypes"},
	{"nvmlDeviceRegisterEvents"},
	{"nvmlEventSetCreate"},
	{"nvmlEventSetWait_v2", "nvmlEventSetWait"},
	{"nvmlEventSetFree"},
	{"nvmlDeviceGetRetiredPagesPendingStatus"},
	{"nvmlDeviceGetRemappedRows"},
	{"nvmlDeviceGetTotalEccErrors"},
	// MIG slices made on demand (slices.go); placements since driver 470.
	{"nvmlDeviceGetHandleByUUID"},
	{"nvmlDeviceCreateGpuInstanceWithPlacement"},
	{"nvmlGpuInstanceDestroy"},
	{"nvmlGpuInstanceGetComputeInstanceProfileInfo"},
	{"nvmlGpuInstanceCreateComputeInstance"},
	{"nvmlGpuInstanceGetComputeInstances"},
	{"nvmlComputeInstanceDestroy"},
	{"nvmlComputeInstanceGetInfo_v2", "nvmlComputeInstanceGetInfo"},
}

// Library says where the NVML library is. The agent asks it again at every
// attempt to open NVML, because the file may appear later: the GPU operator's
// driver container installs it after the agent started.
type Library struct {
	// Path is the library file, used as given. "" searches DriverRoot.
	Path string
	// DriverRoot is where the driver's root filesystem is seen: LibraryName
	// is looked for in LibraryDirs below it. With Path, "" too: the dynamic
	// linker's search path (the NVIDIA container runtime put it there).
	DriverRoot string
}

// Find returns the library file to load: Path, the first LibraryName below
// DriverRoot, or LibraryName alone for the dynamic linker. A library that is
// not there yet is ErrUnavailable.
func (l Library) Find() (string, error) {
	if l.Path != "" {
		return l.Path, nil
	}
	if l.DriverRoot == "" {
		return LibraryName, nil
	}
	for _, dir := range LibraryDirs {
		p := filepath.Join(l.DriverRoot, dir, LibraryName)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: no %s below the driver root %s (in %s)", ErrUnavailable, LibraryName, l.DriverRoot, strings.Join(LibraryDirs, ", "))
}

// Load finds the library, checks that it is NVML, and returns go-nvml's
// binding to it, for Open. It loads the file into the process to look at it:
// a file that does not load (missing, or for another architecture) is
// ErrUnavailable, one that loads without NVML's symbols ErrWrongLibrary.
// Nothing in the file is called.
func (l Library) Load() (lib.Interface, error) {
	path, err := l.Find()
	if err != nil {
		return nil, err
	}
	if err := CheckLibrary(path); err != nil {
		return nil, err
	}
	return lib.New(lib.WithLibraryPath(path)), nil
}

// CheckLibrary loads the library at path (a bare name goes through the
// dynamic linker's search path) privately and looks up every function the
// agent calls.
func CheckLibrary(path string) error {
	// RTLD_LOCAL: a wrong library's symbols stay out of the process's global
	// namespace, where go-nvml's lazily bound calls would find them.
	h := dl.New(path, dl.RTLD_LAZY|dl.RTLD_LOCAL)
	if err := h.Open(); err != nil {
		return fmt.Errorf("%w: loading %s: %w", ErrUnavailable, path, err)
	}
	defer func() { _ = h.Close() }()
	var missing []string
	for _, names := range requiredSymbols {
		found := false
		for _, name := range names {
			if h.Lookup(name) == nil {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, names[0])
		}
	}
	if len(missing) > 0 {
		const most = 5
		list := strings.Join(missing[:min(len(missing), most)], ", ")
		if len(missing) > most {
			list += fmt.Sprintf(" and %d more", len(missing)-most)
		}
		return fmt.Errorf("%w: %s lacks %s", ErrWrongLibrary, path, list)
	}
	return nil
}
