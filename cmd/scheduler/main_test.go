package main

import (
	"testing"

	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/resclass/resclass/internal/maintest"
)

// The binary logs as --logging-format says: a failing start is one JSON line.
func TestLoggingFormatJSON(t *testing.T) {
	maintest.WantJSONLog(t, main, "--logging-format=json", "--config=/nonexistent/config.yaml")
}

// /metrics carries what upstream kube-scheduler's carries besides the
// scheduler's own: client-go's request metrics and the build info.
func TestStandardMetrics(t *testing.T) {
	maintest.WantMetrics(t, legacyregistry.DefaultGatherer, "kubernetes_build_info", "rest_client_requests_total")
}
