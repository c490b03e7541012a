package nodeagent

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	resclassfake "github.com/resclass/resclass/pkg/client/clientset/versioned/fake"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	nvmldiscovery "github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
)

func TestHeartbeat(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	now := time.Unix(1000, 0)
	h := newHeartbeat(time.Minute, prometheus.NewRegistry())
	h.now = func() time.Time { return now }
	for _, step := range []struct {
		name    string
		do      func()
		advance time.Duration
		live    bool
	}{
		{name: "worker not started (waiting for the apiserver)", advance: time.Hour, live: true},
		{name: "just beat", do: h.beat, live: true},
		{name: "within the bound", advance: time.Minute, live: true},
		{name: "past the bound", advance: time.Second, live: false},
		{name: "still stuck", advance: time.Hour, live: false},
		{name: "a pass finished", do: h.beat, live: true},
		{name: "stopping", do: h.stop, advance: time.Hour, live: true},
	} {
		t.Run(step.name, func(t *testing.T) {
			if step.do != nil {
				step.do()
			}
			now = now.Add(step.advance)
			if err := h.live(logger); (err == nil) != step.live {
				t.Errorf("live = %v, want live %v", err, step.live)
			}
		})
	}
}

func TestStallTimeoutFollowsThePollInterval(t *testing.T) {
	for poll, want := range map[time.Duration]time.Duration{
		10 * time.Second: 2 * time.Minute, // the floor
		time.Minute:      6 * time.Minute,
	} {
		if got := stallTimeout(poll); got != want {
			t.Errorf("stallTimeout(%s) = %s, want %s", poll, got, want)
		}
	}
}

// An NVML call that never returns wedges the agent's only worker: /healthz
// turns red, so the kubelet restarts the agent, and green again once the
// call returns.
func TestWedgedNVMLCallFailsHealthz(t *testing.T) {
	logger, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dgx, root := nvmlmock.New(), t.TempDir()
	if err := dgx.WriteSysfs(root); err != nil {
		t.Fatal(err)
	}
	// go-nvml's mock with a blocking function: the GPU count, asked at every
	// resync, blocks while wedged.
	var wedged atomic.Bool
	release := make(chan struct{})
	count := dgx.DeviceGetCountFunc
	dgx.DeviceGetCountFunc = func() (int, lib.Return) {
		if wedged.Load() {
			<-release
		}
		return count()
	}
	kube := kubefake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "wedged"}})
	agent := New(Config{
		NodeName: "wedged", HostRoot: root,
		Kinds:        kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{Binding: dgx, Health: nvmldiscovery.HealthOptions{WaitTimeout: 50 * time.Millisecond}}}),
		PollInterval: 20 * time.Millisecond, ResyncInterval: 50 * time.Millisecond, StallTimeout: 2 * time.Second,
	}, resclassfake.NewClientset(), kube)
	srv, err := serveMetrics(ctx, "127.0.0.1:0", agent.metrics, agent, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	healthz := func() (int, string) {
		client := &http.Client{Timeout: 5 * time.Second}
		resp, err := client.Get("http://" + srv.Addr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()

	eventually := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eventually("the worker runs", func() bool { return agent.worker.last.Load() != 0 })
	if code, body := healthz(); code != http.StatusOK {
		t.Fatalf("/healthz of a working agent: %d %s", code, body)
	}

	wedged.Store(true)
	var body string
	eventually("/healthz red while NVML hangs", func() bool {
		var code int
		code, body = healthz()
		return code == http.StatusInternalServerError
	})
	if !strings.Contains(body, "stall timeout 2s") {
		t.Errorf("/healthz says %q, want the stall named", body)
	}
	logger.Info("healthz while wedged", "body", body)

	wedged.Store(false)
	close(release)
	eventually("/healthz green once NVML answers", func() bool { code, _ := healthz(); return code == http.StatusOK })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
