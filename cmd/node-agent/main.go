// Command node-agent is the resclass DaemonSet: it discovers the node's GPUs, NICs
// and hugepage pools, publishes them as the node's NodeDevices object, and serves
// the kubelet device-plugin API for every ResourceClass that selects a local device.
package main

import (
	"errors"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
)

func main() {
	cmd := &cobra.Command{
		Use:   "node-agent",
		Short: "Discover this node's devices and serve them to the kubelet per resource class",
		Long: `node-agent runs on every node (as a DaemonSet). It discovers GPUs (NVML),
NICs (PCI/sysfs) and hugepage pools (sysfs), publishes them as the NodeDevices
object named after the node, and registers one kubelet device plugin per
ResourceClass that selects at least one local device.

Not implemented yet: discovery and the device-plugin servers land with their
issues. This binary exists so that the layout, build and release pipeline are
in place.`,
		SilenceUsage: true,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("node-agent is not implemented yet")
		},
	}
	os.Exit(cli.Run(cmd))
}
