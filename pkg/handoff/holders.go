package handoff

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// holderCollector exports resclass_node_agent_device_holder from the
// allocation records of the allocator that runs (Run attaches it) and from
// the other sources attached (the DRA plugin's prepared claims), read at
// scrape time: the records are what Allocate answered and what the
// kubelet's checkpoint listed, and they lose a pod when it ends or is
// deleted (forget, sweep), so the series cannot drift from them.
type holderCollector struct {
	desc      *prometheus.Desc
	allocator atomic.Pointer[Allocator]

	mu      sync.Mutex
	sources []HolderSource
}

// HolderSource lists the devices pods hold through classes other than by
// Allocate: the DRA plugin's prepared claims.
type HolderSource interface {
	Holdings() []Holding
}

// Holding is one device a pod holds through a class; Kind is the device's
// kind ("unknown": it left the inventory).
type Holding struct{ Class, Device, Kind, Namespace, Pod string }

func newHolderCollector() *holderCollector {
	return &holderCollector{desc: prometheus.NewDesc("resclass_node_agent_device_holder",
		"1 for each device the node agent handed to a pod through a class (what Allocate answered, or what the kubelet's checkpoint listed after a restart of the agent; "+
			"on a DRA node, each pod a prepared claim was reserved for), until the pod ends or is deleted (on a DRA node, until the claim is unprepared); "+
			"kind is the device's kind (unknown: it left the inventory). A GPU shared by several pods has one series per pod.",
		[]string{"class", "device", "kind", "namespace", "pod"}, nil)}
}

func (c *holderCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *holderCollector) Collect(ch chan<- prometheus.Metric) {
	var all []Holding
	if a := c.allocator.Load(); a != nil {
		all = a.Holdings()
	}
	c.mu.Lock()
	sources := slices.Clone(c.sources)
	c.mu.Unlock()
	for _, s := range sources {
		all = append(all, s.Holdings()...)
	}
	for _, h := range sortHoldings(all) {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1, h.Class, h.Device, h.Kind, h.Namespace, h.Pod)
	}
}

// sortHoldings sorts hs and keeps each (device, pod, class) once: two
// containers of a pod may hold one device (an init container's device
// reused, two shares of one GPU).
func sortHoldings(hs []Holding) []Holding {
	slices.SortFunc(hs, func(x, y Holding) int {
		return cmp.Or(cmp.Compare(x.Device, y.Device), cmp.Compare(x.Namespace, y.Namespace), cmp.Compare(x.Pod, y.Pod), cmp.Compare(x.Class, y.Class))
	})
	return slices.CompactFunc(hs, func(x, y Holding) bool {
		return x.Device == y.Device && x.Namespace == y.Namespace && x.Pod == y.Pod && x.Class == y.Class
	})
}

// Holdings lists the (device, pod, class) of the allocation records.
// Records rebuilt from the checkpoint for a pod the cache did not have are
// not kept (loadCheckpoint), so every record names its pod. The lock is held
// only to copy the tuples, not while the registry takes the metrics.
func (a *Allocator) Holdings() []Holding {
	a.recordsMu.Lock()
	out := make([]Holding, 0, len(a.allocated))
	for _, r := range a.allocated {
		for _, id := range r.Devices {
			out = append(out, Holding{Class: r.Class, Device: id, Namespace: r.Namespace, Pod: r.Name})
		}
	}
	a.recordsMu.Unlock()
	for i := range out {
		out[i].Kind = "unknown"
		if d := a.device(out[i].Device); d != nil {
			out[i].Kind = d.Kind
		}
	}
	return out
}
