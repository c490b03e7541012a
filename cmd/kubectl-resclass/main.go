// Command kubectl-resclass is the kubectl plugin "kubectl resclass": it asks
// the cluster, with the user's kubeconfig and read rights only, what the
// resclass scheduler decides (pkg/kubectlplugin). Install it by copying it
// onto the PATH.
package main

import (
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/component-base/cli"

	"github.com/resclass/resclass/pkg/kubectlplugin"
)

func main() {
	os.Exit(cli.Run(kubectlplugin.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})))
}
