// Command scheduler is kube-scheduler built with resclass's framework plugins, the
// out-of-tree way (kubernetes-sigs/scheduler-plugins): every upstream plugin keeps
// working and ours are enabled through a KubeSchedulerConfiguration profile
// (deploy/scheduler/config.yaml).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/resclass/resclass/pkg/scheduler/resourceclasses"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand(app.WithPlugin(resourceclasses.Name, resourceclasses.New))))
}
