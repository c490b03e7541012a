package dra

import (
	"context"
	"fmt"
	"sync/atomic"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	metaapply "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
	resourceinformers "k8s.io/client-go/informers/resource/v1"
	"k8s.io/client-go/kubernetes"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	rcapply "github.com/resclass/resclass/pkg/client/applyconfiguration/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	rcinformers "github.com/resclass/resclass/pkg/client/informers/externalversions/resclass/v1alpha1"
	rclisters "github.com/resclass/resclass/pkg/client/listers/resclass/v1alpha1"
)

const (
	// FieldManager is the server-side-apply manager of the DeviceClasses and
	// of the ResourceClass condition the controller writes.
	FieldManager = "resclass-deviceclasses"

	// ConditionDeviceClass is the ResourceClass condition saying whether the
	// class has its DeviceClass: True (reason Synced), or False with reason
	// Untranslatable (the class cannot be written as a DRA selector; the
	// message says why) or NameTaken (a DeviceClass of that name that
	// resclass does not own exists).
	ConditionDeviceClass = "DeviceClass"

	ReasonSynced         = "Synced"
	ReasonUntranslatable = "Untranslatable"
	ReasonNameTaken      = "NameTaken"
)

var (
	syncs = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace: "resclass", Subsystem: "deviceclasses", Name: "syncs_total",
		Help: "ResourceClass -> DeviceClass syncs by result: applied (created or restored), unchanged, deleted, " +
			"untranslatable (the class has no DeviceClass), name_taken (a DeviceClass resclass does not own has the name), error.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"result"})
	withoutDeviceClass = metrics.NewGauge(&metrics.GaugeOpts{
		Namespace: "resclass", Subsystem: "deviceclasses", Name: "classes_without_deviceclass",
		Help:           "ResourceClasses that have no DeviceClass (condition DeviceClass=False), so DRA-mode nodes serve them to nobody.",
		StabilityLevel: metrics.ALPHA,
	})
)

func init() {
	legacyregistry.MustRegister(syncs, withoutDeviceClass)
}

// Controller keeps one DeviceClass per ResourceClass (DeviceClass): created
// when the class appears, restored when edited by hand, deleted with the class
// (also by garbage collection: the class owns it). A class that cannot be
// translated gets a Warning Event and the condition DeviceClass=False.
type Controller struct {
	kube    kubernetes.Interface
	rc      versioned.Interface
	classes rclisters.ResourceClassLister
	devices resourcelisters.DeviceClassLister
	events  events.EventRecorder
	queue   workqueue.TypedRateLimitingInterface[string]
	synced  []toolscache.InformerSynced
	leading atomic.Bool
	// unready holds the classes whose condition is False, for the gauge
	// (only the worker touches it).
	unready map[string]bool
}

// NewController registers the controller's handlers on the informers; Run
// starts it.
func NewController(kube kubernetes.Interface, rc versioned.Interface, classes rcinformers.ResourceClassInformer,
	devices resourceinformers.DeviceClassInformer, recorder events.EventRecorder) (*Controller, error) {
	c := &Controller{
		kube: kube, rc: rc, classes: classes.Lister(), devices: devices.Lister(), events: recorder,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "resclass-deviceclasses"}),
		unready: map[string]bool{},
	}
	enqueue := func(obj any) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if m, err := meta.Accessor(obj); err == nil {
			c.queue.Add(m.GetName())
		}
	}
	handler := toolscache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue}
	r1, err := classes.Informer().AddEventHandler(handler)
	if err != nil {
		return nil, err
	}
	r2, err := devices.Informer().AddEventHandler(handler)
	if err != nil {
		return nil, err
	}
	c.synced = []toolscache.InformerSynced{r1.HasSynced, r2.HasSynced}
	return c, nil
}

// Run works the queue until ctx is done (the process's life); it syncs only
// while Lead runs, so that only the replica holding a Lease writes (two would
// fight over nothing, but both would send Events).
func (c *Controller) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("deviceclasses")
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	if !toolscache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return
	}
	for c.next(ctx, logger) {
	}
}

// Lead lets Run sync until ctx is done (leadership lost), starting with every
// class: a new leader finds what changed while none led.
func (c *Controller) Lead(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("deviceclasses")
	c.leading.Store(true)
	defer c.leading.Store(false)
	if !toolscache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return
	}
	classes, _ := c.classes.List(labels.Everything())
	for _, rc := range classes {
		c.queue.Add(rc.Name)
	}
	logger.Info("Keeping a DeviceClass per ResourceClass as leader", "classes", len(classes))
	<-ctx.Done()
}

func (c *Controller) next(ctx context.Context, logger klog.Logger) bool {
	name, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(name)
	if !c.leading.Load() {
		c.queue.Forget(name) // the next leader starts with every class
		return true
	}
	if err := c.Sync(ctx, name); err != nil {
		syncs.WithLabelValues("error").Inc()
		logger.Error(err, "Syncing the DeviceClass; retrying", "class", name)
		c.queue.AddRateLimited(name)
		return true
	}
	c.queue.Forget(name)
	return true
}

// controlledBy reports whether dc is a DeviceClass of a ResourceClass named
// name (any incarnation of it).
func controlledBy(dc *resourceapi.DeviceClass, name string) (*metav1.OwnerReference, bool) {
	ref := metav1.GetControllerOf(dc)
	if ref == nil || ref.Kind != "ResourceClass" || ref.Name != name {
		return nil, false
	}
	if gv, err := schema.ParseGroupVersion(ref.APIVersion); err != nil || gv.Group != v1alpha1.SchemeGroupVersion.Group {
		return nil, false
	}
	return ref, true
}

// Sync makes the DeviceClass named name what the ResourceClass named name
// says.
func (c *Controller) Sync(ctx context.Context, name string) error {
	rc, err := c.classes.Get(name)
	if apierrors.IsNotFound(err) {
		delete(c.unready, name)
		withoutDeviceClass.Set(float64(len(c.unready)))
		return c.deleteOwned(ctx, name, "")
	}
	if err != nil {
		return err
	}
	if rc.DeletionTimestamp != nil {
		return nil // garbage collection deletes the DeviceClass after it
	}
	existing, err := c.devices.Get(name)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if existing != nil {
		if _, ours := controlledBy(existing, name); !ours {
			syncs.WithLabelValues("name_taken").Inc()
			msg := fmt.Sprintf("DeviceClass %s exists and is not resclass's (no ResourceClass controls it): DRA-mode nodes serve this class to nobody; rename the class or that DeviceClass", name)
			return c.condition(ctx, rc, metav1.ConditionFalse, ReasonNameTaken, msg)
		}
	}
	want, err := DeviceClass(rc)
	if err != nil {
		syncs.WithLabelValues("untranslatable").Inc()
		if err := c.deleteOwned(ctx, name, ""); err != nil { // a stale one would select other devices
			return err
		}
		return c.condition(ctx, rc, metav1.ConditionFalse, ReasonUntranslatable, err.Error())
	}
	if existing != nil && upToDate(existing, want) {
		syncs.WithLabelValues("unchanged").Inc()
	} else {
		_, err := c.kube.ResourceV1().DeviceClasses().Apply(ctx, applyConfiguration(want), metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
		if err != nil {
			return fmt.Errorf("applying DeviceClass %s: %w", name, err)
		}
		syncs.WithLabelValues("applied").Inc()
		klog.FromContext(ctx).V(2).Info("DeviceClass applied", "class", name, "restored", existing != nil)
	}
	msg := fmt.Sprintf("DeviceClass %s selects the class's devices on DRA nodes; pods request %s there too", name, ExtendedResourceName(name))
	if want.Spec.ExtendedResourceName == nil {
		msg = fmt.Sprintf("DeviceClass %s selects the devices that serve the class's shares on DRA nodes; pods there use a ResourceClaim that requests N units as capacity (no extended resource: docs/dra.md, \"Share classes\")", name)
	}
	return c.condition(ctx, rc, metav1.ConditionTrue, ReasonSynced, msg)
}

// deleteOwned deletes the DeviceClass name if a ResourceClass of that name
// controls it (uid empty: any incarnation of the class).
func (c *Controller) deleteOwned(ctx context.Context, name string, uid types.UID) error {
	dc, err := c.devices.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	ref, ours := controlledBy(dc, name)
	if !ours || (uid != "" && ref.UID != uid) {
		return nil
	}
	err = c.kube.ResourceV1().DeviceClasses().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &dc.UID}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return err
	}
	syncs.WithLabelValues("deleted").Inc()
	return nil
}

// upToDate reports whether dc has everything the controller applies.
func upToDate(dc, want *resourceapi.DeviceClass) bool {
	ref := metav1.GetControllerOf(dc)
	wantRef := want.OwnerReferences[0]
	return ref != nil && ref.UID == wantRef.UID && ref.APIVersion == wantRef.APIVersion &&
		dc.Labels[ManagedByLabel] == ManagedByValue &&
		equality.Semantic.DeepEqual(dc.Spec.Selectors, want.Spec.Selectors) &&
		equality.Semantic.DeepEqual(dc.Spec.ExtendedResourceName, want.Spec.ExtendedResourceName)
}

func applyConfiguration(dc *resourceapi.DeviceClass) *resourceapply.DeviceClassApplyConfiguration {
	ref := dc.OwnerReferences[0]
	spec := resourceapply.DeviceClassSpec()
	if dc.Spec.ExtendedResourceName != nil {
		spec.WithExtendedResourceName(*dc.Spec.ExtendedResourceName)
	}
	for _, s := range dc.Spec.Selectors {
		spec.WithSelectors(resourceapply.DeviceSelector().WithCEL(resourceapply.CELDeviceSelector().WithExpression(s.CEL.Expression)))
	}
	return resourceapply.DeviceClass(dc.Name).
		WithLabels(dc.Labels).
		WithOwnerReferences(metaapply.OwnerReference().WithAPIVersion(ref.APIVersion).WithKind(ref.Kind).
			WithName(ref.Name).WithUID(ref.UID).WithController(true)).
		WithSpec(spec)
}

// condition records the DeviceClass condition on rc (server-side apply of
// that one condition, so the scheduler's status writer keeps the rest), with
// a Warning Event when it turns False, and keeps the gauge.
func (c *Controller) condition(ctx context.Context, rc *v1alpha1.ResourceClass, status metav1.ConditionStatus, reason, msg string) error {
	if status == metav1.ConditionTrue {
		delete(c.unready, rc.Name)
	} else {
		c.unready[rc.Name] = true
	}
	withoutDeviceClass.Set(float64(len(c.unready)))
	if old := meta.FindStatusCondition(rc.Status.Conditions, ConditionDeviceClass); old != nil &&
		old.Status == status && old.Reason == reason && old.Message == msg && old.ObservedGeneration == rc.Generation {
		return nil
	}
	if status == metav1.ConditionFalse && c.events != nil {
		// The recorder names the object by its kind, which a lister's copy
		// does not carry. An Event's note holds at most 1 kB.
		ref := &v1alpha1.ResourceClass{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "ResourceClass"},
			ObjectMeta: metav1.ObjectMeta{Name: rc.Name, UID: rc.UID, ResourceVersion: rc.ResourceVersion},
		}
		note := msg
		if len(note) > 1000 {
			note = note[:1000]
		}
		c.events.Eventf(ref, nil, "Warning", "DeviceClass"+reason, "SyncDeviceClass", "%s", note)
	}
	cond := metaapply.Condition().WithType(ConditionDeviceClass).WithStatus(status).WithReason(reason).
		WithMessage(msg).WithObservedGeneration(rc.Generation).WithLastTransitionTime(metav1.Now())
	if old := meta.FindStatusCondition(rc.Status.Conditions, ConditionDeviceClass); old != nil && old.Status == status {
		cond.WithLastTransitionTime(old.LastTransitionTime)
	}
	_, err := c.rc.ResclassV1alpha1().ResourceClasses().ApplyStatus(ctx,
		rcapply.ResourceClass(rc.Name).WithStatus(rcapply.ResourceClassStatus().WithConditions(cond)),
		metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
