// Package nodeagent is the resclass node agent's command line: discovery of the
// node's devices and, as its issues land, publishing them and serving the kubelet
// device-plugin API.
package nodeagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	nicdiscovery "github.com/resclass/resclass/pkg/discovery/nic"
	nvmldiscovery "github.com/resclass/resclass/pkg/discovery/nvml"
)

// Conditions, one per discovery source.
const (
	// ConditionNVML reports whether GPU discovery through NVML works on the node.
	ConditionNVML = "NVMLAvailable"
	// ConditionNICs reports whether NIC discovery works on the node.
	ConditionNICs = "NICsDiscovered"
)

// NewCommand returns the node-agent command.
func NewCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node-agent",
		Short: "Discover this node's devices and serve them to the kubelet per resource class",
		Long: `node-agent runs on every node (as a DaemonSet). It discovers GPUs (NVML),
NICs (PCI/sysfs) and hugepage pools (sysfs), publishes them as the NodeDevices
object named after the node, and registers one kubelet device plugin per
ResourceClass that selects at least one local device.

Today it discovers GPUs and NICs ("node-agent discover"); hugepage pools,
publishing and the device-plugin servers land with their issues.`,
		SilenceUsage: true,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("serving is not implemented yet; try `node-agent discover`")
		},
	}
	cmd.AddCommand(newDiscoverCommand())
	return cmd
}

type discoverOptions struct {
	hostRoot       string
	output         string
	nvmlLibrary    string
	includeVirtual bool
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
	cmd.Flags().StringVar(&o.nvmlLibrary, "nvml-library", "", "path of libnvidia-ml.so.1 (default: the dynamic linker's search path)")
	cmd.Flags().BoolVar(&o.includeVirtual, "include-virtual-nics", false, "also list interfaces without hardware behind them (loopback, veth, bridges)")
	return cmd
}

// discover runs every source. A source that cannot run on this node is a
// condition, not an error: the other sources still report.
func discover(o discoverOptions) v1alpha1.NodeDevicesStatus {
	var status v1alpha1.NodeDevicesStatus
	var opts []lib.LibraryOption
	if o.nvmlLibrary != "" {
		opts = append(opts, lib.WithLibraryPath(o.nvmlLibrary))
	}
	gpus, err := discoverGPUs(lib.New(opts...), o.hostRoot)
	cond := metav1.Condition{Type: ConditionNVML, Status: metav1.ConditionTrue, Reason: "Discovered", Message: fmt.Sprintf("%d GPUs", len(gpus))}
	switch {
	case errors.Is(err, nvmldiscovery.ErrUnavailable):
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Unavailable", err.Error()
	case err != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Failed", err.Error()
	}
	meta.SetStatusCondition(&status.Conditions, cond)
	status.Devices = append(status.Devices, gpus...)

	nics, err := nicdiscovery.Discover(nicdiscovery.Options{HostRoot: o.hostRoot, IncludeVirtual: o.includeVirtual})
	cond = metav1.Condition{Type: ConditionNICs, Status: metav1.ConditionTrue, Reason: "Discovered", Message: fmt.Sprintf("%d NICs", len(nics))}
	if err != nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Failed", err.Error()
	}
	meta.SetStatusCondition(&status.Conditions, cond)
	status.Devices = append(status.Devices, nics...)
	sort.Slice(status.Devices, func(i, j int) bool { return status.Devices[i].ID < status.Devices[j].ID })
	status.Summary = Summarize(status.Devices)
	return status
}

func discoverGPUs(l lib.Interface, hostRoot string) ([]v1alpha1.Device, error) {
	d, err := nvmldiscovery.Open(l, hostRoot)
	if err != nil {
		return nil, err
	}
	defer func() { _ = d.Close() }()
	return d.Discover()
}

// Summarize counts devices by kind for NodeDevices' printer columns.
func Summarize(devices []v1alpha1.Device) v1alpha1.DeviceSummary {
	var s v1alpha1.DeviceSummary
	for _, d := range devices {
		switch d.Kind {
		case v1alpha1.DeviceKindNvidiaGPU:
			s.GPUs++
		case v1alpha1.DeviceKindNIC:
			s.NICs++
		case v1alpha1.DeviceKindHugePages:
			s.HugePagePools++
		}
		if !d.Healthy {
			s.Unhealthy++
		}
	}
	return s
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
