package resourceclasses

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2/ktesting"

	"github.com/resclass/resclass/pkg/scheduler/readiness"
)

// A device cache that cannot sync (the NodeDevices CRD missing, say) keeps
// readiness false and the gauge 0, and the log names the informer; once it
// syncs, both turn.
func TestDeviceCacheSyncIsReadiness(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var nodeDevices atomic.Bool
	synced := func() bool { return true }
	watchSync(ctx, logger, map[string]func() bool{"NodeDevices": nodeDevices.Load, "ResourceClasses": synced, "Pods": synced}, 50*time.Millisecond)

	err := readiness.Check()
	if err == nil || !strings.Contains(err.Error(), "NodeDevices not listed yet") || strings.Contains(err.Error(), "ResourceClasses") {
		t.Fatalf("readiness with NodeDevices unsynced: %v, want it named, alone", err)
	}
	if v, _ := testutil.GetGaugeMetricValue(cacheSynced); v != 0 {
		t.Errorf("%s = %v, want 0", "resclass_scheduler_device_cache_synced", v)
	}
	logs := func() string { return logger.GetSink().(ktesting.Underlier).GetBuffer().String() }
	poll(t, "the log says what does not sync", func() bool {
		return strings.Contains(logs(), "the device cache has not synced") && strings.Contains(logs(), "NodeDevices") && strings.Contains(logs(), "a restart does not fix this")
	})

	nodeDevices.Store(true)
	poll(t, "ready once synced", func() bool {
		v, _ := testutil.GetGaugeMetricValue(cacheSynced)
		return readiness.Check() == nil && v == 1
	})
	poll(t, "the log says it synced", func() bool { return strings.Contains(logs(), "the device cache has synced") })

	cancel()
	poll(t, "the check unregistered when the scheduler stops", func() bool { return readiness.Check() == nil })
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
