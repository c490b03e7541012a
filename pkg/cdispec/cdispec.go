// Package cdispec writes the CDI (Container Device Interface) spec of the
// node's NVIDIA GPUs and MIG devices, so that a container runtime with CDI
// enabled (containerd 2.x, CRI-O) can resolve the CDI names the node agent
// hands out with a CDI device-list strategy (docs/node-agent.md, "Device list
// strategy").
//
// The spec is generated here from discovery, not with NVIDIA's generator
// (github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi): that module brings
// runc, NRI, a WebAssembly runtime and logrus into the agent, and the specs
// it generates rely on NVIDIA's nvidia-cdi-hook binary being installed on the
// host (for the ldcache and symlink hooks). What a CUDA container needs is
// small and known: the GPU's device node (a MIG device's: its GPU's and its
// MIG capability nodes), the control nodes, and the driver's user-space
// libraries and tools. Libraries are mounted under their soname (the file
// libcuda.so.1 points to, mounted as libcuda.so.1), so no hook has to create
// symlinks or refresh the linker cache: the dynamic linker finds them in the
// standard library directory of Debian/Ubuntu (usr/lib/x86_64-linux-gnu) and
// RHEL (usr/lib64) images alike, as long as the image's layout is the host's.
//
// The devices are named resclass.io/gpu=<UUID>, not nvidia.com/gpu=<UUID>:
// NVIDIA's container toolkit may write its own spec for nvidia.com/gpu, and
// two specs of one kind naming the same device conflict (the CDI cache then
// resolves neither). NVIDIA's device plugin does the same with its own
// vendor, k8s.device-plugin.nvidia.com.
package cdispec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
)

const (
	// Vendor and Class make the CDI kind of the devices this package writes.
	Vendor = "resclass.io"
	Class  = "gpu"
	// Kind is the CDI kind: Vendor/Class.
	Kind = Vendor + "/" + Class
	// DefaultDir is where the spec is written: /var/run/cdi is the
	// higher-priority one of the two directories runtimes read by default
	// (/etc/cdi, /var/run/cdi), and is for generated specs.
	DefaultDir = "/var/run/cdi"
	// FileName is the spec's file in the directory.
	FileName = "resclass.io-gpu.yaml"
)

// DeviceName is the fully qualified CDI name of the GPU or MIG device id.
func DeviceName(id string) string { return Kind + "=" + id }

// libraries are the driver's user-space libraries a CUDA or NVML program
// loads, by soname: the libraries of NVIDIA's "utility" and "compute" driver
// capabilities.
var libraries = []string{
	"libnvidia-ml.so.1",
	"libcuda.so.1",
	"libcudadebugger.so.1",
	"libnvidia-ptxjitcompiler.so.1",
	"libnvidia-nvvm.so.4",
	"libnvidia-opencl.so.1",
	"libnvidia-cfg.so.1",
	"libnvidia-allocator.so.1",
}

// libraryDirs are searched for them, below the driver root, in this order.
var libraryDirs = []string{
	"usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib",
	"lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib64",
}

// binaries are the driver's tools, in usr/bin below the driver root.
var binaries = []string{"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"}

// controlNodes every CUDA container needs besides its GPUs' nodes.
var controlNodes = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}

// mountOptions are those NVIDIA's generated specs use for driver files.
var mountOptions = []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}

// Config says where the host's files are.
type Config struct {
	// HostRoot is where the agent sees the host's / ("/" outside a
	// container). Device nodes are looked up below it.
	HostRoot string
	// DriverRoot is the host path of the NVIDIA driver's root: "/" for a
	// driver installed on the host, /run/nvidia/driver for the GPU
	// operator's driver container. The agent reads it below HostRoot; the
	// spec names host paths.
	DriverRoot string
	// MIGMinors is the kernel's table of MIG capability minors;
	// /proc/driver/nvidia-caps/mig-minors when empty.
	MIGMinors string
	// Kinds say which devices the spec names and with which device nodes
	// (devicekind.CDIKind); nil names none.
	Kinds *devicekind.Registry
}

// Generate returns the CDI spec of the devices whose kind is a
// devicekind.CDIKind (the GPU and MIG devices), each with the device nodes its
// kind lists, and the NVIDIA driver's control nodes and files for all.
// Device nodes are written fully (type, major, minor, read from the host's
// /dev), so the runtime needs no lookup of its own; a node the host lacks is
// written by path only, and the runtime's error then names it.
func Generate(cfg Config, devices []v1alpha1.Device) (*specs.Spec, error) {
	if cfg.HostRoot == "" {
		cfg.HostRoot = "/"
	}
	if cfg.DriverRoot == "" {
		cfg.DriverRoot = "/"
	}
	if cfg.MIGMinors == "" {
		cfg.MIGMinors = "/proc/driver/nvidia-caps/mig-minors"
	}
	if cfg.Kinds == nil {
		return nil, nil
	}
	byID := map[string]*v1alpha1.Device{}
	for i := range devices {
		byID[devices[i].ID] = &devices[i]
	}
	var migMinors map[string]uint32
	host := &devicekind.CDIHost{
		Device: func(id string) *v1alpha1.Device { return byID[id] },
		CapabilityMinor: func(name string) (uint32, bool) {
			if migMinors == nil {
				migMinors = readMIGMinors(cfg.MIGMinors)
			}
			m, ok := migMinors[name]
			return m, ok
		},
	}
	spec := &specs.Spec{Kind: Kind}
	for i := range devices {
		d := &devices[i]
		k, ok := cfg.Kinds.Kind(d.Kind).(devicekind.CDIKind)
		if !ok {
			continue
		}
		paths, ok := k.CDIDeviceNodes(host, d)
		if !ok {
			continue
		}
		nodes := make([]*specs.DeviceNode, len(paths))
		for j, p := range paths {
			nodes[j] = deviceNode(cfg.HostRoot, p)
		}
		spec.Devices = append(spec.Devices, specs.Device{Name: d.ID, ContainerEdits: specs.ContainerEdits{DeviceNodes: nodes}})
	}
	if len(spec.Devices) == 0 {
		return nil, nil
	}
	// NVIDIA_VISIBLE_DEVICES=void: a node whose default runtime is still
	// NVIDIA's legacy one must not inject GPUs again from an image's
	// NVIDIA_VISIBLE_DEVICES=all (NVIDIA's own specs do the same).
	edits := specs.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}}
	for _, p := range controlNodes {
		if _, err := os.Stat(filepath.Join(cfg.HostRoot, p)); err == nil {
			edits.DeviceNodes = append(edits.DeviceNodes, deviceNode(cfg.HostRoot, p))
		}
	}
	edits.Mounts = driverMounts(cfg)
	spec.ContainerEdits = edits
	v, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = v
	return spec, nil
}

// deviceNode describes the host's device node p (a path on the host, also
// used in the container).
func deviceNode(hostRoot, p string) *specs.DeviceNode {
	n := &specs.DeviceNode{Path: p, HostPath: p}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(hostRoot, p), &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR {
		n.Type = "c"
		n.Major = int64(unix.Major(uint64(st.Rdev))) //nolint:unconvert // Rdev's type differs by architecture
		n.Minor = int64(unix.Minor(uint64(st.Rdev))) //nolint:unconvert // as above
	}
	return n
}

// driverMounts finds the driver's libraries and tools below the driver root.
func driverMounts(cfg Config) []*specs.Mount {
	view := filepath.Join(cfg.HostRoot, cfg.DriverRoot)
	var mounts []*specs.Mount
	for _, lib := range libraries {
		for _, dir := range libraryDirs {
			target, ok := resolve(view, path.Join(dir, lib))
			if !ok {
				continue
			}
			mounts = append(mounts, &specs.Mount{
				HostPath: path.Join(cfg.DriverRoot, target), ContainerPath: path.Join("/", dir, lib), Options: mountOptions,
			})
			break
		}
	}
	for _, bin := range binaries {
		if target, ok := resolve(view, path.Join("usr/bin", bin)); ok {
			mounts = append(mounts, &specs.Mount{
				HostPath: path.Join(cfg.DriverRoot, target), ContainerPath: path.Join("/usr/bin", bin), Options: mountOptions,
			})
		}
	}
	return mounts
}

// maxLinks bounds the symlinks followed for one file.
const maxLinks = 8

// resolve follows rel's symlinks below root, as the host would with root as
// its /, and returns the regular file's path relative to root. A link that
// leaves root, a loop or anything but a regular file at the end is not found.
func resolve(root, rel string) (string, bool) {
	for range maxLinks {
		fi, err := os.Lstat(filepath.Join(root, rel))
		if err != nil {
			return "", false
		}
		if fi.Mode().IsRegular() {
			return rel, true
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			return "", false
		}
		target, err := os.Readlink(filepath.Join(root, rel))
		if err != nil {
			return "", false
		}
		if path.IsAbs(target) {
			rel = path.Clean(target)[1:]
		} else {
			rel = path.Join(path.Dir(rel), target)
		}
		if rel == ".." || strings.HasPrefix(rel, "../") {
			return "", false
		}
	}
	return "", false
}

// maxMIGMinorsSize bounds the read of the kernel's table (a few KiB on an
// eight-GPU node).
const maxMIGMinorsSize = 1 << 20

func readMIGMinors(file string) map[string]uint32 {
	f, err := os.Open(file)
	if err != nil {
		return map[string]uint32{}
	}
	defer func() { _ = f.Close() }()
	data, err := io.ReadAll(io.LimitReader(f, maxMIGMinorsSize+1))
	if err != nil || len(data) > maxMIGMinorsSize {
		return map[string]uint32{}
	}
	m, _ := ParseMIGMinors(data)
	return m
}

// ParseMIGMinors parses /proc/driver/nvidia-caps/mig-minors: lines of a
// capability path and its device minor ("gpu0/gi1/ci0/access 13"). Lines it
// cannot read are skipped and counted in the error; the others are returned.
func ParseMIGMinors(data []byte) (map[string]uint32, error) {
	out := map[string]uint32{}
	bad := 0
	for line := range strings.SplitSeq(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			bad++
			continue
		}
		minor, err := strconv.ParseUint(fields[1], 10, 20) // Linux minors have 20 bits
		if err != nil {
			bad++
			continue
		}
		out[fields[0]] = uint32(minor)
	}
	if bad > 0 {
		return out, fmt.Errorf("%d unreadable lines in mig-minors", bad)
	}
	return out, nil
}

// Writer writes the spec into a CDI directory through the CDI library (which
// validates it and replaces the file atomically), only when it changed or the
// file is gone.
type Writer struct {
	cache *cdi.Cache
	dir   string

	mu   sync.Mutex
	last []byte
}

// NewWriter returns a writer into dir (DefaultDir when empty).
func NewWriter(dir string) (*Writer, error) {
	if dir == "" {
		dir = DefaultDir
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI spec directory %s: %w", dir, err)
	}
	return &Writer{cache: cache, dir: dir}, nil
}

// Path is the spec file's path.
func (w *Writer) Path() string { return filepath.Join(w.dir, FileName) }

// Write writes spec and reports whether it wrote. A nil spec (no GPUs)
// removes the file: a stale spec would name devices that are gone.
func (w *Writer) Write(spec *specs.Spec) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if spec == nil {
		if w.last == nil {
			if _, err := os.Stat(w.Path()); errors.Is(err, fs.ErrNotExist) {
				return false, nil
			}
		}
		w.last = nil
		return true, w.cache.RemoveSpec(FileName)
	}
	data, err := yaml.Marshal(spec)
	if err != nil {
		return false, err
	}
	if bytes.Equal(data, w.last) {
		if _, err := os.Stat(w.Path()); err == nil {
			return false, nil
		}
	}
	if err := w.cache.WriteSpec(spec, FileName); err != nil {
		return false, fmt.Errorf("writing the CDI spec %s: %w", w.Path(), err)
	}
	w.last = data
	return true, nil
}

// IDs lists the device names of spec, for logs and tests.
func IDs(spec *specs.Spec) []string {
	if spec == nil {
		return nil
	}
	out := make([]string, len(spec.Devices))
	for i, d := range spec.Devices {
		out[i] = d.Name
	}
	slices.Sort(out)
	return out
}
