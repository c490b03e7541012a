package nvml

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// ApplicationXIDs are the XIDs that report an error of the application running
// on the GPU, not of the GPU: the GPU stays healthy. It is the list NVIDIA's
// device plugin skips, from NVIDIA's XID catalogue
// (https://docs.nvidia.com/deploy/xid-errors/).
var ApplicationXIDs = map[uint64]string{
	13:  "graphics engine exception",
	31:  "GPU memory page fault",
	43:  "GPU stopped processing",
	45:  "preemptive cleanup, due to previous errors",
	68:  "video processor exception",
	109: "context switch timeout",
}

// criticalXIDs names the XIDs an operator meets most; others are reported by
// number only.
var criticalXIDs = map[uint64]string{
	48:  "double-bit ECC error",
	62:  "internal micro-controller halt",
	63:  "ECC page retirement or row remapping event",
	64:  "ECC page retirement or row remapping failure",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	119: "GSP RPC timeout",
	120: "GSP error",
}

// HealthEvent says that a GPU became unhealthy or healthy again.
type HealthEvent struct {
	// ID is the GPU's UUID.
	ID      string
	Healthy bool
	// Reason says why a GPU is unhealthy; empty when it is healthy.
	Reason string
}

// HealthOptions tune WatchHealth.
type HealthOptions struct {
	// IgnoredXIDs are XIDs to treat as application errors on top of
	// ApplicationXIDs (the agent's --ignored-xids).
	IgnoredXIDs []uint64
	// RecoveryAfter is how long a GPU must go without a critical event, and
	// pass the recovery probes, before it is healthy again. Default 5 minutes.
	RecoveryAfter time.Duration
	// WaitTimeout bounds one wait for NVML events, and so how soon cancellation
	// and recovery are noticed. Default 5 seconds.
	WaitTimeout time.Duration
	// Clock measures RecoveryAfter; a fake one in tests.
	Clock clock.Clock
}

// sick is what the watcher knows about one unhealthy GPU.
type sick struct {
	dev    lib.Device
	reason string
	last   time.Time // of the last critical event
	// recorded is when the fault was last written to the fault file; ecc
	// the volatile uncorrected ECC count then (nil: not reported), which
	// must drop (a reset) before the GPU is healthy again.
	recorded time.Time
	ecc      *uint64
}

// faultRecordEvery bounds the fault file's writes under an XID storm: a
// repeated fault refreshes its recorded time at most this often.
const faultRecordEvery = 10 * time.Second

// WatchHealth follows the GPUs' NVML events until ctx ends and calls report on
// every change of a GPU's health. XID critical errors (except application
// XIDs) and double-bit ECC errors make a GPU unhealthy. Unlike NVIDIA's device
// plugin, a GPU recovers: once it has gone RecoveryAfter without another
// critical event and NVML answers for it again with no page retirement or row
// remapping pending (the state after a GPU reset), it is reported healthy.
//
// An event NVML does not attribute to a GPU marks every GPU, as it may concern
// any. A GPU that cannot register for events is watched by nobody; the error
// says which, and the others are watched.
//
// A failing wait is news too: NVML's wait answers ERROR_GPU_IS_LOST (and the
// like) when a GPU fell off the bus, without saying which. Every watched GPU
// is then asked for its memory, as the recovery probe does, and each that does
// not answer is unhealthy with NVML's answer (in the recovery probe's words);
// the recovery above applies to it
// (the wait keeps failing while the GPU is lost, so its quiet period only
// starts once it is back). A failure that no watched GPU owns up to (a GPU
// NVML could not name is lost, say) is logged, and leaves the others healthy:
// NVIDIA's plugin marks every GPU then, which takes a node's healthy GPUs away
// for as long as one is lost.
//
// Faults reported by events are kept in the Discoverer's fault file
// (KeepFaults), and read back when the watcher starts: a GPU that had one
// before the agent restarted, or NVML was opened again, is unhealthy again at
// once, and recovers by the same rule, its quiet period counted from the
// recorded time. Where NVML reported a volatile uncorrected ECC count with the
// fault, the GPU recovers only once that count has dropped: a reset or a
// driver reload zeroes it, and nothing else does (faults.go).
//
// The GPUs watched are those named when it starts; the caller restarts it
// with NVML.
func (d *Discoverer) WatchHealth(ctx context.Context, opts HealthOptions, report func(HealthEvent)) error {
	logger := klog.FromContext(ctx)
	if opts.RecoveryAfter <= 0 {
		opts.RecoveryAfter = 5 * time.Minute
	}
	if opts.WaitTimeout <= 0 {
		opts.WaitTimeout = 5 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	ignored := map[uint64]bool{}
	for xid := range ApplicationXIDs {
		ignored[xid] = true
	}
	for _, xid := range opts.IgnoredXIDs {
		ignored[xid] = true
	}

	set, ret := d.lib.EventSetCreate()
	if ret != lib.SUCCESS {
		return fmt.Errorf("NVML event set: %s", ret.Error())
	}
	defer func() { _ = set.Free() }()

	uuids := map[lib.Device]string{}
	var unwatched []string
	for i, s := range d.slots {
		if s.dev == nil || s.uuid == "" {
			unwatched = append(unwatched, fmt.Sprintf("GPU %d: not named", i))
			continue
		}
		dev, uuid := s.dev, s.uuid
		uuids[dev] = uuid
		supported, ret := dev.GetSupportedEventTypes()
		if ret != lib.SUCCESS {
			unwatched = append(unwatched, fmt.Sprintf("%s: supported events: %s", uuid, ret.Error()))
			continue
		}
		mask := supported & (lib.EventTypeXidCriticalError | lib.EventTypeDoubleBitEccError)
		if ret := dev.RegisterEvents(mask, set); ret != lib.SUCCESS {
			unwatched = append(unwatched, fmt.Sprintf("%s: registering events: %s", uuid, ret.Error()))
		}
	}
	if len(unwatched) > 0 {
		// Not fatal: the other GPUs are watched. The caller reports it.
		logger.Error(nil, "GPUs without health events", "gpus", unwatched)
	}

	unhealthy := map[string]*sick{}
	// The faults kept from before: unhealthy until they are cleared.
	for dev, uuid := range uuids {
		if f, kept := d.faults.Get(uuid); kept {
			unhealthy[uuid] = &sick{dev: dev, reason: f.Reason, last: f.Time, recorded: f.Time, ecc: f.ECCVolatileUncorrected}
			report(HealthEvent{ID: uuid, Reason: f.Reason})
		}
	}
	// markUnhealthy marks the GPU; a fault an event reported (record) is
	// kept in the fault file too.
	markUnhealthy := func(dev lib.Device, uuid, reason string, record bool) {
		s, known := unhealthy[uuid]
		if !known {
			s = &sick{dev: dev}
			unhealthy[uuid] = s
		}
		s.last = opts.Clock.Now()
		if record && (s.reason != reason || s.last.Sub(s.recorded) >= faultRecordEvery) {
			s.recorded = s.last
			if ecc := volatileUncorrectedECC(dev); ecc != nil {
				s.ecc = ecc
			}
			if err := d.faults.Record(uuid, Fault{Reason: reason, Time: s.last, ECCVolatileUncorrected: s.ecc}); err != nil {
				logger.Error(err, "GPU fault not kept across restarts", "gpu", uuid)
			}
		}
		if s.reason != reason {
			s.reason = reason
			logger.Info("GPU unhealthy", "gpu", uuid, "reason", reason)
			report(HealthEvent{ID: uuid, Reason: reason})
		}
	}
	lastWaitErr := lib.SUCCESS
	for ctx.Err() == nil {
		e, ret := set.Wait(uint32(opts.WaitTimeout.Milliseconds()))
		if ret == lib.SUCCESS || ret == lib.ERROR_TIMEOUT {
			lastWaitErr = lib.SUCCESS
		}
		switch ret {
		case lib.SUCCESS:
			reason, critical := describeEvent(e, ignored)
			if !critical {
				logger.V(2).Info("GPU event that is not a device fault", "reason", reason)
				break
			}
			if uuid, ok := uuids[e.Device]; ok {
				markUnhealthy(e.Device, uuid, reason, true)
				break
			}
			for dev, uuid := range uuids {
				markUnhealthy(dev, uuid, reason+" (not attributed to a GPU)", true)
			}
		case lib.ERROR_TIMEOUT:
		default:
			// NVML reports ERROR_GPU_IS_LOST and the like here, naming no
			// GPU: the GPUs that no longer answer are the ones.
			culprits := 0
			for dev, uuid := range uuids {
				// The recovery probe's words: it finds the same while the
				// GPU stays lost, and reports no change.
				if reason := probe(dev); strings.HasPrefix(reason, "NVML: ") {
					markUnhealthy(dev, uuid, reason, false)
					culprits++
				}
			}
			if culprits == 0 && ret != lastWaitErr {
				// Not a GPU this watcher knows (one NVML could not name,
				// say): the others stay healthy. Logged when it starts, not
				// at every wait.
				logger.Info("waiting for NVML events failed, and every watched GPU answers", "error", ret.Error())
			}
			lastWaitErr = ret
			// Then wait on, at the pace of the timeout.
			select {
			case <-ctx.Done():
			case <-opts.Clock.After(opts.WaitTimeout):
			}
		}
		for _, uuid := range sortedKeys(unhealthy) {
			s := unhealthy[uuid]
			if opts.Clock.Since(s.last) < opts.RecoveryAfter {
				continue
			}
			if problem := probe(s.dev); problem != "" {
				if s.reason != problem {
					s.reason = problem
					report(HealthEvent{ID: uuid, Reason: problem})
				}
				continue
			}
			if s.ecc != nil && *s.ecc > 0 {
				// An uncorrected ECC error is there until a reset: the
				// quiet period is not enough.
				now := volatileUncorrectedECC(s.dev)
				if now == nil || *now >= *s.ecc {
					continue
				}
				logger.Info("GPU reset seen: its volatile uncorrected ECC count dropped", "gpu", uuid, "recorded", *s.ecc, "now", *now)
			}
			if err := d.faults.Clear(uuid); err != nil {
				// Kept in the file, it comes back at the next start
				// and recovers again then: logged, not fatal.
				logger.Error(err, "GPU fault not cleared from the fault file", "gpu", uuid)
			}
			delete(unhealthy, uuid)
			logger.Info("GPU healthy again", "gpu", uuid, "quietFor", opts.RecoveryAfter)
			report(HealthEvent{ID: uuid, Healthy: true})
		}
	}
	return nil
}

// describeEvent says what the event is and whether it is a device fault.
func describeEvent(e lib.EventData, ignored map[uint64]bool) (string, bool) {
	switch e.EventType {
	case lib.EventTypeDoubleBitEccError:
		return "double-bit ECC error", true
	case lib.EventTypeXidCriticalError:
		xid := e.EventData
		name := criticalXIDs[xid]
		if app, ok := ApplicationXIDs[xid]; ok {
			name = app
		}
		reason := "XID " + strconv.FormatUint(xid, 10)
		if name != "" {
			reason += " (" + name + ")"
		}
		return reason, !ignored[xid]
	}
	return fmt.Sprintf("NVML event type %#x", e.EventType), false
}

// probe returns why the GPU is still unfit, or "": NVML must answer for it,
// and no retired page or remapped row may wait for a reset.
func probe(dev lib.Device) string {
	if _, ret := dev.GetMemoryInfo(); ret != lib.SUCCESS {
		return "NVML: " + ret.Error()
	}
	return pendingRepair(dev)
}

// volatileUncorrectedECC is the GPU's volatile uncorrected ECC error count,
// nil where NVML does not report one (no ECC, or the GPU does not answer).
func volatileUncorrectedECC(dev lib.Device) *uint64 {
	n, ret := dev.GetTotalEccErrors(lib.MEMORY_ERROR_TYPE_UNCORRECTED, lib.VOLATILE_ECC)
	if ret != lib.SUCCESS {
		return nil
	}
	return &n
}

// pendingRepair says which repair waits for a GPU reset, "" when none does or
// NVML does not say: a retired page or a remapped row takes effect only at
// the next reset, and until then the GPU is unfit (discovery asks it too, so a
// restarted agent sees it at once).
func pendingRepair(dev lib.Device) string {
	if pending, ret := dev.GetRetiredPagesPendingStatus(); ret == lib.SUCCESS && pending == lib.FEATURE_ENABLED {
		return "retired ECC pages pending: reset the GPU"
	}
	if _, _, pending, failed, ret := dev.GetRemappedRows(); ret == lib.SUCCESS {
		switch {
		case failed:
			return "row remapping failed: the GPU needs service"
		case pending:
			return "row remapping pending: reset the GPU"
		}
	}
	return ""
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
