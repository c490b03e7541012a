// Command scheduler is kube-scheduler built with resclass's framework plugins, the
// out-of-tree way (kubernetes-sigs/scheduler-plugins): every upstream plugin keeps
// working and ours are enabled through a KubeSchedulerConfiguration profile
// (deploy/scheduler/config.yaml). Its imports are upstream kube-scheduler's
// main's, so that it offers what kube-scheduler offers.
package main

import (
	"fmt"
	"os"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go's request metrics on /metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // kubernetes_build_info on /metrics
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/pkg/features"

	"github.com/resclass/resclass/pkg/scheduler/nodefit"
	"github.com/resclass/resclass/pkg/scheduler/readiness"
	"github.com/resclass/resclass/pkg/scheduler/resourceclasses"
)

// plugins are resclass's, beside upstream's: ResourceClasses, and
// NodeResourcesFit shown pods without their class requests (the shipped
// profile runs it in NodeResourcesFit's place).
var plugins = []app.Option{
	app.WithPlugin(resourceclasses.Name, resourceclasses.New),
	app.WithPlugin(nodefit.Name, nodefit.New),
}

func main() {
	// Every ResourceClass has a DeviceClass whose extendedResourceName is the
	// class's resource, class.resclass.io/<class> (docs/dra.md). With
	// DRAExtendedResource on, the DynamicResources plugin would claim those
	// requests through DRA on every node that does not advertise the resource,
	// which is every node here: ResourceClasses' own plugin serves them on
	// device-plugin nodes, and DRA nodes are the stock scheduler's. So the
	// gate is off by default in this binary (--feature-gates can still set it).
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{string(features.DRAExtendedResource): false}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(cli.Run(readiness.Command(app.NewSchedulerCommand(plugins...))))
}
