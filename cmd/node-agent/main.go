// Command node-agent is the resclass DaemonSet: it discovers the node's GPUs, NICs
// and hugepage pools, publishes them as the node's NodeDevices object, and serves
// the kubelet device-plugin API for every ResourceClass that selects a local device.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go's request metrics on /metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // kubernetes_build_info on /metrics

	"github.com/resclass/resclass/pkg/nodeagent"
)

func main() {
	os.Exit(cli.Run(nodeagent.NewCommand()))
}
