package nodeagent

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// A source's description can fail for a moment (NVML answers an error, the
// driver is reloaded, a GPU is briefly not enumerated) while the devices and
// the containers using them are fine. Dropping the devices then costs more
// than the fault: NodeDevices loses them, the classes' device-plugin endpoints
// stop (the kubelet marks their devices unhealthy and in-flight Allocates
// fail), and the CDI spec loses their names, so a GPU container that restarts
// meanwhile cannot be created. So a device described before is kept, for a
// bounded time (Config.DeviceGracePeriod), through
//
//   - a failed pass (the source does not describe, or does not open again):
//     every device is kept with the health it last had, the watcher's marks
//     included, since what failed is the source, not the device; the
//     condition is False with the source's reason and says what is kept and
//     until when;
//   - a partial pass (the source describes, but not this device): the device
//     itself is in doubt, so it is kept unhealthy, with the reason.
//
// Past the grace, kept devices are removed, with a Warning Event on the Node
// and a log line naming them. A pass that describes a device again ends its
// grace: it is published as described.

// knownDevice is a device as last described, and when.
type knownDevice struct {
	dev  v1alpha1.Device
	seen time.Time
}

// keepResult is what keep did, for the caller's log, Event and requeue.
type keepResult struct {
	// kept are the devices published from the last description.
	kept int
	// until is when the first kept device goes (zero when none is kept).
	until time.Time
	// dropped are the devices whose grace ended in this pass.
	dropped []string
}

// keep remembers the devices o just described and adds to o.devices those
// described before and missing now, within grace; failure is why the source
// did not describe (nil for a pass that described). It returns what it kept
// and dropped.
func (o *opened) keep(now time.Time, grace time.Duration, failure error) keepResult {
	if o.known == nil {
		o.known = map[string]knownDevice{}
	}
	present := make(map[string]bool, len(o.devices))
	for _, d := range o.devices {
		present[d.ID] = true
		o.known[d.ID] = knownDevice{dev: cloneDevices([]v1alpha1.Device{d})[0], seen: now}
	}
	var res keepResult
	unhealthy := 0
	for _, id := range slices.Sorted(maps.Keys(o.known)) {
		if present[id] {
			continue
		}
		k := o.known[id]
		until := k.seen.Add(grace)
		if !now.Before(until) {
			delete(o.known, id)
			res.dropped = append(res.dropped, id)
			continue
		}
		d := cloneDevices([]v1alpha1.Device{k.dev})[0]
		if failure == nil {
			markUnhealthy(&d, fmt.Sprintf("not described by %s since %s; removed at %s unless described again", o.kind.SourceName(), k.seen.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339)))
		} else if reason, sick := o.health.get(id); sick {
			// The watcher stops with the source and forgets: its
			// verdict is kept with the device.
			markUnhealthy(&d, reason)
			k.dev = cloneDevices([]v1alpha1.Device{d})[0]
			o.known[id] = k
		}
		if !d.Healthy {
			unhealthy++
		}
		o.devices = append(o.devices, d)
		res.kept++
		if res.until.IsZero() || until.Before(res.until) {
			res.until = until
		}
	}
	switch {
	case res.kept > 0 && failure != nil:
		o.cond.Message += fmt.Sprintf("; keeping the %d devices last described (%d unhealthy) until %s at the latest (grace %s), with their endpoints and CDI names", res.kept, unhealthy, res.until.UTC().Format(time.RFC3339), grace)
	case res.kept > 0:
		o.cond.Message += fmt.Sprintf("; %d devices described before are not now: kept unhealthy until %s at the latest (grace %s)", res.kept, res.until.UTC().Format(time.RFC3339), grace)
	}
	if len(res.dropped) > 0 {
		o.cond.Message += fmt.Sprintf("; removed %d devices not described for %s: %s", len(res.dropped), grace, strings.Join(res.dropped, ", "))
	}
	return res
}

// markUnhealthy marks d unhealthy for reason, after any reason it has.
func markUnhealthy(d *v1alpha1.Device, reason string) {
	switch {
	case d.Healthy:
		d.Healthy, d.Reason = false, reason
	case !strings.Contains(d.Reason, reason):
		d.Reason += "; " + reason
	}
}

// DefaultDeviceGracePeriod is Config.DeviceGracePeriod's default: longer than
// a driver container's restart or a burst of NVML errors, short enough that
// GPUs that are really gone leave the inventory within minutes.
const DefaultDeviceGracePeriod = 5 * time.Minute

// reportKept reports what o.describe kept and dropped: the gauge of kept
// devices, a log line and Event for the dropped, and a pass queued for when
// the first kept device's grace ends, so it goes on time even when nothing
// else describes the source before.
func (r *running) reportKept(ctx context.Context, o *opened, res keepResult) {
	logger := klog.FromContext(ctx).WithValues("source", o.kind.SourceName())
	r.a.metrics.keptDevices.WithLabelValues(o.kind.SourceName()).Set(float64(res.kept))
	if len(res.dropped) > 0 {
		logger.Info("devices removed: not described within the grace period", "devices", res.dropped, "grace", r.a.config.DeviceGracePeriod, "reason", o.cond.Message)
		r.recorder.Eventf(r.node, corev1.EventTypeWarning, "DevicesRemoved", "%s: %d devices removed, not described for %s: %s", o.kind.SourceName(), len(res.dropped), r.a.config.DeviceGracePeriod, strings.Join(res.dropped, ", "))
	}
	if res.kept > 0 {
		logger.V(2).Info("devices kept from the last description", "devices", res.kept, "until", res.until, "reason", o.cond.Message)
		r.queue.AddAfter(o.pass, time.Until(res.until))
	}
}
