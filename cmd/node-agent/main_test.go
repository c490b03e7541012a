package main

import (
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
