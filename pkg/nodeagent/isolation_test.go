package nodeagent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/resclass/resclass/pkg/gpuisolation"
	"github.com/resclass/resclass/pkg/handoff"
)

// TestIsolationReport walks a node through the verdicts as an operator
// hardens it: an Event at each change and none while it holds, the gauge
// always on the current state.
func TestIsolationReport(t *testing.T) {
	root := t.TempDir()
	path := filepath.Join(root, gpuisolation.PackageRuntimeConfig)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	recorder := record.NewFakeRecorder(10)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}}
	m := newMetrics()
	i := newIsolation(Config{HostRoot: root, DeviceListStrategies: handoff.Strategies{handoff.StrategyCDICRI}})

	for _, step := range []struct {
		name    string
		content string // "" removes the file
		gpus    int
		state   gpuisolation.State
		event   string // "Type Reason", "" for none
	}{
		{"no GPUs, no file", "", 0, gpuisolation.StateNoGPUs, ""},
		{"GPUs appear: cannot be checked", "", 8, gpuisolation.StateUnknown, "Warning " + EventGPUIsolationUnknown},
		{"still so", "", 8, gpuisolation.StateUnknown, ""},
		{"the package's defaults", "disable-require = false\n", 8, gpuisolation.StateUnisolated, "Warning " + EventGPUsNotIsolated},
		{"again", "disable-require = false\n", 8, gpuisolation.StateUnisolated, ""},
		{"hardened", gpuisolation.KeyAcceptEnvVarUnprivileged + " = false\n", 8, gpuisolation.StateIsolated, "Normal " + EventGPUsIsolated},
		{"still hardened", gpuisolation.KeyAcceptEnvVarUnprivileged + " = false\n", 8, gpuisolation.StateIsolated, ""},
		{"broken by an edit", gpuisolation.KeyAcceptEnvVarUnprivileged + " = \"false\"\n", 8, gpuisolation.StateUnknown, "Warning " + EventGPUIsolationUnknown},
	} {
		if step.content == "" {
			_ = os.Remove(path)
		} else {
			write(step.content)
		}
		c := i.check(step.gpus)
		i.report(context.Background(), recorder, node, m, c)
		if got := gpuisolation.StateOf(c); got != step.state {
			t.Fatalf("%s: %s (%s: %s), want %s", step.name, got, c.Reason, c.Message, step.state)
		}
		for _, s := range gpuisolation.States {
			want := 0.0
			if s == step.state {
				want = 1
			}
			if got := testutil.ToFloat64(m.isolation.WithLabelValues(string(s))); got != want {
				t.Errorf("%s: resclass_node_agent_gpu_isolation{state=%q} = %v, want %v", step.name, s, got, want)
			}
		}
		select {
		case e := <-recorder.Events:
			if step.event == "" || !strings.HasPrefix(e, step.event+" ") {
				t.Errorf("%s: Event %q, want %q", step.name, e, step.event)
			}
		default:
			if step.event != "" {
				t.Errorf("%s: no Event, want %q", step.name, step.event)
			}
		}
	}
}

// TestIsolationEnvVarStrategy: the agent's own envvar strategy makes a node
// with GPUs unisolated even on a hardened runtime.
func TestIsolationEnvVarStrategy(t *testing.T) {
	root := t.TempDir()
	path := filepath.Join(root, gpuisolation.GPUOperatorRuntimeConfig)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(gpuisolation.KeyAcceptEnvVarUnprivileged+" = false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		strategies handoff.Strategies
		reason     string
	}{
		{nil, gpuisolation.ReasonIsolated},
		{handoff.Strategies{handoff.StrategyCDICRI, handoff.StrategyEnvVar}, gpuisolation.ReasonEnvVarStrategy},
		{handoff.Strategies{handoff.StrategyEnvVar}, gpuisolation.ReasonEnvVarStrategy},
	} {
		c := newIsolation(Config{HostRoot: root, DeviceListStrategies: tc.strategies}).check(2)
		if c.Reason != tc.reason {
			t.Errorf("%v: %s/%s, want %s: %s", tc.strategies, c.Status, c.Reason, tc.reason, c.Message)
		}
	}
}
