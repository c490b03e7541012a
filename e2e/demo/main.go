// Command demo starts the embedded cluster, walks through resclass's scenarios on
// it and prints what happens: `make demo`. With --keep (or DEMO_KEEP=1) the cluster
// stays up for kubectl until interrupted.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/resclass/resclass/e2e/framework"
)

func main() {
	keep := flag.Bool("keep", os.Getenv("DEMO_KEEP") == "1", "keep the cluster running until interrupted, for kubectl (also DEMO_KEEP=1)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root, err := framework.RepoRoot()
	if err == nil {
		err = run(ctx, os.Stdout, options{root: root, keep: *keep})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
	if *keep {
		fmt.Println("stopped") // after the clean-up: nothing of the cluster is left
	}
}
