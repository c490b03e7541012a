package nvml

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"k8s.io/klog/v2"
)

// A GPU fault that an XID or ECC event reported cannot be seen again by asking
// NVML: the event is gone once delivered, and a GPU that had XID 48 or 95
// answers every query as if healthy until it is reset. So the health watcher
// writes each such fault to a small file on the node (FaultFile), and reads it
// back when it starts: an agent restarted, or NVML opened again, still knows
// which GPUs wait for a reset.
//
// A fault is cleared only on evidence:
//   - a reboot: the file records the kernel's boot id, and a file from
//     another boot is dropped (the default path is on /var/run, a tmpfs that
//     a reboot empties anyway);
//   - a reset: where NVML reported a volatile uncorrected ECC count when the
//     fault was recorded, the fault stays until that count drops (a GPU reset
//     and a driver reload zero the volatile counters);
//   - otherwise (an XID with no ECC count behind it, a GPU without ECC), the
//     watcher's recovery rule, now measured from the fault's recorded time:
//     HealthOptions.RecoveryAfter without another fault, and NVML answers
//     with no page retirement or row remapping pending.
//
// Deleting the file clears every fault (an operator who reset the GPUs by
// hand and wants them back before the rule does).

// The bounds of a fault file: a node has at most a few dozen GPUs and keeps
// one fault per GPU, its latest; anything bigger was not written by the agent.
const (
	maxFaultFileBytes = 64 << 10
	maxFaults         = 256
	maxFaultReason    = 512
	maxFaultGPUID     = 128
	maxBootID         = 64
	faultFileVersion  = 1
)

// Fault is what is kept of one GPU's latest fault.
type Fault struct {
	// Reason is the watcher's reason, e.g. "XID 48 (double-bit ECC error)".
	Reason string `json:"reason"`
	// Time is when the fault was reported.
	Time time.Time `json:"time"`
	// ECCVolatileUncorrected is the GPU's volatile uncorrected ECC count read
	// when the fault was recorded; nil where NVML did not report one. Above
	// zero, the fault is cleared only once the count drops (a reset).
	ECCVolatileUncorrected *uint64 `json:"eccVolatileUncorrected,omitempty"`
}

// faultFile is the file's content.
type faultFile struct {
	Version int    `json:"version"`
	BootID  string `json:"bootID"`
	// Faults by GPU UUID.
	Faults map[string]Fault `json:"faults"`
}

// ParseFaults reads a fault file strictly: at most 64 KiB of one JSON object,
// version 1, no unknown field, a boot id, at most 256 faults, each with a
// GPU UUID and a reason of printable characters within their bounds and a
// time. The error says what is wrong, for the log line of a file set aside.
func ParseFaults(data []byte) (bootID string, faults map[string]Fault, err error) {
	if len(data) > maxFaultFileBytes {
		return "", nil, fmt.Errorf("%d bytes, more than the %d a fault file may have", len(data), maxFaultFileBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f faultFile
	if err := dec.Decode(&f); err != nil {
		return "", nil, fmt.Errorf("not a fault file: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return "", nil, errors.New("not a fault file: data after the JSON object")
	}
	if f.Version != faultFileVersion {
		return "", nil, fmt.Errorf("version %d, want %d", f.Version, faultFileVersion)
	}
	if err := checkText("boot id", f.BootID, maxBootID); err != nil {
		return "", nil, err
	}
	if len(f.Faults) > maxFaults {
		return "", nil, fmt.Errorf("%d faults, more than %d", len(f.Faults), maxFaults)
	}
	for _, id := range slices.Sorted(maps.Keys(f.Faults)) {
		fault := f.Faults[id]
		if err := checkText("GPU id", id, maxFaultGPUID); err != nil {
			return "", nil, err
		}
		if err := checkText(id+": reason", fault.Reason, maxFaultReason); err != nil {
			return "", nil, err
		}
		if fault.Time.IsZero() || fault.Time.Year() < 1 || fault.Time.Year() > 9999 {
			return "", nil, fmt.Errorf("%s: no time, or one out of range", id)
		}
	}
	if f.Faults == nil {
		f.Faults = map[string]Fault{}
	}
	return f.BootID, f.Faults, nil
}

// formatFaults is the file's content for these faults; ParseFaults reads it
// back as it was.
func formatFaults(bootID string, faults map[string]Fault) ([]byte, error) {
	data, err := json.MarshalIndent(faultFile{Version: faultFileVersion, BootID: bootID, Faults: faults}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// checkText refuses an empty value, one over max bytes, and one with
// characters that are not printable (a log line or a condition quotes it).
func checkText(what, s string, max int) error {
	switch {
	case s == "":
		return fmt.Errorf("%s is empty", what)
	case len(s) > max:
		return fmt.Errorf("%s of %d bytes, more than %d", what, len(s), max)
	case strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || r == unicode.ReplacementChar }) >= 0:
		return fmt.Errorf("%s %.40q has characters that are not printable", what, s)
	}
	return nil
}

// FaultFile keeps the GPUs' faults on the node; safe for concurrent use (the
// health watcher writes, discovery reads).
type FaultFile struct {
	path   string
	bootID string
	logger klog.Logger

	mu     sync.Mutex
	faults map[string]Fault
}

// BootIDFile is where the kernel gives its boot id, which changes at each
// boot; the same inside a container as on its host.
const BootIDFile = "/proc/sys/kernel/random/boot_id"

// ReadBootID reads the kernel's boot id from path (BootIDFile on a node).
func ReadBootID(path string) (string, error) {
	data, err := readBounded(path, maxBootID+1)
	if err != nil {
		return "", fmt.Errorf("boot id: %w", err)
	}
	id := strings.TrimSpace(string(data))
	if err := checkText("boot id", id, maxBootID); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return id, nil
}

// OpenFaultFile reads the faults kept at path for the boot bootID. A missing
// file is no fault; a file of another boot is dropped (the reboot reset every
// GPU); a file that does not parse is set aside as path+".corrupt", with an
// error logged that says why, and no fault is known: the agent never stops
// for it. Nothing is written until a fault is recorded, into the directory
// of path, which must exist. The error is for what cannot be done at all (a
// file that cannot be read or set aside): the caller then runs without
// keeping faults.
func OpenFaultFile(logger klog.Logger, path, bootID string) (*FaultFile, error) {
	if err := checkText("boot id", bootID, maxBootID); err != nil {
		return nil, err
	}
	f := &FaultFile{path: path, bootID: bootID, logger: logger.WithValues("path", path), faults: map[string]Fault{}}
	data, err := readBounded(path, maxFaultFileBytes+1)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return f, nil
	case err != nil:
		return nil, fmt.Errorf("GPU fault file: %w", err)
	}
	boot, faults, err := ParseFaults(data)
	switch {
	case err != nil:
		aside := path + ".corrupt"
		if rerr := os.Rename(path, aside); rerr != nil {
			return nil, fmt.Errorf("GPU fault file %s is corrupt (%w) and cannot be set aside: %w", path, err, rerr)
		}
		f.logger.Error(err, "GPU fault file is corrupt; set aside, GPU faults recorded before this start are forgotten", "setAsideAs", aside)
	case boot != bootID:
		f.logger.Info("GPU fault file is from another boot; its faults are cleared (a reboot resets the GPUs)", "faults", len(faults), "fileBootID", boot)
		if err := f.write(); err != nil {
			// Read again at the next start, and dropped again then.
			f.logger.Error(err, "GPU fault file of another boot not rewritten")
		}
	default:
		f.faults = faults
		for _, id := range slices.Sorted(maps.Keys(faults)) {
			f.logger.Info("GPU fault kept from before this start", "gpu", id, "reason", faults[id].Reason, "time", faults[id].Time)
		}
	}
	return f, nil
}

// Get returns the fault kept for the GPU.
func (f *FaultFile) Get(id string) (Fault, bool) {
	if f == nil {
		return Fault{}, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fault, ok := f.faults[id]
	return fault, ok
}

// Record keeps fault as the GPU's latest and writes the file. Past maxFaults
// GPUs, a new GPU's fault is refused (the error says so): the file is the
// agent's, and a node has far fewer GPUs.
func (f *FaultFile) Record(id string, fault Fault) error {
	if f == nil {
		return nil
	}
	if err := checkText("GPU id", id, maxFaultGPUID); err != nil {
		return err
	}
	if len(fault.Reason) > maxFaultReason {
		fault.Reason = strings.ToValidUTF8(fault.Reason[:maxFaultReason], "")
	}
	fault.Time = fault.Time.UTC().Truncate(time.Second)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, known := f.faults[id]; !known && len(f.faults) >= maxFaults {
		return fmt.Errorf("GPU fault file %s holds %d GPUs already; %s's fault is not kept", f.path, maxFaults, id)
	}
	f.faults[id] = fault
	return f.write()
}

// Clear forgets the GPU's fault and writes the file.
func (f *FaultFile) Clear(id string) error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, known := f.faults[id]; !known {
		return nil
	}
	delete(f.faults, id)
	return f.write()
}

// write replaces the file atomically: a new file in the same directory,
// synced, renamed over the old one, and the directory synced, so that a crash
// leaves the old content or the new one, never a mix.
func (f *FaultFile) write() error {
	data, err := formatFaults(f.bootID, f.faults)
	if err != nil {
		return err
	}
	dir := filepath.Dir(f.path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(f.path)+"-*")
	if err != nil {
		return fmt.Errorf("GPU fault file: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("GPU fault file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("GPU fault file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("GPU fault file: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.path); err != nil {
		return fmt.Errorf("GPU fault file: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// readBounded reads at most limit bytes of path; a longer file is read up to
// the limit, and the parser refuses it.
func readBounded(path string, limit int64) ([]byte, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = file.Close() }()
	return io.ReadAll(io.LimitReader(file, limit))
}
