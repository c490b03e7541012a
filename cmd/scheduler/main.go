// Command scheduler is kube-scheduler built with resclass's framework plugins, the
// out-of-tree way (kubernetes-sigs/scheduler-plugins): every upstream plugin keeps
// working and ours are enabled through a KubeSchedulerConfiguration profile.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	// The ResourceClasses plugin registers here (app.WithPlugin) when it lands; until
	// then this is the stock kube-scheduler of the pinned Kubernetes release.
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
