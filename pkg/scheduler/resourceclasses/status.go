package resourceclasses

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
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
	"github.com/resclass/resclass/pkg/scheduler/matching"
)

// statusWriter keeps every ResourceClass's status
// (v1alpha1.ResourceClassStatus; docs/scheduler.md, "ResourceClass status") in step with the cache: allocatable, the healthy devices
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
	// leaders run, besides the status writes, while this replica holds the
	// Lease (the DeviceClass controller).
	leaders []func(context.Context)
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
					for _, lead := range w.leaders {
						go lead(ctx)
					}
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

// NodeStatus is a class's supply and use on one node: what the class status
// sums, for `kubectl resclass capacity --nodes` (Snapshot.NodeStatus).
type NodeStatus struct {
	Name string
	// Allocatable is the number of healthy devices on the node that the class
	// selects; Requested of those, the ones a new pod of the class cannot get.
	// For a share class, both count units of the class (classStatusLocked).
	Allocatable, Requested int64
}

// classStatusLocked computes every known class's status from the cache (and,
// with perNode, the same per node, sorted by node name); cache.classStatus
// calls it under the read lock:
//   - allocatable: the devices the class selects that are healthy and may be
//     given out (not a GPU in MIG mode); a hugepage pool counts as one;
//   - requested: of those, the ones a new pod of the class cannot get: held by
//     any pod, whichever class it took them through, or needed by pods whose
//     assignment is not believed (cache.go, holding); a pool when it has no
//     free pages left.
//
// So allocatable − requested is how many devices a new pod of the class can
// get, and a device counts in every class that selects it. A share class
// counts units instead (docs/sharing.md): allocatable, the units of the
// class that fit the capacity of each healthy shared device it selects
// with no mode change waiting; available, those that fit what the device
// has free; requested, the difference.
func (c *cache) classStatusLocked(perNode bool) (map[string]v1alpha1.ResourceClassStatus, map[string][]NodeStatus) {
	type counts struct{ allocatable, requested int64 }
	totals := map[string]*counts{}
	var nodes map[string][]NodeStatus
	if perNode {
		nodes = map[string][]NodeStatus{}
	}
	for name, n := range c.nodes {
		for class, idx := range n.matches {
			t := totals[class]
			if t == nil {
				t = &counts{}
				totals[class] = t
			}
			alloc, room := n.capacity(class, idx)
			t.allocatable += alloc
			t.requested += alloc - room
			if perNode {
				nodes[class] = append(nodes[class], NodeStatus{Name: name, Allocatable: alloc, Requested: alloc - room})
			}
		}
	}
	twice := 0
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
		var alloc, req int64
		if t := totals[class]; t != nil {
			alloc, req = t.allocatable, t.requested
		}
		out[class] = v1alpha1.ResourceClassStatus{
			Allocatable: *resource.NewQuantity(alloc, resource.DecimalSI),
			Requested:   *resource.NewQuantity(req, resource.DecimalSI),
			Available:   *resource.NewQuantity(alloc-req, resource.DecimalSI),
		}
		if perNode {
			slices.SortFunc(nodes[class], func(a, b NodeStatus) int { return strings.Compare(a.Name, b.Name) })
		}
	}
	return out, nodes
}

// capacity is how many of the devices idx (those class selects on n) may be
// given out (alloc) and how many of those a new pod of class can get (room);
// for a share class, how many units.
func (n *nodeState) capacity(class string, idx []int) (alloc, room int64) {
	unit, shares := n.shareUnits[class]
	var free []int
	alloc, room = n.sliceCapacity(idx)
	for _, i := range idx {
		d := n.devices[i]
		if !d.healthy || d.excluded || d.slice != nil {
			continue
		}
		if shares {
			if d.shared != nil {
				alloc += unitsIn(unit, d.shared.capacity)
				room += unitsIn(unit, d.shared.free())
			}
			continue
		}
		alloc++
		switch {
		case d.pool != nil:
			if d.pool.freeBytes() > 0 {
				room++
			}
		case d.holders == 0:
			free = append(free, i)
		}
	}
	if len(free) == 0 || len(n.blocked) == 0 {
		return alloc, room + int64(len(free))
	}
	// Devices that pods whose assignment is not believed hold, which ones
	// unknown, are rows of the matching: the most a new pod gets is the
	// largest draw that leaves room for them.
	isFree := make([]bool, len(n.devices))
	for i, d := range n.devices {
		isFree[i] = d.healthy && !d.excluded && d.pool == nil && d.shared == nil && d.holders == 0
	}
	demand, cands := blockedRows(n, isFree)
	for k := len(free); k > 0; k-- {
		prob := matching.Problem{Devices: len(n.devices), Demand: append([]int{k}, demand...), Candidates: append([][]int{free}, cands...)}
		if _, ok := matching.Solve(prob); ok {
			return alloc, room + int64(k)
		}
	}
	return alloc, room
}
