package mps

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// Only devices in MPS mode now, including one whose change away waits for
// its pods; not one that waits to become MPS.
func TestMPSDevices(t *testing.T) {
	nd := &v1alpha1.NodeDevices{Status: v1alpha1.NodeDevicesStatus{Devices: []v1alpha1.Device{
		{ID: "GPU-whole"},
		{ID: "GPU-mps", Sharing: &v1alpha1.DeviceSharing{Mode: v1alpha1.SharingMPS}},
		{ID: "GPU-leaving", Sharing: &v1alpha1.DeviceSharing{Mode: v1alpha1.SharingMPS, RequestedMode: v1alpha1.SharingExclusive}},
		{ID: "GPU-coming", Sharing: &v1alpha1.DeviceSharing{Mode: v1alpha1.SharingExclusive, RequestedMode: v1alpha1.SharingMPS}},
		{ID: "GPU-sliced", Sharing: &v1alpha1.DeviceSharing{Mode: v1alpha1.SharingTimeSlicing}},
	}}}
	if got := MPSDevices(nd); !slices.Equal(got, []string{"GPU-mps", "GPU-leaving"}) {
		t.Errorf("MPSDevices = %v, want [GPU-mps GPU-leaving]", got)
	}
}

// Every flag says what it does, and the defaults are the documented ones.
func TestFlags(t *testing.T) {
	cmd := NewCommand()
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name != "help" && len(f.Usage) < 40 {
			t.Errorf("--%s: help %q says too little", f.Name, f.Usage)
		}
	})
	for name, want := range map[string]string{"mps-dir": "/run/resclass/mps", "mps-control-binary": "nvidia-cuda-mps-control", "exclusive-process": "true", "probe-period": "10s", "driver-root": ""} {
		if f := cmd.Flags().Lookup(name); f == nil || f.DefValue != want {
			t.Errorf("--%s: %+v, want default %q", name, f, want)
		}
	}
	t.Setenv("NODE_NAME", "")
	cmd = NewCommand()
	cmd.SetArgs(nil)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	if err := cmd.ExecuteContext(context.Background()); err == nil || !strings.Contains(err.Error(), "--node-name") {
		t.Errorf("without a node name: %v", err)
	}
}

// /readyz waits for the first pass; /healthz fails when passes stop.
func TestEndpoints(t *testing.T) {
	h := newHarness(t, nil)
	started := make(chan struct{})
	srv, err := serve(h.ctx, "127.0.0.1:0", h.s.cfg.Metrics, h.s, started)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	status := func(path string) int {
		resp, err := http.Get("http://" + srv.Addr + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if got := status("/readyz"); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz before the first pass: %d", got)
	}
	close(started)
	if got := status("/readyz"); got != http.StatusOK {
		t.Errorf("/readyz after the first pass: %d", got)
	}
	h.s.pass(h.ctx)
	if got := status("/healthz"); got != http.StatusOK {
		t.Errorf("/healthz after a pass: %d", got)
	}
	h.clock.Step(3*h.s.cfg.ProbePeriod + quitTimeout + time.Second)
	if got := status("/healthz"); got != http.StatusInternalServerError {
		t.Errorf("/healthz with no pass for long: %d", got)
	}
	resp, err := http.Get("http://" + srv.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if !strings.Contains(string(body), "resclass_mps_daemons_running") {
		t.Errorf("/metrics lacks resclass_mps_daemons_running")
	}
}
