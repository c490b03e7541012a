package mps

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/informers/externalversions"
	nvmldiscovery "github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/internal/kubeclient"
	"github.com/resclass/resclass/pkg/mpsstate"
)

type options struct {
	nodeName         string
	kubeconfig       string
	dir              string
	driverRoot       string
	binary           string
	exclusiveProcess bool
	probePeriod      time.Duration
	probeTimeout     time.Duration
	metricsAddress   string
}

// NewCommand returns "mps-control", a subcommand of node-agent (one image
// for both DaemonSets).
func NewCommand() *cobra.Command {
	o := options{}
	cmd := &cobra.Command{
		Use:   "mps-control",
		Short: "Run the CUDA MPS control daemon of every GPU of this node in MPS mode",
		Long: `mps-control runs as the DaemonSet resclass-mps-control on nodes where the
node agent publishes resclass.io/gpu-sharing-mps=true (docs/sharing.md,
"Where the MPS control daemon runs"). It watches its node's NodeDevices and,
for every GPU published in sharing mode MPS, runs one nvidia-cuda-mps-control
with CUDA_VISIBLE_DEVICES set to the GPU and its pipe and log directories in
--mps-dir/<GPU UUID>/; it probes each (get_server_list), starts a daemon that
died or stopped answering again after a backoff, and quits one whose GPU left
MPS mode. It writes each daemon's state to --mps-dir/<GPU UUID>/state, which
the node agent reads before it hands out MPS shares of the GPU.

On SIGTERM it quits every daemon, which ends every MPS client of the node:
the DaemonSet's updateStrategy is OnDelete, so that deleting the pod is the
operator's act (docs/install.md, "MPS control daemons").`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "the node this runs on, whose NodeDevices (of the same name) says which GPUs are in MPS mode; the DaemonSet sets NODE_NAME from spec.nodeName (default $NODE_NAME)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means the pod's service account (in-cluster)")
	f.StringVar(&o.dir, "mps-dir", mpsstate.DefaultDir, "directory of the GPUs' MPS directories, <dir>/<GPU UUID>/{pipe,log,state}, as this process sees it: the host's "+mpsstate.DefaultDir+", which the node agent reads and MPS clients mount; with --driver-root it must be below it (e.g. /driver-root"+mpsstate.DefaultDir+")")
	f.StringVar(&o.driverRoot, "driver-root", "", "where the NVIDIA driver's root filesystem is mounted (the host's / for a driver installed on the host): the daemons run chrooted there, so that nvidia-cuda-mps-control finds nvidia-cuda-mps-server and the driver's libraries as installed, and NVML is loaded from below it for --exclusive-process. \"\": no chroot, the programs in PATH and NVML through the dynamic linker's search path")
	f.StringVar(&o.binary, "mps-control-binary", DefaultBinary, "the MPS control program: a path (inside --driver-root when set), or a name looked up in PATH, or with --driver-root in its usr/bin, usr/sbin, usr/local/bin, bin and sbin")
	f.BoolVar(&o.exclusiveProcess, "exclusive-process", true, "set each GPU's compute mode to EXCLUSIVE_PROCESS through NVML before its daemon starts, so that no process uses the GPU except through the MPS server (whose clients' limits are then the only way in), and back to DEFAULT after the daemon quit")
	f.DurationVar(&o.probePeriod, "probe-period", 10*time.Second, fmt.Sprintf("how often each daemon is probed (echo get_server_list | nvidia-cuda-mps-control) and its state file rewritten; a daemon that fails %d probes in a row is killed and started again. At most %s: the node agent takes an older state for a dead DaemonSet pod", probeFailures, mpsstate.StaleAfter/3))
	f.DurationVar(&o.probeTimeout, "probe-timeout", 5*time.Second, "how long one probe (and one quit) may take before it counts as failed")
	f.StringVar(&o.metricsAddress, "metrics-bind-address", ":9421", "address of the plain-HTTP /metrics (resclass_mps_daemons_running, resclass_mps_daemon_restarts_total), /healthz (a supervision pass finished recently) and /readyz (the first pass is done) endpoint; \"0\" turns it off")
	return cmd
}

func (o *options) run(ctx context.Context) error {
	// SIGTERM (the pod deleted) ends ctx: the daemons are quit.
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	logger := klog.FromContext(ctx)
	if o.nodeName == "" {
		return errors.New("--node-name (or NODE_NAME) is required: the node this runs on")
	}
	resclass, kube, err := kubeclient.New(o.kubeconfig, "resclass-mps-control/"+o.nodeName)
	if err != nil {
		return err
	}

	cfg := Config{Dir: o.dir, DriverRoot: o.driverRoot, Binary: o.binary, ExclusiveProcess: o.exclusiveProcess,
		ProbePeriod: o.probePeriod, ProbeTimeout: o.probeTimeout, Metrics: NewMetrics()}
	if o.exclusiveProcess {
		nvml, err := nvmldiscovery.Library{DriverRoot: o.driverRoot}.Load()
		if err != nil {
			return fmt.Errorf("NVML, for --exclusive-process: %w", err)
		}
		modes := &NVMLComputeMode{NVML: nvml}
		defer modes.Close()
		cfg.ComputeMode = modes
	}
	broadcaster := record.NewBroadcaster(record.WithContext(context.WithoutCancel(ctx)))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "resclass-mps-control", Host: o.nodeName})
	// The kubelet's reference to its Node: the name as UID, no read of the
	// Node needed.
	node := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: o.nodeName, UID: types.UID(o.nodeName)}
	cfg.Event = func(eventType, reason, message string) { recorder.Event(node, eventType, reason, message) }
	sup, err := New(cfg)
	if err != nil {
		return err
	}

	started := make(chan struct{})
	if o.metricsAddress != "0" {
		srv, err := serve(ctx, o.metricsAddress, cfg.Metrics, sup, started)
		if err != nil {
			return err
		}
		defer func() { _ = srv.Close() }()
		logger.Info("serving metrics", "address", srv.Addr)
	}

	// An informer on this node's NodeDevices only.
	byName := func(lo *metav1.ListOptions) {
		lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", o.nodeName).String()
	}
	factory := externalversions.NewSharedInformerFactoryWithOptions(resclass, 0, externalversions.WithTweakListOptions(byName))
	informer := factory.Resclass().V1alpha1().NodeDevices()
	lister := informer.Lister()
	update := func() {
		nd, err := lister.Get(o.nodeName)
		if apierrors.IsNotFound(err) {
			// Only the garbage collector deletes it, with the Node (and
			// this pod), or an operator by hand: no reason to end the
			// clients of every GPU. The agent publishes it again.
			logger.Info("no NodeDevices for this node: the daemons are kept as they are")
			return
		}
		if err != nil {
			logger.Error(err, "NodeDevices not read")
			return
		}
		sup.Update(logger, MPSDevices(nd))
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { update() },
		UpdateFunc: func(any, any) { update() },
		DeleteFunc: func(any) { update() },
	}
	if _, err := informer.Informer().AddEventHandler(handler); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		return nil // stopped before the first list: no daemon was started
	}
	update()
	sup.Run(ctx, started)
	return nil
}

// MPSDevices are the devices of nd that serve shares through MPS now. A
// device whose change away from MPS waits for its pods (RequestedMode) is
// still in MPS mode: its clients run.
func MPSDevices(nd *v1alpha1.NodeDevices) []string {
	var ids []string
	for _, d := range nd.Status.Devices {
		if d.Sharing != nil && d.Sharing.Mode == v1alpha1.SharingMPS {
			ids = append(ids, d.ID)
		}
	}
	return ids
}

// serve serves /metrics (the supervisor's, and component-base's registry as
// upstream components serve it: Go, process, client-go), /healthz and
// /readyz, over plain HTTP: what it tells (GPU UUIDs, daemon restarts) is
// the node's GPU inventory, which NodeDevices publishes to every reader
// anyway, and checking callers would need TokenReview and
// SubjectAccessReview rights the DaemonSet does not otherwise need.
func serve(ctx context.Context, address string, m *Metrics, sup *Supervisor, started <-chan struct{}) (*http.Server, error) {
	ln, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("metrics endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(prometheus.Gatherers{m.Registry, legacyregistry.DefaultGatherer}, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := sup.Live(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-started:
			_, _ = w.Write([]byte("ok"))
		default:
			http.Error(w, "NodeDevices not read yet", http.StatusServiceUnavailable)
		}
	})
	srv := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "metrics endpoint")
		}
	}()
	return srv, nil
}
