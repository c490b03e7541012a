// Package nodeagent is the resclass node agent: it discovers the node's devices
// (NVML itself, every other kind through its devicekind.Poller), watches their
// health, publishes them as the node's NodeDevices object and labels, serves
// the kubelet device-plugin API with one endpoint per ResourceClass (answered
// by pkg/handoff from the scheduler's assignment), keeps the CDI spec of the
// node's GPUs, and serves its own introspection API. docs/node-agent.md
// describes it for operators, docs/architecture.md its place among the three
// binaries.
package nodeagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	nvmldiscovery "github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/gpuisolation"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/mps"
)

// addLibraryFlags are how the agent finds the NVML library, for the agent and
// discover alike.
func addLibraryFlags(cmd *cobra.Command, l *nvmldiscovery.Library) {
	f := cmd.Flags()
	f.StringVar(&l.Path, "nvml-library", "", "path of libnvidia-ml.so.1, used as given (default: found below --nvml-driver-root); the file is checked for NVML's functions before any is called, so a wrong file is the condition NVMLAvailable=False/WrongLibrary, not a crash")
	f.StringVar(&l.DriverRoot, "nvml-driver-root", "", fmt.Sprintf("where the NVIDIA driver's root filesystem is mounted in the agent's container, to find %s below it (in %s) at each attempt: the host's / for a driver installed on the host (e.g. /host with --host-root=/host), the GPU operator's /run/nvidia/driver for its driver container (mounted e.g. at /driver-root). Default \"\": the dynamic linker's search path (the NVIDIA container runtime put the library there)", nvmldiscovery.LibraryName, strings.Join(nvmldiscovery.LibraryDirs, ", ")))
}

// NewCommand returns the node-agent command.
func NewCommand() *cobra.Command {
	o := serveOptions{}
	logging := logsapi.NewLoggingConfiguration()
	// The logging feature gates (LoggingAlphaOptions, LoggingBetaOptions,
	// ...), which the --log-* flags' help names, as upstream components have.
	gates := featuregate.NewFeatureGate()
	utilruntime.Must(logsapi.AddFeatureGates(gates))
	cmd := &cobra.Command{
		Use:   "node-agent",
		Short: "Discover this node's devices and serve them to the kubelet per resource class",
		Long: `node-agent runs on every node (as a DaemonSet). It discovers GPUs (NVML),
NICs (PCI/sysfs) and hugepage pools (sysfs), publishes them as the NodeDevices
object named after the node, and registers one kubelet device plugin per
ResourceClass that selects at least one local device.

Without a subcommand it runs as the DaemonSet does: it waits for its Node,
publishes NodeDevices (server-side apply, only when something changed) and the
resclass.io/* node labels, watches GPU health (NVML XID and ECC events, with
recovery) and NIC link state, and records an Event on the Node when a device
becomes unhealthy or healthy again. It serves one kubelet device-plugin
endpoint per ResourceClass and answers Allocate with the devices the scheduler
wrote into the pod's resclass.io/assignment, naming GPUs as
--device-list-strategy says. Each GPU's sharing mode follows the Node's labels
node.resclass.io/gpu-sharing and gpu-sharing.node.resclass.io/<GPU UUID>
(exclusive, time-slicing, mps), applied without a restart once no pod holds
the GPU (docs/sharing.md); a share gets its own limits (--mps-dir).

On a node labelled node.resclass.io/device-mode=dra it serves the devices
through Dynamic Resource Allocation instead: it publishes them as
ResourceSlices of the driver resclass.io and serves a DRA kubelet plugin
(--dra-plugin-dir, --dra-registration-dir), no device-plugin endpoint; a
change of the label makes it exit so that its restart serves the new mode
(docs/dra.md, "Nodes"). "node-agent discover" prints the inventory
without a cluster; "node-agent status" reads a running agent; "node-agent
mps-control" is the DaemonSet resclass-mps-control, which runs the CUDA MPS
control daemons of the node's GPUs in MPS mode (docs/sharing.md).`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		// The logging flags (--logging-format=json, -v, ...) apply to the
		// subcommands too, as upstream components apply them.
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return logsapi.ValidateAndApply(logging, gates)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context())
		},
	}
	logsapi.AddFlags(logging, cmd.PersistentFlags())
	gates.AddFlag(cmd.PersistentFlags())
	o.addFlags(cmd)
	cmd.AddCommand(newDiscoverCommand())
	cmd.AddCommand(newStatusCommand())
	cmd.AddCommand(mps.NewCommand())
	return cmd
}

type discoverOptions struct {
	hostRoot       string
	output         string
	nvml           nvmldiscovery.Library
	includeVirtual bool
	// The GPUIsolation condition's inputs, as the agent has them.
	runtimeConfigs []string
	strategies     handoff.Strategies
}

func newDiscoverCommand() *cobra.Command {
	o := discoverOptions{}
	cmd := &cobra.Command{
		Use:   "discover",
		Short: "Print this node's devices as the agent would publish them, without a cluster",
		Long: `discover finds the node's devices and prints them with the attributes that
ResourceClass selectors compare, and the state of each discovery source. It
needs no cluster: run it first on a new node.

  node-agent discover                 a table
  node-agent discover -o yaml         the NodeDevices status the agent publishes
  node-agent discover --host-root /host   when running in a container with the host's / at /host`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			status := discover(o)
			return write(cmd.OutOrStdout(), status, o.output)
		},
	}
	cmd.Flags().StringVar(&o.hostRoot, "host-root", "/", "where the host's root filesystem is mounted; sysfs is read below it")
	cmd.Flags().StringVarP(&o.output, "output", "o", "table", "output format: table, yaml or json")
	addLibraryFlags(cmd, &o.nvml)
	cmd.Flags().BoolVar(&o.includeVirtual, "include-virtual-nics", false, "also list interfaces without hardware behind them (loopback, veth, bridges)")
	addRuntimeConfigFlag(cmd, &o.runtimeConfigs)
	cmd.Flags().Var(&o.strategies, "device-list-strategy", "the agent's --device-list-strategy, for the "+gpuisolation.ConditionType+" condition (default "+string(handoff.DefaultStrategy)+")")
	return cmd
}

// discover runs every source once. A source that cannot run on this node is a
// condition, not an error: the other sources still report.
func discover(o discoverOptions) v1alpha1.NodeDevicesStatus {
	s := newSources(kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{Library: &o.nvml}}),
		devicekind.DiscoverOptions{HostRoot: o.hostRoot, IncludeVirtual: o.includeVirtual})
	defer s.close()
	s.describeOnce()
	devices, conds := s.described()
	host, hostConds := s.discoverHost()
	status := assemble(s.kinds, append(devices, host...), append(conds, hostConds...)...)
	isolation := newIsolation(Config{HostRoot: o.hostRoot, NVIDIARuntimeConfigs: o.runtimeConfigs, DeviceListStrategies: o.strategies})
	meta.SetStatusCondition(&status.Conditions, isolation.check(int(status.Summary.GPUs)))
	return status
}

func write(w io.Writer, status v1alpha1.NodeDevicesStatus, format string) error {
	switch format {
	case "yaml":
		data, err := yaml.Marshal(status)
		if err != nil {
			return err
		}
		_, err = w.Write(data)
		return err
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(status)
	case "table":
		return printTable(w, status)
	}
	return fmt.Errorf("unknown output format %q: use table, yaml or json", format)
}

func printTable(w io.Writer, status v1alpha1.NodeDevicesStatus) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var err error
	line := func(format string, args ...any) {
		if err == nil {
			_, err = fmt.Fprintf(tw, format+"\n", args...)
		}
	}
	line("ID\tKIND\tHEALTHY\tATTRIBUTES")
	for _, d := range status.Devices {
		healthy := "yes"
		if !d.Healthy {
			healthy = "no: " + d.Reason
		}
		line("%s\t%s\t%s\t%s", d.ID, d.Kind, healthy, attributeSummary(d.Attributes))
	}
	line("")
	for _, c := range status.Conditions {
		line("%s=%s\t%s\t%s", c.Type, c.Status, c.Reason, c.Message)
	}
	return errors.Join(err, tw.Flush())
}

func attributeSummary(attrs map[string]v1alpha1.DeviceAttribute) string {
	names := make([]string, 0, len(attrs))
	for name := range attrs {
		names = append(names, name)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, name := range names {
		parts = append(parts, name+"="+attrs[name].String())
	}
	return strings.Join(parts, " ")
}
