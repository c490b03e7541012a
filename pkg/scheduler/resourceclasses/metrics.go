package resourceclasses

import (
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// The plugin's metrics, served on the scheduler's /metrics with its own.
var (
	reservations = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace: "resclass", Subsystem: "scheduler", Name: "reservations_total",
		Help:           "Pods whose devices were reserved, by strategy and whether they are on one NUMA node (unknown: the devices publish none).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"strategy", "numa_aligned"})
	assignments = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace: "resclass", Subsystem: "scheduler", Name: "assignment_writes_total",
		Help:           "Assignment annotations written (in the Binding or by the PreBind patch), by result (written, error, invalid).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"result"})
	statusWrites = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace: "resclass", Subsystem: "scheduler", Name: "class_status_writes_total",
		Help:           "ResourceClass status writes by the leader, by result (written, conflict, error).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"result"})
	untrustedAssignments = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace: "resclass", Subsystem: "scheduler", Name: "untrusted_assignments_total",
		Help: "Pod assignment annotations the scheduler does not believe, by reason: changed, garbled or removed after the scheduler accepted them " +
			"(its decision stands), or, learned from a pod, missing, garbled, node, requests, device or class (the pod holds its requests, which devices unknown).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"reason"})
	conflicts = metrics.NewGauge(&metrics.GaugeOpts{
		Namespace: "resclass", Subsystem: "scheduler", Name: "devices_held_twice",
		Help:           "Devices that more than one pod's assignment names (should be 0; see docs/scheduler.md).",
		StabilityLevel: metrics.ALPHA,
	})
	invalidDevices = metrics.NewGauge(&metrics.GaugeOpts{
		Namespace: "resclass", Subsystem: "scheduler", Name: "invalid_devices",
		Help:           "Published devices given to no pod because an attribute cannot be read (out of its bounds or of the wrong type); the NodeDevices object has a Warning Event naming them.",
		StabilityLevel: metrics.ALPHA,
	})
	topologyQuality = metrics.NewHistogram(&metrics.HistogramOpts{
		Namespace: "resclass", Subsystem: "scheduler", Name: "topology_placement_quality",
		Help: "With strategy Topology, how well the devices reserved for a pod of two or more exclusive devices are connected: the mean over their pairs of 100 (NVLink), " +
			"75 (one PCIe switch), 50 (one PCIe root complex), 25 (one NUMA node) or 0.",
		Buckets:        []float64{0, 25, 50, 75, 99, 100},
		StabilityLevel: metrics.ALPHA,
	})
	activations = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace: "resclass", Subsystem: "scheduler", Name: "pods_activated_total",
		Help: "Waiting class pods moved back to the active queue by the plugin, by what may let them fit: node_devices (a node's NodeDevices gave a class " +
			"the pod requests more room, and the pod fits that node now), released (a pod's devices were released) or class (a class was created or changed).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"reason"})
	preemptedPods = metrics.NewCounter(&metrics.CounterOpts{
		Namespace: "resclass", Subsystem: "scheduler", Name: "preempted_device_pods_total",
		Help:           "Pods holding devices that the scheduler's preemption evicted for a higher-priority pod (each has a DevicesPreempted Event naming its devices).",
		StabilityLevel: metrics.ALPHA,
	})
)

func init() {
	legacyregistry.MustRegister(reservations, assignments, statusWrites, untrustedAssignments, conflicts, invalidDevices, topologyQuality, preemptedPods, activations)
}

// The reasons of pods_activated_total.
const (
	activatedNodeDevices = "node_devices"
	activatedReleased    = "released"
	activatedClass       = "class"
)
