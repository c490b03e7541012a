package main

import (
	"os/exec"
	"strings"
	"testing"

	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/resclass/resclass/internal/maintest"
)

// The binary logs as --logging-format says: a failing start is one JSON line.
func TestLoggingFormatJSON(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	maintest.WantJSONLog(t, main, "--logging-format=json")
}

// /metrics carries, besides the agent's own, what upstream components'
// carries: client-go's request metrics, the build info, Go and process.
func TestStandardMetrics(t *testing.T) {
	maintest.WantMetrics(t, legacyregistry.DefaultGatherer, "kubernetes_build_info", "rest_client_requests_total", "go_goroutines", "process_start_time_seconds")
}

// The agent's mapped text is most of its resident memory (docs/node-agent.md,
// "Memory"), so it links nothing that grows it for no use: cel-go and the
// apiserver's CEL libraries come with pkg/dra's DeviceClass translation (the
// agent needs pkg/dra/dradevice only), and golang.org/x/net/trace, which gRPC
// links unless built with the Dockerfile's -tags grpcnotrace, makes the linker
// keep every exported method of every type.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "grpcnotrace", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, unwanted := range []string{"github.com/google/cel-go/", "k8s.io/apiserver/pkg/cel", "golang.org/x/net/trace"} {
			if strings.HasPrefix(pkg, unwanted) {
				t.Errorf("the node agent links %s", pkg)
			}
		}
	}
}
