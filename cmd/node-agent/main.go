// Command node-agent is the resclass DaemonSet: it discovers the node's GPUs, NICs
// and hugepage pools, publishes them as the node's NodeDevices object, and serves
// the kubelet device-plugin API for every ResourceClass that selects a local device.
package main

import (
	"os"

	"k8s.io/component-base/cli"

	"github.com/resclass/resclass/pkg/nodeagent"
)

func main() {
	os.Exit(cli.Run(nodeagent.NewCommand()))
}
