package nodeagent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/draplugin"
	"github.com/resclass/resclass/pkg/handoff"
)

// metrics are the agent's Prometheus metrics, in a registry of its own, served
// on --metrics-bind-address together with component-base's legacy registry
// (serveMetrics), which holds the Go and process collectors.
type metrics struct {
	registry    *prometheus.Registry
	devices     *prometheus.GaugeVec
	publishes   *prometheus.CounterVec
	transitions *prometheus.CounterVec
	discovery   *prometheus.HistogramVec
	// The device-plugin endpoints and the allocator.
	registrations *prometheus.CounterVec
	restarts      *prometheus.CounterVec
	handoff       *handoff.Metrics
	// cdiWrites counts CDI spec writes (written, error).
	cdiWrites *prometheus.CounterVec
	// migSlices counts MIG slices made for pods, by result; migOwned is
	// how many the ownership record lists.
	migSlices *prometheus.CounterVec
	migOwned  prometheus.Gauge
	// dra counts the DRA plugin's prepares and unprepares (DRA mode).
	dra *draplugin.Metrics
	// isolation is 1 for the node's GPU isolation state, 0 for the others.
	isolation *prometheus.GaugeVec
	// keptDevices are the devices an opened source did not describe in its
	// last pass, published from their last description (grace.go).
	keptDevices *prometheus.GaugeVec
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "resclass_node_agent_devices",
			Help: "Devices the node agent publishes, by kind and health.",
		}, []string{"kind", "healthy"}),
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "resclass_node_agent_publishes_total",
			Help: "Inventory publish attempts by result: written (the apiserver's copy differed), unchanged (no write needed) or error.",
		}, []string{"result"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "resclass_node_agent_health_transitions_total",
			Help: "Device health changes by kind and the state entered (unhealthy, healthy).",
		}, []string{"kind", "to"}),
		discovery: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "resclass_node_agent_discovery_duration_seconds",
			Help:    "Time one discovery pass takes, by source: nvml (GPUs, MIG, NVLink) or sysfs (NICs, hugepages).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"source"}),
	}
	m.registrations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "resclass_node_agent_plugin_registrations_total",
		Help: "Registrations of a class endpoint with the kubelet, by resource and result (ok, error). Each kubelet restart adds one per endpoint.",
	}, []string{"resource", "result"})
	m.restarts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "resclass_node_agent_plugin_restarts_total",
		Help: "Restarts of a class endpoint's gRPC server because it stopped or its socket was removed (a kubelet restart removes every socket).",
	}, []string{"resource"})
	m.cdiWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "resclass_node_agent_cdi_spec_writes_total",
		Help: "Writes of the CDI spec of the node's GPUs (with a CDI --device-list-strategy), by result: written, error.",
	}, []string{"result"})
	m.isolation = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "resclass_node_agent_gpu_isolation",
		Help: "1 for the node's GPU isolation state, 0 for the others: isolated (the NVIDIA container runtime refuses NVIDIA_VISIBLE_DEVICES from unprivileged containers and GPUs are named through CDI), unisolated, unknown (its configuration cannot be checked) or no-gpus; the condition GPUIsolation says why.",
	}, []string{"state"})
	m.keptDevices = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "resclass_node_agent_kept_devices",
		Help: "Devices published from their last description because the source's last pass failed or left them out, by source (nvml); they are removed once --device-grace-period passes without them being described.",
	}, []string{"source"})
	m.migSlices = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "resclass_node_agent_mig_slices_total",
		Help: "MIG slices made for pods on GPUs marked for dynamic MIG, by result: made, failed (not made: the pod fails admission), destroyed (no pod held it), forgotten (gone behind the agent's back).",
	}, []string{"result"})
	m.migOwned = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "resclass_node_agent_mig_slices",
		Help: "MIG slices the agent made that exist now, as its ownership record lists them.",
	})
	m.handoff = handoff.NewMetrics(m.registry)
	m.dra = draplugin.NewMetrics(m.registry)
	m.registry.MustRegister(m.migSlices, m.migOwned, m.keptDevices, m.isolation, m.cdiWrites, m.registrations, m.restarts, m.devices, m.publishes, m.transitions, m.discovery)
	return m
}

// observe sets the device gauges to the inventory.
func (m *metrics) observe(devices []v1alpha1.Device) {
	m.devices.Reset()
	for _, d := range devices {
		healthy := "true"
		if !d.Healthy {
			healthy = "false"
		}
		m.devices.WithLabelValues(d.Kind, healthy).Inc()
	}
}
