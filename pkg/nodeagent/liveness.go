package nodeagent

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// minStallTimeout is the least the worker may go without finishing a pass
// before /healthz fails, whatever the poll interval: opening NVML on a node
// of many GPUs without persistence mode takes seconds per GPU, and a publish
// waits out a dead connection to the apiserver (client-go's HTTP/2 health
// check gives up after 45 s).
const minStallTimeout = 2 * time.Minute

// stallTimeout is the bound /healthz applies when Config.StallTimeout is
// unset: six poll intervals, at least minStallTimeout. The poll queues a pass
// every interval, so a worker that is not stuck finishes one at least that
// often.
func stallTimeout(poll time.Duration) time.Duration {
	return max(6*poll, minStallTimeout)
}

// heartbeat is the worker's liveness: the worker beats after every pass it
// finishes, and live fails once the last beat is older than the bound. One
// worker makes every pass, so one call that never returns (a hung NVML call,
// a wedged driver) stops the agent seeing health changes and publishing, for
// good; only a restart helps, which is what the kubelet's liveness probe
// does. Before the worker starts (waiting for the apiserver and the Node)
// and after it stops, there is nothing to judge: live is nil.
type heartbeat struct {
	bound time.Duration
	now   func() time.Time
	// last is the time of the last beat in Unix nanoseconds; 0 while the
	// worker does not run.
	last atomic.Int64
	// reported is set once a stall is logged, until the next beat.
	reported atomic.Bool
	gauge    prometheus.Gauge
}

func newHeartbeat(bound time.Duration, registry prometheus.Registerer) *heartbeat {
	h := &heartbeat{bound: bound, now: time.Now, gauge: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "resclass_node_agent_last_pass_timestamp_seconds",
		Help: "When the agent's worker last finished a pass (Unix time). /healthz fails when it is older than the stall timeout (docs/node-agent.md, \"Probes\").",
	})}
	registry.MustRegister(h.gauge)
	return h
}

// beat records a finished pass (or the worker's start).
func (h *heartbeat) beat() {
	now := h.now()
	h.last.Store(now.UnixNano())
	h.reported.Store(false)
	h.gauge.Set(float64(now.UnixNano()) / 1e9)
}

// stop says the worker no longer runs (the agent is stopping).
func (h *heartbeat) stop() { h.last.Store(0) }

// live returns an error when the worker has not finished a pass within the
// bound, logging it once per stall.
func (h *heartbeat) live(logger klog.Logger) error {
	last := h.last.Load()
	if last == 0 {
		return nil
	}
	age := h.now().Sub(time.Unix(0, last))
	if age <= h.bound {
		return nil
	}
	err := fmt.Errorf("the worker has finished no pass for %s (stall timeout %s): a call it made does not return (NVML, the apiserver); a restart is what helps", age.Round(time.Second), h.bound)
	if h.reported.CompareAndSwap(false, true) {
		logger.Error(err, "liveness failing: the worker is stuck")
	}
	return err
}

// Live returns an error when a restart of the agent is what helps: its
// worker has finished no pass within Config.StallTimeout (stuck in a call),
// or the kubelet's device-plugin directory it serves in was deleted and its
// mount still shows the deleted one (deviceplugin.Manager.Orphaned). While
// the agent waits for the apiserver at start, and while it stops, it is live.
func (a *Agent) Live(logger klog.Logger) error {
	if err := a.worker.live(logger); err != nil {
		return err
	}
	if m := a.endpoints.Load(); m != nil {
		return m.Orphaned()
	}
	return nil
}
