// Command e2e-node runs one kubelet node of the e2e harness (package node). The
// harness starts it in a new mount namespace; it stops on SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/resclass/resclass/e2e/framework/node"
)

func main() {
	var cfg node.Config
	flag.StringVar(&cfg.Dir, "dir", "", "the node's directory (absolute); everything the node writes goes there")
	flag.StringVar(&cfg.Name, "name", "", "node name")
	flag.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig the kubelet uses")
	flag.StringVar(&cfg.Kubelet, "kubelet", "kubelet", "path of the kubelet binary")
	flag.IntVar(&cfg.KubeletPort, "kubelet-port", 10250, "kubelet API port")
	flag.IntVar(&cfg.HealthzPort, "healthz-port", 10248, "kubelet healthz port (127.0.0.1)")
	flag.StringVar(&cfg.ClientCAFile, "client-ca-file", "", "CA of the clients the kubelet accepts")
	flag.StringVar(&cfg.Labels, "labels", "", "node labels, k=v,k=v")
	flag.IntVar(&cfg.ExampleDevices, "example-devices", 0, "serve the example device plugin with this many devices")
	flag.IntVar(&cfg.Verbosity, "v", 2, "kubelet log verbosity")
	flag.Parse()
	// Everything after the flags is the node agent's command line: e2e-node [flags] -- agent args...
	cfg.Agent = flag.Args()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := node.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "e2e-node:", err)
		os.Exit(1)
	}
}
