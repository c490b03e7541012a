package main

import (
	"testing"

	"github.com/resclass/resclass/internal/maintest"
)

// The binary logs as --logging-format says: a failing start is one JSON line.
func TestLoggingFormatJSON(t *testing.T) {
	maintest.WantJSONLog(t, main, "--logging-format=json", "--kubeconfig=/nonexistent/kubeconfig")
}
