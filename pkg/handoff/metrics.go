package handoff

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the allocator's Prometheus metrics. A nil *Metrics counts nothing.
type Metrics struct {
	outcomes *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	orders   *prometheus.CounterVec
	holders  *holderCollector
}

// NewMetrics registers the allocator's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "resclass_node_agent_allocations_total",
			Help: "Allocate calls by class and outcome: allocated (the scheduler's devices), mismatch (the kubelet chose other devices than the scheduler assigned: refused), unassigned (no pod was assigned these devices: refused), invalid (malformed request), error (the devices left the node).",
		}, []string{"class", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "resclass_node_agent_kubelet_call_duration_seconds",
			Help:    "Time to answer a kubelet call (preferred: GetPreferredAllocation, allocate: Allocate), per container, including any wait for the pod to reach the agent's cache.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 4, 10),
		}, []string{"call"}),
		orders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "resclass_node_agent_admission_order_total",
			Help: "Kubelet calls for which several pods waited for the same devices, by call (preferred, allocate) and result: asked (the kubelet's PodResources API named the pod it admits), waited (it admits a pod not in the agent's cache yet), guessed (it did not answer: the oldest pod was taken).",
		}, []string{"call", "result"}),
	}
	m.holders = newHolderCollector()
	reg.MustRegister(m.outcomes, m.latency, m.orders, m.holders)
	return m
}

func (m *Metrics) outcome(class, outcome string) {
	if m != nil {
		m.outcomes.WithLabelValues(class, outcome).Inc()
	}
}

func (m *Metrics) observe(call string, start time.Time) {
	if m != nil {
		m.latency.WithLabelValues(call).Observe(time.Since(start).Seconds())
	}
}

func (m *Metrics) order(call, result string) {
	if m != nil {
		m.orders.WithLabelValues(call, result).Inc()
	}
}

// AttachHolders adds src's holdings to the device_holder series until the
// returned func detaches it.
func (m *Metrics) AttachHolders(src HolderSource) (detach func()) {
	if m == nil {
		return func() {}
	}
	c := m.holders
	c.mu.Lock()
	c.sources = append(c.sources, src)
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if i := slices.Index(c.sources, src); i >= 0 {
			c.sources = slices.Delete(c.sources, i, i+1)
		}
	}
}

// attach makes a's records the device_holder series until the returned func
// detaches it (unless another allocator was attached since).
func (m *Metrics) attach(a *Allocator) (detach func()) {
	if m == nil {
		return func() {}
	}
	m.holders.allocator.Store(a)
	return func() { m.holders.allocator.CompareAndSwap(a, nil) }
}
