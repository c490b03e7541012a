package distribution

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// Condition types and reasons of a ResourceDistribution's status.
const (
	// ConditionSynced is True when every target namespace holds an up-to-date
	// copy.
	ConditionSynced = "Synced"

	ReasonSynced      = "Synced"
	ReasonConflict    = "Conflict"
	ReasonInvalid     = "InvalidSpec"
	ReasonWriteFailed = "WriteFailed"
)

// Reconciler keeps the copies of each ResourceDistribution: one in every
// namespace its targets select, none elsewhere, never touching an object it
// does not own.
type Reconciler struct {
	// Client reads from the manager's cache: distributions, namespaces, and
	// only the Secrets and ConfigMaps labelled LabelDistribution (the copies).
	Client client.Client
	// APIReader reads the apiserver directly, for an object the cache does
	// not hold: a same-named object found when a create collides.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Workers is how many copies one reconcile writes at once.
	Workers int
	Clock   clock.PassiveClock
}

// SetupWithManager registers the controller: a distribution is reconciled
// when it changes, when one of its copies changes or disappears, and when any
// namespace appears, changes labels or goes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Workers <= 0 {
		r.Workers = 16
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("resourcedistribution").
		For(&v1alpha1.ResourceDistribution{}).
		Owns(&corev1.Secret{}).
		Owns(&corev1.ConfigMap{}).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.allDistributions)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(r)
}

// allDistributions maps a namespace event to every distribution: whether the
// namespace is targeted depends on each one's targets, which are cheap to
// evaluate in Reconcile.
func (r *Reconciler) allDistributions(ctx context.Context, _ client.Object) []reconcile.Request {
	var list v1alpha1.ResourceDistributionList
	if err := r.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing ResourceDistributions for a namespace event")
		return nil
	}
	reqs := make([]reconcile.Request, len(list.Items))
	for i := range list.Items {
		reqs[i] = reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}}
	}
	return reqs
}

// Reconcile brings one distribution's copies in line with its spec.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	rd := &v1alpha1.ResourceDistribution{}
	if err := r.Client.Get(ctx, req.NamespacedName, rd); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !rd.DeletionTimestamp.IsZero() {
		// The garbage collector deletes the copies through their ownerReferences.
		return reconcile.Result{}, nil
	}
	status := rd.Status.DeepCopy()
	status.ObservedGeneration = rd.Generation

	spec := field.NewPath("spec")
	res, errs := ParseResource(rd.Spec.Resource, spec.Child("resource"))
	targets, targetErrs := CompileTargets(&rd.Spec.Targets, spec.Child("targets"))
	if errs = append(errs, targetErrs...); len(errs) > 0 {
		// The webhook refuses such a spec; this is one written while it was down.
		msg := errs.ToAggregate().Error()
		r.Recorder.Eventf(rd, nil, corev1.EventTypeWarning, ReasonInvalid, "Validate", "%s", msg)
		status.Description = "Resource distribution failed: invalid spec: " + msg
		setSynced(status, rd.Generation, metav1.ConditionFalse, ReasonInvalid, msg)
		return reconcile.Result{}, r.writeStatus(ctx, rd, status)
	}

	// Every namespace event reconciles every distribution: read the cache's
	// objects as they are (nothing here changes them) rather than copying
	// every namespace each time.
	var nsList corev1.NamespaceList
	if err := r.Client.List(ctx, &nsList, client.UnsafeDisableDeepCopy); err != nil {
		return reconcile.Result{}, err
	}
	namespaces := make([]*corev1.Namespace, len(nsList.Items))
	for i := range nsList.Items {
		namespaces[i] = &nsList.Items[i]
	}
	desired := targets.Resolve(namespaces)

	owned, err := r.ownedCopies(ctx, rd, res)
	if err != nil {
		return reconcile.Result{}, err
	}

	now := r.Clock.Now()
	var (
		mu          sync.Mutex
		distributed = map[string]string{}
		conflicts   []string
		writeErrs   []error
	)
	work := make(chan string)
	var wg sync.WaitGroup
	for range min(r.Workers, max(len(desired), 1)) {
		wg.Go(func() {
			for ns := range work {
				rv, conflict, err := r.syncCopy(ctx, rd, res, ns, owned[ns], now)
				mu.Lock()
				switch {
				case err != nil:
					writeErrs = append(writeErrs, fmt.Errorf("namespace %s: %w", ns, err))
				case conflict:
					conflicts = append(conflicts, ns)
				default:
					distributed[ns] = rv
				}
				mu.Unlock()
			}
		})
	}
	for _, ns := range desired {
		work <- ns
	}
	close(work)
	wg.Wait()

	// Copies in namespaces no longer targeted: only ours, and only that exact
	// object (a UID precondition), so a foreign object created meanwhile under
	// the same name survives.
	want := make(map[string]bool, len(desired))
	for _, ns := range desired {
		want[ns] = true
	}
	for ns, obj := range owned {
		if want[ns] {
			continue
		}
		uid := obj.GetUID()
		if err := r.Client.Delete(ctx, obj, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			writeErrs = append(writeErrs, fmt.Errorf("removing the copy in %s: %w", ns, err))
			continue
		}
		log.V(2).Info("removed a copy from a namespace no longer targeted", "namespace", ns, "resource", res.String())
	}

	slices.Sort(conflicts)
	newConflicts := !slices.Equal(conflicts, namespaceNames(status.ConflictingNamespaces))
	status.Desired = int32(len(desired))
	status.Succeeded = int32(len(distributed))
	status.DistributedResources = distributed
	status.ConflictingNamespaces = make([]v1alpha1.ResourceDistributionNamespace, len(conflicts))
	for i, ns := range conflicts {
		status.ConflictingNamespaces[i] = v1alpha1.ResourceDistributionNamespace{Name: ns}
	}
	switch {
	case len(conflicts) > 0:
		msg := fmt.Sprintf("%s %q exists in %d target namespace(s) and is not this distribution's; it is left untouched: %s",
			res.Kind, res.Name, len(conflicts), strings.Join(conflicts, ", "))
		status.Description = "Resource distribution failed: Name Conflict. " + msg
		setSynced(status, rd.Generation, metav1.ConditionFalse, ReasonConflict, msg)
		if newConflicts {
			r.Recorder.Eventf(rd, nil, corev1.EventTypeWarning, ReasonConflict, "Distribute", "%s", msg)
		}
	case len(writeErrs) > 0:
		msg := errors.Join(writeErrs...).Error()
		status.Description = "Resource distribution failed: " + msg
		setSynced(status, rd.Generation, metav1.ConditionFalse, ReasonWriteFailed, msg)
	default:
		msg := fmt.Sprintf("%s %q is in sync in %d namespace(s)", res.Kind, res.Name, len(distributed))
		status.Description = "Resource distribution succeeded: " + msg
		setSynced(status, rd.Generation, metav1.ConditionTrue, ReasonSynced, msg)
	}
	if err := r.writeStatus(ctx, rd, status); err != nil {
		return reconcile.Result{}, err
	}
	if len(writeErrs) > 0 {
		return reconcile.Result{}, errors.Join(writeErrs...)
	}
	return reconcile.Result{}, nil
}

// ownedCopies returns this distribution's copies by namespace, from the cache
// of labelled copies, checked by owner UID (a label alone proves nothing).
func (r *Reconciler) ownedCopies(ctx context.Context, rd *v1alpha1.ResourceDistribution, res *Resource) (map[string]client.Object, error) {
	list := newList(res)
	// Not copied either: syncCopy copies a copy before changing it.
	if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy,
		client.MatchingLabelsSelector{Selector: labels.SelectorFromSet(labels.Set{LabelDistribution: LabelValue(rd.Name)})}); err != nil {
		return nil, err
	}
	owned := map[string]client.Object{}
	err := meta.EachListItem(list, func(o runtime.Object) error {
		obj := o.(client.Object)
		if obj.GetName() == res.Name && res.Owned(obj, rd) {
			owned[obj.GetNamespace()] = obj
		}
		return nil
	})
	return owned, err
}

// syncCopy makes the copy in ns current. It returns the copy's
// resourceVersion, or conflict when a same-named object that is not ours is
// there (which it never modifies).
func (r *Reconciler) syncCopy(ctx context.Context, rd *v1alpha1.ResourceDistribution, res *Resource, ns string, existing client.Object, now time.Time) (rv string, conflict bool, err error) {
	if existing == nil {
		created := res.Copy(ns, rd, now)
		err := r.Client.Create(ctx, created)
		if err == nil {
			return created.GetResourceVersion(), false, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return "", false, err
		}
		// Not in the cache: a foreign object, or our own copy the cache has
		// not seen yet.
		existing = res.NewObject()
		if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: res.Name}, existing); err != nil {
			return "", false, err
		}
		if !res.Owned(existing, rd) {
			return "", true, nil
		}
	}
	if res.UpToDate(existing) {
		return existing.GetResourceVersion(), false, nil
	}
	if res.NeedsRecreate(existing) {
		// A Secret's type, or an immutable object's content, cannot change in
		// place.
		uid := existing.GetUID()
		if err := r.Client.Delete(ctx, existing, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return "", false, err
		}
		created := res.Copy(ns, rd, now)
		if err := r.Client.Create(ctx, created); err != nil {
			return "", false, err
		}
		return created.GetResourceVersion(), false, nil
	}
	updated := existing.DeepCopyObject().(client.Object)
	if err := res.ApplyTo(updated, rd, now); err != nil {
		return "", false, err
	}
	if err := r.Client.Update(ctx, updated); err != nil {
		return "", false, err
	}
	return updated.GetResourceVersion(), false, nil
}

// writeStatus updates the status when it changed; Synced's transition time
// moves only with its status.
func (r *Reconciler) writeStatus(ctx context.Context, rd *v1alpha1.ResourceDistribution, status *v1alpha1.ResourceDistributionStatus) error {
	if statusEqual(&rd.Status, status) {
		return nil
	}
	updated := rd.DeepCopy()
	updated.Status = *status
	// A merge patch without a resourceVersion precondition: the status is
	// computed whole from what this reconcile observed, and a second
	// reconcile queued by the copies' own events must not fail with a
	// conflict against the status the first just wrote.
	return r.Client.Status().Patch(ctx, updated, client.MergeFrom(rd))
}

func statusEqual(a, b *v1alpha1.ResourceDistributionStatus) bool {
	ca, cb := meta.FindStatusCondition(a.Conditions, ConditionSynced), meta.FindStatusCondition(b.Conditions, ConditionSynced)
	sameCondition := (ca == nil) == (cb == nil) && (ca == nil || (ca.Status == cb.Status && ca.Reason == cb.Reason && ca.Message == cb.Message && ca.ObservedGeneration == cb.ObservedGeneration))
	return sameCondition && a.ObservedGeneration == b.ObservedGeneration && a.Description == b.Description &&
		a.Desired == b.Desired && a.Succeeded == b.Succeeded &&
		maps.Equal(a.DistributedResources, b.DistributedResources) &&
		slices.Equal(a.ConflictingNamespaces, b.ConflictingNamespaces)
}

func setSynced(status *v1alpha1.ResourceDistributionStatus, generation int64, s metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: ConditionSynced, Status: s, Reason: reason, Message: msg, ObservedGeneration: generation,
	})
}

func namespaceNames(nss []v1alpha1.ResourceDistributionNamespace) []string {
	names := make([]string, len(nss))
	for i, ns := range nss {
		names[i] = ns.Name
	}
	return names
}

func newList(res *Resource) client.ObjectList {
	if res.Kind == "Secret" {
		return &corev1.SecretList{}
	}
	return &corev1.ConfigMapList{}
}
