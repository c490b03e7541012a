package resourceclasses

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/scheduler/readiness"
)

// cacheSynced is 1 once the device cache has synced. Until it has, PreFilter
// refuses every pod with class requests ("the device cache is not synced
// yet"): a NodeDevices or ResourceClass CRD missing, or RBAC that does not
// let the scheduler list them, keeps it so for ever, and a restart does not
// help. So it is readiness (pkg/scheduler/readiness) and this gauge, never
// liveness.
var cacheSynced = metrics.NewGauge(&metrics.GaugeOpts{
	Namespace: "resclass", Subsystem: "scheduler", Name: "device_cache_synced",
	Help:           "1 once the ResourceClasses plugin's device cache (NodeDevices, ResourceClasses, pods) has synced; until then pods with class requests are not scheduled. 0 for long means a CRD is missing or RBAC does not allow the list (the log says which).",
	StabilityLevel: metrics.ALPHA,
})

func init() { legacyregistry.MustRegister(cacheSynced) }

// syncReportAfter is how long the cache may take to sync before the plugin
// says, in the log, which informer does not.
const syncReportAfter = time.Minute

// syncState is the device cache's sync, by informer.
type syncState struct {
	informers map[string]func() bool
}

// unsynced names the informers not synced yet, sorted.
func (s syncState) unsynced() []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(s.informers)) {
		if !s.informers[name]() {
			out = append(out, name)
		}
	}
	return out
}

// check is the readiness check: nil once every informer has synced.
func (s syncState) check() error {
	if names := s.unsynced(); len(names) > 0 {
		return fmt.Errorf("the device cache is not synced: %s not listed yet", strings.Join(names, ", "))
	}
	return nil
}

// watchSync registers the device cache's readiness check until ctx ends and
// keeps cacheSynced; if the cache has not synced after reportAfter, it logs
// which informers have not, and what that usually means, and logs again
// when it syncs.
func watchSync(ctx context.Context, logger klog.Logger, informers map[string]func() bool, reportAfter time.Duration) {
	s := syncState{informers: informers}
	unregister := readiness.Register("resclass-device-cache", s.check)
	cacheSynced.Set(0)
	go func() {
		defer unregister()
		start := time.Now()
		reported := false
		_ = wait.PollUntilContextCancel(ctx, time.Second, true, func(context.Context) (bool, error) {
			names := s.unsynced()
			if len(names) == 0 {
				cacheSynced.Set(1)
				if reported {
					logger.Info("the device cache has synced; pods with class requests are scheduled again", "after", time.Since(start).Round(time.Second))
				}
				return true, nil
			}
			if !reported && time.Since(start) >= reportAfter {
				reported = true
				logger.Error(nil, "the device cache has not synced: the scheduler cannot list these resources, so pods with class requests are not scheduled; "+
					"check that the resclass CRDs are installed and that the scheduler's ClusterRole allows list and watch on them (a restart does not fix this; readiness stays false until it syncs)",
					"unsynced", names, "after", reportAfter)
			}
			return false, nil
		})
		<-ctx.Done()
	}()
}
