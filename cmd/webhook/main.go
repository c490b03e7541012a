// Command webhook serves resclass's admission webhooks (ResourceClass validation,
// the pod affinity and covering-quota policies); see pkg/webhook and
// docs/webhook.md.
package main

import (
	"os"

	"k8s.io/component-base/cli"

	"github.com/resclass/resclass/pkg/webhook"
)

func main() {
	os.Exit(cli.Run(webhook.NewCommand()))
}
