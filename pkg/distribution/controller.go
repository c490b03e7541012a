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
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// Condition types and reasons of a ResourceDistribution's status.
const (
	// ConditionSynced is True when every target namespace holds an up-to-date
	// copy.
	ConditionSynced = "Synced"

	// ConditionAuthorized is True when the distribution's author may make
	// every write its copies need; False names the namespaces and verbs
	// where not.
	ConditionAuthorized = "Authorized"

	ReasonSynced      = "Synced"
	ReasonConflict    = "Conflict"
	ReasonInvalid     = "InvalidSpec"
	ReasonWriteFailed = "WriteFailed"
	ReasonAuthorized  = "Authorized"
	// ReasonForbidden: the author may not make some writes (a Warning Event
	// with this reason names them too).
	ReasonForbidden = "Forbidden"
	// ReasonAuthorExpired: the author record is older than the controller's
	// --distribution-author-max-age, so nothing is written until the spec
	// is written again.
	ReasonAuthorExpired = "AuthorExpired"
	// ReasonNoAuthor: the distribution carries no valid author record
	// (v1alpha1.AnnotationAuthorPrefix), so nothing is written.
	ReasonNoAuthor = "NoAuthor"
)

// DefaultMaxStatusCopies is how many namespaces status.distributedResources
// names at most (about 30 bytes each); status.distributed counts them all.
// Admission reads the map to know where deleting or shrinking a distribution
// removes copies; when it is incomplete, admission asks for delete in every
// namespace not targeted any more (docs/distribution.md, "Where the copies
// are").
const DefaultMaxStatusCopies = 1000

// MaxStatusCopiesLimit is the largest MaxStatusCopies: the CRD refuses a
// larger map (MaxProperties), 300 kB of status, well below etcd's 1.5 MiB
// request limit next to a Secret of up to 1 MiB in the spec.
const MaxStatusCopiesLimit = 10000

// Reconciler keeps the copies of each ResourceDistribution: one in every
// namespace its targets select, none elsewhere, never touching an object it
// does not own.
type Reconciler struct {
	// Client reads from the manager's cache: distributions, namespaces, and
	// only the metadata of the Secrets and ConfigMaps labelled
	// LabelDistribution (the copies).
	Client client.Client
	// APIReader reads the apiserver directly, for what the cache does not
	// hold: a same-named object found when a create collides, and the whole
	// copy before it is updated or recreated.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Workers is how many copies one reconcile writes at once.
	Workers int
	Clock   clock.PassiveClock
	// Authorizer answers whether a distribution's author may write a copy
	// (SubjectAccessReview); every create, update and delete asks it first.
	Authorizer *Authorizer
	// Protected are resclass's own namespaces, left out of the default
	// targets (CompileTargets).
	Protected []string
	// ConflictRetry is how soon a distribution with conflicts is reconciled
	// again the first time (default DefaultConflictRetry); each look that
	// finds them still there doubles it, up to ConflictRetryMax (default
	// DefaultConflictRetryMax).
	ConflictRetry    time.Duration
	ConflictRetryMax time.Duration
	// MaxStatusCopies bounds status.distributedResources; default
	// DefaultMaxStatusCopies, at most MaxStatusCopiesLimit.
	MaxStatusCopies int
	// AuthorMaxAge, when positive, is how long an author record is replayed:
	// the groups it carries are those of the request that wrote the spec, and
	// no API tells the controller the author's groups now. Older, nothing is
	// written until the spec is written again (status.authorSince).
	AuthorMaxAge time.Duration

	// targets caches each distribution's compiled targets by UID and
	// generation, for mapping namespace events to the distributions they
	// concern.
	targetsMu sync.Mutex
	targets   map[types.UID]compiledTargets

	conflicts *conflictTracker
}

type compiledTargets struct {
	generation int64
	targets    *Targets
}

// SetupWithManager registers the controller: a distribution is reconciled
// when it changes, when one of its copies changes or disappears, and when a
// namespace it may target (or holds a copy in) appears, changes labels or
// goes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Workers <= 0 {
		r.Workers = 16
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.ConflictRetry <= 0 {
		r.ConflictRetry = DefaultConflictRetry
	}
	if r.ConflictRetryMax < r.ConflictRetry {
		r.ConflictRetryMax = max(DefaultConflictRetryMax, r.ConflictRetry)
	}
	r.conflicts = newConflictTracker(r.ConflictRetry, r.ConflictRetryMax)
	if r.Authorizer == nil {
		return errors.New("the ResourceDistribution controller needs an Authorizer")
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("resourcedistribution").
		For(&v1alpha1.ResourceDistribution{}).
		// The copies are watched, and cached, as metadata only: deciding
		// whether a copy is ours and up to date needs its owner, labels,
		// content-hash annotation and resourceVersion, never its data. So
		// the controller's memory holds no Secret data between reconciles,
		// and the apiserver sends no data on the watch; the few writes that
		// need the whole object (an update, a recreate) read it first.
		Owns(&corev1.Secret{}, builder.OnlyMetadata).
		Owns(&corev1.ConfigMap{}, builder.OnlyMetadata).
		Watches(&corev1.Namespace{}, handler.Funcs{
			CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				r.enqueueFor(ctx, q, nil, e.Object)
			},
			UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				r.enqueueFor(ctx, q, e.ObjectOld, e.ObjectNew)
			},
			DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				r.enqueueFor(ctx, q, e.Object, nil)
			},
			GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				r.enqueueFor(ctx, q, nil, e.Object)
			},
		}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(r)
}

// enqueueFor queues the distributions a namespace event concerns: those whose
// targets match the namespace before or after, and those whose status names
// it (a copy or a conflict there). An update that changes neither the labels
// nor whether the namespace is going concerns none.
func (r *Reconciler) enqueueFor(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request], oldObj, newObj client.Object) {
	oldNS, _ := oldObj.(*corev1.Namespace)
	newNS, _ := newObj.(*corev1.Namespace)
	if oldNS != nil && newNS != nil && maps.Equal(oldNS.Labels, newNS.Labels) &&
		oldNS.DeletionTimestamp.Equal(newNS.DeletionTimestamp) && oldNS.Status.Phase == newNS.Status.Phase {
		return
	}
	name := ""
	if newNS != nil {
		name = newNS.Name
		if oldNS == nil {
			r.conflicts.forgetNamespace(name)
		}
	} else if oldNS != nil {
		name = oldNS.Name
	} else {
		return
	}
	var list v1alpha1.ResourceDistributionList
	if err := r.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing ResourceDistributions for a namespace event")
		return
	}
	r.targetsMu.Lock()
	defer r.targetsMu.Unlock()
	fresh := make(map[types.UID]compiledTargets, len(list.Items))
	for i := range list.Items {
		rd := &list.Items[i]
		ct, ok := r.targets[rd.UID]
		if !ok || ct.generation != rd.Generation {
			// An invalid spec compiles to nil, which matches nothing; its
			// reconcile reports it.
			t, _ := CompileTargets(&rd.Spec.Targets, r.Protected, field.NewPath("spec", "targets"))
			ct = compiledTargets{generation: rd.Generation, targets: t}
		}
		fresh[rd.UID] = ct
		// status.conflictingNamespaces names only the first 100; the
		// others are target namespaces, which the targets' match finds.
		// A copy the status does not name (it names only the first
		// MaxStatusCopies) needs no namespace event: the copies are
		// watched, and a namespace's deletion deletes its copy.
		_, copied := rd.Status.DistributedResources[name]
		concerned := copied || ct.targets.Matches(oldNS) || ct.targets.Matches(newNS) ||
			slices.ContainsFunc(rd.Status.ConflictingNamespaces, func(n v1alpha1.ResourceDistributionNamespace) bool { return n.Name == name })
		if concerned {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: rd.Name}})
		}
	}
	// Only the distributions that exist stay cached.
	r.targets = fresh
}

// Reconcile brings one distribution's copies in line with its spec, making
// only the writes its author may make.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	rd := &v1alpha1.ResourceDistribution{}
	if err := r.Client.Get(ctx, req.NamespacedName, rd); err != nil {
		if apierrors.IsNotFound(err) {
			r.conflicts.forget(req.Name)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !rd.DeletionTimestamp.IsZero() {
		// The garbage collector deletes the copies through their ownerReferences.
		return reconcile.Result{}, nil
	}
	status := rd.Status.DeepCopy()
	status.ObservedGeneration = rd.Generation
	// Computed again below; a spec that is invalid or has no author asks no
	// SubjectAccessReview, and an old list would describe another spec.
	status.Unauthorized, status.UnauthorizedNamespaces = 0, nil

	spec := field.NewPath("spec")
	res, errs := ParseResource(rd.Spec.Resource, spec.Child("resource"))
	targets, targetErrs := CompileTargets(&rd.Spec.Targets, r.Protected, spec.Child("targets"))
	if errs = append(errs, targetErrs...); len(errs) > 0 {
		// The webhook refuses such a spec; this is one written while it was down.
		msg := boundMessage(errs.ToAggregate().Error(), maxMessageBytes)
		r.warn(rd, ReasonInvalid, "Validate", msg)
		status.Description = boundMessage("Resource distribution failed: invalid spec: "+msg, maxMessageBytes)
		setCondition(status, ConditionSynced, rd.Generation, metav1.ConditionFalse, ReasonInvalid, msg)
		return reconcile.Result{}, r.writeStatus(ctx, rd, status)
	}
	author, err := ParseAuthor(rd.Annotations)
	if err != nil {
		// Stored before resclass bound the author in the apiserver, or while
		// its admission policy was removed: nobody vouches for the spec, so
		// nothing is written for it. An author in the old JSON annotation is
		// one of these: anyone could set it while the webhook was not called.
		why := "the distribution was stored without a valid author record (before resclass recorded authors, or while its admission policy resclass-spec-author was not installed), so nobody vouches for its spec"
		if errors.Is(err, ErrOldAuthorFormat) {
			why = "an author in that format was not bound to the requester when the webhook was not called, so it does not vouch for the spec"
		}
		msg := boundMessage(fmt.Sprintf("%v (annotations %s.*): %s. "+
			"No copy is created, updated or deleted for it until someone allowed to write its copies changes its spec, which records them as the author (docs/distribution.md, \"Upgrading\")",
			err, v1alpha1.AnnotationAuthorPrefix, why), maxMessageBytes)
		if c := meta.FindStatusCondition(status.Conditions, ConditionAuthorized); c == nil || c.Message != msg {
			r.warn(rd, ReasonNoAuthor, "Authorize", msg)
		}
		status.Description = boundMessage("Resource distribution failed: "+msg, maxMessageBytes)
		setCondition(status, ConditionAuthorized, rd.Generation, metav1.ConditionFalse, ReasonNoAuthor, msg)
		setCondition(status, ConditionSynced, rd.Generation, metav1.ConditionFalse, ReasonNoAuthor, msg)
		return reconcile.Result{}, r.writeStatus(ctx, rd, status)
	}
	expired, authorLeft := authorAge(status, rd.Generation, r.Clock.Now(), r.AuthorMaxAge)
	if expired {
		msg := boundMessage(fmt.Sprintf("the author record (%s, seen since %s) is older than the controller's --distribution-author-max-age=%s: the groups it carries may no longer be the author's. "+
			"No copy is created, updated or deleted for it until someone allowed to write its copies writes its spec again, which records them afresh (docs/distribution.md, \"The author's groups, and when they are refreshed\")",
			author, status.AuthorSince.UTC().Format(time.RFC3339), r.AuthorMaxAge), maxMessageBytes)
		if c := meta.FindStatusCondition(status.Conditions, ConditionAuthorized); c == nil || c.Message != msg {
			r.warn(rd, ReasonAuthorExpired, "Authorize", msg)
		}
		status.Description = boundMessage("Resource distribution failed: "+msg, maxMessageBytes)
		setCondition(status, ConditionAuthorized, rd.Generation, metav1.ConditionFalse, ReasonAuthorExpired, msg)
		setCondition(status, ConditionSynced, rd.Generation, metav1.ConditionFalse, ReasonAuthorExpired, msg)
		return reconcile.Result{}, r.writeStatus(ctx, rd, status)
	}

	// Read the cache's namespaces as they are (nothing here changes them)
	// rather than copying every namespace each time.
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
	// Namespaces remembered as conflicting are counted so without a
	// request until it is time to look again; then one list tells which
	// still are (conflicts.go).
	foreign, due := r.conflicts.recall(rd, now)
	looked := len(foreign) == 0 || due
	if len(foreign) > 0 && due {
		if foreign, err = r.conflictLook(ctx, rd, res, foreign); err != nil {
			// Each namespace then tries its create, as the first time.
			log.Error(err, "listing the objects of the copy's name; trying each conflicting namespace instead", "resource", res.String())
			foreign = nil
		}
	}

	var (
		// distributed holds every copy there is, by namespace: the up to
		// date ones (succeeded) and those the author may no longer update or
		// delete, which stay. Admission reads it to know where deleting the
		// distribution deletes copies.
		distributed = map[string]string{}
		succeeded   int
		conflicts   []string
		forbidden   = map[string][]string{} // verb -> namespaces
		writeErrs   []writeFailure
	)
	var mu sync.Mutex
	work := make(chan string)
	var wg sync.WaitGroup
	for range min(r.Workers, max(len(desired), 1)) {
		wg.Go(func() {
			for ns := range work {
				out := r.syncCopy(ctx, rd, res, author, ns, owned[ns], foreign[ns], now)
				mu.Lock()
				switch {
				case out.err != nil:
					writeErrs = append(writeErrs, writeFailure{namespace: ns, err: out.err})
					// A copy that failed to update is still a copy:
					// deleting the distribution must still ask for it.
					if out.rv != "" {
						distributed[ns] = out.rv
					} else if obj := owned[ns]; obj != nil {
						distributed[ns] = obj.GetResourceVersion()
					}
				case out.conflict:
					conflicts = append(conflicts, ns)
				case out.forbidden != "":
					forbidden[out.forbidden] = append(forbidden[out.forbidden], ns)
					if out.rv != "" {
						distributed[ns] = out.rv // a copy, not up to date
					}
				default:
					distributed[ns] = out.rv
					succeeded++
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

	// Copies in namespaces no longer targeted: only ours, only where the
	// author may delete, and only that exact object (a UID precondition), so
	// a foreign object created meanwhile under the same name survives.
	want := make(map[string]bool, len(desired))
	for _, ns := range desired {
		want[ns] = true
	}
	for _, ns := range slices.Sorted(maps.Keys(owned)) {
		if want[ns] {
			continue
		}
		obj := owned[ns]
		ok, err := r.Authorizer.Allowed(ctx, author, VerbDelete, res.APIResource(), ns)
		if err != nil {
			writeErrs = append(writeErrs, writeFailure{namespace: ns, err: err})
			distributed[ns] = obj.GetResourceVersion()
			continue
		}
		if !ok {
			forbidden[VerbDelete] = append(forbidden[VerbDelete], ns)
			distributed[ns] = obj.GetResourceVersion()
			continue
		}
		uid := obj.GetUID()
		if err := r.Client.Delete(ctx, obj, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			writeErrs = append(writeErrs, writeFailure{namespace: ns, err: fmt.Errorf("removing the copy: %w", err)})
			distributed[ns] = obj.GetResourceVersion()
			continue
		}
		log.V(2).Info("removed a copy from a namespace no longer targeted", "namespace", ns, "resource", res.String())
	}

	slices.Sort(conflicts)
	oldConflicting, oldConflicts := status.Conflicting, status.ConflictingNamespaces
	status.Conflicting, status.ConflictingNamespaces = conflictingNamespaces(conflicts)
	newConflicts := status.Conflicting != oldConflicting || !slices.Equal(status.ConflictingNamespaces, oldConflicts)
	status.Unauthorized, status.UnauthorizedNamespaces = unauthorizedNamespaces(author, res, forbidden)
	status.Desired = int32(len(desired))
	status.Succeeded = int32(succeeded)
	status.Distributed = int32(len(distributed))
	status.DistributedResources = firstCopies(distributed, r.MaxStatusCopies)

	var problems []string
	var conflictMsg, forbiddenMsg string
	if len(conflicts) > 0 {
		conflictMsg = boundMessage(fmt.Sprintf("%s %q exists in %d target namespace(s) and is not this distribution's; it is left untouched: %s",
			res.Kind, res.Name, len(conflicts), nameList(conflicts)), maxMessageBytes)
		problems = append(problems, "Name Conflict. "+conflictMsg)
		if newConflicts {
			r.warn(rd, ReasonConflict, "Distribute", conflictMsg)
		}
	}
	if len(forbidden) > 0 {
		forbiddenMsg = forbiddenMessage(author, res, forbidden)
		problems = append(problems, forbiddenMsg)
		if c := meta.FindStatusCondition(status.Conditions, ConditionAuthorized); c == nil || c.Message != forbiddenMsg {
			r.warn(rd, ReasonForbidden, "Authorize", forbiddenMsg)
		}
		for verb, nss := range forbidden {
			forbiddenWrites.WithLabelValues(verb).Add(float64(len(nss)))
		}
		setCondition(status, ConditionAuthorized, rd.Generation, metav1.ConditionFalse, ReasonForbidden, forbiddenMsg)
	} else {
		setCondition(status, ConditionAuthorized, rd.Generation, metav1.ConditionTrue, ReasonAuthorized,
			fmt.Sprintf("the author %s may make every write the copies need", author))
	}
	var failedMsg string
	if len(writeErrs) > 0 {
		failedMsg = failureMessage(writeErrs)
		problems = append(problems, failedMsg)
	}
	switch {
	case len(conflicts) > 0:
		setCondition(status, ConditionSynced, rd.Generation, metav1.ConditionFalse, ReasonConflict, conflictMsg)
	case len(forbidden) > 0:
		setCondition(status, ConditionSynced, rd.Generation, metav1.ConditionFalse, ReasonForbidden, forbiddenMsg)
	case len(writeErrs) > 0:
		setCondition(status, ConditionSynced, rd.Generation, metav1.ConditionFalse, ReasonWriteFailed, failedMsg)
	default:
		msg := fmt.Sprintf("%s %q is in sync in %d namespace(s)", res.Kind, res.Name, succeeded)
		status.Description = boundMessage("Resource distribution succeeded: "+msg, maxMessageBytes)
		setCondition(status, ConditionSynced, rd.Generation, metav1.ConditionTrue, ReasonSynced, msg)
	}
	if len(problems) > 0 {
		status.Description = boundMessage("Resource distribution failed: "+strings.Join(problems, "; "), maxMessageBytes)
	}
	// Foreign objects are not watched: look again, soon at first, then less
	// often while the conflicts stay (conflicts.go). Recorded before the
	// status write, which notes its version in this memory, and also when
	// some writes failed, whose retries would otherwise try every conflict.
	var result reconcile.Result
	result.RequeueAfter = r.conflicts.record(rd, conflicts, looked, now)
	if err := r.writeStatus(ctx, rd, status); err != nil {
		return reconcile.Result{}, err
	}
	if len(writeErrs) > 0 {
		// The same bounded summary: the error goes into the log, once per
		// retry.
		return reconcile.Result{}, errors.New(failedMsg)
	}
	if r.AuthorMaxAge > 0 && (result.RequeueAfter == 0 || authorLeft < result.RequeueAfter) {
		// Again when the author record expires, to stop writing then.
		result.RequeueAfter = authorLeft
	}
	return result, nil
}

// authorAge keeps status.authorSince: the time the controller first saw
// the spec of this generation (and so its author record), which only it
// writes. It reports whether the record is older than maxAge (never when
// maxAge is 0) and how long it has left.
func authorAge(status *v1alpha1.ResourceDistributionStatus, generation int64, now time.Time, maxAge time.Duration) (expired bool, left time.Duration) {
	if status.AuthorSince == nil || status.AuthorGeneration != generation {
		// Stored with second precision: keep what a read gives back.
		since := metav1.NewTime(now).Rfc3339Copy()
		status.AuthorSince, status.AuthorGeneration = &since, generation
	}
	if maxAge <= 0 {
		return false, 0
	}
	left = status.AuthorSince.Add(maxAge).Sub(now)
	return left <= 0, left
}

// forbiddenMessage names, per verb, the namespaces where the author may not
// write.
func forbiddenMessage(author Author, res *Resource, forbidden map[string][]string) string {
	var parts []string
	for _, verb := range []string{VerbCreate, VerbUpdate, VerbDelete} {
		nss := forbidden[verb]
		if len(nss) == 0 {
			continue
		}
		slices.Sort(nss)
		parts = append(parts, fmt.Sprintf("%s %s in %d namespace(s): %s", verb, res.APIResource(), len(nss), nameList(nss)))
	}
	return boundMessage(fmt.Sprintf("the author %s may not %s; those writes are not made (a distribution writes a copy only where its author could write it)",
		author, strings.Join(parts, "; may not ")), maxMessageBytes)
}

// messageNames bounds the namespaces a condition message, an Event or the
// description names: a distribution over thousands of namespaces would
// otherwise write a message past the 32768 bytes a condition may hold.
// status.unauthorizedNamespaces and status.conflictingNamespaces list them.
const messageNames = 20

// Bounds on what the controller writes as text. A condition's message may
// hold 32768 bytes (the CRD), and a status patch past it is refused whole,
// so the status would go stale; an Event's note 1024 (events.k8s.io), past
// which the Event is lost. A message is built bounded (nameList,
// failureMessage); these cut whatever else grows with the input (a user
// name, the apiserver's error texts) at the sink.
const (
	maxMessageBytes = 4096
	maxEventBytes   = 1024
	// failuresNamed is how many failed namespaces a message names, each
	// with its error cut to failureErrorBytes.
	failuresNamed     = 10
	failureErrorBytes = 256
)

// writeFailure is a write the apiserver (or a SubjectAccessReview) refused
// or failed, in one namespace.
type writeFailure struct {
	namespace string
	err       error
}

// failureMessage says how many namespaces' writes failed and why in the
// first failuresNamed of them by name, each error cut short; the rest are
// counted ("and K more"). Ten thousand failures make a message of the same
// size as eleven.
func failureMessage(failures []writeFailure) string {
	sorted := slices.SortedFunc(slices.Values(failures), func(a, b writeFailure) int { return strings.Compare(a.namespace, b.namespace) })
	var b strings.Builder
	fmt.Fprintf(&b, "writes failed in %d namespace(s): ", len(sorted))
	for i, f := range sorted[:min(len(sorted), failuresNamed)] {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s", f.namespace, boundMessage(f.err.Error(), failureErrorBytes))
	}
	if len(sorted) > failuresNamed {
		fmt.Fprintf(&b, "; and %d more", len(sorted)-failuresNamed)
	}
	return boundMessage(b.String(), maxMessageBytes)
}

// boundMessage cuts msg to at most limit bytes, at a rune boundary, and says
// it was cut.
func boundMessage(msg string, limit int) string {
	const cut = " ...(cut)"
	if len(msg) <= limit {
		return msg
	}
	end := limit - len(cut)
	for end > 0 && !utf8.RuneStart(msg[end]) {
		end--
	}
	return msg[:end] + cut
}

// warn records a Warning Event on the distribution, its note bounded.
func (r *Reconciler) warn(rd *v1alpha1.ResourceDistribution, reason, action, msg string) {
	r.Recorder.Eventf(rd, nil, corev1.EventTypeWarning, reason, action, "%s", boundMessage(msg, maxEventBytes))
}

// nameList joins sorted names, the first messageNames of them, saying how
// many more there are.
func nameList(names []string) string {
	if len(names) <= messageNames {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:messageNames], ", "), len(names)-messageNames)
}

// unauthorizedNamespaces is status.unauthorized and
// status.unauthorizedNamespaces: how many namespaces the author may not write
// in, and the first v1alpha1.MaxUnauthorizedNamespaces of them by name, each
// with the verb refused and what it means for the copy there.
func unauthorizedNamespaces(author Author, res *Resource, forbidden map[string][]string) (int32, []v1alpha1.ResourceDistributionUnauthorizedNamespace) {
	var all []v1alpha1.ResourceDistributionUnauthorizedNamespace
	for verb, nss := range forbidden {
		consequence := map[string]string{
			VerbCreate: "no copy is made there",
			VerbUpdate: "the copy there keeps its old content",
			VerbDelete: "the copy there stays",
		}[verb]
		reason := fmt.Sprintf("the author %s may not %s %s in this namespace, so %s", author, verb, res.APIResource(), consequence)
		if len(reason) > 1024 {
			reason = reason[:1021] + "..."
		}
		for _, ns := range nss {
			all = append(all, v1alpha1.ResourceDistributionUnauthorizedNamespace{Name: ns, Verb: verb, Reason: reason})
		}
	}
	if len(all) == 0 {
		return 0, nil
	}
	slices.SortFunc(all, func(a, b v1alpha1.ResourceDistributionUnauthorizedNamespace) int {
		return strings.Compare(a.Name, b.Name)
	})
	total := int32(len(all))
	if len(all) > v1alpha1.MaxUnauthorizedNamespaces {
		all = all[:v1alpha1.MaxUnauthorizedNamespaces]
	}
	return total, all
}

// conflictingNamespaces is status.conflicting and
// status.conflictingNamespaces: how many target namespaces hold a foreign
// object of the copy's name, and the first v1alpha1.MaxConflictingNamespaces
// of them (sorted is sorted by name).
func conflictingNamespaces(sorted []string) (int32, []v1alpha1.ResourceDistributionNamespace) {
	if len(sorted) == 0 {
		return 0, nil
	}
	listed := make([]v1alpha1.ResourceDistributionNamespace, min(len(sorted), v1alpha1.MaxConflictingNamespaces))
	for i := range listed {
		listed[i] = v1alpha1.ResourceDistributionNamespace{Name: sorted[i]}
	}
	return int32(len(sorted)), listed
}

// ownedCopies returns this distribution's copies by namespace, from the cache
// of labelled copies, checked by owner UID (a label alone proves nothing).
func (r *Reconciler) ownedCopies(ctx context.Context, rd *v1alpha1.ResourceDistribution, res *Resource) (map[string]client.Object, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(res.Kind + "List"))
	// Not copied: nothing here changes them (syncCopy reads the whole object
	// from the apiserver before changing it).
	if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy,
		client.MatchingLabelsSelector{Selector: labels.SelectorFromSet(labels.Set{LabelDistribution: LabelValue(rd.Name)})}); err != nil {
		return nil, err
	}
	owned := map[string]client.Object{}
	for i := range list.Items {
		obj := &list.Items[i]
		if obj.GetName() == res.Name && res.Owned(obj, rd) {
			owned[obj.GetNamespace()] = obj
		}
	}
	return owned, nil
}

// copyResult is what became of one target namespace.
type copyResult struct {
	// rv is the copy's resourceVersion: up to date, or (forbidden set) the
	// one left as it was.
	rv string
	// conflict: a same-named object that is not ours is there (never
	// modified).
	conflict bool
	// forbidden is the verb the author may not do there; nothing was written.
	forbidden string
	err       error
}

// syncCopy makes the copy in ns current, asking first whether the author may
// make each write. knownForeign: a foreign object of the copy's name is known
// to be there (conflicts.go), so no create is tried.
func (r *Reconciler) syncCopy(ctx context.Context, rd *v1alpha1.ResourceDistribution, res *Resource, author Author, ns string, existing client.Object, knownForeign bool, now time.Time) copyResult {
	allowed := func(verb string) (string, error) {
		ok, err := r.Authorizer.Allowed(ctx, author, verb, res.APIResource(), ns)
		if err != nil || ok {
			return "", err
		}
		return verb, nil
	}
	if existing == nil {
		if verb, err := allowed(VerbCreate); err != nil || verb != "" {
			return copyResult{forbidden: verb, err: err}
		}
		if knownForeign {
			return copyResult{conflict: true}
		}
		created := res.Copy(ns, rd, now)
		err := r.Client.Create(ctx, created)
		if err == nil {
			return copyResult{rv: created.GetResourceVersion()}
		}
		if !apierrors.IsAlreadyExists(err) {
			return copyResult{err: err}
		}
		// Not in the cache: a foreign object, or our own copy the cache has
		// not seen yet.
		existing = res.NewObject()
		if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: res.Name}, existing); err != nil {
			return copyResult{err: err}
		}
		if !res.Owned(existing, rd) {
			return copyResult{conflict: true}
		}
	}
	if res.UpToDate(existing) {
		return copyResult{rv: existing.GetResourceVersion()}
	}
	if _, metadataOnly := existing.(*metav1.PartialObjectMetadata); metadataOnly {
		// The cache holds the copy's metadata: its type, immutability and
		// data come from the apiserver.
		whole := res.NewObject()
		if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: res.Name}, whole); err != nil {
			if !apierrors.IsNotFound(err) {
				return copyResult{err: err}
			}
			// Deleted meanwhile: its delete event queues this
			// distribution again, which creates it.
			return copyResult{err: fmt.Errorf("the copy in %s was deleted while being updated; it is created again", ns)}
		}
		if !res.Owned(whole, rd) {
			return copyResult{conflict: true}
		}
		existing = whole
		if res.UpToDate(existing) {
			return copyResult{rv: existing.GetResourceVersion()}
		}
	}
	if res.NeedsRecreate(existing) {
		// A Secret's type, or an immutable object's content, cannot change in
		// place.
		for _, verb := range []string{VerbDelete, VerbCreate} {
			if verb, err := allowed(verb); err != nil || verb != "" {
				return copyResult{forbidden: verb, rv: existing.GetResourceVersion(), err: err}
			}
		}
		uid := existing.GetUID()
		if err := r.Client.Delete(ctx, existing, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return copyResult{err: err}
		}
		created := res.Copy(ns, rd, now)
		if err := r.Client.Create(ctx, created); err != nil {
			return copyResult{err: err}
		}
		return copyResult{rv: created.GetResourceVersion()}
	}
	if verb, err := allowed(VerbUpdate); err != nil || verb != "" {
		return copyResult{forbidden: verb, rv: existing.GetResourceVersion(), err: err}
	}
	updated := existing.DeepCopyObject().(client.Object)
	if err := res.ApplyTo(updated, rd, now); err != nil {
		return copyResult{err: err}
	}
	if err := r.Client.Update(ctx, updated); err != nil {
		return copyResult{err: err}
	}
	return copyResult{rv: updated.GetResourceVersion()}
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
	if err := r.Client.Status().Patch(ctx, updated, client.MergeFrom(rd)); err != nil {
		return err
	}
	// The resourceVersion of this write is the controller's own, not a
	// user's touch that asks to look at the conflicts now.
	r.conflicts.wrote(rd, updated.ResourceVersion)
	return nil
}

func statusEqual(a, b *v1alpha1.ResourceDistributionStatus) bool {
	sameCondition := func(typ string) bool {
		ca, cb := meta.FindStatusCondition(a.Conditions, typ), meta.FindStatusCondition(b.Conditions, typ)
		return (ca == nil) == (cb == nil) && (ca == nil || (ca.Status == cb.Status && ca.Reason == cb.Reason && ca.Message == cb.Message && ca.ObservedGeneration == cb.ObservedGeneration))
	}
	return sameCondition(ConditionSynced) && sameCondition(ConditionAuthorized) && a.ObservedGeneration == b.ObservedGeneration && a.Description == b.Description &&
		a.Desired == b.Desired && a.Succeeded == b.Succeeded && a.Distributed == b.Distributed &&
		maps.Equal(a.DistributedResources, b.DistributedResources) &&
		a.Conflicting == b.Conflicting && slices.Equal(a.ConflictingNamespaces, b.ConflictingNamespaces) &&
		a.Unauthorized == b.Unauthorized && slices.Equal(a.UnauthorizedNamespaces, b.UnauthorizedNamespaces) &&
		a.AuthorSince.Equal(b.AuthorSince) && a.AuthorGeneration == b.AuthorGeneration
}

// setCondition sets a condition, its message bounded (boundMessage).
func setCondition(status *v1alpha1.ResourceDistributionStatus, typ string, generation int64, s metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: typ, Status: s, Reason: reason, Message: boundMessage(msg, maxMessageBytes), ObservedGeneration: generation,
	})
}

// firstCopies is the status's map of copies: all of them, or the first limit
// by namespace name (limit <= 0: DefaultMaxStatusCopies).
func firstCopies(distributed map[string]string, limit int) map[string]string {
	if limit <= 0 {
		limit = DefaultMaxStatusCopies
	}
	if len(distributed) <= limit {
		return distributed
	}
	first := make(map[string]string, limit)
	for _, ns := range slices.Sorted(maps.Keys(distributed))[:limit] {
		first[ns] = distributed[ns]
	}
	return first
}

// copiesIncomplete reports a status whose map of copies leaves some out
// (status.distributed counts more). A status written before distributed
// existed counts 0 and names every copy.
func copiesIncomplete(status *v1alpha1.ResourceDistributionStatus) bool {
	return int(status.Distributed) > len(status.DistributedResources)
}

// CopyNamespaces returns the namespaces the status names as holding a copy,
// sorted, and whether that is all of them.
func CopyNamespaces(status *v1alpha1.ResourceDistributionStatus) (namespaces []string, complete bool) {
	return slices.Sorted(maps.Keys(status.DistributedResources)), !copiesIncomplete(status)
}
