// Command webhook serves resclass's admission webhooks (ResourceClass validation,
// the affinity and quota policies, ResourceDistribution validation) and runs the
// ResourceDistribution controller.
package main

import (
	"errors"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
)

func main() {
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Serve resclass admission webhooks and the ResourceDistribution controller",
		Long: `webhook validates ResourceClasses (selectors, immutable spec), enforces the
pod-affinity namespaceSelector and covering-quota policies, validates and
authorizes ResourceDistributions and keeps their copies in sync.

Not implemented yet: the webhooks and the controller land with their issues.
This binary exists so that the layout, build and release pipeline are in place.`,
		SilenceUsage: true,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("webhook is not implemented yet")
		},
	}
	os.Exit(cli.Run(cmd))
}
