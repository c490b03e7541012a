package handoff

import (
	"cmp"
	"slices"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// holderCollector exports resclass_node_agent_device_holder from the
// allocation records of the allocator that runs (Run attaches it), read at
// scrape time: the records are what Allocate answered and what the
// kubelet's checkpoint listed, and they lose a pod when it ends or is
// deleted (forget, sweep), so the series cannot drift from them.
type holderCollector struct {
	desc      *prometheus.Desc
	allocator atomic.Pointer[Allocator]
}

func newHolderCollector() *holderCollector {
	return &holderCollector{desc: prometheus.NewDesc("resclass_node_agent_device_holder",
		"1 for each device the node agent handed to a pod through a class (what Allocate answered, or what the kubelet's checkpoint listed after a restart of the agent), "+
			"until the pod ends or is deleted; kind is the device's kind (unknown: it left the inventory). A GPU shared by several pods has one series per pod.",
		[]string{"class", "device", "kind", "namespace", "pod"}, nil)}
}

func (c *holderCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *holderCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.allocator.Load()
	if a == nil {
		return
	}
	for _, h := range a.holdings() {
		kind := "unknown"
		if d := a.device(h.device); d != nil {
			kind = d.Kind
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1, h.class, h.device, kind, h.namespace, h.pod)
	}
}

// holding is one device a pod holds through a class. Its strings are the
// records' own: collecting copies no more than their headers.
type holding struct{ class, device, namespace, pod string }

// holdings lists the (device, pod, class) of the allocation records, each
// once: two containers of a pod may hold one device (an init container's
// device reused, two shares of one GPU). Records rebuilt from the checkpoint
// for a pod the cache did not have are not kept (loadCheckpoint), so every
// record names its pod. The lock is held only to copy the tuples, not while
// the registry takes the metrics.
func (a *Allocator) holdings() []holding {
	a.recordsMu.Lock()
	out := make([]holding, 0, len(a.allocated))
	for _, r := range a.allocated {
		for _, id := range r.Devices {
			out = append(out, holding{class: r.Class, device: id, namespace: r.Namespace, pod: r.Name})
		}
	}
	a.recordsMu.Unlock()
	slices.SortFunc(out, func(x, y holding) int {
		return cmp.Or(cmp.Compare(x.device, y.device), cmp.Compare(x.namespace, y.namespace), cmp.Compare(x.pod, y.pod), cmp.Compare(x.class, y.class))
	})
	return slices.Compact(out)
}
