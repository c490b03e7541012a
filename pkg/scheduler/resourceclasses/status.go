package resourceclasses

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	listers "github.com/resclass/resclass/pkg/client/listers/resclass/v1alpha1"
)

// statusWriter keeps every ResourceClass's status (seed 003's
// ResourceClassStatus) in step with the cache: allocatable, the healthy devices
// the class selects cluster-wide, and requested, the devices pods hold through
// it, with the same per node. Changes are debounced: a burst of bindings is one
// write per class. Only the holder of a Lease writes, so replicas do not fight;
// the figures come from the informers every replica has, so the writer need not
// be the scheduling leader.
type statusWriter struct {
	cache    *cache
	client   versioned.Interface
	lister   listers.ResourceClassLister
	kube     kubernetes.Interface
	args     *Args
	synced   func() bool
	kicked   chan struct{}
	identity string
}

func newStatusWriter(c *cache, client versioned.Interface, lister listers.ResourceClassLister, kube kubernetes.Interface, args *Args, synced func() bool) *statusWriter {
	host, _ := os.Hostname()
	return &statusWriter{cache: c, client: client, lister: lister, kube: kube, args: args, synced: synced,
		kicked: make(chan struct{}, 1), identity: host + "_" + string(uuid.NewUUID())}
}

// kick says something changed; it never blocks.
func (w *statusWriter) kick() {
	select {
	case w.kicked <- struct{}{}:
	default:
	}
}

func (w *statusWriter) run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("class-status")
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: w.args.StatusLeaseNamespace, Name: w.args.StatusLeaseName},
		Client:     w.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: w.identity},
	}
	for ctx.Err() == nil {
		leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
			Lock:          lock,
			LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
			ReleaseOnCancel: true,
			Name:            "resclass-class-status",
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					logger.Info("Writing ResourceClass status as leader", "lease", klog.KObj(&lock.LeaseMeta))
					w.write(ctx, logger)
				},
				OnStoppedLeading: func() { logger.Info("No longer the ResourceClass status writer") },
			},
		})
	}
}

// write runs while leading: wait for a change, let the burst settle, write.
func (w *statusWriter) write(ctx context.Context, logger klog.Logger) {
	w.kick() // the first pass writes whatever is stale
	retry := time.NewTimer(0)
	<-retry.C
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kicked:
		case <-retry.C:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.args.StatusUpdateInterval.Duration):
		}
		if !w.synced() {
			retry.Reset(w.args.StatusUpdateInterval.Duration)
			continue
		}
		if err := w.sync(ctx, logger); err != nil {
			logger.Error(err, "Writing ResourceClass status; retrying")
			retry.Reset(5 * w.args.StatusUpdateInterval.Duration)
		}
	}
}

// sync writes every class whose status differs from the cache's figures.
func (w *statusWriter) sync(ctx context.Context, logger klog.Logger) error {
	want := w.cache.classStatus()
	classes, err := w.lister.List(labels.Everything())
	if err != nil {
		return err
	}
	var failed error
	for _, rc := range classes {
		status, ok := want[rc.Name]
		if !ok {
			status = v1alpha1.ResourceClassStatus{}
		}
		status.Conditions = rc.Status.Conditions
		if equality.Semantic.DeepEqual(rc.Status, status) {
			continue
		}
		next := rc.DeepCopy()
		next.Status = status
		_, err := w.client.ResclassV1alpha1().ResourceClasses().UpdateStatus(ctx, next, metav1.UpdateOptions{FieldManager: "resclass-scheduler"})
		switch {
		case err == nil:
			statusWrites.WithLabelValues("written").Inc()
			logger.V(4).Info("ResourceClass status written", "class", rc.Name, "allocatable", status.Allocatable.String(), "requested", status.Requested.String())
		case apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			statusWrites.WithLabelValues("conflict").Inc()
			failed = fmt.Errorf("class %s: %w", rc.Name, err)
		default:
			statusWrites.WithLabelValues("error").Inc()
			failed = fmt.Errorf("class %s: %w", rc.Name, err)
		}
	}
	return failed
}

// classStatus computes every known class's status from the cache. A device
// counts as allocatable when it is healthy and may be given out (not a GPU in
// MIG mode); a hugepage pool counts as one. Requested counts each pod's distinct
// devices per class; a shared pool counts once per pod using it.
func (c *cache) classStatus() map[string]v1alpha1.ResourceClassStatus {
	c.mu.RLock()
	defer c.mu.RUnlock()
	type counts struct{ allocatable, requested int64 }
	perNode := map[string]map[string]*counts{} // class -> node -> counts
	get := func(class, node string) *counts {
		if perNode[class] == nil {
			perNode[class] = map[string]*counts{}
		}
		if perNode[class][node] == nil {
			perNode[class][node] = &counts{}
		}
		return perNode[class][node]
	}
	for name, n := range c.nodes {
		for class, idx := range n.matches {
			cn := get(class, name)
			for _, i := range idx {
				if d := n.devices[i]; d.healthy && !d.excluded {
					cn.allocatable++
				}
			}
		}
	}
	twice := 0
	for _, h := range c.pods {
		if h.blocked != nil {
			// Held, which devices unknown (cache.go, holding).
			for class, k := range h.blocked {
				if c.classes[class] != nil {
					get(class, h.node).requested += int64(k)
				}
			}
			continue
		}
		for class, ids := range h.devices {
			if c.classes[class] != nil {
				get(class, h.node).requested += int64(len(ids))
			}
		}
	}
	for _, n := range c.nodes {
		for _, d := range n.devices {
			if d.holders > 1 {
				twice++
			}
		}
	}
	conflicts.Set(float64(twice))
	out := map[string]v1alpha1.ResourceClassStatus{}
	for class := range c.classes {
		var s v1alpha1.ResourceClassStatus
		var alloc, req int64
		for _, node := range slices.Sorted(maps.Keys(perNode[class])) {
			n := perNode[class][node]
			alloc += n.allocatable
			req += n.requested
			s.Nodes = append(s.Nodes, v1alpha1.ResourceClassNodeStatus{Name: node, Allocatable: n.allocatable, Requested: n.requested})
		}
		s.Allocatable = *resource.NewQuantity(alloc, resource.DecimalSI)
		s.Requested = *resource.NewQuantity(req, resource.DecimalSI)
		out[class] = s
	}
	return out
}
