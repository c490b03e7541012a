package draplugin

import (
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
)

// healthResend is how often the health stream repeats the whole list when
// nothing changed: the kubelet takes a device it has not heard of within its
// health-check timeout as Unknown.
const healthResend = 30 * time.Second

// maxHealthMessage is the kubelet's limit on a device's health message.
const maxHealthMessage = 1024

// healthHub keeps the health of the published devices and wakes the
// kubelet's health streams (ResourceHealthStatus: the kubelet shows it in the
// pod status of containers holding the device) when it changes.
type healthHub struct {
	mu      sync.Mutex
	devices map[string]deviceHealth // DRA name -> health
	changed chan struct{}           // closed and replaced on every change
}

type deviceHealth struct {
	healthy bool
	reason  string
	since   time.Time
}

func newHealthHub() *healthHub {
	return &healthHub{devices: map[string]deviceHealth{}, changed: make(chan struct{})}
}

// set records the health of the published devices by DRA name.
func (h *healthHub) set(now time.Time, health map[string]deviceHealth) {
	h.mu.Lock()
	defer h.mu.Unlock()
	changed := len(health) != len(h.devices)
	next := make(map[string]deviceHealth, len(health))
	for name, d := range health {
		old, ok := h.devices[name]
		if ok && old.healthy == d.healthy && old.reason == d.reason {
			d.since = old.since
		} else {
			d.since, changed = now, true
		}
		next[name] = d
	}
	h.devices = next
	if changed {
		close(h.changed)
		h.changed = make(chan struct{})
	}
}

// snapshot is the whole list for the kubelet, and the channel closed at the
// next change.
func (h *healthHub) snapshot(pool string) (*drahealthv1alpha1.NodeWatchResourcesResponse, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	resp := &drahealthv1alpha1.NodeWatchResourcesResponse{}
	for _, name := range slices.Sorted(maps.Keys(h.devices)) {
		d := h.devices[name]
		status := drahealthv1alpha1.HealthStatus_HEALTHY
		if !d.healthy {
			status = drahealthv1alpha1.HealthStatus_UNHEALTHY
		}
		msg := d.reason
		if len(msg) > maxHealthMessage {
			msg = msg[:maxHealthMessage-3] + "..."
		}
		resp.Devices = append(resp.Devices, &drahealthv1alpha1.DeviceHealth{
			Device:          &drahealthv1alpha1.DeviceIdentifier{PoolName: pool, DeviceName: name},
			Health:          status,
			LastUpdatedTime: d.since.Unix(),
			Message:         msg,
		})
	}
	return resp, h.changed
}

// NodeWatchResources implements the kubelet's DRAResourceHealth service: the
// health of every published device now, again at every change, and at least
// every healthResend.
func (p *Plugin) NodeWatchResources(_ *drahealthv1alpha1.NodeWatchResourcesRequest, stream grpc.ServerStreamingServer[drahealthv1alpha1.NodeWatchResourcesResponse]) error {
	t := time.NewTicker(healthResend)
	defer t.Stop()
	for {
		resp, changed := p.health.snapshot(p.cfg.NodeName)
		if err := stream.Send(resp); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		case <-t.C:
		}
	}
}
