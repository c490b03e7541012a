package nodeagent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/cdispec"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	nvmldiscovery "github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/internal/kubeclient"
	"github.com/resclass/resclass/pkg/introspection"
	"github.com/resclass/resclass/pkg/kubeletpods"
	"github.com/resclass/resclass/pkg/mpsstate"
)

type serveOptions struct {
	nodeName            string
	kubeconfig          string
	hostRoot            string
	includeVirtual      bool
	poll                time.Duration
	resync              time.Duration
	recoveryAfter       time.Duration
	ignoredXIDs         xidList
	metricsAddress      string
	pluginDir           string
	poolSlots           int
	waitForPod          time.Duration
	podResources        string
	podResourcesTimeout time.Duration
	introspection       string

	// Robustness (docs/node-agent.md, "Late drivers, partial failures and
	// shutdown").
	nvml            nvmldiscovery.Library
	nvmlRetryMax    time.Duration
	shutdownTimeout time.Duration
	shutdownDelay   time.Duration
	deviceGrace     time.Duration
	gpuFaultFile    string
	stallTimeout    time.Duration
	// How containers get their GPUs, and the CDI spec (docs/node-agent.md,
	// "Device list strategy").
	deviceListStrategies handoff.Strategies
	cdiSpecDir           string
	cdiDriverRoot        string
	// The NVIDIA container runtime's configuration, checked for GPU
	// isolation (docs/node-agent.md, "GPU isolation").
	nvidiaRuntimeConfigs []string
	// Who may read /metrics.
	metricsSecure bool
	// DRA mode (docs/dra.md, "Nodes").
	dra DRAConfig
	// GPU sharing (docs/sharing.md).
	mpsDir string
}

func (o *serveOptions) addFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "the node this agent runs on; the DaemonSet sets NODE_NAME from spec.nodeName (default $NODE_NAME)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means the pod's service account (in-cluster)")
	f.StringVar(&o.hostRoot, "host-root", "/", "where the host's root filesystem is mounted; sysfs is read below it")
	f.BoolVar(&o.includeVirtual, "include-virtual-nics", false, "also publish interfaces without hardware behind them (loopback, veth, bridges)")
	f.DurationVar(&o.poll, "poll-interval", 10*time.Second, "how often NIC link state and free hugepages are re-read from sysfs (cheap: no NVML, and nothing is written unless something changed)")
	f.DurationVar(&o.resync, "resync-interval", 5*time.Minute, "how often GPUs are re-described through NVML (MIG layout, NVLinks) and the published objects re-checked")
	f.DurationVar(&o.recoveryAfter, "gpu-recovery-after", 5*time.Minute, "how long an unhealthy GPU must go without a critical NVML event, answering NVML with no page retirement or row remapping pending, before it is healthy again")
	f.Var(&o.ignoredXIDs, "ignored-xids", fmt.Sprintf("XIDs to treat as application errors in addition to the built-in list (13, 31, 43, 45, 68, 109), e.g. --ignored-xids=94,95: decimal numbers from 1 to %d, repeatable", nvmldiscovery.MaxXID))
	f.StringVar(&o.pluginDir, "device-plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory: one endpoint (rc-<class>.sock) per ResourceClass that selects a device of this node is served and registered there; \"\" serves none (inventory only)")
	f.IntVar(&o.poolSlots, "hugepage-pool-slots", 110, "how many containers may draw from one hugepage pool at once: the slot devices each pool is to the kubelet (docs/hugepages.md); raise it with the kubelet's maxPods")
	f.StringVar(&o.podResources, "pod-resources-socket", kubeletpods.DefaultSocket, "the kubelet's PodResources API socket: when several pods wait for the same devices, the agent asks the kubelet which pods it knows, to hand the devices to the pod it admits (\"\": do not ask, take the oldest pod)")
	f.DurationVar(&o.podResourcesTimeout, "pod-resources-timeout", time.Second, "how long one question to the kubelet's PodResources API may take before the agent takes the oldest pod (counted in resclass_node_agent_admission_order_total{result=\"guessed\"})")
	f.DurationVar(&o.waitForPod, "pod-wait", 3*time.Second, "how long a kubelet Allocate or GetPreferredAllocation call waits for the agent's pod cache to show the pod it is about before answering without it")
	f.StringVar(&o.introspection, "introspection-socket", introspection.DefaultIntrospectionSocket, "`path` of the unix socket (mode 0600) of the agent's own gRPC API, which \"node-agent status\" reads: devices with their classes, allocations and refusals, health changes; \"\" serves none")
	f.StringVar(&o.metricsAddress, "metrics-bind-address", ":9420", "address of the /metrics, /healthz and /readyz endpoint; \"0\" turns it off")

	// Robustness: a late or wrong NVML library, and shutdown.
	addLibraryFlags(cmd, &o.nvml)
	f.DurationVar(&o.nvmlRetryMax, "nvml-retry-max-interval", 30*time.Second, "NVML that does not open (no driver yet, a wrong library) or goes away is tried again with backoff from 1s, doubling up to this interval; the GPUs are published once it opens, without a restart")
	f.DurationVar(&o.deviceGrace, "device-grace-period", DefaultDeviceGracePeriod, "how long GPUs described before stay published, served to the kubelet and named in the CDI spec when NVML fails (kept with their last health; NVMLAvailable=False says what is kept and until when) or stops listing one (kept unhealthy); a GPU not described again within it is removed, with a DevicesRemoved Event. 0 removes them at once")
	f.StringVar(&o.gpuFaultFile, "gpu-fault-file", "/var/run/resclass/gpu-faults.json", "where GPU faults reported by NVML events (XIDs, double-bit ECC) are kept across agent restarts, so that a GPU waiting for a reset is not published healthy again; cleared per GPU on a reset (its volatile ECC count drops) or by the recovery rule of --gpu-recovery-after, and wholly by a reboot (the file records the boot id). A corrupt file is set aside as <file>.corrupt. \"\" keeps none")
	f.DurationVar(&o.stallTimeout, "stall-timeout", 0, "/healthz fails (and the kubelet's liveness probe restarts the agent) when its worker has finished no discovery and publish pass for this long: a call that does not return, such as a hung NVML call; 0 means six --poll-interval, at least 2m")
	f.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM the agent first sets its NodeDevices condition AgentServing to False, so that the scheduler places no more pods here (at most 5s), keeps its device-plugin endpoints serving for --shutdown-delay, then drains them (their sockets removed at once; calls in flight get --pod-wait plus --pod-resources-timeout plus 1s to finish), then waits at most this long for its Events to be written, and exits 0; keep the sum below the pod's terminationGracePeriodSeconds")
	f.DurationVar(&o.shutdownDelay, "shutdown-delay", 2*time.Second, "how long a stopping agent keeps its device-plugin endpoints serving after it set AgentServing to False: a pod the scheduler bound before it read that still reaches the kubelet and is admitted; 0 drains at once")
	// Device list strategy, CDI and the metrics endpoint's access.
	f.Var(&o.deviceListStrategies, "device-list-strategy", "how a container's GPUs are named to the container runtime, one or more of (comma-separated): envvar (NVIDIA_VISIBLE_DEVICES and the device nodes, for NVIDIA's container runtime), cdi-cri (CDI names in the CRI field, for containerd 1.7+/2.x and CRI-O with CDI), cdi-annotations (CDI names in a cdi.k8s.io/ container annotation); with a CDI strategy the agent writes the CDI spec of the node's GPUs into --cdi-spec-dir. envvar works only where NVIDIA's runtime takes the variable from unprivileged containers, which lets any container that sets it reach every GPU of the node: the agent reports it as unisolated (GPUIsolation condition)")
	f.StringVar(&o.cdiSpecDir, "cdi-spec-dir", cdispec.DefaultDir, "directory the CDI spec ("+cdispec.FileName+") is written to with a CDI --device-list-strategy: one the container runtime reads (its cdi_spec_dirs)")
	addRuntimeConfigFlag(cmd, &o.nvidiaRuntimeConfigs)
	f.StringVar(&o.cdiDriverRoot, "cdi-driver-root", "/", "host path of the NVIDIA driver's root, read below --host-root, whose libraries and tools the CDI spec mounts into GPU containers: / for a driver installed on the host, /run/nvidia/driver for the GPU operator's driver container")
	f.StringVar(&o.dra.PluginDataDir, "dra-plugin-dir", "/var/lib/kubelet/plugins/resclass.io", "on a node labelled "+v1alpha1.LabelDeviceMode+"="+v1alpha1.DeviceModeDRA+": the directory of the agent's DRA kubelet plugin (its socket dra.sock and its checkpoint of prepared claims, read back after a restart); the kubelet must reach it at the same path")
	f.StringVar(&o.dra.RegistrationDir, "dra-registration-dir", "/var/lib/kubelet/plugins_registry", "on a node in DRA mode: the kubelet's plugin registration directory, where the agent's DRA plugin registers (socket resclass.io-reg.sock)")
	f.StringVar(&o.mpsDir, "mps-dir", mpsstate.DefaultDir, "host directory of the MPS control daemons of GPUs in MPS mode (docs/sharing.md), as the resclass-mps-control DaemonSet's: their states <dir>/<GPU UUID>/state are read below --host-root (a GPU whose daemon is not running takes no new share), and a container given an MPS share mounts <dir>/<GPU UUID>/pipe and <dir>/shm (as /dev/shm)")
	f.BoolVar(&o.metricsSecure, "metrics-secure", true, "serve --metrics-bind-address over HTTPS (a self-signed certificate made at start) and let only callers allowed to GET the non-resource URL /metrics read /metrics (TokenReview and SubjectAccessReview, as kube components do, decisions cached a minute, denials 10 s); /healthz and /readyz stay open for the kubelet's probes. false: plain HTTP without authentication, for a --metrics-bind-address on 127.0.0.1")
}

func (o *serveOptions) run(ctx context.Context) error {
	// SIGTERM (the kubelet stopping the pod) and Ctrl-C end ctx: Run then
	// shuts down in order and returns, and the process exits 0.
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	logger := klog.FromContext(ctx)
	if o.nodeName == "" {
		return errors.New("--node-name (or NODE_NAME) is required: the node this agent runs on")
	}
	resclass, kube, err := kubeclient.New(o.kubeconfig, "resclass-node-agent/"+o.nodeName)
	if err != nil {
		return err
	}

	xids := []uint64(o.ignoredXIDs)
	grace := o.deviceGrace
	if grace == 0 {
		grace = -1 // Config's 0 is the default
	}
	cfg := Config{
		NodeName:            o.nodeName,
		HostRoot:            o.hostRoot,
		IncludeVirtualNICs:  o.includeVirtual,
		OpenRetryMax:        o.nvmlRetryMax,
		DeviceGracePeriod:   grace,
		ShutdownTimeout:     o.shutdownTimeout,
		ShutdownDelay:       noneIfZero(o.shutdownDelay),
		StallTimeout:        o.stallTimeout,
		PollInterval:        o.poll,
		ResyncInterval:      o.resync,
		PluginDir:           o.pluginDir,
		HugepagePoolSlots:   o.poolSlots,
		WaitForPod:          o.waitForPod,
		PodResourcesSocket:  o.podResources,
		PodResourcesTimeout: o.podResourcesTimeout,
		IntrospectionSocket: o.introspection,

		DeviceListStrategies: o.deviceListStrategies,
		CDISpecDir:           o.cdiSpecDir,
		CDIDriverRoot:        o.cdiDriverRoot,
		NVIDIARuntimeConfigs: o.nvidiaRuntimeConfigs,
		DRA:                  o.dra,
		MPSDir:               o.mpsDir,
	}
	// The kinds' own settings: how NVML is found and GPU health judged.
	cfg.Kinds = kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{
		Library: &o.nvml,
		Health:  nvmldiscovery.HealthOptions{RecoveryAfter: o.recoveryAfter, IgnoredXIDs: xids},
		Faults:  openFaultFile(logger, o.gpuFaultFile),
	}, MPSDir: o.mpsDir})
	m := newMetrics()
	agent := newAgent(cfg, resclass, kube, m)

	if o.metricsAddress != "0" {
		var access kubernetes.Interface
		if o.metricsSecure {
			access = kube
		}
		srv, err := serveMetrics(ctx, o.metricsAddress, m, agent, access)
		if err != nil {
			return err
		}
		defer func() { _ = srv.Close() }()
		logger.Info("serving metrics", "address", srv.Addr)
	}
	return agent.Run(ctx)
}

// openFaultFile opens the GPU fault file, nil for none: a node where it
// cannot be read runs without it (faults are then forgotten at a restart, as
// the error logged says), never stops for it.
func openFaultFile(logger klog.Logger, path string) *nvmldiscovery.FaultFile {
	if path == "" {
		return nil
	}
	boot, err := nvmldiscovery.ReadBootID(nvmldiscovery.BootIDFile)
	if err == nil {
		var f *nvmldiscovery.FaultFile
		if f, err = nvmldiscovery.OpenFaultFile(logger, path, boot); err == nil {
			return f
		}
	}
	logger.Error(err, "GPU faults are not kept across restarts", "path", path)
	return nil
}

// serveMetrics serves /metrics, /healthz (the worker is not stuck: Live) and
// /readyz (the inventory was published at least once). With access set, it serves HTTPS,
// and /metrics answers only callers the apiserver authenticates (TokenReview)
// and authorizes to GET the non-resource URL /metrics (SubjectAccessReview):
// the inventory and health of the node are no one else's business.
func serveMetrics(ctx context.Context, address string, m *metrics, a *Agent, access kubernetes.Interface) (*http.Server, error) {
	logger := klog.FromContext(ctx)
	// The agent's own metrics, and component-base's registry as upstream
	// components serve it: the Go and process collectors, and, through
	// cmd/node-agent's imports, client-go's request metrics and
	// kubernetes_build_info.
	metricsHandler := promhttp.HandlerFor(prometheus.Gatherers{m.registry, legacyregistry.DefaultGatherer}, promhttp.HandlerOpts{})
	var tlsConfig *tls.Config
	if access != nil {
		metricsHandler = newMetricsAuth(access, metricsHandler)
		var err error
		if tlsConfig, err = selfSignedTLS(); err != nil {
			return nil, fmt.Errorf("metrics endpoint certificate: %w", err)
		}
	}
	ln, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("metrics endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metricsHandler)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := a.Live(logger); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.Published() {
			http.Error(w, "inventory not published yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	srv := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 10 * time.Second, TLSConfig: tlsConfig}
	go func() {
		var err error
		if tlsConfig != nil {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "metrics endpoint stopped")
		}
	}()
	return srv, nil
}

// selfSignedTLS makes the metrics endpoint's certificate at start, as
// controller-runtime's metrics server does without a certificate directory:
// scrapers authenticate themselves with their token; the agent's identity is
// the Pod's IP, which Prometheus's pod discovery already gives.
func selfSignedTLS() (*tls.Config, error) {
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("resclass-node-agent", nil, nil)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	// HTTP/1.1 only: HTTP/2's rapid-reset exposure is not worth it here.
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}, nil
}

// Published says whether the agent has published its inventory at least once.
func (a *Agent) Published() bool { return a.published.Load() }

// Metrics is the agent's own registry, as /metrics serves it beside
// component-base's.
func (a *Agent) Metrics() prometheus.Gatherer { return a.metrics.registry }

// xidList is --ignored-xids: parsed by nvmldiscovery.ParseXIDs, so a bad entry stops
// the agent at start with a message naming it.
type xidList []uint64

func (l *xidList) String() string {
	parts := make([]string, len(*l))
	for i, x := range *l {
		parts[i] = strconv.FormatUint(x, 10)
	}
	return strings.Join(parts, ",")
}

func (l *xidList) Set(s string) error {
	xids, err := nvmldiscovery.ParseXIDs(s)
	if err != nil {
		return err
	}
	for _, x := range xids {
		if !slices.Contains(*l, x) {
			*l = append(*l, x)
		}
	}
	return nil
}

func (l *xidList) Type() string { return "xids" }

// noneIfZero maps a flag's 0 ("none") to a Config's negative: a Config's zero
// value is its default.
func noneIfZero(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
