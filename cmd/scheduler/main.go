// Command scheduler is kube-scheduler built with resclass's framework plugins, the
// out-of-tree way (kubernetes-sigs/scheduler-plugins): every upstream plugin keeps
// working and ours are enabled through a KubeSchedulerConfiguration profile
// (deploy/scheduler/config.yaml). Its imports are upstream kube-scheduler's
// main's, so that it offers what kube-scheduler offers.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go's request metrics on /metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // kubernetes_build_info on /metrics
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/resclass/resclass/pkg/scheduler/resourceclasses"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand(app.WithPlugin(resourceclasses.Name, resourceclasses.New))))
}
